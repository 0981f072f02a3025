"""The op trace: what a traced run records and the comparison reads.

One ``OpRecord`` per aten op and one ``RngEvent`` per call that set the torch
generators' state, plus the list of digests that records refer to by position
(a *digest id*) and the digest id of each tensor of the final state.  ``Trace``
holds them, and writes and reads ``trace.json`` (records as JSON arrays in
field order, so a long trace stays compact).  ``TraceWriter`` writes it as a
run goes, a few thousand records a line, and ``iter_trace_rows`` reads it a
line at a time: a long run holds neither its trace nor its reference's.

Python reads of tensor data that dispatch no aten op (``Tensor.tolist``,
``Tensor.numpy``, ``torch.save``) are records too, named by the Python call
(``PYTHON_READS``): the comparison must see every value Python took out of
the trace.

The tracer (child process, torch) writes through this module; the comparison
(parent process) reads through it.  It imports neither torch nor numpy.
"""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, NamedTuple, Sequence

UNINIT = -1  # digest id of an allocation op's output: equal in every run on purpose
# digest id of an input whose bytes the op does not read: its own scratch space
# (an argument the schema names ``workspace`` or ``reserve``) or an argument it
# only overwrites (copy_'s destination, an ``out=`` tensor): equal in every run
# on purpose (see tracer.SCRATCH_ARGUMENTS and OVERWRITING_OPS)
UNREAD = -2

# records of Python calls that read tensor data without dispatching an aten op:
# the call's name -> the type of what Python gets (``out_meta``)
# What a compiled graph's call is named in a trace: inductor.graph_<n>.<kind> (record/compiled_graphs.py),
# kind forward, backward or inference; one record stands for all the graph's kernels.
GRAPH_OP_PREFIX = "inductor.graph_"


def is_graph_call(op: str) -> bool:
    return op.startswith(GRAPH_OP_PREFIX)


def graph_op_name(index: int, kind: str) -> str:
    return f"{GRAPH_OP_PREFIX}{index}.{kind}"


PYTHON_READS = {"Tensor.tolist": "list", "Tensor.numpy": "ndarray", "torch.save": "file"}

# phases of an op
FORWARD, BACKWARD, OPTIMIZER = "forward", "backward", "optimizer"
#: before training started (no module forward, backward or optimizer step yet): building the model and the data
SETUP = "setup"

# where the contents of an input's storage came from (the kind of a leaf)
PRODUCED = "op"  # a traced op wrote it
ALLOCATED = "alloc"  # a traced allocation (torch.empty*) made it and nothing traced wrote it
EXTERNAL = "external"  # no traced op made it: it entered from outside torch


class OpRecord(NamedTuple):
    """One aten op.  Inputs and outputs are digest ids; sequences are tuples
    in the tracer's process and lists once read back from JSON.

    The tracer builds records as plain tuples in this field order on its hot
    path (a NamedTuple costs more to build, and the garbage collector keeps
    tracking tuple subclasses: see ``OpTracer.record``) and wraps them when
    the trace leaves it."""

    op: str  # the overload, "aten.add.Tensor"
    phase: str  # SETUP, FORWARD, BACKWARD or OPTIMIZER
    path: str  # user source file (relative to the run's working directory when under it); "" if none
    line: int  # 0 if no user frame
    module: str  # module path that was running ("model.blocks.0"), "" outside modules
    step: int  # optimizer step it ran in, from 1
    out_meta: Sequence[str]  # per result: "float32[2, 3]" for a tensor, "<float>" for a Python value, "None"
    args: int  # CRC-32 of the non-tensor arguments
    inputs: Sequence[int]  # digest ids of the tensor inputs, in argument order
    outputs: Sequence[int]  # digest ids of the tensor outputs (views have none), of written inputs, then of Python values
    leaves: Sequence[Sequence]  # (input position, ALLOCATED or EXTERNAL, record index) of inputs no traced op wrote
    seeded: bool  # the op draws from a generator (torch.Tag.nondeterministic_seeded)


class RngEvent(NamedTuple):
    """A call that set the global generators' state (``torch.seed()``, ...)."""

    call: str  # "torch.seed"
    path: str  # where the user called it
    line: int
    step: int  # optimizer step it happened in, from 1
    before_op: int  # records traced before it
    state: int  # digest of the generator state it left


def python_value_meta(type_name: str) -> str:
    """The ``out_meta`` of a value that went to Python (``.item()``'s float,
    ``tolist()``'s list, a file ``torch.save`` wrote): its type only.  The value
    itself is an output, digested like a tensor."""
    return f"<{type_name}>"


