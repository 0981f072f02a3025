"""The op trace: what a traced run records and the comparison reads.

One ``OpRecord`` per aten op and one ``RngEvent`` per call that set the torch
generators' state, plus the list of digests that records refer to by position
(a *digest id*) and the digest id of each tensor of the final state.  ``Trace``
holds them, and writes and reads ``trace.json`` (records as JSON arrays in
field order, so a long trace stays compact).

Python reads of tensor data that dispatch no aten op (``Tensor.tolist``,
``Tensor.numpy``, ``torch.save``) are records too, named by the Python call
(``PYTHON_READS``): the comparison must see every value Python took out of
the trace.

The tracer (child process, torch) writes through this module; the comparison
(parent process) reads through it.  It imports neither torch nor numpy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, Sequence

UNINIT = -1  # digest id of an allocation op's output: equal in every run on purpose
# digest id of an input whose bytes the op does not read: its own scratch space
# (an argument the schema names ``workspace`` or ``reserve``) or an argument it
# only overwrites (copy_'s destination, an ``out=`` tensor): equal in every run
# on purpose (see tracer.SCRATCH_ARGUMENTS and OVERWRITING_OPS)
UNREAD = -2

# records of Python calls that read tensor data without dispatching an aten op:
# the call's name -> the type of what Python gets (``out_meta``)
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
        data = json.loads(Path(path).read_text())
        return cls(
            [OpRecord._make(row) for row in data["ops"]],
            data["digests"],
            [RngEvent._make(row) for row in data.get("rng_events", [])],
            data.get("final", {}),
        )

    def save(self, path: str | Path) -> None:
        Path(path).write_text(
            json.dumps({"ops": self.ops, "digests": self.digests, "rng_events": self.rng_events, "final": self.final})
        )

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
