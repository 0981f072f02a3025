"""``detaudit run``'s engine: run a script R times traced, compare, report.

Each repeat is a fresh subprocess (``launch.run_script``) with the same seed,
stopped after N optimizer steps, writing its op trace and final state.  When
root causes are found, the deviation of each is measured from the causing
op's tensors in both runs of the pair that showed it.  When the repeats run
one at a time, run 1 keeps the tensors of its first two steps' ops and every
later repeat compares itself with run 1's trace as it runs and keeps the
tensors of the ops that differ (``record/online_capture.py``): where the runs part
ways in those steps, nothing is rerun.  Otherwise (with ``jobs`` > 1, or
for whatever a run did not keep) each run of the pair that lacks tensors is
rerun with a targeted capture.  Each run is reported to ``progress`` (``detaudit.report.progress``)
as it starts and ends; the capture reruns are added to its total when they
are known to be needed.  A run that fails (or writes no results) stops the
audit with ``ScriptFailed``, naming the run, how it ended and the tail of its
output.

With ``jobs`` > 1 the repeats (and a pair's two capture reruns) run up to
``jobs`` at a time; the report is the same as one at a time (results are
taken in repeat order).  Repeats never share a GPU: where one may be visible,
the first repeat runs alone and says, in the environment it records, whether
torch saw CUDA; if it did, the rest run one at a time too, comparing
themselves with it as they run.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from detaudit.dynamic.faults.feature import InjectFault
from detaudit.dynamic.faults.spec import fault_for_repeat
from detaudit.dynamic.record.features import ReplicaDigests, SaveFinalState, Tracing
from detaudit.dynamic.variations import VARIATIONS
from detaudit.dynamic.verdict.compiled import compiled_section, compiled_warnings, graph_cause, settle_graph_cause
from detaudit.dynamic.verdict.run_report import RECORDER_KEY, RunFailure, rank_list
from detaudit.launch.features import RecordEnvironment
from detaudit.launch.options import LaunchOptions
from detaudit.launch.process import ScriptResult, run_script, terminate_all
from detaudit.report.progress import NoProgress


class ScriptFailed(Exception):
    """A run of the user's script crashed, was killed, timed out or wrote no results."""

    def __init__(self, failure: RunFailure):
        self.failure = failure
        super().__init__(f"{failure.message}\n{failure.output_tail}".rstrip())


