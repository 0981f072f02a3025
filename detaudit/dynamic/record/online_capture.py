"""Runs that keep, as they run, the tensors a capture rerun would save.

A later repeat compares itself with the reference run as it runs and keeps
the tensors of the records that differ; the reference keeps its first steps.

``detaudit run`` measures each root cause's deviation (max |diff|) and the
divergence chart's from the tensors of both runs of a pair at the records
that differed (``verdict/build.py``).  The reference run (run 1) cannot know those
records while it runs, but a later repeat can: given the reference's trace,
``OnlineCapture`` (the tracer's ``observer``) compares each record's op,
shapes, arguments and input and output digests with the reference's record
at the same position, as ``compare.compare_traces`` aligns them, and for a
record that differs keeps

* in full (``digests.full_capture``) a record that may be a root cause: no
  tensor input differs (a kernel, the generator, an argument), or a differing
  input entered from outside the trace or from an allocation (its inputs are
  copied before the op, as it read them).  At most ``MAX_PER_SITE`` records of
  one source line and op: a site is one cause, measured at its first record;
* sampled (``digests.sampled_capture``) any record of the steps the divergence
  chart shows: the step where the first difference appears and the next one.

A control-flow divergence ends the comparison (nothing after it is aligned).

Run 1 itself cannot know which of its records will differ; without a
reference (``reference=None``) it keeps every record of its first
``STEPS_SHOWN`` steps, in full and sampled, up to ``FIRST_STEPS_BYTES``:
where the runs part ways there (a batch from an unseeded generator, a racy
kernel, the first step's usual suspects) no run is rerun at all.  Records of
run 1 are kept with the inputs of those that read data from outside the
trace only: the others' causes are measured on their outputs.

On CPU the digests are taken as each op runs, so each record is decided on
the spot.  Digests on a device wait there until ``flush()`` at the step's end
(no host sync per op): a record is then kept as a device copy of its outputs
(and of its inputs, when one entered from outside) until the flush decides
it, at most ``PENDING_BYTES`` of them at a time.  Everything kept is bounded
(``KEPT_BYTES``, ``FIRST_STEPS_BYTES``); what does not fit is left out, and
the parent reruns the run that lacks it instead (``select``).

Imports torch: the child's side.  The parent calls ``select`` only where it
measures tensors.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch

from detaudit.dynamic.compare.divergence import STEPS_SHOWN
from detaudit.dynamic.compare.trace_format import ALLOCATED, EXTERNAL, OpRecord, iter_trace_rows, read_trace_tail
from detaudit.dynamic.record.digests import full_capture, sampled_capture

MAX_PER_SITE = 4  # records kept in full per (op, file, line): a site's first read one is its cause
KEPT_BYTES = 512 << 20  # host memory for what is kept, in full and sampled
FIRST_STEPS_BYTES = 64 << 20  # run 1: what it keeps of its first steps (written in every audit)
PENDING_BYTES = 512 << 20  # device memory for the records of a step that wait for its flush
CAPTURE_NAME = "online_capture.pt"
# positions of OpRecord's fields in the plain tuples the tracer builds (tracer.records)
_OP, _PATH, _LINE, _STEP, _OUT_META, _ARGS, _INPUTS, _OUTPUTS, _LEAVES = (
    OpRecord._fields.index(name) for name in ("op", "path", "line", "step", "out_meta", "args", "inputs", "outputs", "leaves")
)
_ENTERED = (EXTERNAL, ALLOCATED)  # leaves whose difference the classifier names where they are read


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _special(digest_id: int) -> tuple:
    """What a negative digest id (an allocation, an input not read) compares as:
    equal to itself in every run, never to a digest."""
    return ("special", digest_id)


def _numbers(results: list) -> list:
    """The Python numbers among an op's results (what ``full_capture`` keeps of them)."""
    return [v for v in results if isinstance(v, (bool, int, float, complex))]


