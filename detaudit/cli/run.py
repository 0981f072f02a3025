"""``detaudit run SCRIPT``: run a training script several times under identical
seeds and name what makes it nondeterministic."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from detaudit.cli import add_distributed_arguments, add_script_arguments, distributed_of, positive_int
from detaudit.dynamic.variations import VARIATIONS
from detaudit.dynamic.verdict.tolerance import tolerance_argument

FORMATS = ("text", "json", "sarif", "github")


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run a training script repeatedly and localize nondeterminism",
        description=(
            "Run SCRIPT in fresh subprocesses under identical seeds, trace every aten op, and report "
            "the ops, source lines and tensors that make it nondeterministic. "
            "Exit 0 deterministic (or latent: the final states were identical though an op that was read "
            "differed), 1 nondeterministic (a final tensor differs; with --strict also latent), "
            "2 the script failed or timed out (with --format json/sarif/github, the failure is written there too)."
        ),
    )
    add_script_arguments(parser)
    parser.add_argument(
        "--steps", type=int, help="stop after N optimizer steps (0: run to completion; default 2, with --against the reference's)"
    )
    parser.add_argument("--repeats", type=int, help="runs to compare (default 3; with --against, runs compared with the reference, default 1)")
    parser.add_argument(
        "--seed", type=int, help="seed for random, numpy and torch before each run (default 0, with --against the reference's)"
    )
    parser.add_argument("--no-seed", action="store_true", help="leave seeding to the script itself")
    parser.add_argument(
        "--vary", choices=tuple(VARIATIONS), help="vary " + " or ".join(v.help for v in VARIATIONS.values())
    )
    parser.add_argument(
        "--batch-sizes", type=_batch_sizes, metavar="N,N,...", help="with --vary batch: the batch sizes (default 1,2,4,8,32)"
    )
    parser.add_argument(
        "--positions", type=_positions, metavar="P,P,...|all",
        help="with --vary batch: positions in each batch (default first, middle, last; negative counts from the end)",
    )
    parser.add_argument("--deterministic", action="store_true", help="call detaudit.enable_determinism() first")
    parser.add_argument(
        "--strict",
        action="store_true",
        help="fail (exit 1) on latent differences too: an op gave different bits that were read but vanished "
        "before the final state",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run before it is killed")
    parser.add_argument(
        "--jobs",
        type=positive_int,
        default=1,
        help="runs at a time (default 1); the report is the same, and runs never share a GPU: one at a time where "
        "the script sees CUDA",
    )
    parser.add_argument("--format", choices=FORMATS, default="text")
    parser.add_argument("--junit-xml", metavar="FILE", help="also write a JUnit XML result to FILE")
    parser.add_argument(
        "--html",
        metavar="FILE",
        help="also write a self-contained HTML report to FILE (its divergence chart needs matplotlib: the plot extra)",
    )
    parser.add_argument(
        "--remedy",
        action="store_true",
        help="when nondeterministic: find the smallest set of settings that makes the runs bitwise reproducible, "
        "time it against the defaults and full determinism, and print the code to paste (text or json)",
    )
    parser.add_argument(
        "--timing-repeats", type=positive_int, metavar="N", help="with --remedy: timed runs per configuration (default: --repeats)"
    )
    parser.add_argument(
        "--timing-steps", type=int, default=10, metavar="N", help="with --remedy: optimizer steps per timed run (default 10; 0: all)"
    )
    reference = parser.add_argument_group("reference runs (another machine, torch version or setting)")
    reference.add_argument(
        "--save-reference", metavar="DIR",
        help="also keep run 1 in DIR (its trace, first steps' tensors, final state and environment, compressed) "
        "for later runs to compare with",
    )
    reference.add_argument(
        "--against", metavar="DIR",
        help="compare this run with the reference in DIR: exit 0 identical (or within --tolerance), 1 drift, "
        "naming the first ops that departed and the environment differences",
    )
    reference.add_argument(
        "--tolerance", type=tolerance_argument, metavar="ULP|REL",
        help="with --against: pass when every differing final tensor is within 4ulp (units in the last place) "
        "or a relative difference such as 1e-6",
    )
    parser.add_argument(
        "--repro", metavar="DIR",
        help="write a standalone script to DIR that reruns the first root cause's op on the tensors it read "
        "(torch only): N calls for a run-to-run cause, one with its output digest for a drift",
    )
    parser.add_argument(
        "--eager", action="store_true",
        help="run the script's torch.compile'd regions eagerly, op by op (by default they run compiled, as they do "
        "without detaudit, and each compiled graph's call is traced at its inputs and outputs)",
    )
    add_distributed_arguments(parser)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from detaudit.cli import UsageError

    script = Path(args.script)
    if not script.is_file():
        raise UsageError(f"no such script: {args.script}")
    _reference_defaults(args)
    if args.repeats < (1 if args.against else 2):
        raise UsageError(
            "--repeats must be at least 1 with --against" if args.against
            else "--repeats must be at least 2 (one run has nothing to compare with)"
        )
    variation = VARIATIONS.get(args.vary)
    if variation is not None and variation.repeats_script and args.repeats < 3:
        raise UsageError("--vary needs --repeats 3 or more (a control pair plus a varied run)")
    for other in VARIATIONS.values():  # options of one variation given without it
        stray = [name for name in other.options if getattr(args, name) is not None and other is not variation]
        if stray:
            raise UsageError(f"--{stray[0].replace('_', '-')} goes with --vary {other.name}")
    vary_options = {name: getattr(args, name) for name in variation.options} if variation else None
    if args.html and variation is not None and not variation.repeats_script:
        raise UsageError(f"--html reports repeated runs; --vary {variation.name} has its own report (use --format)")
    if args.steps < 0 or args.timeout <= 0:
        raise UsageError("--steps must be >= 0 and --timeout > 0")
    if args.remedy and variation is not None and not variation.repeats_script:
        raise UsageError(f"--remedy remedies repeated runs; --vary {variation.name} is an audit of its own")
    if args.remedy and args.format not in ("text", "json"):
        raise UsageError("--remedy prints text or json")
    if not args.remedy and (args.timing_repeats is not None or args.timing_steps != 10):
        raise UsageError("--timing-repeats and --timing-steps go with --remedy")
    if args.remedy and ((args.timing_repeats or args.repeats) < (3 if args.vary else 2) or args.timing_steps < 0):
        raise UsageError(
            "--timing-repeats must be at least 2 to compare the timed runs (3 with --vary) and --timing-steps >= 0"
        )

    distributed = distributed_of(args)
    if distributed is not None:
        refused = [
            option
            for option, given in (
                ("--vary", args.vary), ("--remedy", args.remedy), ("--html", args.html), ("--jobs", args.jobs > 1),
                ("--save-reference", args.save_reference), ("--against", args.against), ("--repro", args.repro),
            )
            if given
        ]
        if refused:
            raise UsageError(f"{refused[0]} is not supported with --nproc-per-node")

    from detaudit.dynamic.reference.folder import ReferenceFolderError
    from detaudit.dynamic.runner import ScriptFailed, audit_distributed, audit_script
    from detaudit.report.progress import RunProgress

    try:
        # on stderr in every format: stdout carries the report alone
        runs = args.repeats if variation is None or variation.repeats_script else 1  # an audit of its own is one run
        common = dict(
            steps=args.steps, repeats=args.repeats, seed=None if args.no_seed else args.seed,
            deterministic=args.deterministic, strict=args.strict, timeout=args.timeout,
        )
        with RunProgress(script.name, runs, more_may_follow=distributed is None) as progress:
            if distributed is not None:
                report = audit_distributed(
                    str(script), args.script_args, distributed=distributed, progress=progress, **common
                )
            else:
                report = audit_script(
                    str(script), args.script_args, vary=args.vary, progress=progress, vary_options=vary_options,
                    jobs=args.jobs, save_reference=args.save_reference, against=args.against,
                    tolerance=args.tolerance, repro=args.repro, eager=args.eager, **common,
                )
    except ReferenceFolderError as error:
        raise UsageError(str(error)) from None
    except ScriptFailed as failed:
        print(f"detaudit: error: {failed}", file=sys.stderr)
        if args.junit_xml:
            Path(args.junit_xml).write_text(failed.failure.to_junit_xml())
        _write_failure(failed.failure, args.format)
        return failed.failure.exit_code

    remedy = None
    if args.remedy and not report.deterministic:
        from detaudit.dynamic.remedy.search import find_remedy

        remedy = find_remedy(
            str(script),
            args.script_args,
            report,
            steps=args.steps,
            repeats=args.repeats,
            seed=None if args.no_seed else args.seed,
            vary=args.vary,
            timeout=args.timeout,
            timing_repeats=args.timing_repeats,
            timing_steps=args.timing_steps,
            progress=lambda message: print(f"detaudit: {message}", file=sys.stderr),
        )
    if args.junit_xml:
        Path(args.junit_xml).write_text(report.to_junit_xml())
    if args.html:
        _write_html(report, args.html)
    _write(report, args.format, remedy if args.remedy else False)
    return report.exit_code


def _reference_defaults(args: argparse.Namespace) -> None:
    """Fill --steps, --seed and --repeats: the reference's steps and seed with
    --against (asking for others is an error: the runs would not compare),
    else 2 steps, seed 0, 3 repeats; and refuse what does not go with a reference."""
    from detaudit.cli import UsageError

    refused = [
        (option, with_option)
        for option, given, with_option, also in (
            ("--tolerance", args.tolerance is not None, "--against", not args.against),
            ("--save-reference", args.save_reference, "--against", args.against),
            ("--vary", args.vary, "--against", args.against),
            ("--remedy", args.remedy, "--against", args.against),
            ("--vary", args.vary, "--save-reference", args.save_reference),
            ("--repro", args.repro, "--vary", args.vary),
        )
        if given and also
    ]
    if refused:
        option, with_option = refused[0]
        raise UsageError(f"{option} goes only with --against" if option == "--tolerance" else f"{option} does not go with {with_option}")
    if args.save_reference:
        from detaudit.dynamic.reference.folder import ReferenceFolderError, check_writable

        try:
            check_writable(args.save_reference)
        except ReferenceFolderError as error:
            raise UsageError(str(error)) from None
    if args.against:
        from detaudit.dynamic.reference.folder import ReferenceFolderError, read_manifest

        try:
            manifest = read_manifest(args.against)
        except ReferenceFolderError as error:
            raise UsageError(str(error)) from None
        steps, seed = manifest.get("steps"), manifest.get("seed")
        seed_given = args.no_seed or args.seed is not None
        if (args.steps is not None and args.steps != steps) or (seed_given and (None if args.no_seed else args.seed) != seed):
            saved = f"--steps {steps} " + ("--no-seed" if seed is None else f"--seed {seed}")
            raise UsageError(f"the reference in {args.against} ran with {saved}: a run with other steps or seeds does not compare with it")
        args.steps, args.seed, args.no_seed = steps, 0 if seed is None else seed, seed is None
    args.steps = 2 if args.steps is None else args.steps
    args.seed = 0 if args.seed is None else args.seed
    if args.repeats is None:
        args.repeats = 1 if args.against else 3


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


def _batch_sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated batch sizes, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be at least 1, got {text!r}")
    return sizes


def _positions(text: str) -> list[int] | str:
    if text.strip() == "all":
        return "all"
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'all' or comma-separated positions, got {text!r}") from None


def _write_html(report, path: str) -> None:
    from detaudit.report.divergence_chart import INSTALL_HINT, matplotlib_available
    from detaudit.report.html import write_run_html

    write_run_html(report, path)
    missing = "" if report.divergence is None or matplotlib_available() else f" (no chart: {INSTALL_HINT})"
    print(f"detaudit: wrote {path}{missing}", file=sys.stderr)


def _write(report, output_format: str, remedy=False) -> None:
    """``remedy``: the RemedyReport, None when there was nothing to remedy, False when not asked for."""
    if output_format == "json":
        data = report.to_dict()
        if remedy is not False:
            data["remedy"] = remedy.to_dict() if remedy else None
        print(json.dumps(data, indent=2))
    elif output_format == "sarif":
        from detaudit.dynamic.compare.causes import CAUSE_KINDS
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
        if remedy:
            remedy.render(console)