def audit_script(
    script: str,
    script_args: Sequence[str] = (),
    *,
    steps: int = 2,
    repeats: int = 3,
    seed: int | None = 0,
    vary: str | None = None,
    deterministic: bool = False,
    strict: bool = False,
    timeout: float | None = None,
    cwd: str | None = None,
    progress=None,  # a detaudit.report.progress.RunProgress (started/finished/add), None for silence
    vary_options: dict | None = None,
    remedy_options: Mapping[str, Any] | None = None,
    measure: bool = True,
    jobs: int = 1,
    save_reference: str | None = None,
    against: str | None = None,
    tolerance=None,  # a verdict.tolerance.Tolerance, with ``against``
    repro: str | None = None,
    eager: bool = False,
):
    """Run ``script`` ``repeats`` times and report; ``strict``: a latent
    difference fails the gate too (see ``verdict/run_report.py``).  ``remedy_options``:
    child settings every run gets (``detaudit.launch.child_settings``), made
    after the variation's setting (the remedies ``--remedy`` tries).  ``measure=False`` skips the capture
    reruns that measure each cause's deviation.  ``jobs``: runs at a time
    (see the module docstring).  ``save_reference``: a folder to keep run 1
    in as a reference (``dynamic/reference/folder.py``).  ``against``: a
    reference folder; the ``repeats`` runs are each compared with it
    (``audit_against``).  ``eager``: ``torch.compile``'d regions run eagerly, op
    by op, instead of compiled, one record per graph call (``record/compiled_graphs.py``)."""
    from detaudit.dynamic.compare.classify import Trace
    from detaudit.dynamic.compare.state_diff import SavedState
    from detaudit.dynamic.record import native
    from detaudit.dynamic.verdict.build import build_report, op_hint

    # here, once: no run's time limit pays for building the compiled recorder
    native.ensure_built(announce=lambda text: print(f"detaudit: {text}", file=sys.stderr, flush=True))

    if against is not None:
        return _audit_against(
            script, script_args, against, runs=repeats, tolerance=tolerance, steps=steps, seed=seed,
            deterministic=deterministic, strict=strict, timeout=timeout, cwd=cwd, progress=progress, jobs=jobs,
            repro=repro, eager=eager,
        )
    variation = VARIATIONS[vary] if vary else None
    if variation is not None and not variation.repeats_script:  # an audit of its own (batch)
        return variation.audit_function()(
            script, script_args, seed=seed, deterministic=deterministic, timeout=timeout, cwd=cwd,
            progress=progress, **(vary_options or {}),
        )
    settings = variation.settings(repeats) if variation else []
    base = LaunchOptions(
        seed=seed, max_steps=steps, settings={"deterministic": True} if deterministic else {},
        features=(SaveFinalState(),),
    )

    def options_for(repeat: int, output_dir: Path, *features) -> LaunchOptions:
        """Repeat ``repeat``'s options: its variation setting, the remedy's settings after it, its fault."""
        options = base.with_settings({variation.setting: settings[repeat]} if variation else {})
        fault = fault_for_repeat(repeat)
        options = options.with_settings(remedy_options or {}).with_features(
            Tracing(allocation_fill=repeat + 1, compiled_graphs=not eager), *((InjectFault(fault),) if fault else ()),
            *features
        )
        return replace(options, output_dir=output_dir)

    warnings: list[str] = []
    progress = progress or NoProgress()

    def launch(repeat: int, options: LaunchOptions) -> ScriptResult:
        return _launch(script, script_args, options, _label(repeat, options), _which(repeat, options), progress=progress,
                       timeout=timeout, cwd=cwd, repeats=repeats, steps=steps)

    def launch_all(runs: list[tuple[int, LaunchOptions]], at_a_time: int) -> list[ScriptResult]:
        """The runs' results in the order given; their warnings in that order too."""
        results = _run_concurrently(launch, runs, at_a_time)
        for (repeat, options), result in zip(runs, results):
            warnings.extend(f"{_which(repeat, options)} {warning}" for warning in result.warnings)
        return results

    with tempfile.TemporaryDirectory(prefix="detaudit-run-") as workdir:
        runs = [
            (repeat, options_for(repeat, Path(workdir) / f"run{repeat}", RecordEnvironment()))
            for repeat in range(repeats)
        ]
        if measure or save_reference:  # run 1 keeps its first steps, in case a run compared with it differs there
            from detaudit.dynamic.reference.folder import FIRST_STEPS_BYTES

            # (what a reference keeps of them is committed: less)
            budget = FIRST_STEPS_BYTES if save_reference else None
            runs[0] = (0, runs[0][1].changing(Tracing, keep_first_steps=True, first_steps_bytes=budget))
        if jobs == 1 or _gpu_may_be_visible():
            results = launch_all(runs[:1], 1)
            if jobs > 1 and results[0].payload.get("environment", {}).get("torch.cuda.is_available"):
                jobs = 1
                warnings.append("--jobs: the runs went one at a time, as CUDA is visible (repeats never share a GPU)")
            if jobs == 1 and measure:  # run 1 has ended: the others compare with it as they run
                reference = results[0].payload["trace_file"]
                runs[1:] = [(repeat, options.changing(Tracing, compare_with=reference)) for repeat, options in runs[1:]]
            results += launch_all(runs[1:], jobs)
        else:
            results = launch_all(runs, jobs)
        if save_reference:
            from detaudit.dynamic.reference import folder

            manifest = folder.save(
                save_reference, results[0].payload, script=script, script_args=script_args, steps=steps, seed=seed,
                deterministic=deterministic,
            )
        traces = [Trace.load(result.payload["trace_file"]) for result in results]
        states = [SavedState.of_file(result.payload["state_file"], result.payload["state_digests"]) for result in results]

        def capture(other: int, records: list[int], sampled: list[int]) -> tuple[dict, dict]:
            """Each run's tensors from what it kept as it ran when that is all
            there, else from a rerun of it."""
            import torch

            from detaudit.dynamic.record.online_capture import select

            kept = {}
            for repeat in (0, other):
                path = results[repeat].payload.get("online_capture_file")
                kept[repeat] = select(torch.load(path, weights_only=True), records, sampled) if path else None
            rerun = [repeat for repeat in (0, other) if kept[repeat] is None]
            progress.add(len(rerun))
            reruns = [
                (repeat, options_for(repeat, Path(workdir) / f"capture{repeat}").changing(
                    Tracing, capture_ops=tuple(records), sampled_ops=tuple(sampled)
                ))
                for repeat in rerun
            ]
            for repeat, result in zip(rerun, launch_all(reruns, jobs)):
                path = result.payload.get("capture_file")
                kept[repeat] = torch.load(path, weights_only=True) if path else {}
            return kept[0], kept[other]

        report = build_report(
            script,
            traces,
            states,
            steps=steps,
            environment=_environment(results[0].payload),
            capture=capture if measure else None,
            variation=variation,
            run_environments=[result.payload.get("environment", {}) for result in results],
        )
        cause = graph_cause(report)
        if cause is not None:  # inside the graph: which node departs between two compiled replays
            progress.add(1)
            options = options_for(0, Path(workdir) / "bisect").changing(
                Tracing, capture_ops=(cause.record,), bisect_graphs="replay"
            )
            cause.inside_graph = _inside_graphs(launch_all([(0, options)], 1)[0]).get(cause.record)
            settle_graph_cause(cause)
            if cause.inside_graph and cause.inside_graph.get("reproduced"):
                cause.hint = op_hint(cause.inside_graph["op"])  # the kernel's own fix, where the ops table has one
        if repro:

            def call_of(record: int) -> dict:
                """Run 1's capture of ``record`` with its call, from a rerun of it."""
                import torch

                progress.add(1)
                options = options_for(0, Path(workdir) / "repro").changing(Tracing, capture_ops=(record,), call_of=record)
                return torch.load(launch_all([(0, options)], 1)[0].payload["capture_file"], weights_only=True)[record]

            warnings.extend(_write_repro(repro, report, call_of))
    report.steps_run = [result.payload["steps"] for result in results]
    report.strict = strict
    if not any(report.steps_run):
        warnings.insert(0, _no_step_warning(len(traces[0].ops), len(states[0])))
    if variation:
        warnings.extend(_variation_warnings(report.variation, results, cwd))
    warnings.extend(compiled_warnings(results[0].payload, eager=eager))
    report.compiled = compiled_section(results[0].payload)
    report.warnings = warnings
    if save_reference:
        report.notes.append(_saved_note(save_reference, manifest))
    return report


