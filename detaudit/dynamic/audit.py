"""``detaudit.audit(step)``: the dynamic pass in-process, for tests and notebooks.

``step`` is a zero-argument callable that builds what it needs, runs one or
more training steps and returns what to compare (a model, an optimizer,
tensors, or a dict/list/tuple of them).  It is run ``repeats`` times, seeded
identically and traced, in this process: causes that need a fresh process
(hash order, autotuning state) are ``detaudit run``'s job.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable

from detaudit.dynamic.verdict.run_report import RECORDER_KEY, RunReport


def _run_traced(
    step: Callable[[], Any], seed: int | None, deterministic: bool, fill: int, capture_ops=(), setup=None, sampled_ops=()
):
    from detaudit.dynamic.compare.classify import Trace
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
    tracer = OpTracer(capture_ops=capture_ops, sampled_ops=sampled_ops, allocation_fill=fill)
    tracer.attach(watcher)
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
    return Trace(**tracer.trace_data()), cpu_copy(state), tracer.captured, tracer.recorder


def audit(
    step: Callable[[], Any],
    *,
    repeats: int = 3,
    seed: int | None = 0,
    deterministic: bool = False,
    setup: Callable[[], Any] | None = None,
    strict: bool = False,
) -> RunReport:
    """Run ``step`` ``repeats`` times under the same seed and report whether
    (and where) the runs differ.  ``seed=None`` leaves seeding to ``step``.
    ``setup`` runs before each repeat, untraced: it can put back state that
    ``step`` changes but did not create (a model built once, outside it).
    ``strict``: a latent difference fails the report too (``report.passed``)."""
    from detaudit.dynamic.compare.state_diff import SavedState
    from detaudit.dynamic.verdict.build import build_report

    if repeats < 2:
        raise ValueError("repeats must be at least 2 (one run has nothing to compare with)")
    traces, states = [], []
    for repeat in range(repeats):
        # each repeat fills torch.empty's memory with its own number (OpTracer.allocation_fill)
        trace, state, _, recorder = _run_traced(step, seed, deterministic, repeat + 1, setup=setup)
        traces.append(trace)
        states.append(SavedState.of_tensors(state))

    def capture(other: int, records: list[int], sampled: list[int]) -> tuple[dict, dict]:
        # in one process every repeat runs under the same conditions but its fill
        return tuple(_run_traced(step, seed, deterministic, repeat + 1, records, setup, sampled)[2] for repeat in (0, other))

    report = build_report(
        getattr(step, "__qualname__", repr(step)),
        traces,
        states,
        steps=0,
        environment={**_environment(), RECORDER_KEY: recorder},
        capture=capture,
    )
    report.strict = strict
    return report


def _environment() -> dict:
    from detaudit.runtime.environment import fingerprint

    return fingerprint()