def is_python_value(meta: str) -> bool:
    return meta.startswith("<")


@dataclass
class Trace:
    ops: list[OpRecord]
    digests: list[int]  # a digest id indexes this list
    rng_events: list[RngEvent] = field(default_factory=list)
    final: dict[str, int] = field(default_factory=dict)  # final-state tensor name -> digest id
    # (path, line) of the ops run once training started: phase_of's, made on first use
    _trained_lines: set | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def load(cls, path: str | Path) -> "Trace":
        """Read trace.json a line at a time, its records as the tracer made them
        (tuples, each name one string object however often it occurs): a
        record costs about what it cost in the traced run, not the several
        times more of JSON's lists and fresh strings."""
        names: dict[str, str] = {}

        def name(text: str) -> str:
            return names.setdefault(text, text)

        ops = [
            OpRecord(
                name(op), name(phase), name(path), line, name(module), step, tuple(map(name, out_meta)),
                args, tuple(inputs), tuple(outputs), tuple(map(tuple, leaves)), seeded,
            )
            for rows in iter_trace_rows(path)
            for op, phase, path, line, module, step, out_meta, args, inputs, outputs, leaves, seeded in rows
        ]
        tail = read_trace_tail(path)
        return cls(ops, tail["digests"], [RngEvent._make(row) for row in tail["rng_events"]], tail["final"])

    def save(self, path: str | Path) -> None:
        write_trace(path, self.ops, self.digests, self.rng_events, self.final)

    def phase_of(self, index: int) -> str:
        """The phase a report gives op ``index``: setup only for a line that
        never ran again once training started (a batch made in the loop's
        first iteration, before its first forward, is the loop's forward)."""
        record = self.ops[index]
        if record.phase != SETUP:
            return record.phase
        if self._trained_lines is None:
            self._trained_lines = {(op.path, op.line) for op in self.ops if op.phase != SETUP}
        return FORWARD if (record.path, record.line) in self._trained_lines else SETUP

    def value(self, digest_id: int):
        if digest_id < 0:
            return "uninitialized" if digest_id == UNINIT else "unread"
        return self.digests[digest_id]


_ROWS_PER_LINE = 4096  # records serialized at a time, a line of the file each


class TraceWriter:
    """Writes trace.json as the records come, a few thousand records a line,
    so that neither the records nor the file's text (as long again) is ever
    held whole; the digests, generator events and final state are written at
    ``close()``, which makes ``path`` appear whole (it is written beside it
    until then): a run that dies leaves no half trace behind."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._partial = self.path.with_name(self.path.name + ".partial")
        self._out = open(self._partial, "w", encoding="utf-8")
        self._out.write('{"ops": [')
        self._separator = "\n"

    def write_ops(self, ops: Iterable[Sequence]) -> None:
        """Append records in ``OpRecord``'s field order (any sequences: the tracer's plain tuples)."""
        for chunk in _chunks(ops, _ROWS_PER_LINE):
            self._out.write(self._separator + json.dumps(chunk)[1:-1])
            self._separator = ",\n"
        self._out.flush()  # empty before the script can fork: a child that exits through Python writes nothing twice

    def close(self, digests: list[int], rng_events: list, final: dict) -> None:
        self._out.write("\n], " + json.dumps({"digests": digests, "rng_events": rng_events, "final": final})[1:])
        self._out.close()
        os.replace(self._partial, self.path)


def write_trace(path: str | Path, ops: Iterable[Sequence], digests: list[int], rng_events: list, final: dict) -> None:
    """Write trace.json at once (``TraceWriter``, with every record)."""
    writer = TraceWriter(path)
    writer.write_ops(ops)
    writer.close(digests, rng_events, final)


def iter_trace_rows(path: str | Path) -> Iterator[list]:
    """The records of a trace.json ``TraceWriter`` wrote, a line (a few
    thousand records, as lists) at a time: a reader that goes through them in
    order holds one line, not the trace."""
    with open(path, encoding="utf-8") as lines:
        next(lines)  # '{"ops": ['
        for line in lines:
            if line.startswith("], "):
                return
            yield json.loads("[" + line.rstrip().removesuffix(",") + "]")


def read_trace_tail(path: str | Path) -> dict:
    """A trace.json's fields other than its records (digests, rng_events, final), from its last line."""
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            if line.startswith("], "):
                return json.loads("{" + line[3:])
    raise ValueError(f"{path}: not a whole trace")


def _chunks(items: Iterable, size: int) -> Iterator[list]:
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk
