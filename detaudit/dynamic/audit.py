"""``detaudit.audit(step)``: the dynamic pass in-process, for tests and notebooks.

``step`` is a zero-argument callable that builds what it needs, runs one or
more training steps and returns what to compare (a model, an optimizer,
tensors, or a dict/list/tuple of them).  It is run ``repeats`` times, seeded
identically and traced, in this process: causes that need a fresh process
(hash order, autotuning state) are ``detaudit run``'s job.

``save_reference=DIR`` also keeps run 1 as a reference folder
(``dynamic/reference/folder.py``); ``reference=DIR`` compares ``repeats``
runs of the step with the reference in DIR instead of with each other
(verdict identical, within-tolerance or drift, as ``detaudit run --against``).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable

from detaudit.dynamic.verdict.run_report import RECORDER_KEY, RunReport


def _run_traced(
    step: Callable[[], Any], seed: int | None, deterministic: bool, fill: int, capture_ops=(), setup=None, sampled_ops=(),
    keep=None,
):
    """One traced run of ``step``: its trace, final state, captured tensors,
    recorder, what it kept as it ran (``keep``: None; "first-steps", as
    run 1 of ``detaudit run`` keeps them; or a reference trace.json to compare
    with as it runs, keeping where it departs), and what it compiled
    (``OpTracer.compile_payload``: its compiled regions run compiled, as
    under ``detaudit run``, where this torch lets them be traced)."""
    from detaudit.dynamic.compare.classify import Trace
    from detaudit.dynamic.record.compiled_graphs import unavailable_reason
    from detaudit.dynamic.record.final_state import cpu_copy, returned_state
    from detaudit.dynamic.record.tracer import OpTracer
    from detaudit.launch.child_settings import seed_all
    from detaudit.launch.watcher import StopRun, TrainingWatcher

    if setup is not None:
        setup()
    if deterministic:
        from detaudit.runtime.determinism import deterministic as deterministic_block

        switches = deterministic_block()
    else:
        switches = nullcontext()
    if seed is not None:
        seed_all(seed)
    watcher = TrainingWatcher()
    watcher.training_started = True  # the function audited is a training step: nothing of it is setup
    tracer = OpTracer(
        capture_ops=capture_ops, sampled_ops=sampled_ops, allocation_fill=fill, trace_compiled=unavailable_reason() is None
    )
    tracer.attach(watcher)
    kept = None
    if keep is not None:
        from detaudit.dynamic.record.online_capture import OnlineCapture
        from detaudit.dynamic.reference.folder import FIRST_STEPS_BYTES

        if keep == "first-steps":  # a reference's, committed: as little as detaudit run --save-reference keeps
            kept = tracer.observer = OnlineCapture(tracer, None, FIRST_STEPS_BYTES)
        else:
            kept = tracer.observer = OnlineCapture(tracer, keep)
    value = None
    try:
        with switches, tracer:
            value = step()
    except StopRun:  # a capture run stops once it has what it needs
        pass
    finally:
        watcher.close()
    state = returned_state(value)
    tracer.note_final_state(state)
    return Trace(**tracer.trace_data()), cpu_copy(state), tracer.captured, tracer.recorder, kept, tracer.compile_payload()


def audit(
    step: Callable[[], Any],
    *,
    repeats: int | None = None,
    seed: int | None = 0,
    deterministic: bool = False,
    setup: Callable[[], Any] | None = None,
    strict: bool = False,
    save_reference: str | None = None,
    reference: str | None = None,
    tolerance: str | None = None,
) -> RunReport:
    """Run ``step`` ``repeats`` times (default 3; against a reference, 1) under
    the same seed and report whether (and where) the runs differ.  ``seed=None`` leaves seeding to ``step``.
    ``setup`` runs before each repeat, untraced: it can put back state that
    ``step`` changes but did not create (a model built once, outside it).
    ``strict``: a latent difference fails the report too (``report.passed``).
    ``save_reference`` / ``reference`` / ``tolerance`` (``"4ulp"``, ``"1e-6"``,
    with ``reference``): see the module docstring."""
    from detaudit.dynamic.compare.state_diff import SavedState
    from detaudit.dynamic.verdict.build import build_report

    if reference is not None:
        runs = 1 if repeats is None else repeats
        return _audit_against(step, reference, runs=runs, seed=seed, deterministic=deterministic, setup=setup,
                              strict=strict, tolerance=tolerance)
    if tolerance is not None:
        raise ValueError("tolerance goes with reference=")
    repeats = 3 if repeats is None else repeats
    if repeats < 2:
        raise ValueError("repeats must be at least 2 (one run has nothing to compare with)")
    if save_reference is not None:
        from detaudit.dynamic.reference.folder import check_writable

        check_writable(save_reference)
    traces, states = [], []
    for repeat in range(repeats):
        # each repeat fills torch.empty's memory with its own number (OpTracer.allocation_fill)
        keep = "first-steps" if repeat == 0 and save_reference is not None else None
        trace, state, _, recorder, kept, compiled = _run_traced(step, seed, deterministic, repeat + 1, setup=setup, keep=keep)
        if repeat == 0:  # the report's compiled section: graph breaks are counted in the run that compiles
            first_compiled = compiled
        traces.append(trace)
        states.append(SavedState.of_tensors(state))
        if kept is not None:
            _save_reference(save_reference, step, trace, state, kept, recorder, seed=seed, deterministic=deterministic)

    def capture(other: int, records: list[int], sampled: list[int]) -> tuple[dict, dict]:
        # in one process every repeat runs under the same conditions but its fill
        return tuple(_run_traced(step, seed, deterministic, repeat + 1, records, setup, sampled)[2] for repeat in (0, other))

    report = build_report(
        _name(step),
        traces,
        states,
        steps=0,
        environment={**_environment(), RECORDER_KEY: recorder},
        capture=capture,
    )
    report.strict = strict
    _add_compiled(report, first_compiled)
    return report


def _add_compiled(report: RunReport, compiled: dict) -> None:
    """The report's compiled section and warnings, from the first run's ``compile_payload``."""
    from detaudit.dynamic.verdict.compiled import compiled_section, compiled_warnings

    report.compiled = compiled_section(compiled)
    report.warnings.extend(compiled_warnings(compiled, eager=False))


def _name(step) -> str:
    return getattr(step, "__qualname__", repr(step))


def _save_reference(folder: str, step, trace, state: dict, kept, recorder: str, *, seed, deterministic: bool) -> None:
    """Keep one in-process run as a reference folder, as ``detaudit run --save-reference`` keeps run 1."""
    import tempfile
    from pathlib import Path

    from detaudit.dynamic.record.final_state import save_state
    from detaudit.dynamic.reference import folder as reference_folder

    with tempfile.TemporaryDirectory(prefix="detaudit-reference-") as workdir:
        trace.save(Path(workdir) / "trace.json")
        payload = {
            "trace_file": str(Path(workdir) / "trace.json"), **kept.save(Path(workdir)),
            **save_state(state, Path(workdir) / "state.pt"), "environment": _environment(), "recorder": recorder,
            "steps": 0,
        }
        reference_folder.save(folder, payload, script=_name(step), script_args=(), steps=0, seed=seed,
                              deterministic=deterministic)


def _audit_against(step, folder: str, *, runs: int, seed, deterministic: bool, setup, strict: bool, tolerance) -> RunReport:
    """``runs`` traced runs of ``step`` in this process, each compared with the
    reference in ``folder`` as run 1 (``runner._audit_against`` in-process)."""
    import tempfile

    import torch

    from detaudit.dynamic.compare.classify import Trace
    from detaudit.dynamic.compare.state_diff import SavedState
    from detaudit.dynamic.record.online_capture import select_kept
    from detaudit.dynamic.reference import folder as reference_folder
    from detaudit.dynamic.reference.explain import against_notes
    from detaudit.dynamic.reference.precision import explain_precision
    from detaudit.dynamic.verdict.build import build_report
    from detaudit.dynamic.verdict.tolerance import Tolerance

    if runs < 1:
        raise ValueError("repeats must be at least 1 against a reference")
    limit = Tolerance.parse(tolerance) if tolerance is not None else None
    with tempfile.TemporaryDirectory(prefix="detaudit-against-") as workdir:
        saved = reference_folder.load(folder, workdir)
        traces, states, kept = [Trace.load(saved.trace_file)], [SavedState.of_file(saved.state_file, saved.state_digests)], [None]
        for run in range(1, runs + 1):
            trace, state, _, recorder, online, compiled = _run_traced(
                step, seed, deterministic, run + 1, setup=setup, keep=saved.trace_file
            )
            if run == 1:
                first_compiled = compiled
            traces.append(trace)
            states.append(SavedState.of_tensors(state))
            kept.append({"full": online.full, "sampled": online.sampled})
        reference_kept = torch.load(saved.first_steps_file, weights_only=True) if saved.first_steps_file else None

        def capture(other: int, records: list[int], sampled: list[int]) -> tuple[dict, dict]:
            # what both kept (the reference cannot be rerun): runner._audit_against's rule
            return (select_kept(reference_kept, records, sampled) if reference_kept else {}), select_kept(
                kept[other], records, sampled
            )

        environment = _environment()
        report = build_report(
            _name(step), traces, states, steps=0, environment={**environment, RECORDER_KEY: recorder}, capture=capture,
            run_environments=[saved.environment] + [environment] * runs, across_environments=True,
        )
        explain_precision(
            report, traces[0], traces[1], reference_kept,
            lambda records: _run_traced(step, seed, deterministic, 2, records, setup)[2],
        )
    report.reference, report.tolerance, report.strict = saved.summary(), limit, strict
    report.notes += against_notes(saved, (), report)
    _add_compiled(report, first_compiled)
    return report


def _environment() -> dict:
    from detaudit.runtime.environment import fingerprint

    return fingerprint()
