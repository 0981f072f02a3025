"""``detaudit status``: the determinism state of a fresh Python process here.

It shows what a training script started from this shell inherits: versions,
devices, torch's defaults, thread counts and the environment variables that
matter.  Inside a script, ``print(detaudit.status())`` shows the live state.
"""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "status", help="show the determinism state (flags, seeds, versions, env) of this environment"
    )
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument(
        "--init-cuda", action="store_true", help="initialise CUDA to read the GPU names (off: CUDA stays untouched)"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from detaudit.runtime.status import status

    result = status(initialize_cuda=args.init_cuda)
    if args.format == "json":
        import json

        print(json.dumps(result.to_dict(), indent=2))
    else:
        from detaudit.report.text import make_console

        make_console().print(result)
    return 0
