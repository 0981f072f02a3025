"""The ``detaudit`` command line.

Each subcommand lives in its own module of this package, exposing
``add_parser(subparsers)``; the parser it adds sets ``handler`` to a function
``(args) -> exit code``.  Only the chosen subcommand's module is imported, so
``detaudit check`` never pays for (or breaks with) the dynamic pass's CLI, and
subcommand modules import heavy dependencies (torch, numpy, libcst) inside
their handlers.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from detaudit import __version__

#: subcommand -> one-line help (shown by ``detaudit --help`` without importing it)
SUBCOMMANDS = {
    "check": "statically check training code for reproducibility hazards",
    "rules": "list the static rules, or document one",
    "run": "run a training script several times and find what makes it nondeterministic",
    "ops": "print the knowledge base of nondeterministic ops",
    "calibrate": "measure which ops are nondeterministic with the installed torch",
    "status": "print this process's determinism settings",
    "variance": "how much of a result's spread is nondeterminism (fixed vs varied seeds)",
    "compare": "does model B really beat model A over seeds",
    "instability": "does a one-ULP change diverge as far as a reseed",
}


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="detaudit",
        description="Find and fix what makes PyTorch training irreproducible.",
    )
    parser.add_argument("--version", action="version", version=f"detaudit {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = next((arg for arg in argv if arg in SUBCOMMANDS), None)
    for name, help_text in SUBCOMMANDS.items():
        if name == chosen:
            importlib.import_module(f"detaudit.cli.{name}").add_parser(subparsers)
        else:
            subparsers.add_parser(name, help=help_text)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return args.handler(args)
    except UsageError as error:
        print(f"detaudit: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("detaudit: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `detaudit ... | head`: the reader left, nothing is wrong
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception:  # an internal failure must not look like "findings" (exit 1)
        import traceback

        traceback.print_exc()
        print("detaudit: internal error (see the traceback above)", file=sys.stderr)
        return 2
