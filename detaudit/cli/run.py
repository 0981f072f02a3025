"""``detaudit run SCRIPT``: run a training script several times under identical
seeds and name what makes it nondeterministic."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from detaudit.cli import add_script_arguments
from detaudit.dynamic.variations import VARIATIONS

FORMATS = ("text", "json", "sarif", "github")


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run a training script repeatedly and localize nondeterminism",
        description=(
            "Run SCRIPT in fresh subprocesses under identical seeds, trace every aten op, and report "
            "the ops, source lines and tensors that make it nondeterministic. "
            "Exit 0 deterministic, 1 nondeterministic, 2 the script failed or timed out "
            "(with --format json/sarif/github, the failure is written there too)."
        ),
    )
    add_script_arguments(parser)
    parser.add_argument("--steps", type=int, default=2, help="stop after N optimizer steps (0: run to completion)")
    parser.add_argument("--repeats", type=int, default=3, help="runs to compare (default 3)")
    parser.add_argument("--seed", type=int, default=0, help="seed for random, numpy and torch before each run")
    parser.add_argument("--no-seed", action="store_true", help="leave seeding to the script itself")
    parser.add_argument(
        "--vary", choices=tuple(VARIATIONS), help="vary " + " or ".join(v.help for v in VARIATIONS.values())
    )
    parser.add_argument("--deterministic", action="store_true", help="call detaudit.enable_determinism() first")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run before it is killed")
    parser.add_argument("--format", choices=FORMATS, default="text")
    parser.add_argument("--junit-xml", metavar="FILE", help="also write a JUnit XML result to FILE")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from detaudit.cli import UsageError

    script = Path(args.script)
    if not script.is_file():
        raise UsageError(f"no such script: {args.script}")
    if args.repeats < 2:
        raise UsageError("--repeats must be at least 2 (one run has nothing to compare with)")
    if args.vary and args.repeats < 3:
        raise UsageError("--vary needs --repeats 3 or more (a control pair plus a varied run)")
    if args.steps < 0 or args.timeout <= 0:
        raise UsageError("--steps must be >= 0 and --timeout > 0")

    from detaudit.dynamic.runner import ScriptFailed, audit_script

    def progress(message: str) -> None:
        if args.format == "text":
            print(f"detaudit: {message}", file=sys.stderr)

    try:
        report = audit_script(
            str(script),
            args.script_args,
            steps=args.steps,
            repeats=args.repeats,
            seed=None if args.no_seed else args.seed,
            vary=args.vary,
            deterministic=args.deterministic,
            timeout=args.timeout,
            progress=progress,
        )
    except ScriptFailed as failed:
        print(f"detaudit: error: {failed}", file=sys.stderr)
        if args.junit_xml:
            Path(args.junit_xml).write_text(failed.failure.to_junit_xml())
        _write_failure(failed.failure, args.format)
        return failed.failure.exit_code

    if args.junit_xml:
        Path(args.junit_xml).write_text(report.to_junit_xml())
    _write(report, args.format)
    return report.exit_code


def _write_failure(failure, output_format: str) -> None:
    """The machine formats say that the audit failed (the text one has said it on stderr)."""
    details = f"{failure.message}\n{failure.output_tail}".rstrip()
    if output_format == "json":
        print(json.dumps(failure.to_dict(), indent=2))
    elif output_format == "sarif":
        from detaudit.report.sarif import invocation, to_sarif

        print(json.dumps(to_sarif([], [], run_invocation=invocation(False, [("error", details)])), indent=2))
    elif output_format == "github":
        from detaudit.report.github import github_message

        sys.stdout.write(github_message("error", details, path=failure.target, title="detaudit run failed"))


def _write(report, output_format: str) -> None:
    if output_format == "json":
        print(json.dumps(report.to_dict(), indent=2))
    elif output_format == "sarif":
        from detaudit.dynamic.causes import CAUSE_KINDS
        from detaudit.report.sarif import invocation, to_sarif

        run_invocation = invocation(True, [("warning", warning) for warning in report.warnings])
        print(json.dumps(to_sarif(report.findings(), CAUSE_KINDS.values(), run_invocation=run_invocation), indent=2))
    elif output_format == "github":
        from detaudit.report.github import github_annotations, github_message

        sys.stdout.write(github_annotations(report.findings()))
        for warning in report.warnings:
            sys.stdout.write(github_message("warning", warning, path=report.target, title="detaudit run"))
        print(report.verdict_line())
    else:
        from rich.console import Console

        console = Console()
        if not console.is_terminal:  # logs and CI: wide enough that the tables stay on one line per row
            console = Console(width=160)
        report.render(console)
