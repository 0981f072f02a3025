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

Python is upstream too.  Once Python has read a value that differed (an op
returned a differing number, ``.item()``; ``tolist()``; ``torch.save``), what
enters from Python afterwards can be computed from it: a control-flow
divergence, a differing external input or plain argument after such a read is
propagated from the causes whose difference Python read, not a new root cause.

Each difference carries the set of root causes it descends from (its
*taint*), from producer to reader through digest ids.  A root cause counts
only when something read its difference: a later op computed from a
differing output (or a view of it), it reached the final state, or it is a
different program path.  An output nobody read (a workspace, the unused output
of a multi-output op) cannot change a result and is never reported; nor, where
the final state is digested, can a difference that ops only moved
(``MOVES_DATA``: views, copies, concatenations) before it was overwritten,
as FSDP2 copies the uninitialized storage of a model built on the meta
device before its weights are initialised: the copies carry its taint, and
whatever computes from them reads it.  A cause whose
taint reaches a differing tensor of the final state (parameters, gradients,
buffers, optimizer state, loss) *reaches the final state*; a read one that
does not is *latent*: its difference vanished on the way, and other data or
more steps can bring it through.

An RNG cause also names the last call before it that left the generator in a
different state in the two runs (``torch.seed()``, ``torch.manual_seed(<time>)``),
when the tracer saw one.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import NamedTuple

from detaudit.dynamic.compare.causes import (
    COLLECTIVE,
    CONTROL_FLOW,
    EXTERNAL_INPUT,
    NONDETERMINISTIC_OP,
    PYTHON_VALUE,
    RNG,
    UNINITIALIZED_MEMORY,
    CauseKind,
    ExtraOps,
    OneSidedOps,
    OtherRunOp,
    OtherSide,
    RngStateChange,
)
from detaudit.dynamic.compare.trace_format import (
    ALLOCATED,
    EXTERNAL,
    PRODUCED,
    UNINIT,
    OpRecord,
    Trace,
    is_python_value,
)


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
    # for each of the record's outputs, whether it shows the cause: its difference was read as data
    # (not a workspace that only its kernel's backward reads); None = every output
    capture_outputs: tuple[bool, ...] | None = None
    other_side: OtherSide | None = None  # control flow: what the other run did; RNG: where the state changed
    read: bool = False  # something read its difference (else it is scratch, never reported)
    other_record: int = -1  # the other run's record aligned with capture_record (the same index unless realigned)
    reaches_final: bool = False  # its difference reached a differing tensor of the final state

    def site(self, trace: Trace) -> Site:
        record = trace.ops[self.record]
        return Site(self.kind, record.op, record.path, record.line, record.module, trace.phase_of(self.record))


@dataclass
class PairComparison:
    causes: list[CauseAt]  # root causes whose difference something read, in trace order
    propagated: int  # records that differ only because of an upstream cause
    compared: int  # aligned records
    differing: list[int] = field(default_factory=list)  # aligned records whose inputs, arguments or outputs differ
    final_known: bool = False  # both traces recorded their final state's digests
    final_differs: bool = False  # ... and some final tensor differs


_NO_CAUSE: frozenset[int] = frozenset()
# root causes that Python can compute from a value it read: they follow a differing read
_ENTER_FROM_PYTHON = frozenset({EXTERNAL_INPUT, PYTHON_VALUE, CONTROL_FLOW})


def _differs(a: Trace, b: Trace, refs_a: list[int], refs_b: list[int]) -> list[int]:
    return [p for p, (x, y) in enumerate(zip(refs_a, refs_b)) if a.value(x) != b.value(y)]


class _Taint:
    """Which root causes each differing value descends from (by digest id of the reference trace)."""

    def __init__(self):
        self.causes: list[CauseAt] = []
        self.of_digest: dict[int, frozenset[int]] = {}  # digest id -> indices into causes
        self.of_record: dict[int, frozenset[int]] = {}  # record -> taint of its differing outputs
        self.python_read: frozenset[int] = _NO_CAUSE  # causes whose difference Python has read

    def everything(self) -> frozenset[int]:
        """What an untraceable difference may descend from: every cause so far."""
        return frozenset(range(len(self.causes)))

    def of_inputs(self, record: OpRecord, positions: list[int]) -> frozenset[int]:
        leaves = {position: (source, origin) for position, source, origin in record.leaves}
        taint = set()
        for position in positions:
            known = self.of_digest.get(record.inputs[position])
            if known is None:
                source, origin = leaves.get(position, (PRODUCED, None))
                if source != PRODUCED:  # entered here: the classifier names it
                    continue
                # a view hashed where it was read carries its producer's differences
                known = self.of_record.get(origin) if origin is not None else None
                if known is None:
                    known = self.everything()
            taint |= known
        return frozenset(taint)

    def mark_read(self, taint: frozenset[int], *, final: bool = False) -> None:
        for index in taint:
            self.causes[index].read = True
            if final:
                self.causes[index].reaches_final = True