def _write_repro(folder: str, report, call_of) -> list[str]:
    """Write the repro of the report's first root cause that its op's kernel
    explains into ``folder`` (``call_of(record)``: its capture with the call);
    a note says where, a warning why none was written."""
    from detaudit.dynamic.repro import repro_cause, write_repro

    cause = repro_cause(report.root_causes)
    if cause is None:
        return ["--repro: no root cause that rerunning one op shows (a nondeterministic op or a drift): no repro written"]
    captured = call_of(cause.record)
    try:
        script = write_repro(folder, cause, captured)
    except ValueError as error:
        return [f"--repro: {error}: no repro written"]
    report.notes.append(f"a repro of {cause.op} at {cause.path}:{cause.line} is in {folder}: python {script}")
    return []


def _saved_note(folder: str, manifest: dict) -> str:
    files = ", ".join(f"{name} {_size(size)}" for name, size in manifest["files"].items())
    return f"run 1 saved as a reference in {folder} ({_size(manifest['size_bytes'])}: {files}); compare with --against {folder}"


def _size(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 1e5 else f"{size / 1e3:.1f} kB"


def _audit_against(
    script: str,
    script_args: Sequence[str],
    reference_folder: str,
    *,
    runs: int,
    tolerance,
    steps: int,
    seed: int | None,
    deterministic: bool,
    strict: bool,
    timeout: float | None,
    cwd: str | None,
    progress,
    jobs: int,
    repro: str | None = None,
    eager: bool = False,
):
    """``runs`` traced runs of ``script``, each compared with the reference
    in ``reference_folder`` as run 1 (``build_report(across_environments=True)``):
    an op whose inputs matched the reference's bitwise and whose outputs did
    not is a drift root.  Each run keeps, as it runs, the tensors of the
    records where it departs from the reference; the reference's come from
    the first steps it kept.  Nothing is rerun (the reference cannot be): a
    drift root past what both kept is located, not measured, and the audit
    costs one traced run per run plus the comparison."""
    import torch

    from detaudit.dynamic.compare.classify import Trace
    from detaudit.dynamic.compare.state_diff import SavedState
    from detaudit.dynamic.record import native
    from detaudit.dynamic.record.online_capture import select_kept
    from detaudit.dynamic.reference import folder
    from detaudit.dynamic.reference.eager import eager_checked_calls, explain_compiled_against_eager, ran_eagerly
    from detaudit.dynamic.reference.explain import against_notes
    from detaudit.dynamic.reference.precision import explain_precision
    from detaudit.dynamic.verdict.build import build_report

    native.ensure_built(announce=lambda text: print(f"detaudit: {text}", file=sys.stderr, flush=True))
    progress = progress or NoProgress()
    warnings: list[str] = []
    with tempfile.TemporaryDirectory(prefix="detaudit-run-") as workdir:
        reference = folder.load(reference_folder, Path(workdir) / "reference")

        def options_for(run: int, output_dir: Path) -> LaunchOptions:
            """Run ``run``'s options (from 1: the reference is run 0), its allocations filled unlike the reference's."""
            fault = fault_for_repeat(run)
            return LaunchOptions(
                seed=seed, max_steps=steps, settings={"deterministic": True} if deterministic else {},
                features=(
                    SaveFinalState(), RecordEnvironment(), Tracing(allocation_fill=run + 1, compiled_graphs=not eager),
                    *((InjectFault(fault),) if fault else ()),
                ),
                output_dir=output_dir,
            )

        def launch(run: int, options: LaunchOptions) -> ScriptResult:
            # the reference is run 1 in the report: run 2 is the first run against it
            label = f"capture rerun of run {run + 1}" if _captures(options) else f"run {run + 1} (against the reference)"
            which = f"the {label}" if _captures(options) else label
            result = _launch(script, script_args, options, label, which, progress=progress, timeout=timeout, cwd=cwd,
                             repeats=runs, steps=steps)
            warnings.extend(f"{label} {warning}" for warning in result.warnings)
            return result

        at_a_time = 1 if _gpu_may_be_visible() else jobs
        planned = [
            (run, options_for(run, Path(workdir) / f"run{run}").changing(Tracing, compare_with=reference.trace_file))
            for run in range(1, runs + 1)
        ]
        results = [None, *_run_concurrently(launch, planned, at_a_time)]
        traces = [Trace.load(reference.trace_file)] + [Trace.load(r.payload["trace_file"]) for r in results[1:]]
        states = [SavedState.of_file(reference.state_file, reference.state_digests)] + [
            SavedState.of_file(r.payload["state_file"], r.payload["state_digests"]) for r in results[1:]
        ]
        reference_kept = torch.load(reference.first_steps_file, weights_only=True) if reference.first_steps_file else None

        def capture(other: int, records: list[int], sampled: list[int]) -> tuple[dict, dict]:
            """Each side's tensors from what it kept: a record either lacks is
            not measured (the reference cannot be rerun, so neither is this run)."""
            mine = select_kept(reference_kept, records, sampled) if reference_kept else {}
            path = results[other].payload["online_capture_file"]
            return mine, select_kept(torch.load(path, weights_only=True), records, sampled)

        report = build_report(
            script,
            traces,
            states,
            steps=steps,
            environment=_environment(results[1].payload),
            capture=capture,
            run_environments=[reference.environment] + [r.payload.get("environment", {}) for r in results[1:]],
            across_environments=True,
        )

        def capture_run(records: list[int]) -> dict:
            """Run 2's full captures of ``records`` (a capture rerun)."""
            progress.add(1)
            options = options_for(1, Path(workdir) / "precision").changing(Tracing, capture_ops=tuple(records))
            return torch.load(launch(1, options).payload["capture_file"], weights_only=True)

        explain_precision(report, traces[0], traces[1], reference_kept, capture_run)
        if ran_eagerly(traces[0], traces[1]) and report.root_causes:
            # an eager reference: the first graph whose compiled result departs from its ops run eagerly
            progress.add(1)
            options = options_for(1, Path(workdir) / "bisect").changing(
                Tracing, capture_ops=tuple(eager_checked_calls(traces[1])), bisect_graphs="eager"
            )
            explain_compiled_against_eager(report, traces[1], _inside_graphs(launch(1, options)))
        if repro:

            def call_of(record: int) -> dict:
                """This run's capture of ``record`` with its call (a rerun), and the reference's outputs there."""
                progress.add(1)
                options = options_for(1, Path(workdir) / "repro").changing(Tracing, capture_ops=(record,), call_of=record)
                captured = torch.load(launch(1, options).payload["capture_file"], weights_only=True)[record]
                kept = (reference_kept or {}).get("full", {}).get(record)
                return {**captured, "reference_outputs": kept["outputs"] if kept else None}

            warnings.extend(_write_repro(repro, report, call_of))
    report.reference = reference.summary()
    report.tolerance = tolerance
    report.strict = strict
    report.steps_run = [reference.manifest.get("steps_run") or 0] + [r.payload["steps"] for r in results[1:]]
    report.notes += against_notes(reference, script_args, report)
    warnings.extend(compiled_warnings(results[1].payload, eager=eager))
    report.compiled = compiled_section(results[1].payload)
    report.warnings = warnings
    return report


def _launch(script, script_args, options: LaunchOptions, label: str, which: str, *, progress, timeout, cwd, repeats: int,
            steps: int) -> ScriptResult:
    """One run of the script, reported to ``progress`` as ``label``; ``ScriptFailed`` naming it as ``which``."""
    progress.started(label)
    started = time.monotonic()
    result = run_script(script, script_args, options=options, timeout=timeout, cwd=cwd)
    ok = not result.failed and result.wrote_results
    progress.finished(label, _outcome(result, time.monotonic() - started, count_steps=not _captures(options)), ok=ok)
    if not ok:
        raise ScriptFailed(RunFailure.of(script, which, result, repeats=repeats, steps=steps))
    return result


def _environment(payload: dict) -> dict:
    """A run's fingerprint as the report shows it, with the recorder that traced it."""
    return {**payload.get("environment", {}), RECORDER_KEY: payload.get("recorder")}


def _captures(options: LaunchOptions) -> bool:
    """Whether the run is a capture rerun (it stops once it has its records' tensors)."""
    return bool(options.feature(Tracing).capture_ops)


def _label(repeat: int, options: LaunchOptions) -> str:
    return f"capture rerun of run {repeat + 1}" if _captures(options) else f"run {repeat + 1}"


def _which(repeat: int, options: LaunchOptions) -> str:
    """The run as a failure or a warning names it."""
    label = _label(repeat, options)
    return f"the {label}" if _captures(options) else label


def _run_concurrently(launch, runs: list[tuple], at_a_time: int) -> list:
    """``launch(*run)`` for each run, up to ``at_a_time`` at once, results in
    run order.  A failure (the first in run order) is raised once the runs
    going have ended, and starts no new one; Ctrl-C kills the runs going."""
    if at_a_time <= 1 or len(runs) <= 1:
        return [launch(*run) for run in runs]
    with ThreadPoolExecutor(max_workers=at_a_time) as pool:
        futures = [pool.submit(launch, *run) for run in runs]
        try:
            return [future.result() for future in futures]
        except BaseException as error:
            if not isinstance(error, ScriptFailed):
                terminate_all()  # Ctrl-C reaches only this thread: the runs going would go on to their end
            pool.shutdown(cancel_futures=True)
            raise


def _gpu_may_be_visible() -> bool:
    """Whether a GPU driver is present (NVIDIA, ROCm) or the platform may have
    one (macOS): asked without torch, so a yes only means "ask a run"."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return sys.platform == "darwin" or os.path.exists("/proc/driver/nvidia/gpus") or os.path.exists("/dev/kfd")


def _variation_warnings(variation: dict, results: list[ScriptResult], cwd: str | None) -> list[str]:
    """Say so when a run did not run with the setting it was asked for
    (the script set its own), naming where the script set it."""
    asked, ran = variation["settings"], variation.get("in_effect")
    if not ran or ran == asked:
        return []
    runs = ", ".join(
        f"run {index + 1} asked for {a}, ran with {r}" for index, (a, r) in enumerate(zip(asked, ran)) if a != r
    )
    message = f"--vary {variation['vary']} did not take in every run ({runs})"
    overrides = {
        (override["call"], _relative(override["path"], cwd), override["line"])
        for result in results
        for override in result.payload.get("overrides", [])
    }
    if overrides:
        where = "; ".join(f"{call} at {path}:{line}" for call, path, line in sorted(overrides))
        message += f": the script sets it itself ({where}), which overrides detaudit's setting"
    if len(set(map(str, ran))) == 1:
        message += f"; every run ran with {ran[0]}, so the runs compared no {variation['vary']} at all"
    return [message]


def _stopped_by_other_rank_notes(runs) -> list[str]:
    """Ranks that ended when another stopped at the step limit (bootstrap's
    ``_stopped_by_other_rank``): one note, for the runs they did so in."""
    stopped = {
        (rank, payload["stopped_by_rank"])
        for run in runs
        for rank, payload in enumerate(result.payload for result in run.ranks)
        if "stopped_by_rank" in payload
    }
    if not stopped:
        return []
    by = sorted({stopper for _, stopper in stopped})
    return [
        f"{rank_list(sorted({rank for rank, _ in stopped}))} ended when {rank_list(by)} stopped at the step limit "
        "(they make fewer optimizer steps, or none): detaudit's stop, not a failure; what they did up to there is compared."
    ]


def _inside_graphs(result: ScriptResult) -> dict[int, dict]:
    """A bisection rerun's findings: record -> what it found inside that graph call."""
    import torch

    path = result.payload.get("capture_file")
    captured = torch.load(path, weights_only=True) if path else {}
    return {record: kept["inside_graph"] for record, kept in captured.items() if kept.get("inside_graph")}


def _relative(path: str, cwd: str | None) -> str:
    base = os.path.abspath(cwd or os.getcwd())
    return os.path.relpath(path, base) if path.startswith(base + os.sep) else path


def _no_step_warning(ops: int, tensors: int) -> str:
    return (
        "no optimizer step ran (the script never called optimizer.step()): the runs were compared over "
        f"the whole script instead, {ops} traced ops and {tensors} final tensors (the modules it called"
        " and the last loss), not over training steps"
    )


def _outcome(result: ScriptResult, seconds: float, *, count_steps: bool) -> str:
    """What a finished run's progress line says: "ok in 2.1 s, 2 steps" (a
    capture rerun stops early: its steps are not the run's)."""
    if result.failed or not result.wrote_results:
        return "timed out" if result.timed_out else ("was killed" if result.signal_name else "failed")
    steps = result.payload.get("steps") if count_steps else None
    return f"ok in {seconds:.1f} s" + (f", {steps} step{'s' if steps != 1 else ''}" if steps is not None else "")


def audit_distributed(
    script: str,
    script_args: Sequence[str] = (),
    *,
    distributed,  # a torchrun.Distributed
    steps: int = 2,
    repeats: int = 3,
    seed: int | None = 0,
    deterministic: bool = False,
    strict: bool = False,
    timeout: float | None = None,
    cwd: str | None = None,
    progress=None,
):
    """``audit_script`` for a script run under torchrun: each repeat is one
    torchrun run, each rank analysed as a single process is, then merged and
    checked across ranks (``verdict/ranks.py``).  A run that fails names the
    rank that failed first (or hung) with its output.  No capture reruns:
    deviations are not measured."""
    from detaudit.dynamic.compare.classify import Trace
    from detaudit.dynamic.compare.state_diff import SavedState
    from detaudit.dynamic.verdict.build import build_report
    from detaudit.dynamic.verdict.ranks import merge_ranks
    from detaudit.launch.torchrun import run_distributed

    progress = progress or NoProgress()
    base = LaunchOptions(
        seed=seed, max_steps=steps, settings={"deterministic": True} if deterministic else {},
        features=(RecordEnvironment(), SaveFinalState(), ReplicaDigests()),
    )
    warnings: list[str] = []
    with tempfile.TemporaryDirectory(prefix="detaudit-run-") as workdir:
        runs = []
        for repeat in range(repeats):
            label = f"run {repeat + 1}"
            progress.started(label)
            started = time.monotonic()
            options = replace(base.with_features(Tracing(allocation_fill=repeat + 1)), output_dir=Path(workdir) / f"run{repeat}")
            run = run_distributed(
                script, script_args, options=options, distributed=distributed, timeout=timeout, cwd=cwd
            )
            progress.finished(label, _outcome(run.ranks[0], time.monotonic() - started, count_steps=True), ok=not run.failed)
            if run.failed:
                rank = run.blamed_rank()
                failure = RunFailure.of(script, f"rank {rank} of {label}", run.ranks[rank], repeats=repeats, steps=steps)
                if run.launcher.timed_out:  # where every rank was, then the hung rank's output
                    failure.ended = f"hung ({failure.ended})"
                    failure.output_tail = f"{run.describe_hang()}\n{failure.output_tail}".strip()
                raise ScriptFailed(failure)
            warnings.extend(f"{label} {warning}" for warning in run.launcher.warnings)
            runs.append(run)
        ranks = range(distributed.nproc_per_node)
        traces = [[Trace.load(run.ranks[rank].payload["trace_file"]) for run in runs] for rank in ranks]
        reports = [
            build_report(
                script,
                traces[rank],
                [
                    SavedState.of_file(run.ranks[rank].payload["state_file"], run.ranks[rank].payload["state_digests"])
                    for run in runs
                ],
                steps=steps,
                environment=_environment(runs[0].ranks[rank].payload),
                run_environments=[run.ranks[rank].payload.get("environment", {}) for run in runs],
            )
            for rank in ranks
        ]
    replicas = [[run.ranks[rank].payload.get("replica_digests", []) for run in runs] for rank in ranks]
    early_reads = [[run.ranks[rank].payload.get("early_reads", []) for run in runs] for rank in ranks]
    report = merge_ranks(reports, traces, replicas, early_reads)
    # what each parallelism's replica check compared: once, whichever rank and run said it
    report.notes += dict.fromkeys(
        note for run in runs for rank in ranks for note in run.ranks[rank].payload.get("replica_notes", [])
    )
    report.notes += _stopped_by_other_rank_notes(runs)
    report.steps_run = [run.ranks[0].payload["steps"] for run in runs]
    report.strict = strict
    report.warnings = warnings + compiled_warnings(runs[0].ranks[0].payload, eager=False)
    return report
