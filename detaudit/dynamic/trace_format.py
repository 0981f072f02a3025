"""The op trace: what a traced run records and the comparison reads.

One ``OpRecord`` per aten op and one ``RngEvent`` per call that set the torch
generators' state, plus the list of digests that records refer to by position
(a *digest id*).  ``Trace`` holds them, and writes and reads ``trace.json``
(records as JSON arrays in field order, so a long trace stays compact).

The tracer (child process, torch) writes through this module; the comparison
(parent process) reads through it.  It imports neither torch nor numpy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, Sequence

UNINIT = -1  # digest id of an allocation op's output: equal in every run on purpose

# phases of an op
FORWARD, BACKWARD, OPTIMIZER = "forward", "backward", "optimizer"

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
    phase: str  # FORWARD, BACKWARD or OPTIMIZER
    path: str  # user source file (relative to the run's working directory when under it); "" if none
    line: int  # 0 if no user frame
    module: str  # module path that was running ("model.blocks.0"), "" outside modules
    step: int  # optimizer step it ran in, from 1
    out_meta: Sequence[str]  # per result: "float32[2, 3]" for a tensor, repr for a plain value
    args: int  # CRC-32 of the non-tensor arguments
    inputs: Sequence[int]  # digest ids of the tensor inputs, in argument order
    outputs: Sequence[int]  # digest ids of the outputs (views have none), then of written inputs
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


@dataclass
class Trace:
    ops: list[OpRecord]
    digests: list[int]  # a digest id indexes this list
    rng_events: list[RngEvent] = field(default_factory=list)

    @classmethod
    def load(cls, path: str | Path) -> "Trace":
        data = json.loads(Path(path).read_text())
        return cls(
            [OpRecord._make(row) for row in data["ops"]],
            data["digests"],
            [RngEvent._make(row) for row in data.get("rng_events", [])],
        )

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps({"ops": self.ops, "digests": self.digests, "rng_events": self.rng_events}))

    def value(self, digest_id: int):
        return "uninitialized" if digest_id == UNINIT else self.digests[digest_id]
