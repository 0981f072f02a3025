"""Where two runs part ways, op by op: the data of the divergence chart.

For one pair of runs (the first pair that differed), the records of the
reference run over the step in which the first difference appears and the
step after it (so that the spread into the next forward pass shows).  Each
record is equal, a root cause, or propagated (it differs only because
something upstream did); a control-flow divergence ends the comparison where
the runs start to execute different ops.

The deviation of each differing record (max |diff|) is measured from the
captures of that pair that measure its root causes (``verdict/build.py``), never
by the trace: tracing costs nothing more for it.  A root cause's record is measured as its
``RootCause`` is (the same number); other records over their outputs, in full
up to ``record.digests.SAMPLE_ELEMENTS`` elements and over that many evenly spaced
elements of a larger output (a lower bound, flagged ``sampled``).  At most
``MAX_MEASURED_RECORDS`` records are measured, evenly spread over the range;
the others show as differing, unmeasured.

Imports neither torch nor numpy.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import NamedTuple

from detaudit.dynamic.compare.causes import CONTROL_FLOW
from detaudit.dynamic.compare.classify import CauseAt, PairComparison
from detaudit.dynamic.compare.trace_format import UNINIT, Trace

ROOT, PROPAGATED = "root", "propagated"
STEPS_SHOWN = 2  # the step where the runs part ways and the next one
MAX_MEASURED_RECORDS = 2000  # sampled captures per chart: at most 2000 x 4096 elements per run


@dataclass
class DivergencePoint:
    """One record that differed between the two runs."""

    record: int  # index in the reference run's trace
    op: str
    phase: str
    step: int
    path: str
    line: int
    status: str  # ROOT or PROPAGATED
    kind: str = ""  # a root's cause kind ("nondeterministic-op")
    max_abs_diff: float | None = None  # measured in the capture rerun; None: not measured
    sampled: bool = False  # measured over a sample of a large output's elements: a lower bound


class PhaseSpan(NamedTuple):
    """Consecutive records of one phase of one step: [start, end)."""

    phase: str
    step: int
    start: int
    end: int


@dataclass
class Divergence:
    runs: tuple[int, int]  # the pair compared, as run numbers from 1: (1, 2)
    steps: list[int]  # the optimizer steps shown
    start: int  # the records shown: [start, end) of the reference run's trace
    end: int
    spans: list[PhaseSpan]
    points: list[DivergencePoint]  # the records that differed, in trace order; the others were equal
    control_flow_at: int | None = None  # from this record on the runs executed different ops: not compared
    # differing records whose outputs are fresh allocations (torch.empty_like of a differing
    # tensor): garbage by definition, never measured
    allocations: set[int] = field(default_factory=set, repr=False)

    @property
    def other_run(self) -> int:
        """The index (from 0) of the run compared with run 0."""
        return self.runs[1] - 1

    @property
    def compared_ops(self) -> int:
        end = self.end if self.control_flow_at is None else min(self.end, self.control_flow_at)
        return max(0, end - self.start)

    @property
    def equal_ops(self) -> int:
        return self.compared_ops - len(self.points)

    def records_to_measure(self) -> list[int]:
        """The differing records whose deviation the capture rerun measures:
        all of them, or ``MAX_MEASURED_RECORDS`` spread evenly over the range."""
        records = [point.record for point in self.points if point.record not in self.allocations]
        if len(records) <= MAX_MEASURED_RECORDS:
            return records
        step = len(records) / MAX_MEASURED_RECORDS
        return sorted({records[int(i * step)] for i in range(MAX_MEASURED_RECORDS)})

    def to_dict(self) -> dict:
        return {
            "runs": list(self.runs),
            "steps": self.steps,
            "start": self.start,
            "end": self.end,
            "compared_ops": self.compared_ops,
            "equal_ops": self.equal_ops,
            "control_flow_at": self.control_flow_at,
            "spans": [span._asdict() for span in self.spans],
            "points": [asdict(point) for point in self.points],
        }


def divergence_of(trace: Trace, comparison: PairComparison, other: int) -> Divergence | None:
    """The chart's records for run 0 (``trace``) against run ``other``; None
    when the pair did not differ."""
    ops = trace.ops
    control_flow = next((cause for cause in comparison.causes if cause.kind is CONTROL_FLOW), None)
    control_flow_at = comparison.compared if control_flow is not None else None
    candidates = list(comparison.differing) + ([control_flow_at] if control_flow_at is not None else [])
    if not candidates or not ops:
        return None
    first = min(candidates)
    first_step = ops[min(first, len(ops) - 1)].step
    start = first
    while start > 0 and ops[start - 1].step >= first_step:
        start -= 1
    last_step = first_step + STEPS_SHOWN - 1
    end = min(first, len(ops))
    while end < len(ops) and ops[end].step <= last_step:
        end += 1
    roots = root_causes_by_record(comparison)
    points = []
    for record in comparison.differing:
        if start <= record < end:
            op = ops[record]
            cause = roots.get(record)
            points.append(
                DivergencePoint(
                    record=record,
                    op=op.op,
                    phase=trace.phase_of(record),
                    step=op.step,
                    path=op.path,
                    line=op.line,
                    status=ROOT if cause else PROPAGATED,
                    kind=cause.kind.name if cause else "",
                )
            )
    return Divergence(
        runs=(1, other + 1),
        steps=sorted({ops[index].step for index in range(start, end)}),
        start=start,
        end=end,
        spans=_phase_spans(trace, start, end),
        points=points,
        control_flow_at=control_flow_at if control_flow_at is not None and control_flow_at <= end else None,
        allocations={p.record for p in points if ops[p.record].outputs and set(ops[p.record].outputs) == {UNINIT}},
    )


def root_causes_by_record(comparison: PairComparison) -> dict[int, CauseAt]:
    """The pair's root causes by the record a chart shows them at."""
    return {_shown_at(cause): cause for cause in comparison.causes if cause.kind is not CONTROL_FLOW}


def _shown_at(cause: CauseAt) -> int:
    """Where a cause shows in the chart: the record whose tensors differ
    (the op that read uninitialized memory, not the allocation)."""
    return cause.capture_record if cause.capture_record >= 0 else cause.record


def _phase_spans(trace: Trace, start: int, end: int) -> list[PhaseSpan]:
    spans: list[PhaseSpan] = []
    for index in range(start, end):
        record, phase = trace.ops[index], trace.phase_of(index)
        if spans and spans[-1].phase == phase and spans[-1].step == record.step:
            spans[-1] = spans[-1]._replace(end=index + 1)
        else:
            spans.append(PhaseSpan(phase, record.step, index, index + 1))
    return spans


def growth_by_step(trace: Trace, comparison: PairComparison, divergence: Divergence | None) -> list[dict]:
    """Per optimizer step of run 0's trace: its ops, how many differed, and the
    largest max |diff| measured among them (the divergence chart's records;
    None where none was measured): how far a difference spread, step by step."""
    ops: dict[int, int] = {}
    for record in trace.ops:
        ops[record.step] = ops.get(record.step, 0) + 1
    differing: dict[int, int] = {}
    for index in comparison.differing:
        step = trace.ops[index].step
        differing[step] = differing.get(step, 0) + 1
    measured: dict[int, float] = {}
    for point in divergence.points if divergence else ():
        if point.max_abs_diff is not None:
            measured[point.step] = max(measured.get(point.step, 0.0), point.max_abs_diff)
    return [
        {"step": step, "ops": count, "differing_ops": differing.get(step, 0), "max_abs_diff": measured.get(step)}
        for step, count in sorted(ops.items())
    ]