class OnlineCapture:
    """The tracer's observer in a repeat compared with ``reference`` (a
    trace.json); in run 1 (``reference=None``), keeping its first steps."""

    def __init__(self, tracer, reference: str | Path | None, budget: int | None = None):
        self.compares = reference is not None  # a repeat; run 1 keeps its first steps
        # the reference's records, read a line of the file at a time as the run
        # reaches them (iter_trace_rows), and dropped once decided: a long run
        # holds the few thousand it is at, not the reference trace
        self._reference_rows = iter_trace_rows(reference) if self.compares else iter(())
        self._reference_digests = read_trace_tail(reference)["digests"] if self.compares else []
        self._reference: dict[int, tuple] = {}  # record -> what the comparison aligns and compares, digests as values
        self._reference_read = 0  # records read from the reference
        # bytes kept at most (a reference folder keeps less of its first steps than run 1 does)
        self._budget = budget if budget is not None else KEPT_BYTES if self.compares else FIRST_STEPS_BYTES
        self.tracer = tracer
        self.full: dict[int, dict] = {}  # record -> full_capture
        self.sampled: dict[int, dict] = {}  # record -> sampled_capture
        self.ended = False  # a control-flow divergence (run 1: past its first steps): nothing after it is kept
        self._first_step: int | None = None if self.compares else 1  # the step of the first differing record
        self._per_site: Counter = Counter()
        self._kept = 0
        self._inputs: tuple[int, list] | None = None  # (record, inputs as the op read them) of the op running
        self._pending: list[tuple] = []  # records waiting for their digests: (record, inputs, outputs, results)
        self._pending_bytes = 0

    # -- the tracer's hooks ------------------------------------------------
    def before_op(self, record_index: int, flat_args: list, inputs: list, leaves: list) -> None:
        """Copy the inputs of an op that reads data from outside the trace
        (unless its digests already show that data equal): if that data
        differs, the op is a root cause measured on its inputs."""
        entered = [leaf[0] for leaf in leaves if leaf[1] in _ENTERED]
        if self.ended or not entered:
            return
        reference = self._reference_record(record_index)
        reference_inputs = reference[3] if reference is not None else ()
        if reference is not None and len(reference_inputs) == len(inputs) and all(
            self._value(inputs[p]) == reference_inputs[p] for p in entered
        ):
            return  # (a digest still on its device is None: never equal, copied)
        self._inputs = (record_index, self._untraced(lambda: [v.detach().clone() for v in flat_args if isinstance(v, torch.Tensor)]))

    def after_op(self, record_index: int, outputs: list, results: list) -> None:
        inputs = None
        if self._inputs is not None and self._inputs[0] == record_index:
            inputs, self._inputs = self._inputs[1], None
        if self.ended or not self._compared(record_index):
            return
        if any(t.is_meta for t in outputs):  # shapes without data: nothing to measure
            return
        if self._resolved(record_index):
            self._decide(record_index, *self._captures(inputs, outputs, results))
            return
        size = _nbytes(outputs) + _nbytes(inputs or [])
        if self._pending_bytes + size > min(PENDING_BYTES, self._budget - self._kept):
            return  # left out: the parent reruns this pair if it needs the record
        self._pending_bytes += size
        self._pending.append((record_index, inputs, self._untraced(lambda: [t.detach().clone() for t in outputs]), _numbers(results)))

    def python_read(self, record_index: int, tensor: torch.Tensor) -> None:
        """A record of a Python read, kept as the tracer's capture keeps it
        (its tensor as input and output, whole), in full and sampled alike."""
        if self.ended or not self._compared(record_index) or not self._resolved(record_index):
            return  # (Python reads the value at once: its digest is on the host)
        copy = self._untraced(lambda: tensor.detach().to("cpu", copy=True))
        entry = {"inputs": [copy], "outputs": [copy]}
        self._decide(record_index, lambda: entry, lambda: entry)

    def flushed(self) -> None:
        """The step's digests reached the host: decide the records that waited for them."""
        pending, self._pending, self._pending_bytes = self._pending, [], 0
        for record_index, inputs, outputs, results in pending:
            if not self.ended:
                self._decide(record_index, *self._captures(inputs, outputs, results))
        # every record traced so far is decided or never will be (left out, shapes only)
        traced = len(self.tracer.records)
        for record_index in [index for index in self._reference if index < traced]:
            del self._reference[record_index]

    def _reference_record(self, record_index: int) -> tuple | None:
        """What the reference's record ``record_index`` aligns and compares:
        (op, out_meta, args, input digests, output digests); None past its end."""
        while record_index >= self._reference_read:
            rows = next(self._reference_rows, None)
            if rows is None:
                return None
            digests = self._reference_digests
            for op, _, _, _, _, _, out_meta, args, inputs, outputs, *_ in rows:
                self._reference[self._reference_read] = (
                    op,
                    tuple(out_meta),
                    args,
                    tuple(_special(i) if i < 0 else digests[i] for i in inputs),
                    tuple(_special(i) if i < 0 else digests[i] for i in outputs),
                )
                self._reference_read += 1
        return self._reference.get(record_index)

    # -- deciding ----------------------------------------------------------
    def _compared(self, record_index: int) -> bool:
        """Whether the record lines up with the reference's (as compare_traces
        aligns them), in run 1 whether it is in the first steps; the first one
        that is not ends the comparison."""
        record = self.tracer.records[record_index]
        if not self.compares:
            self.ended = record[_STEP] >= 1 + STEPS_SHOWN
            return not self.ended
        reference = self._reference_record(record_index)
        if reference is None or reference[0] != record[_OP] or reference[1] != record[_OUT_META] or len(reference[3]) != len(record[_INPUTS]):
            self.ended = True
            self._pending = []
            return False
        return True

    def _value(self, digest_id: int):
        if digest_id < 0:
            return _special(digest_id)
        return self.tracer.known_digest(digest_id)

    def _resolved(self, record_index: int) -> bool:
        record = self.tracer.records[record_index]
        return all(i < 0 or self.tracer.known_digest(i) is not None for i in (*record[_INPUTS], *record[_OUTPUTS]))

    @staticmethod
    def _captures(inputs: list | None, outputs: list, results: list) -> tuple:
        """(full, sampled): what to keep of an op's record, made only if kept."""
        return (
            lambda: full_capture([t.cpu() for t in inputs or []], outputs, results),
            lambda: sampled_capture(outputs),
        )

    def _decide(self, record_index: int, full, sampled) -> None:
        """Keep a record that differs from the reference's: ``full()`` if it may
        be a root cause, ``sampled()`` if the divergence chart shows it."""
        record = self.tracer.records[record_index]
        if not self.compares:  # run 1: every record of its first steps may be one that differs
            self._keep(self.sampled, record_index, sampled)
            self._keep(self.full, record_index, full)
            return
        _, _, reference_args, reference_inputs, reference_outputs = self._reference.pop(record_index)
        inputs_differ = [p for p, (i, v) in enumerate(zip(record[_INPUTS], reference_inputs)) if self._value(i) != v]
        outputs_differ = any(self._value(o) != v for o, v in zip(record[_OUTPUTS], reference_outputs))
        if not (inputs_differ or outputs_differ or record[_ARGS] != reference_args):
            return
        step = record[_STEP]
        if self._first_step is None:
            self._first_step = step
        entered = {leaf[0] for leaf in record[_LEAVES] if leaf[1] in _ENTERED}
        may_be_root = not inputs_differ or any(p in entered for p in inputs_differ)
        if step < self._first_step + STEPS_SHOWN:
            self._keep(self.sampled, record_index, sampled)
        site = (record[_OP], record[_PATH], record[_LINE])
        if may_be_root and self._per_site[site] < MAX_PER_SITE:
            self._per_site[site] += 1
            self._keep(self.full, record_index, full)

    def _untraced(self, copy):
        """``copy()``, with the tracer paused: the copies are not the run's (outside
        the dispatcher, and a wrapper subclass such as DTensor runs Python, which
        reads tensors, to copy itself)."""
        with self.tracer.untraced():
            return copy()

    def _keep(self, into: dict, record_index: int, capture) -> None:
        entry = self._untraced(capture)
        size = _nbytes(entry["outputs"]) + _nbytes(entry.get("inputs", []))
        if self._kept + size > self._budget:
            return  # left out: the parent reruns this pair if it needs the record
        self._kept += size
        into[record_index] = entry

    def save(self, output_dir: Path) -> dict:
        """Write what was kept; its path for the payload."""
        path = Path(output_dir) / CAPTURE_NAME
        torch.save({"full": self.full, "sampled": self.sampled}, path)
        return {"online_capture_file": str(path)}


def select(captured: dict, records: list[int], sampled: list[int]) -> dict | None:
    """The capture a rerun asked for ``records`` (``sampled`` of them sampled)
    would give, from what a run kept online; None when something is missing."""
    chosen = select_kept(captured, records, sampled)
    return chosen if len(chosen) == len(records) else None


def select_kept(captured: dict, records: list[int], sampled: list[int]) -> dict:
    """What a run kept online of ``records``, whatever is there (a reference
    saved elsewhere cannot be rerun for the rest)."""
    wanted_sampled = set(sampled)
    kept = ((record, captured["sampled" if record in wanted_sampled else "full"].get(record)) for record in records)
    return {record: entry for record, entry in kept if entry is not None}
