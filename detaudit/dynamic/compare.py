"""Align two op traces and name the root causes of their differences.

Records are aligned by position: both runs execute the same program, so until
the op names or output shapes stop matching (a control-flow divergence) record
``i`` of one run is record ``i`` of the other.  A record whose outputs differ is

* a root cause when none of its tensor inputs or plain arguments differ
  (an RNG op if the op consumes the generator, uninitialized memory if it read
  an allocation nothing wrote, else a nondeterministic kernel);
* a root cause when a differing input entered from outside torch (an external
  input, located where it entered) or came from uninitialized memory;
* a root cause when only a plain argument differs (a Python value: an index,
  a scalar, a flag computed in Python);
* *propagated* otherwise: it only differs because something upstream did.

An RNG cause also names the last call before it that left the generator in a
different state in the two runs (``torch.seed()``, ``torch.manual_seed(<time>)``),
when the tracer saw one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from detaudit.dynamic.causes import (
    CONTROL_FLOW,
    EXTERNAL_INPUT,
    NONDETERMINISTIC_OP,
    PYTHON_VALUE,
    RNG,
    UNINITIALIZED_MEMORY,
    CauseKind,
    ExtraOps,
    OtherRunOp,
    OtherSide,
    RngStateChange,
)
from detaudit.dynamic.trace_format import ALLOCATED, EXTERNAL, PRODUCED, UNINIT, OpRecord, Trace


class Site(NamedTuple):
    """What a cause is and where: the same site in several pairs is one cause."""

    kind: CauseKind
    op: str
    path: str
    line: int
    module: str
    phase: str


@dataclass
class CauseAt:
    """One root cause found in one pair of runs."""

    kind: CauseKind
    record: int  # where it is reported (the allocation for uninitialized memory)
    capture_record: int  # the record whose tensors show the deviation
    capture_side: str  # "outputs" or "inputs"
    capture_position: int | None = None  # which input; None = every output
    other_side: OtherSide | None = None  # control flow: what the other run did; RNG: where the state changed

    def site(self, trace: Trace) -> Site:
        record = trace.ops[self.record]
        return Site(self.kind, record.op, record.path, record.line, record.module, record.phase)


@dataclass
class PairComparison:
    causes: list[CauseAt]
    propagated: int  # records that differ only because of an upstream cause
    compared: int  # aligned records


def _differs(a: Trace, b: Trace, refs_a: list[int], refs_b: list[int]) -> list[int]:
    return [p for p, (x, y) in enumerate(zip(refs_a, refs_b)) if a.value(x) != b.value(y)]


def compare_traces(a: Trace, b: Trace) -> PairComparison:
    causes: list[CauseAt] = []
    propagated = 0
    differing_records: set[int] = set()
    aligned = min(len(a.ops), len(b.ops))
    for index in range(aligned):
        ra, rb = a.ops[index], b.ops[index]
        if ra.op != rb.op or ra.out_meta != rb.out_meta or len(ra.inputs) != len(rb.inputs):
            causes.append(_control_flow(index, ra, rb))
            return PairComparison(causes, propagated, index)
        inputs_differ = _differs(a, b, ra.inputs, rb.inputs)
        outputs_differ = bool(_differs(a, b, ra.outputs, rb.outputs))
        args_differ = ra.args != rb.args
        if not (inputs_differ or outputs_differ or args_differ):
            continue
        cause = _classify(a, b, ra, index, inputs_differ, outputs_differ, args_differ, differing_records)
        differing_records.add(index)
        if cause is None:
            propagated += 1
        else:
            causes.append(cause)
    if len(a.ops) != len(b.ops):
        longer = b if len(b.ops) > len(a.ops) else a
        extra = longer.ops[aligned]
        causes.append(
            CauseAt(
                CONTROL_FLOW,
                record=aligned - 1 if aligned else 0,
                capture_record=-1,
                capture_side="",
                other_side=ExtraOps(abs(len(a.ops) - len(b.ops)), extra.op, extra.path, extra.line),
            )
        )
    return PairComparison(causes, propagated, aligned)


def _control_flow(index: int, reference: OpRecord, other: OpRecord) -> CauseAt:
    return CauseAt(
        CONTROL_FLOW,
        record=index,
        capture_record=-1,
        capture_side="",
        other_side=OtherRunOp(reference.out_meta, other.op, other.out_meta, other.path, other.line),
    )


def _classify(
    trace: Trace,
    other: Trace,
    record: OpRecord,
    index: int,
    inputs_differ: list[int],
    outputs_differ: bool,
    args_differ: bool,
    differing_records: set[int],
) -> CauseAt | None:
    """The root cause record ``index`` is, or None when it only propagates a difference."""
    leaves = {position: (source, origin) for position, source, origin in record.leaves}
    for position in inputs_differ:
        source, origin = leaves.get(position, (PRODUCED, None))
        if source == ALLOCATED:
            return CauseAt(UNINITIALIZED_MEMORY, origin, index, "inputs", position)
        if source == EXTERNAL and (origin == index or origin not in differing_records):
            return CauseAt(EXTERNAL_INPUT, index, index, "inputs", position)
    if inputs_differ:
        return None
    if args_differ:  # a value computed in Python (hash(), set order, time) entered as an argument
        return CauseAt(PYTHON_VALUE, index, index, "outputs")
    if not outputs_differ:
        return None
    if record.seeded:
        return CauseAt(RNG, index, index, "outputs", other_side=_rng_state_change(trace, other, index))
    for position, ref in enumerate(record.inputs):
        source, origin = leaves.get(position, (PRODUCED, None))
        if ref == UNINIT or source == ALLOCATED:
            return CauseAt(UNINITIALIZED_MEMORY, origin if origin is not None else index, index, "outputs")
    return CauseAt(NONDETERMINISTIC_OP, index, index, "outputs")


def _rng_state_change(a: Trace, b: Trace, index: int) -> RngStateChange | None:
    """The last generator-state change before record ``index`` that left a
    different state in the two runs (None when none was seen)."""
    changed = None
    for event_a, event_b in zip(a.rng_events, b.rng_events):
        if event_a.before_op > index:
            break
        if event_a.state != event_b.state:
            changed = event_a
    if changed is None:
        return None
    return RngStateChange(changed.call, changed.path, changed.line, changed.step)


def first_step(trace: Trace, record: int) -> int:
    return trace.ops[record].step if 0 <= record < len(trace.ops) else 0