def compare_traces(a: Trace, b: Trace, *, realign: bool = False) -> PairComparison:
    """Compare trace ``b`` with trace ``a`` record by record.  ``realign``:
    where the op sequences part, align the rest by op, module and shapes
    (``aligned_pairs``) and go on comparing past the ops one side ran alone,
    named as one control-flow cause where they start: for runs in two
    environments, where another torch decomposes an op differently or
    another device takes another path.  Without it the comparison ends at
    the first mismatch: within one environment the rest is another program
    path."""
    taint = _Taint()
    propagated = 0
    differing_records: set[int] = set()
    aligned = min(len(a.ops), len(b.ops))
    # where the final state is digested, a moved difference counts once it reaches it; without,
    # moving it is all that is known of its use
    final_known = bool(a.final) and bool(b.final)
    pairs = aligned_pairs(a, b) if realign else ((index, index) for index in range(aligned))
    for index, other_index in pairs:
        if other_index is None:  # a stretch of ops one side ran alone (OneSidedOps), realigned after it
            propagated += _add_cause(taint, index)
            continue
        ra, rb = a.ops[index], b.ops[other_index]
        if not realign and _key(ra) != _key(rb):
            propagated += _add_cause(taint, _control_flow(index, ra, rb))
            return _result(a, b, taint, propagated, index, differing_records)
        inputs_differ = _differs(a, b, ra.inputs, rb.inputs)
        outputs_differ = _differs(a, b, ra.outputs, rb.outputs)
        args_differ = ra.args != rb.args
        if not (inputs_differ or outputs_differ or args_differ):
            continue
        upstream = taint.of_inputs(ra, inputs_differ)
        if not (final_known and moves_data(ra.op)):
            taint.mark_read(upstream)
        cause = _classify(a, b, ra, index, inputs_differ, bool(outputs_differ), args_differ, differing_records)
        if cause is not None:
            cause.other_record = other_index
        differing_records.add(index)
        if cause is not None and cause.kind in _ENTER_FROM_PYTHON and taint.python_read:
            cause, upstream = None, upstream | taint.python_read  # Python computed it from a value that differed
        if cause is None:
            propagated += 1
        else:
            upstream = upstream | {len(taint.causes)}
            taint.causes.append(cause)
        for position in outputs_differ:
            taint.of_digest[ra.outputs[position]] = upstream
        if outputs_differ or (inputs_differ and not ra.outputs):  # (a view has no output digests)
            taint.of_record[index] = upstream
            if any(is_python_value(meta) for meta in ra.out_meta):
                taint.python_read |= upstream
    if realign:
        return _result(a, b, taint, propagated, len(a.ops), differing_records)
    if len(a.ops) != len(b.ops):
        longer = b if len(b.ops) > len(a.ops) else a
        extra = longer.ops[aligned]
        propagated += _add_cause(
            taint,
            CauseAt(
                CONTROL_FLOW,
                record=aligned - 1 if aligned else 0,
                capture_record=-1,
                capture_side="",
                other_side=ExtraOps(abs(len(a.ops) - len(b.ops)), extra.op, extra.path, extra.line),
            ),
        )
    return _result(a, b, taint, propagated, aligned, differing_records)


def _key(record: OpRecord, *, any_precision: bool = False) -> tuple:
    """What two records must share to be the same op of the program: op,
    output shapes, inputs, module; ``any_precision``: a floating-point
    output's dtype aside (a float64 run and a float32 run run the same ops)."""
    out_meta = tuple(record.out_meta)
    if any_precision:
        out_meta = tuple(_FLOAT_DTYPE.sub("float", meta) for meta in out_meta)
    return record.op, out_meta, len(record.inputs), record.module


_FLOAT_DTYPE = re.compile(r"^(?:float64|float32|float16|bfloat16)(?=\[)")


