"""``detaudit instability``: does one ULP change the trained model as much as a new seed?"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from detaudit.cli import (
    UsageError,
    add_distributed_arguments,
    add_format_argument,
    add_script_arguments,
    distributed_of,
    positive_int,
)

DESCRIPTION = """\
Summers & Dinneen's probe: three runs of SCRIPT in deterministic mode: as is;
from the same seed with one random weight of the first parameter tensor moved
by one ULP at the first optimizer step (no edit of the script needed); and
from another seed.  Reports the relative L2 distance of the final weights
from the baseline, the logged metrics per step and, when the script logs
predictions, disagreement and correlation.  Everything after '--' goes to
the script; '{seed}' there is replaced by each run's seed (also in the
DETAUDIT_SEED environment variable), for scripts that seed themselves."""


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "instability",
        help="one-ULP perturbation vs reseed: is this training unstable?",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_script_arguments(parser)
    parser.add_argument("--steps", type=int, default=0, metavar="N", help="stop each run after N optimizer steps")
    parser.add_argument("--seed", type=int, default=0, help="the baseline's seed (default 0)")
    parser.add_argument("--reseed", type=int, help="the other run's seed (default: --seed + 1)")
    parser.add_argument("--perturb-seed", type=int, default=0, help="chooses which weight moves, and which way")
    parser.add_argument("--threads", type=positive_int, help="torch threads per run")
    parser.add_argument("--jobs", type=positive_int, default=1, help="runs at a time (default 1, at most 3)")
    parser.add_argument("--timeout", type=float, default=3600.0, metavar="SECONDS", help="per run (default 3600)")
    parser.add_argument("--out", type=Path, metavar="DIR", help="run folders and instability.json (default: detaudit-instability-SCRIPTNAME)")
    add_distributed_arguments(parser)
    add_format_argument(parser, "the report")
    parser.set_defaults(handler=run_instability)


def run_instability(args) -> int:
    from detaudit.report.progress import RunProgress
    from detaudit.stats.display import report_console
    from detaudit.stats.instability import VARIANTS, analyse, render, run_probe

    script = Path(args.script)
    if not script.is_file():
        raise UsageError(f"no such script: {args.script}")
    reseed = args.seed + 1 if args.reseed is None else args.reseed
    if reseed == args.seed:
        raise UsageError("--reseed must differ from --seed")
    folder = args.out or Path(f"detaudit-instability-{script.stem}")
    console = report_console(stderr=args.format == "json")
    console.print(f"3 deterministic runs of {script.name} (seed {args.seed}; one ULP; seed {reseed}) in {folder}")
    runs = run_probe(
        str(script.resolve()),
        args.script_args,
        folder,
        seed=args.seed,
        reseed=reseed,
        perturb_seed=args.perturb_seed,
        steps=args.steps,
        threads=args.threads,
        jobs=args.jobs,
        timeout=args.timeout,
        progress=RunProgress("instability", len(VARIANTS)),
        distributed=distributed_of(args),
    )
    failed = [run for run in runs.values() if run.status != "ok"]
    if failed:
        for run in failed:
            console.print(f"[red]{run.variant} run {run.status}:[/]")
            console.print(run.failure, markup=False, highlight=False)
        return 2
    report = analyse(runs)
    (folder / "instability.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    if args.format == "json":
        print(json.dumps(report.to_dict(), indent=2))
    else:
        render(report, console)
        console.print(f"details: {folder / 'instability.json'}")
    return 0
