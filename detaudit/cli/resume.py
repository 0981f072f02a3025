"""``detaudit resume SCRIPT --interrupt-at K --resume-args=ARGS``: does a run
resumed from its checkpoint continue exactly as one never interrupted?"""

from __future__ import annotations

import json
import sys

from detaudit.cli import UsageError, add_script_arguments, positive_int
from detaudit.resume.presets import PRESETS


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "resume",
        help="check that a training resumed from its checkpoint continues exactly as an uninterrupted one",
        description=(
            "Run SCRIPT three times under one seed: straight for N optimizer steps; interrupted before its "
            "(K+1)-th step, after whatever it saved at step K; and resumed with the resume arguments for N-K steps. "
            "Compare the resumed run with the straight one, component by component (parameters, buffers, "
            "gradients, optimizer state, learning rate, LR scheduler, GradScaler, the RNG states, the batch), "
            "as its first step starts and at every later step end. "
            "Exit 0 equivalent, 1 diverges, 2 a run failed or the resumed run loaded no checkpoint."
        ),
    )
    add_script_arguments(parser)
    parser.add_argument("--interrupt-at", type=positive_int, required=True, metavar="K",
                        help="interrupt the run before its (K+1)-th optimizer step (a step after which it checkpoints)")
    parser.add_argument("--steps", type=positive_int, metavar="N", help="optimizer steps of the straight run (default 2*K)")
    parser.add_argument("--resume-args", default="", metavar="ARGS",
                        help="arguments that make the script resume, split as a shell would; {step} is replaced by K "
                        "and {checkpoint} by the newest checkpoint the interrupted run wrote "
                        "(for example --resume-args='--resume {checkpoint}')")
    parser.add_argument("--preset", choices=tuple(PRESETS),
                        help="resume the way a framework does, from the newest checkpoint the interrupted run wrote: "
                        + "; ".join(f"{p.name}: {p.how}".replace("`", "") for p in PRESETS.values()))
    parser.add_argument("--seed", type=int, default=0, help="seed for random, numpy and torch before each run")
    parser.add_argument("--no-seed", action="store_true", help="leave seeding to the script itself")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run before it is killed")
    parser.add_argument("--format", choices=("text", "json", "sarif", "github"), default="text")
    parser.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report to FILE")
    parser.set_defaults(handler=run_resume)


def run_resume(args) -> int:
    from detaudit.resume.audit import audit_resume

    try:
        report = audit_resume(
            args.script, args.interrupt_at, args.resume_args, preset=args.preset, steps=args.steps, script_args=args.script_args,
            seed=None if args.no_seed else args.seed, timeout=args.timeout,
            progress=lambda message: print(f"detaudit resume: {message}", file=sys.stderr),
        )
    except (ValueError, FileNotFoundError) as error:
        raise UsageError(str(error)) from None
    _write(report, args.format)
    if args.html:
        from detaudit.report.html import write_resume_html

        write_resume_html(report, args.html)
        print(f"detaudit: wrote {args.html}", file=sys.stderr)
    return report.exit_code


def _write(report, output_format: str) -> None:
    if output_format == "json":
        print(json.dumps(report.to_json(), indent=2))
    elif output_format == "sarif":
        from detaudit.report.sarif import invocation, to_sarif
        from detaudit.resume.components import COMPONENTS

        notes = [("error", report.error)] if report.error else []
        run_invocation = invocation(not report.error, notes + [("warning", w) for w in report.warnings])
        print(json.dumps(to_sarif(report.findings(), COMPONENTS.values(), run_invocation=run_invocation), indent=2))
    elif output_format == "github":
        from detaudit.report.github import github_annotations, github_message

        sys.stdout.write(github_annotations(report.findings(), errors=[report.error] if report.error else []))
        for warning in report.warnings:
            sys.stdout.write(github_message("warning", warning, path=report.script, title="detaudit resume"))
        print(report.text().splitlines()[0])
    else:
        print(report.text())
