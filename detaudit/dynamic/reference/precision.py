"""A reference in another floating-point precision: which ops round differently.

A float64 reference and a float32 run differ in every digest of every
floating-point tensor, so digests cannot say where they part.  Values can:
an op *rounds differently* when each of its inputs was, rounded to the
run's precision, what the run read (its producer matched), while its own
output, rounded, is not what the run computed.  Those are the drift roots
of a precision change; every other differing op follows from one.

The reference's values are the outputs it kept of its first steps
(``folder.py``): an input is its producer's output (by digest id); the run's
are one capture rerun at the records aligned with them
(``compare.classify.aligned_pairs``), inputs and outputs.  An input whose
value was not kept (past the reference's budget, a view hashed where it was
read) is unknown, and its op never a root.  Imports torch (the parent measures tensors here).
"""

from __future__ import annotations

from dataclasses import dataclass

from detaudit.dynamic.compare.classify import aligned_pairs
from detaudit.dynamic.compare.state_diff import TensorDiff, tensor_diff
from detaudit.dynamic.compare.trace_format import EXTERNAL, Trace

MAX_ROOTS = 10  # roots reported at most (distinct sites, in trace order)


@dataclass
class RoundingRoot:
    record: int  # in the reference's trace
    other_record: int  # the run's record aligned with it
    diff: TensorDiff  # its worst output, rounded to the narrower precision


def aligned_records(reference: Trace, run: Trace, kept: set[int]) -> list[tuple[int, int]]:
    """(reference record, run record) of the aligned records the reference kept."""
    return [(i, j) for i, j in aligned_pairs(reference, run) if j is not None and i in kept]


def rounding_roots(reference: Trace, pairs: list[tuple[int, int]], reference_kept: dict, run_captured: dict) -> list[RoundingRoot]:
    """The ops that round differently, in trace order (at most ``MAX_ROOTS``
    sites).  ``reference_kept``: reference record -> its kept capture
    (``outputs``, and ``inputs`` where it read data from outside);
    ``run_captured``: run record -> its full capture (``inputs``, ``outputs``)."""
    produced_by = {
        digest: (index, position)
        for index, record in enumerate(reference.ops)
        for position, digest in enumerate(record.outputs)
        if digest >= 0
    }
    aligned = dict(pairs)
    roots: list[RoundingRoot] = []
    sites = set()
    for i, j in pairs:
        mine, theirs = reference_kept.get(i), run_captured.get(j)
        if mine is None or theirs is None or len(mine["outputs"]) != len(theirs["outputs"]):
            continue
        digests = reference.ops[i].outputs
        # an allocation's output (UNINIT) is garbage by design: never compared
        shown = [digest >= 0 for digest in digests] if len(digests) == len(mine["outputs"]) else [True] * len(mine["outputs"])
        diffs = [
            d for d in (tensor_diff("", a, b) for a, b, compared in zip(mine["outputs"], theirs["outputs"], shown) if compared)
            if d is not None
        ]
        if not diffs or not _inputs_matched(reference, i, produced_by, reference_kept, mine, theirs, aligned, run_captured):
            continue
        site = (reference.ops[i].op, reference.ops[i].path, reference.ops[i].line)
        if site not in sites:
            sites.add(site)
            roots.append(RoundingRoot(i, j, max(diffs, key=lambda d: d.max_ulp)))
            if len(roots) == MAX_ROOTS:
                break
    return roots


def _inputs_matched(reference: Trace, index: int, produced_by: dict, reference_kept: dict, mine: dict, theirs: dict,
                    aligned: dict, run_captured: dict) -> bool:
    """Whether every input op ``index`` read was, rounded to the run's
    precision, what the run's op read: its producer's kept output matches,
    rounded, the run's output of the aligned producer (views of it compare
    as their base); a producer only the reference ran (a cast to its
    precision) is compared with the run's input itself, and data from
    outside by the kept input.  What was not kept counts as not matched."""
    record = reference.ops[index]
    external = {position for position, source, _ in record.leaves if source == EXTERNAL}
    run_inputs = theirs.get("inputs", [])
    for position, digest in enumerate(record.inputs):
        if digest < 0:  # an allocation or an input the op does not read
            continue
        if position in external:
            value = mine["inputs"][position] if len(mine.get("inputs", [])) > position else None
            other = run_inputs[position] if position < len(run_inputs) else None
        else:
            producer = produced_by.get(digest)
            value = _output_of(producer, reference, reference_kept)
            other = _output_of((aligned[producer[0]], producer[1]), None, run_captured) if producer and producer[0] in aligned else (
                run_inputs[position] if position < len(run_inputs) else None
            )
        if value is None or other is None or tensor_diff("", value, other) is not None:
            return False
    return True


