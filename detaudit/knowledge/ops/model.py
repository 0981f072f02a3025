"""The ops table's data model: what an entry says, typed and frozen.

Built only by :mod:`.loading` from a validated document; read by the matcher,
the static rule, the dynamic report and ``detaudit ops``.  The vocabularies
below are also enumerated in ``nondeterministic_ops.schema.json`` (a test keeps
them equal).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from detaudit.knowledge.versions import version_in_range

DEVICES = ("cpu", "cuda")
PHASES = ("forward", "backward")
SOURCE_KINDS = ("docs", "alert", "measurement", "source", "issue")
SPELLING_KINDS = ("function", "module", "method")
CONDITION_TESTS = ("equals", "in", "not_in", "passed", "not_number", "reshaped")
#: Tensor methods whose result is the receiver with its dimensions moved (the ``reshaped`` test).
RESHAPING_METHODS = ("transpose", "permute", "movedim", "moveaxis", "swapaxes", "swapdims")

# What torch.use_deterministic_algorithms(True) does to an op, worded for hints;
# ``{where}`` becomes " on CUDA" when the answer differs between devices.
DETERMINISTIC_MODES = {
    "raises": "raises{where}: no deterministic implementation",
    "switches": "switches to a deterministic kernel{where}",
    "nothing": "does not help{where}: no alert, the race stays",
}


class _Missing:
    """A parameter without a default."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


@dataclass(frozen=True)
class Param:
    name: str
    position: int | None  # None for keyword-only parameters
    default: Any = MISSING


@dataclass(frozen=True)
class Condition:
    """An argument condition of an entry: ``test`` is one of
    ``equals``/``in``/``not_in`` (compare a literal), ``reshaped`` (the
    argument is a ``.transpose()``/``.permute()``/``.movedim()`` result: only the
    call site's text shows it), ``passed`` (given and not None) and
    ``not_number`` (given and not a numeric literal); see
    :func:`detaudit.knowledge.ops.matching.condition_holds`."""

    arg: str
    test: str  # one of CONDITION_TESTS
    expected: Any = None  # the literal, or a tuple of them for "in"

    def describe(self) -> str:
        if self.test == "equals":
            return f"{self.arg}={self.expected!r}"
        if self.test in ("in", "not_in"):
            return f"{self.arg} {'in' if self.test == 'in' else 'not in'} {{{', '.join(repr(v) for v in self.expected)}}}"
        if self.test == "passed":
            return f"{self.arg}=..."
        if self.test == "reshaped":
            return f"{self.arg} with its dimensions moved"
        return f"tensor {self.arg}"


@dataclass(frozen=True, repr=False)
class Spelling:
    """One Python spelling that reaches an op: a function or ``nn`` module
    class by qualified name, or a Tensor method by attribute name."""

    kind: str  # one of SPELLING_KINDS
    name: str
    params: tuple[Param, ...]
    shared_name: bool = False  # the method name is common on numpy/pandas objects too
    when: tuple[Condition, ...] | None = None  # overrides the entry's conditions

    def __repr__(self) -> str:
        return f"Spelling({self.kind}={self.name!r})"

    @property
    def display(self) -> str:
        return f".{self.name}()" if self.kind == "method" else self.name


@dataclass(frozen=True)
class Behaviour:
    devices: tuple[str, ...]
    phases: tuple[str, ...]
    mechanism: str
    deterministic_mode: str  # a key of DETERMINISTIC_MODES
    torch: str | None = None  # version range, e.g. ">=2.11,<2.13"; None: the whole table range

    def applies(self, device: str | None = None, torch_version: str | None = None) -> bool:
        if device is not None and device not in self.devices:
            return False
        return torch_version is None or self.torch is None or version_in_range(torch_version, self.torch)


class HasBehaviours:
    """Where and how a set of behaviours is nondeterministic, for anything
    holding ``behaviours``: a table entry, or the part of it a call site reaches."""

    behaviours: tuple[Behaviour, ...]

    @property
    def devices(self) -> tuple[str, ...]:
        """The devices any behaviour applies to, in canonical order."""
        return tuple(d for d in DEVICES if any(d in b.devices for b in self.behaviours))

    @property
    def phases(self) -> tuple[str, ...]:
        """The phases (forward/backward) any behaviour applies to, in canonical order."""
        return tuple(p for p in PHASES if any(p in b.phases for b in self.behaviours))

    @property
    def deterministic_modes(self) -> frozenset[str]:
        return frozenset(b.deterministic_mode for b in self.behaviours)

    @property
    def raising_devices(self) -> tuple[str, ...]:
        """Devices where deterministic mode raises."""
        return tuple(
            d for d in DEVICES if any(d in b.devices and b.deterministic_mode == "raises" for b in self.behaviours)
        )


def _devices_text(devices: Iterable[str]) -> str:
    names = [{"cpu": "CPU", "cuda": "CUDA"}[d] for d in DEVICES if d in set(devices)]
    return " and ".join(names)


@dataclass(frozen=True, repr=False)
class OpEntry(HasBehaviours):
    id: str
    summary: str
    spellings: tuple[Spelling, ...]
    when: tuple[Condition, ...]
    static: str | None  # why a call site alone cannot decide it, when it cannot
    #: what a call site may show that decides ``static`` after all (any one of them)
    certain_when: tuple[Condition, ...]
    aten: tuple[str, ...]
    alerts: tuple[str, ...]
    behaviours: tuple[Behaviour, ...]
    sources: tuple[Mapping[str, str], ...]
    recipe: str | None
    note: str | None
    # what fixes it besides deterministic algorithms (read by the remedy search)
    one_thread_deterministic: bool = False  # CPU: deterministic with one intra-op thread
    deterministic_settings: tuple[str, ...] = ()  # settings-table ids whose safe values fix it
    replacement: str | None = None  # what to compute instead where deterministic algorithms raise
    #: why the results are the same whatever the order (atomic adds of ones to float counts): only
    #: deterministic mode's error at the op is a hazard, not the values
    exact_results: str | None = None
    # ``static`` names a run-time choice whose default is the hazard (SDPA's backend on CUDA):
    # a call site is certain unless the code moves off the default
    hazard_by_default: bool = False

    def __repr__(self) -> str:
        return f"OpEntry({self.id!r})"

    def behaviours_for(self, device: str | None = None, torch_version: str | None = None) -> tuple[Behaviour, ...]:
        return tuple(b for b in self.behaviours if b.applies(device, torch_version))

    def hint(self, device: str | None = None, torch_version: str | None = None) -> str:
        """One line: what is nondeterministic, where, and what deterministic
        mode does about it, e.g. "atomicAdd on CUDA (forward);
        torch.use_deterministic_algorithms(True) switches to a deterministic kernel"."""
        behaviours = self.behaviours_for(device, torch_version)
        if not behaviours:
            where = f" on {_devices_text([device])}" if device else ""
            return f"{self.summary}: no known nondeterminism{where} for this torch version"
        hazards = []
        for b in behaviours:
            text = f"{b.mechanism} on {_devices_text(b.devices)} ({', '.join(b.phases)})"
            if text not in hazards:
                hazards.append(text)
        modes = []
        several = len({b.deterministic_mode for b in behaviours}) > 1
        for b in behaviours:
            where = f" on {_devices_text(b.devices)}" if several else ""
            if several and b.torch and torch_version is None:
                where += f" with torch {b.torch}"
            text = DETERMINISTIC_MODES[b.deterministic_mode].format(where=where)
            if text not in modes:
                modes.append(text)
        return f"{'; '.join(hazards)}; torch.use_deterministic_algorithms(True) {', and '.join(modes)}"
