"""The kinds of root cause the dynamic pass reports, and what a cause says
about the other run.

Each kind is one ``CauseKind`` entry of this registry: its name (the ``kind``
of the JSON report), code, severity, summary and fix hint, which SARIF and
GitHub annotations describe it with.  The classifier (``classify.py``) and the
variations (``variations.py``) refer to these entries, never to their names:
a new kind is an entry here plus the rule in the classifier that reports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Sequence, Union

from detaudit.findings import Severity


class CauseKind(str):
    """A kind of root cause.  It is a ``str`` equal to its name (the JSON
    report's ``kind``, so reports and comparisons with names keep working)
    that carries its code, severity, summary and fix hint, and the remedies
    ``detaudit run --remedy`` tries for it (names in ``remedy/catalogue.py``, most
    targeted first; for a nondeterministic op the ops table says which fit,
    and these are for ops it does not know).  There is one object per kind:
    the registry's."""

    code: str
    summary: str
    fix_hint: str
    severity: Severity
    remedies: tuple[str, ...]

    def __new__(
        cls,
        code: str,
        name: str,
        summary: str,
        fix_hint: str,
        severity: Severity = Severity.ERROR,
        remedies: tuple[str, ...] = (),
    ):
        kind = super().__new__(cls, name)
        kind.code, kind.summary, kind.fix_hint, kind.severity = code, summary, fix_hint, severity
        kind.remedies = remedies
        return kind

    @property
    def name(self) -> str:
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"<CauseKind {self.code} {self.name}>"

    # copies (dataclasses.asdict deep-copies) and pickles are the registry's object
    def __copy__(self) -> "CauseKind":
        return self

    def __deepcopy__(self, memo) -> "CauseKind":
        return self

    def __reduce__(self):
        return cause_kind, (self.name,)


#: every kind by name
CAUSE_KINDS: dict[str, CauseKind] = {}


def cause_kind(name: str) -> CauseKind:
    return CAUSE_KINDS[name]


def _register(kind: CauseKind) -> CauseKind:
    clash = [known for known in CAUSE_KINDS.values() if kind.code == known.code or kind.name == known.name]
    if clash:
        raise ValueError(f"cause kind {kind.code} {kind.name} clashes with {clash[0].code} {clash[0].name}")
    CAUSE_KINDS[kind.name] = kind
    return kind


NONDETERMINISTIC_OP = _register(
    CauseKind(
        "DYN001",
        "nondeterministic-op",
        "An op produced different bits from bitwise-identical inputs.",
        "Call torch.use_deterministic_algorithms(True) (detaudit.enable_determinism()) or replace the op.",
        remedies=("deterministic-algorithms",),
    )
)
RNG = _register(
    CauseKind(
        "DYN002",
        "rng",
        "A random op drew different numbers: the generator state differed between runs.",
        "Seed every generator once at start-up and do not reseed from entropy (torch.seed(), unseeded Generators).",
        remedies=("seed-globals", "seed-generators"),
    )
)
UNINITIALIZED_MEMORY = _register(
    CauseKind(
        "DYN003",
        "uninitialized-memory",
        "Values were read from an allocation (torch.empty*) that nothing wrote.",
        "Use torch.zeros/torch.full, or write every element before reading it.",
        remedies=("deterministic-algorithms",),  # which fill such memory (fill_uninitialized_memory)
    )
)
EXTERNAL_INPUT = _register(
    CauseKind(
        "DYN004",
        "external-input",
        "Data entering from outside torch (numpy, Python values, files) differed between runs.",
        "Make the data source deterministic: seed numpy Generators, sort file lists and sets.",
        remedies=("seed-globals", "seed-generators", "hash-seed"),
    )
)
CONTROL_FLOW = _register(
    CauseKind(
        "DYN005",
        "control-flow",
        "The runs executed different ops or shapes.",
        "Find what the branch or shape depends on (time, pid, hash order, unseeded randomness).",
        remedies=("seed-globals", "seed-generators", "hash-seed"),
    )
)
THREAD_COUNT = _register(
    CauseKind(
        "DYN006",
        "thread-count",
        "The result changes with the number of intra-op threads.",
        "Pin torch.set_num_threads() for reproducible CPU results across machines.",
        Severity.WARNING,
        remedies=("pin-threads",),
    )
)
HASH_ORDER = _register(
    CauseKind(
        "DYN007",
        "hash-order",
        "The result changes with PYTHONHASHSEED: something iterates a set or uses hash().",
        "Iterate sorted(...) instead of a set, or set PYTHONHASHSEED before the interpreter starts.",
        remedies=("hash-seed",),
    )
)
PYTHON_VALUE = _register(
    CauseKind(
        "DYN008",
        "python-value",
        "A Python value passed to an op (an index, a number, a flag) differed between runs; its tensors did not.",
        "Compute it from stable inputs: hashlib or zlib.crc32 instead of hash() on str (or set PYTHONHASHSEED), "
        "sorted() instead of set order, no clocks or process ids.",
        remedies=("hash-seed", "seed-globals", "seed-generators"),
    )
)

CPU_CAPABILITY = _register(
    CauseKind(
        "DYN011",
        "cpu-capability",
        "The result changes with the vector instructions torch's CPU kernels use (ATEN_CPU_CAPABILITY): "
        "the same seeded script gives other bits on a CPU with other instructions.",
        "Pin ATEN_CPU_CAPABILITY (e.g. default) wherever results must match across machines, "
        "or accept the difference: the ops named here round differently per instruction set.",
        Severity.WARNING,
        remedies=("pin-cpu-capability",),
    )
)

# batch invariance (detaudit.dynamic.batch.audit): a sample's result depends on what it is batched with
BATCH_VARIANT_OP = _register(
    CauseKind(
        "DYN009",
        "batch-variant-op",
        "An op gave a sample different bits in a batch than alone, from the same per-sample input: "
        "its kernel reduces in an order chosen by the batch shape.",
        "Run inference at one fixed batch size (pad and mask), or use batch-invariant kernels for this op.",
    )
)
SAMPLE_MIXING = _register(
    CauseKind(
        "DYN010",
        "sample-mixing",
        "An op's result for one sample depends on the other samples in the batch (batch statistics, "
        "a reduction over the batch).",
        "Call model.eval() for inference (BatchNorm then uses its running statistics), or normalise per sample "
        "(LayerNorm, GroupNorm).",
    )
)

# distributed training (detaudit run --nproc-per-node: launch/torchrun.py, verdict/ranks.py)
COLLECTIVE = _register(
    CauseKind(
        "DYN020",
        "collective",
        "A collective or point-to-point op (c10d) received different data while what every rank sent was "
        "identical: the communication itself decided the result (arrival order of a receive from any source, "
        "a reduction order).",
        "Receive from a fixed source rank in a fixed order (dist.recv(t, src=r)), or reduce with a collective "
        "in a fixed order (all_reduce) instead of summing messages as they arrive.",
    )
)
EARLY_READ = _register(
    CauseKind(
        "DYN021",
        "async-read-before-wait",
        "The result of an asynchronous collective (async_op=True) was read before its work's wait(): what "
        "was read depends on how far the communication had got.",
        "Call work.wait() on the handle the collective returned before using its tensors.",
    )
)
REPLICA_DIVERGENCE = _register(
    CauseKind(
        "DYN022",
        "replica-divergence",
        "Data-parallel ranks held different parameters (or buffers, gradients, optimizer state) at an optimizer "
        "step boundary, where every replica must be identical.",
        "Start every rank from the same weights (seed the model identically on every rank, or broadcast rank "
        "0's parameters, as DistributedDataParallel does) and average gradients across ranks before each step.",
    )
)


# reference runs (detaudit run --against: dynamic/reference/): this run against one saved in another environment
ENVIRONMENT_DRIFT = _register(
    CauseKind(
        "DYN030",
        "environment-drift",
        "An op gave other bits than the saved reference from bitwise-identical inputs: the environment "
        "computes it differently (another CPU instruction set, GPU, library build, torch version or setting).",
        "PyTorch promises no bitwise equality across machines and versions: compare with --tolerance, pin what "
        "differs where it can be pinned (ATEN_CPU_CAPABILITY, threads, precision settings), or keep one reference "
        "per environment.",
    )
)
COMPILED_VS_EAGER = _register(
    CauseKind(
        "DYN031",
        "compiled-vs-eager",
        "A torch.compile'd graph gave other bits than the same code run eagerly, from bitwise-identical inputs: "
        "Inductor fuses, decomposes and reorders the computation, and rounds differently.",
        "Compiled and eager code are not bitwise equal, nor promised to be: keep a compiled reference for a compiled "
        "run (and an eager one for eager), or compare with --tolerance.",
    )
)
#: kinds that, between a run and a reference saved elsewhere, mean "this environment computes the op
#: differently": a kernel's other bits, or a generator's other draws from the same state (its sampler's
#: kernel; an RNG cause whose generator state was set differently stays an RNG cause)
DRIFTING_KINDS = frozenset({NONDETERMINISTIC_OP, RNG})


# -- what a cause says about the other run ------------------------------------
@dataclass(frozen=True)
class OtherRunOp:
    """Control flow: at the first mismatch, what the other run executed instead."""

    reference_outputs: Sequence[str]  # what the reference run's op produced ("float32[16, 8]")
    op: str
    outputs: Sequence[str]
    path: str
    line: int

    def describe(self) -> str:
        return (
            f"run 1 produced {self.reference_outputs}, the other run did {self.op} {self.outputs} "
            f"at {self.path}:{self.line}"
        )

    def to_dict(self) -> dict:
        return {
            "reference_outputs": self.reference_outputs,
            "op": self.op,
            "outputs": self.outputs,
            "path": self.path,
            "line": self.line,
        }


@dataclass(frozen=True)
class ExtraOps:
    """Control flow: one run executed more ops than the other; the first extra one."""

    count: int
    op: str
    path: str
    line: int

    def describe(self) -> str:
        return f"one run ran {self.count} more ops, from {self.op} at {self.path}:{self.line}"

    def to_dict(self) -> dict:
        return {"note": self.describe()}


@dataclass(frozen=True)
class OneSidedOps:
    """Control flow between two environments, realigned: a stretch of ops that
    one side ran and the other did not (another decomposition, another path)."""

    reference: tuple[str, ...]  # "aten.var_mean.correction at train.py:12", the first few of run 1's
    reference_count: int
    other: tuple[str, ...]  # the same of the other run's
    other_count: int

    SHOWN: ClassVar[int] = 3

    @classmethod
    def of(cls, reference_ops, other_ops) -> "OneSidedOps":
        def named(ops):
            return tuple(f"{op.op} at {op.path}:{op.line}" for op in ops[: cls.SHOWN])

        return cls(named(reference_ops), len(reference_ops), named(other_ops), len(other_ops))

    def describe(self) -> str:
        def side(names, count):
            return "none" if not count else ", ".join(names) + (f" and {count - len(names)} more" if count > len(names) else "")

        return (
            f"the op sequences part here and realign after: {self.reference_count} op(s) only in run 1 "
            f"({side(self.reference, self.reference_count)}), {self.other_count} only in the other run "
            f"({side(self.other, self.other_count)})"
        )

    def to_dict(self) -> dict:
        return {"note": self.describe(), "reference_only": list(self.reference), "reference_only_count": self.reference_count,
                "other_only": list(self.other), "other_only_count": self.other_count}


@dataclass(frozen=True)
class RngStateChange:
    """An RNG cause: the last call before it that left the generators in a different state."""

    call: str  # "torch.seed"
    path: str
    line: int
    step: int
    also: tuple[str, ...] = ()  # the other draws from that state, "aten.uniform_.default at train.py:12"

    def describe(self) -> str:
        where = f"{self.path}:{self.line}"
        drawn = f" The same state was drawn from by {_draws(self.also)}." if self.also else ""
        return f"the generator state was set differently by {self.call}() at {where} (step {self.step}).{drawn}"

    def to_dict(self) -> dict:
        return {"note": self.describe(), "call": self.call, "path": self.path, "line": self.line, "also": list(self.also)}


def _draws(also: tuple[str, ...], shown: int = 3) -> str:
    """"A, B, C and 4 more": the other draws of one RNG hazard."""
    more = f" and {len(also) - shown} more" if len(also) > shown else ""
    return ", ".join(also[:shown]) + more


@dataclass(frozen=True)
class UnseededGenerator:
    """An RNG cause no traced call explains: the generator's state already
    differed when the run began (never seeded, or seeded outside the trace)."""

    also: tuple[str, ...] = ()  # the other draws of that hazard, "aten.uniform_.default at train.py:12"

    def describe(self) -> str:
        drawn = f" It was drawn from by {_draws(self.also)} too." if self.also else ""
        return f"no traced call set this generator: it was never seeded, so every run starts from another state.{drawn}"

    def to_dict(self) -> dict:
        return {"note": self.describe(), "also": list(self.also)}


@dataclass(frozen=True)
class RankNote:
    """A distributed cause: what the other ranks did (who sent what, which rank disagreed)."""

    note: str

    def describe(self) -> str:
        return self.note

    def to_dict(self) -> dict:
        return {"note": self.note}


OtherSide = Union[OtherRunOp, ExtraOps, OneSidedOps, RngStateChange, UnseededGenerator, RankNote]