def aligned_pairs(a: Trace, b: Trace):
    """(index in ``a``, index in ``b``) of the records that line up, in order:
    positionally while the keys agree, then by an LCS alignment of the keys
    (difflib's) over the rest, floating-point dtypes aside (a float64 and a
    float32 run run the same ops: ``reference/precision.py``).  Each stretch that one side ran alone is one
    ``(CauseAt, None)`` item, a control-flow cause at its start naming both
    sides' ops (``OneSidedOps``)."""
    keys_a, keys_b = [_key(r, any_precision=True) for r in a.ops], [_key(r, any_precision=True) for r in b.ops]
    common = 0
    while common < min(len(keys_a), len(keys_b)) and keys_a[common] == keys_b[common]:
        yield common, common
        common += 1
    matcher = difflib.SequenceMatcher(None, keys_a[common:], keys_b[common:], autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        i1, i2, j1, j2 = i1 + common, i2 + common, j1 + common, j2 + common
        if tag == "equal":
            yield from zip(range(i1, i2), range(j1, j2))
            continue
        at = i1 if i1 < len(a.ops) else max(len(a.ops) - 1, 0)
        yield CauseAt(
            CONTROL_FLOW, record=at, capture_record=-1, capture_side="",
            other_side=OneSidedOps.of(a.ops[i1:i2], b.ops[j1:j2]),
        ), None


def _add_cause(taint: _Taint, control_flow: CauseAt) -> int:
    """Add a control-flow divergence (a different program path is always
    read); 1 when it follows from a value Python read, and is propagated."""
    if taint.python_read:
        taint.mark_read(taint.python_read)
        return 1
    control_flow.read = True
    taint.causes.append(control_flow)
    return 0


def _result(a: Trace, b: Trace, taint: _Taint, propagated: int, compared: int, differing: set[int]) -> PairComparison:
    """Mark the causes whose difference reached the final state."""
    final_known = bool(a.final) and bool(b.final)
    final_differs = False
    _note_outputs_read(a, b, taint.causes)
    for name in sorted(set(a.final) | set(b.final)) if final_known else ():
        ref_a, ref_b = a.final.get(name), b.final.get(name)
        if ref_a is not None and ref_b is not None and a.value(ref_a) == b.value(ref_b):
            continue
        final_differs = True
        known = taint.of_digest.get(ref_a) if ref_a is not None and compared == len(a.ops) else None
        taint.mark_read(known if known is not None else taint.everything(), final=True)
    return PairComparison(
        [c for c in taint.causes if c.read],
        propagated,
        compared,
        differing=sorted(differing),
        final_known=final_known,
        final_differs=final_differs,
    )


def _note_outputs_read(a: Trace, b: Trace, causes: list[CauseAt]) -> None:
    """Set ``capture_outputs`` of the causes shown by their outputs: the
    differing outputs that a later op takes as input or the final state holds
    (a scratch argument is recorded as ``UNREAD``, not as its digest)."""
    shown_by_outputs = [c for c in causes if c.read and c.capture_side == "outputs" and c.capture_record >= 0]
    if not shown_by_outputs:
        return
    read = {ref for record in a.ops for ref in record.inputs}
    read.update(a.final.values())
    for cause in shown_by_outputs:
        mine, theirs = a.ops[cause.capture_record].outputs, b.ops[cause.other_record].outputs
        shown = tuple(x in read and a.value(x) != b.value(y) for x, y in zip(mine, theirs))
        cause.capture_outputs = shown if any(shown) else None


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
    if is_communication(record.op):  # what it sent was the same: it received different data
        return CauseAt(COLLECTIVE, index, index, "outputs")
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


#: aten ops whose outputs are their inputs' elements moved, viewed or converted one by one: a
#: difference that goes through them is not read until an op computes from it
MOVES_DATA = frozenset({
    "view", "_unsafe_view", "reshape", "alias", "detach", "expand", "t", "transpose", "permute",
    "unsqueeze", "squeeze", "flatten", "unflatten", "slice", "narrow", "select", "split",
    "split_with_sizes", "chunk", "unbind", "as_strided", "contiguous", "clone", "copy_", "_to_copy",
    "cat", "stack",
})


def moves_data(op: str) -> bool:
    """Whether a record's op (``aten.copy_.default``) only moves its inputs' elements."""
    return op.startswith("aten.") and op.split(".")[1] in MOVES_DATA


#: the op namespaces of torch.distributed's collectives and point-to-point ops
COMMUNICATION_NAMESPACES = ("c10d.", "_c10d_functional.")


def is_communication(op: str) -> bool:
    return op.startswith(COMMUNICATION_NAMESPACES)


def first_step(trace: Trace, record: int) -> int:
    return trace.ops[record].step if 0 <= record < len(trace.ops) else 0
