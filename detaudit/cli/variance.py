"""``detaudit variance``: how much of a result's spread is nondeterminism."""

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
Runs SCRIPT K times with one fixed seed (only nondeterminism varies) and K
times with K different seeds (initialisation, data order and nondeterminism
vary), then reports per metric the mean and std of each arm and the ratio
std_fixed / std_varied with a bootstrap 95% CI.  The script reports metrics
with detaudit.log_metric(name, value) or by printing 'detaudit-metric: {json}'.
Everything after '--' goes to the script; '{seed}' there is replaced by each
run's seed (also in the DETAUDIT_SEED environment variable), for scripts
that seed themselves from a flag: -- --seed {seed}"""

EPILOG = """\
Large studies: run one shard per machine or Slurm array task, e.g.
  detaudit variance train.py --runs 50 --out study --shard $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT
then join them with: detaudit variance --merge study
(fixtures/examples/slurm_variance.sbatch; with --nproc-per-node each run is a torchrun run)"""


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "variance",
        help="fixed-seed vs varied-seed runs: how much of the spread is nondeterminism",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_script_arguments(parser, required=False)
    parser.add_argument("--runs", type=int, default=5, metavar="K", help="runs per arm (default 5, at least 2)")
    parser.add_argument("--metric", action="append", metavar="NAME", help="report only this metric (repeatable)")
    parser.add_argument("--seed", type=int, default=0, help="the fixed arm's seed; the varied arm uses seed..seed+K-1")
    parser.add_argument(
        "--deterministic",
        action="store_true",
        help="enable deterministic mode in every run: the fixed arm must then collapse to one value",
    )
    parser.add_argument("--jobs", type=positive_int, help="runs at a time (default: GPUs, else cores / --threads)")
    parser.add_argument("--threads", type=positive_int, help="torch threads per run (default: torch's own)")
    parser.add_argument("--max-steps", type=int, default=0, metavar="N", help="stop each run after N optimizer steps")
    parser.add_argument("--timeout", type=float, default=3600.0, metavar="SECONDS", help="per run (default 3600)")
    parser.add_argument("--out", type=Path, metavar="DIR", help="study folder (default: detaudit-variance-SCRIPTNAME)")
    parser.add_argument("--shard", metavar="I/N", help="run only shard I of N of the planned runs")
    parser.add_argument("--merge", nargs="+", type=Path, metavar="DIR", help="join study folders (shards) into --out")
    add_distributed_arguments(parser)
    add_format_argument(parser, "the summary")
    parser.set_defaults(handler=run_variance)


def _open_study(args):
    from detaudit.stats.study import Study, StudySettings

    if args.runs < 2:
        raise UsageError(f"--runs must be at least 2 to measure a spread, got {args.runs}")
    script = Path(args.script)
    if not script.is_file():
        raise UsageError(f"no such script: {args.script}")
    settings = StudySettings(
        script=str(script.resolve()),
        script_args=tuple(args.script_args),
        runs=args.runs,
        seed=args.seed,
        deterministic=args.deterministic,
        threads=args.threads,
        max_steps=args.max_steps,
        **_distributed_settings(args),
    )
    return Study.open(args.out or Path(f"detaudit-variance-{script.stem}"), settings)


def _distributed_settings(args) -> dict:
    """--nproc-per-node and the torchrun options, as the study's settings keep them."""
    distributed = distributed_of(args)
    if distributed is None:
        return {}
    return {"nproc_per_node": distributed.nproc_per_node, "torchrun_options": distributed.torchrun_options}


def run_variance(args) -> int:
    from detaudit.stats.numerics import scipy_missing

    missing = scipy_missing("variance")
    if missing:
        raise UsageError(missing)

    from detaudit.stats import study as study_files
    from detaudit.stats.display import report_console
    from detaudit.stats.runner import StudyStopped

    console = report_console(stderr=args.format == "json")
    try:
        if args.merge:
            if args.script:
                raise UsageError("--merge joins finished studies: give no SCRIPT")
            study = study_files.merge(args.merge, args.out or args.merge[0])
            console.print(f"merged {len(args.merge)} folder(s) into {study.folder}")
            return _report(study, args, console, [])
        if not args.script:
            raise UsageError("give a SCRIPT to run (or --merge DIR...)")
        shard = study_files.parse_shard(args.shard) if args.shard else None
        study = _open_study(args)
        new_records = _run_pending(study, shard, args, console)
    except study_files.StudyError as error:
        raise UsageError(str(error)) from None
    except StudyStopped as stopped:
        _print_first_failure(console, [stopped.record])
        raise UsageError(str(stopped)) from None
    if shard is None:
        return _report(study, args, console, new_records)
    # a shard only adds its runs: the report comes from --merge, once every shard is done
    finished = sum(record.ok for record in new_records)
    console.print(
        f"shard {shard[0]}/{shard[1]}: {finished} run(s) finished now, {len(study.pending(shard))} still to go; "
        f"when every shard is done: detaudit variance --merge {study.folder}",
        soft_wrap=True,
    )
    return _exit_code_for_failures(console, new_records)


def _run_pending(study, shard, args, console) -> list:
    from detaudit.report.progress import RunProgress
    from detaudit.stats import runner

    pending = study.pending(shard)
    if not pending:
        return []
    gpus = runner.visible_gpu_count()
    jobs = args.jobs or runner.default_jobs(gpus, args.threads)
    console.print(f"{len(pending)} run(s) to go in {study.folder}, {jobs} at a time")
    return runner.execute(
        study,
        pending,
        jobs=jobs,
        progress=RunProgress("variance", len(pending)),
        gpus=gpus,
        timeout=args.timeout,
        shard=shard,
        wanted_metrics=args.metric,
    )


def _report(study, args, console, new_records: list) -> int:
    """Tables, summary, plots and the printed statistics of every finished run."""
    from detaudit.stats import plot
    from detaudit.stats.numerics import json_safe
    from detaudit.stats.variance import render, summarize

    study.write_tables()
    if not any(record.ok for record in study.records().values()):
        _print_first_failure(console, new_records or list(study.records().values()))
        return 2
    try:
        summary = summarize(study, args.metric)
    except ValueError as error:
        _print_first_failure(console, new_records or list(study.records().values()))
        raise UsageError(str(error)) from None
    summary_json = json.dumps(json_safe(summary.to_dict()), indent=2)
    (study.folder / "summary.json").write_text(summary_json + "\n")
    title = f"detaudit variance: {Path(study.settings.script).name}"
    plot.write_html(summary, study.folder / "report.html", title)
    if not plot.write_png(summary, study.folder / "variance.png", title):
        console.print("matplotlib is not installed: no variance.png (report.html has the same plot)")
    if args.format == "json":
        print(summary_json)
    else:
        render(summary, console)
        console.print(f"results: {study.folder}/runs.csv, runs.json, summary.json, report.html")
    failures = _exit_code_for_failures(console, new_records)
    return failures or (1 if summary.determinism_proven is False else 0)


def _exit_code_for_failures(console, new_records: list) -> int:
    """2 when a run of this invocation crashed or timed out (its output is shown)."""
    failed_now = [record for record in new_records if not record.ok]
    if failed_now:
        _print_first_failure(console, failed_now)
        return 2
    return 0


def _print_first_failure(console, records) -> None:
    failed = [record for record in records if not record.ok]
    if failed:
        first = failed[0]
        console.print(f"[red]{len(failed)} run(s) failed; output of run {first.run_id}:[/]", highlight=False)
        console.print("\n".join([first.output_tail, *first.problems]), markup=False, highlight=False)
