"""The ``detaudit`` command line.

Each subcommand lives in its own module of this package, exposing
``add_parser(subparsers)``; the parser it adds sets ``handler`` to a function
``(args) -> exit code``.  Subcommand modules import heavy dependencies (torch,
numpy, libcst) inside their handlers, never at module level, so that building
the parser stays cheap for every command.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from detaudit import __version__

SUBCOMMANDS = (
    "check",
    "rules",
    "run",
    "variance",
    "compare",
    "instability",
    "ops",
    "calibrate",
    "status",
)


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="detaudit",
        description="Find and fix what makes PyTorch training irreproducible.",
    )
    parser.add_argument("--version", action="version", version=f"detaudit {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"detaudit.cli.{name}").add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
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
    except Exception:  # an internal failure must not look like "findings" (exit 1)
        import traceback

        traceback.print_exc()
        print("detaudit: internal error (see the traceback above)", file=sys.stderr)
        return 2