def _output_of(producer, trace: Trace | None, kept: dict):
    """Output ``position`` of record ``record`` (``producer``) in a capture, or
    None where it was not kept (or its outputs do not line up with the
    trace's digests: a view among them)."""
    if producer is None:
        return None
    record, position = producer
    captured = kept.get(record)
    if captured is None or position >= len(captured["outputs"]):
        return None
    if trace is not None and len(captured["outputs"]) < len(trace.ops[record].outputs):
        return None
    return captured["outputs"][position]


def first_precision_difference(reference: Trace, run: Trace) -> int | None:
    """The first aligned record of the reference whose output dtypes differ
    from the run's (float64 against float32), or None: the runs compute in
    one precision."""
    for i, j in aligned_pairs(reference, run):
        if j is not None and reference.ops[i].out_meta != run.ops[j].out_meta:
            return i
    return None


def explain_precision(report, reference: Trace, run: Trace, reference_kept: dict | None, capture) -> None:
    """When the reference computed in another precision: a note saying where
    they part, and the drift roots by value (``rounding_roots``) in place of
    the digest-based ones, which every op making a tensor in the other
    precision would be.  ``capture(records)``: the run's full captures of
    its ``records`` (one capture rerun)."""
    from detaudit.dynamic.compare.causes import ENVIRONMENT_DRIFT
    from detaudit.dynamic.verdict.run_report import FINAL_STATE, RootCause

    at = first_precision_difference(reference, run)
    if at is None:
        return
    record = reference.ops[at]
    note = (
        f"the runs compute in other floating-point precisions ({', '.join(record.out_meta)} in the reference, "
        f"{', '.join(run.ops[_aligned_with(reference, run, at)].out_meta)} here), first at {record.op} at "
        f"{record.path}:{record.line}; final tensors are compared rounded to the narrower dtype (see --tolerance)"
    )
    full = (reference_kept or {}).get("full", {})
    pairs = aligned_records(reference, run, set(full))
    captured = capture(sorted(j for _, j in pairs)) if pairs else {}
    roots = rounding_roots(reference, pairs, full, captured) if pairs else []
    if not roots:
        report.notes.append(note + "; no op's rounding could be told apart (the reference kept no values there)")
        return
    report.notes.append(note + ": the drift roots are the first ops whose result, from inputs that match rounded, "
                        "rounds differently")
    report.root_causes = [cause for cause in report.root_causes if cause.kind is not ENVIRONMENT_DRIFT] + [
        RootCause(
            kind=ENVIRONMENT_DRIFT, op=reference.ops[root.record].op, path=reference.ops[root.record].path,
            line=reference.ops[root.record].line, module=reference.ops[root.record].module,
            phase=reference.phase_of(root.record), seen=1, pairs=report.repeats - 1,
            first_step=reference.ops[root.record].step, max_abs_diff=root.diff.max_abs_diff, max_ulp=root.diff.max_ulp,
            hint=f"Rounds differently in {root.diff.dtype.split('->')[-1]} than the reference's "
            f"{root.diff.dtype.split('->')[0]} result rounded: expected of a precision change; compare with --tolerance.",
            effect=FINAL_STATE, record=root.record,
        )
        for root in roots
    ]
    report.root_causes.sort(key=lambda cause: (cause.first_step, cause.record))


def _aligned_with(reference: Trace, run: Trace, index: int) -> int:
    return next(j for i, j in aligned_pairs(reference, run) if i == index)
