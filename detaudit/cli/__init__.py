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
    "resume": "check that a training resumed from its checkpoint continues exactly as an uninterrupted one",
    "ops": "print the knowledge base of nondeterministic ops",
    "calibrate": "measure which ops are nondeterministic with the installed torch",
    "status": "print this process's determinism settings",
    "variance": "how much of a result's spread is nondeterminism (fixed vs varied seeds)",
    "compare": "does model B really beat model A over seeds",
    "instability": "does a one-ULP change diverge as far as a reseed",
}


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


def add_script_arguments(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    """SCRIPT, plus everything after the first ``--`` as the script's own
    arguments (``args.script_args``), for the commands that run a training
    script.  argparse alone cannot take ``-- ARGS`` after options that follow
    SCRIPT, so the subparser splits its arguments at ``--`` first."""
    parser.add_argument("script", nargs=None if required else "?", metavar="SCRIPT", help="the training script")
    parse_known_args = parser.parse_known_args

    def split_at_double_dash(args=None, namespace=None):
        args = list(args or [])
        script_args: list[str] = []
        if "--" in args:
            cut = args.index("--")
            args, script_args = args[:cut], args[cut + 1 :]
        namespace, extras = parse_known_args(args, namespace)
        namespace.script_args = script_args
        return namespace, extras

    parser.parse_known_args = split_at_double_dash
    parser.usage = f"%(prog)s [options] {'SCRIPT' if required else '[SCRIPT]'} [options] [-- ARGS]"


def add_format_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """``--format text|json`` of the statistics commands (``--json`` is short
    for ``--format json``).  Progress goes to stderr, so stdout stays pure JSON."""
    parser.add_argument(
        "--format", choices=("text", "json"), default="text", help=f"print {what} as tables and sentences (default) or as JSON"
    )
    parser.add_argument("--json", dest="format", action="store_const", const="json", help="same as --format json")


def positive_int(text: str) -> int:
    """argparse type for counts (runs, jobs, threads)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


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


#: torchrun options passed through as given (a multi-node rendezvous; the ranks of this node are audited)
TORCHRUN_OPTIONS = ("nnodes", "node_rank", "master_addr", "master_port", "rdzv_backend", "rdzv_endpoint", "rdzv_id")


def add_distributed_arguments(parser) -> None:
    """``--nproc-per-node`` and the torchrun options that go with it (also for the statistics commands)."""
    group = parser.add_argument_group("distributed (each run launched through torchrun)")
    group.add_argument(
        "--nproc-per-node", type=positive_int, metavar="N",
        help="run the script under torchrun with N ranks (init_process_group() as under torchrun; gloo on CPU)",
    )
    for name in TORCHRUN_OPTIONS:
        group.add_argument(f"--{name.replace('_', '-')}", metavar="VALUE", help="passed to torchrun")


def distributed_of(args):
    """The ``torchrun.Distributed`` the arguments ask for; None without --nproc-per-node."""
    from detaudit.launch.torchrun import Distributed

    given = [name for name in TORCHRUN_OPTIONS if getattr(args, name) is not None]
    if args.nproc_per_node is None:
        if given:
            raise UsageError(f"--{given[0].replace('_', '-')} goes with --nproc-per-node")
        return None
    options = tuple(f"--{name.replace('_', '-')}={getattr(args, name)}" for name in given)
    return Distributed(args.nproc_per_node, options)
