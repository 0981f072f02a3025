"""Runs the planned runs of a study in parallel, with a progress display
(``detaudit.report.progress``).

Every run is one fresh subprocess started by the dynamic pass's launcher
(``detaudit.launch.process``); this module only decides what each run gets
(seed, GPU, its own folder), collects what it logged and saves a record the
moment it ends, so an interrupted study loses nothing that finished.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path

from detaudit.report.progress import RunProgress
from detaudit.stats.metrics import STATS_DIR_ENV, STDOUT_PREFIX, RankMetrics, read_run_outputs
from detaudit.stats.study import PlannedRun, RunRecord, Study

OUTPUT_TAIL_LINES = 30
SEED_ENV = "DETAUDIT_SEED"  # each run's seed, for scripts that seed themselves
SEED_PLACEHOLDER = "{seed}"  # replaced by each run's seed in the script's arguments
NO_METRIC = "the script logged no metric (detaudit.log_metric(name, value) or a 'detaudit-metric: {json}' line)"
LET_DETAUDIT_SEED = (
    "let detaudit set the seed: pass it on with '-- --seed {seed}' (each run's seed replaces {seed}) "
    "or read it in the script from the DETAUDIT_SEED environment variable"
)


def visible_gpu_count() -> int:
    """How many CUDA devices runs can be spread over (0 without CUDA)."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def default_jobs(gpus: int, threads_per_run: int | None) -> int:
    """One run per GPU; on CPU, as many runs as fit the cores at the given
    threads per run (torch uses every core by default, hence one run)."""
    if gpus:
        return gpus
    cores = os.cpu_count() or 1
    return max(1, cores // threads_per_run) if threads_per_run else 1


def script_arguments(script_args, seed: int | None) -> list[str]:
    """The script's own arguments with ``{seed}`` replaced by the run's seed,
    so a script that seeds itself from a flag (``--seed {seed}``) gets
    detaudit's seed instead of its default."""
    if seed is None:
        return list(script_args)
    return [argument.replace(SEED_PLACEHOLDER, str(seed)) for argument in script_args]


def run_settings(*, hash_seed: str, threads: int | None, deterministic: bool) -> dict:
    """The child settings (``detaudit.launch.child_settings``) of a statistics run:
    its hash seed, and the thread count and determinism when asked for."""
    settings: dict = {"hash-seed": hash_seed}
    if threads:
        settings["threads"] = threads
    if deterministic:
        settings["deterministic"] = True
    return settings


def launch(
    script: str,
    script_args,
    folder: Path,
    options,
    timeout: float | None,
    cancel: threading.Event | None = None,
    distributed=None,
):
    """One run of the user's script with its own folder for what it logs:
    ``options`` is a ``LaunchOptions``; returns (ScriptResult, RunOutputs).
    The run's seed is also in ``DETAUDIT_SEED`` and in place of ``{seed}`` in
    the script's arguments.  ``distributed`` (a ``torchrun.Distributed``):
    the run goes through torchrun, and what it logged is rank 0's (the
    other ranks log into their own folders); a failed run's result is the
    rank that failed first."""
    from detaudit.launch.process import run_script

    shutil.rmtree(folder, ignore_errors=True)  # leftovers of an interrupted attempt
    folder.mkdir(parents=True)
    seed_env = {} if options.seed is None else {SEED_ENV: str(options.seed)}
    options = replace(
        options.with_features(RankMetrics()),
        extra_env={**options.extra_env, **seed_env, STATS_DIR_ENV: str(folder.resolve())},
        output_dir=folder / "launch",
    )
    arguments = script_arguments(script_args, options.seed)
    if distributed is None:
        result = run_script(
            script, arguments, options=options, timeout=timeout, cancel=cancel, keep_lines_with=STDOUT_PREFIX
        )
    else:
        from detaudit.launch.torchrun import run_distributed

        run = run_distributed(script, arguments, options=options, distributed=distributed, timeout=timeout, cancel=cancel)
        result = run.ranks[run.blamed_rank()] if run.failed else run.ranks[0]
        result.warnings = run.launcher.warnings
        result.kept_lines = [
            line.strip() for line in result.stdout.splitlines() if line.strip().startswith(STDOUT_PREFIX)
        ]
    outputs = read_run_outputs(folder, "\n".join(result.kept_lines))  # every metric line, however long the output
    outputs.problems.extend(result.warnings)
    return result, outputs


def run_status(result, outputs, *, require_metrics: bool = True) -> str:
    """"ok", "failed" or "timed out" (also "failed": no metric when one is required)."""
    if result.timed_out:
        return "timed out"
    if result.failed:
        return "failed"
    if require_metrics and not outputs.final:
        outputs.problems.append(NO_METRIC)
        return "failed"
    return "ok"


def _run_once(study: Study, run: PlannedRun, gpu: int | None, timeout: float | None, cancel: threading.Event) -> RunRecord:
    from detaudit.launch.features import RecordEnvironment
    from detaudit.launch.options import LaunchOptions

    settings = study.settings
    options = LaunchOptions(
        seed=run.seed,
        max_steps=settings.max_steps,
        # the hash seed is part of "the seed": fixed in the fixed arm, varied in the other
        settings=run_settings(hash_seed=str(run.seed), threads=settings.threads, deterministic=settings.deterministic),
        extra_env={} if gpu is None else {"CUDA_VISIBLE_DEVICES": str(gpu)},
        features=(RecordEnvironment(),),
    )
    started = time.monotonic()
    result, outputs = launch(
        settings.script, settings.script_args, study.run_folder(run), options, timeout, cancel, settings.distributed()
    )
    status = run_status(result, outputs)
    return RunRecord(
        arm=run.arm,
        index=run.index,
        seed=run.seed,
        status=status,
        metrics=outputs.final,
        predictions={name: str(path.relative_to(study.folder)) for name, path in outputs.predictions.items()},
        environment=result.payload.get("environment", {}),
        returncode=result.returncode,
        seconds=round(time.monotonic() - started, 3),
        output_tail="" if status == "ok" else result.describe_failure(OUTPUT_TAIL_LINES),
        problems=outputs.problems,
        torch_seed=outputs.torch_seed,
    )


class StudyStopped(Exception):
    """The first run of a study showed that the others cannot give a result
    (no metric, or not the one asked for): the runs going were stopped."""

    def __init__(self, message: str, record: RunRecord):
        super().__init__(message)
        self.record = record


def first_run_problem(record: RunRecord, wanted_metrics) -> str | None:
    """Why no run of this study can give a result, judged on its first run."""
    if record.status == "failed" and record.returncode == 0 and NO_METRIC in record.problems:
        return NO_METRIC
    missing = [name for name in wanted_metrics or () if name not in record.metrics]
    if record.ok and missing:
        return (
            f"it logged {', '.join(sorted(record.metrics))} but not {', '.join(missing)} "
            "(asked for with --metric)"
        )
    return None


def reseeded_note(record: RunRecord) -> str | None:
    """A line when the script replaced the seed detaudit started the run at."""
    if record.torch_seed is None or record.torch_seed == record.seed:
        return None
    return (
        f"run {record.run_id} started at seed {record.seed}, but the script set torch's seed to "
        f"{record.torch_seed} itself (torch.initial_seed() when it logged): {LET_DETAUDIT_SEED}"
    )


def _outcome(record: RunRecord) -> str:
    if record.ok:
        return f"seed {record.seed}, ok in {record.seconds:.1f} s"
    return f"seed {record.seed}, {record.status}"


def execute(
    study: Study,
    runs: list[PlannedRun],
    *,
    jobs: int,
    progress: RunProgress,
    gpus: int = 0,
    timeout: float | None = None,
    shard: tuple[int, int] | None = None,
    wanted_metrics=(),
) -> list[RunRecord]:
    """Runs ``runs`` with up to ``jobs`` at a time (each on its own GPU when
    there are several) and appends each record to the study as it ends.

    The first run to end is checked at once: when it logged no metric (or not
    the ``wanted_metrics``), no other run can do better, so the runs going
    are killed and ``StudyStopped`` is raised (that first record is kept).
    When runs fail before any succeeded, no new run is started."""
    free_slots = list(range(jobs))
    stopping, succeeded = threading.Event(), threading.Event()
    cancelled = threading.Event()  # the runs going now are being killed: drop what they return
    records: list[RunRecord] = []
    noted_reseed = False

    def start(run: PlannedRun) -> RunRecord | None:
        if stopping.is_set():
            return None
        slot = free_slots.pop()
        progress.started(run.run_id)
        try:
            record = _run_once(study, run, slot % gpus if gpus > 1 else None, timeout, stopping)
        finally:
            free_slots.append(slot)
        if cancelled.is_set() and not record.ok:
            return None
        if record.ok:
            succeeded.set()
        elif not succeeded.is_set():
            # failing before any run succeeded: the script is broken, not flaky,
            # so start nothing new (decided here, before this worker takes the next run)
            stopping.set()
        return record

    def stop_everything() -> None:
        from detaudit.launch.process import terminate_all

        stopping.set()
        cancelled.set()
        terminate_all()

    with progress, ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(start, run) for run in runs]
        try:
            for future in as_completed(futures):
                record = future.result()
                if record is None:  # not started, or killed: the study is stopping
                    continue
                study.append(record, shard)
                records.append(record)
                progress.finished(record.run_id, _outcome(record), ok=record.ok)
                problem = first_run_problem(record, wanted_metrics) if len(records) == 1 else None
                if problem:
                    stop_everything()
                    raise StudyStopped(f"stopped after the first run ({record.run_id}): {problem}", record)
                note = None if noted_reseed else reseeded_note(record)
                if note:
                    noted_reseed = True
                    progress.note(f"[yellow]{note}[/]")
        except StudyStopped:
            raise
        except BaseException:  # Ctrl-C: start nothing new, stop what runs; finished runs are already saved
            stop_everything()
            raise
        if stopping.is_set() and len(records) < len(runs):
            progress.note(f"[red]stopped after {len(records)} run(s): no run succeeded[/]")
    return records
