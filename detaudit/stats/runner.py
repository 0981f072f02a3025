"""Runs the planned runs of a study in parallel, with a progress display.

Every run is one fresh subprocess started by the dynamic pass's launcher
(``detaudit.dynamic.launch``); this module only decides what each run gets
(seed, GPU, its own folder), collects what it logged and saves a record the
moment it ends, so an interrupted study loses nothing that finished.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from detaudit.stats.metrics import STATS_DIR_ENV, STDOUT_PREFIX, read_run_outputs
from detaudit.stats.study import ARMS, FIXED, PlannedRun, RunRecord, Study

OUTPUT_TAIL_LINES = 30


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


def launch(script: str, script_args, folder: Path, options, timeout: float | None, cancel: threading.Event | None = None):
    """One run of the user's script with its own folder for what it logs:
    ``options`` is a ``LaunchOptions``; returns (ScriptResult, RunOutputs)."""
    from detaudit.dynamic.launch import run_script

    shutil.rmtree(folder, ignore_errors=True)  # leftovers of an interrupted attempt
    folder.mkdir(parents=True)
    options.extra_env = {**options.extra_env, STATS_DIR_ENV: str(folder.resolve())}
    options.output_dir = folder / "launch"
    result = run_script(script, script_args, options=options, timeout=timeout, cancel=cancel, keep_lines_with=STDOUT_PREFIX)
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
        outputs.problems.append("the script logged no metric (detaudit.log_metric or a 'detaudit-metric:' line)")
        return "failed"
    return "ok"


def _run_once(study: Study, run: PlannedRun, gpu: int | None, timeout: float | None, cancel: threading.Event) -> RunRecord:
    from detaudit.dynamic.launch import LaunchOptions

    settings = study.settings
    options = LaunchOptions(
        seed=run.seed,
        max_steps=settings.max_steps,
        threads=settings.threads,
        hash_seed=str(run.seed),  # part of "the seed": fixed in the fixed arm, varied in the other
        deterministic=settings.deterministic,
        extra_env={} if gpu is None else {"CUDA_VISIBLE_DEVICES": str(gpu)},
        record_environment=True,
    )
    started = time.monotonic()
    result, outputs = launch(settings.script, settings.script_args, study.run_folder(run), options, timeout, cancel)
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
    )


def execute(
    study: Study,
    runs: list[PlannedRun],
    *,
    jobs: int,
    gpus: int = 0,
    timeout: float | None = None,
    shard: tuple[int, int] | None = None,
    console=None,
) -> list[RunRecord]:
    """Runs ``runs`` with up to ``jobs`` at a time (each on its own GPU when
    there are several) and appends each record to the study as it ends."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    free_slots = list(range(jobs))
    stopping, succeeded = threading.Event(), threading.Event()
    records: list[RunRecord] = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, disable=console is None) as progress:
        tasks = {
            arm: progress.add_task(
                "fixed seed" if arm == FIXED else "varied seeds", total=sum(r.arm == arm for r in runs)
            )
            for arm in ARMS
        }

        def start(run: PlannedRun) -> RunRecord | None:
            if stopping.is_set():
                return None
            slot = free_slots.pop()
            try:
                record = _run_once(study, run, slot % gpus if gpus > 1 else None, timeout, stopping)
            finally:
                free_slots.append(slot)
            if record.ok:
                succeeded.set()
            elif not succeeded.is_set():
                # failing before any run succeeded: the script is broken, not flaky,
                # so start nothing new (decided here, before this worker takes the next run)
                stopping.set()
            return record

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(start, run) for run in runs]
            try:
                for future in as_completed(futures):
                    record = future.result()
                    if record is None:  # not started: the study is stopping
                        continue
                    study.append(record, shard)
                    records.append(record)
                    progress.advance(tasks[record.arm])
                    if not record.ok:
                        progress.console.print(f"[red]run {record.run_id} (seed {record.seed}) {record.status}[/]")
            except BaseException:  # Ctrl-C: start nothing new, stop what runs; finished runs are already saved
                stopping.set()
                from detaudit.dynamic.launch import terminate_all

                terminate_all()
                raise
        if stopping.is_set() and len(records) < len(runs):
            progress.console.print(f"[red]stopped after {len(records)} run(s): no run succeeded[/]")
    return records
