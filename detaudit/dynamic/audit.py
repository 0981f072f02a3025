"""``detaudit.audit(step)``: the dynamic pass in-process, for tests and notebooks.

``step`` is a zero-argument callable that builds what it needs, runs one or
more training steps and returns what to compare (a model, an optimizer,
tensors, or a dict/list/tuple of them).  It is run ``repeats`` times, seeded
identically and traced, in this process: causes that need a fresh process
(hash order, allocator or autotuning state) are ``detaudit run``'s job.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable

from detaudit.dynamic.report import RunReport


def _run_traced(step: Callable[[], Any], seed: int | None, deterministic: bool, capture_ops=(), setup=None):
    from detaudit.dynamic.bootstrap import seed_all
    from detaudit.dynamic.compare import Trace
    from detaudit.dynamic.state import cpu_copy, returned_state
    from detaudit.dynamic.tracer import OpTracer
    from detaudit.dynamic.watch import StopRun, TrainingWatcher

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
    tracer = OpTracer(capture_ops=capture_ops)
    tracer.attach(watcher)
    value = None
    try:
        with switches, tracer:
            value = step()
    except StopRun:  # a capture run stops once it has what it needs
        pass
    finally:
        watcher.close()
    return Trace(**tracer.trace_data()), cpu_copy(returned_state(value)), tracer.captured


def audit(
    step: Callable[[], Any],
    *,
    repeats: int = 3,
    seed: int | None = 0,
    deterministic: bool = False,
    setup: Callable[[], Any] | None = None,
) -> RunReport:
    """Run ``step`` ``repeats`` times under the same seed and report whether
    (and where) the runs differ.  ``seed=None`` leaves seeding to ``step``.
    ``setup`` runs before each repeat, untraced: it can put back state that
    ``step`` changes but did not create (a model built once, outside it)."""
    from detaudit.dynamic.analysis import build_report

    if repeats < 2:
        raise ValueError("repeats must be at least 2 (one run has nothing to compare with)")
    traces, states = [], []
    for _ in range(repeats):
        trace, state, _ = _run_traced(step, seed, deterministic, setup=setup)
        traces.append(trace)
        states.append(state)

    def capture(other: int, records: list[int]) -> tuple[dict, dict]:
        # in one process every repeat runs under the same conditions: rerun twice
        return tuple(_run_traced(step, seed, deterministic, records, setup)[2] for _ in range(2))

    return build_report(
        getattr(step, "__qualname__", repr(step)),
        traces,
        states,
        steps=0,
        environment=_environment(),
        capture=capture,
    )


def _environment() -> dict:
    from detaudit.runtime.environment import fingerprint

    return fingerprint()
