"""A run's final state as the parent of ``detaudit run`` compares it, without torch.

The child writes its final state (``record/final_state.py``) and, beside it, each tensor's
dtype, shape and digest (the tracer's ``host_digest`` of its CPU copy).  Two
states are compared by those: a tensor whose digests agree is identical, bit
for bit.  Only when some digests differ (or one could not be taken) are the
tensors loaded, with torch, to measure how they differ (``TensorDiff``).  A
deterministic audit never imports torch in the parent.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable


@dataclass
class TensorDiff:
    name: str
    shape: list[int]
    dtype: str
    max_abs_diff: float
    max_rel_diff: float
    max_ulp: int
    fraction_differing: float

    def to_dict(self) -> dict:
        return asdict(self)


def missing_diff(name: str, shape: list[int]) -> TensorDiff:
    """A tensor present in one run only: it differs as much as anything can."""
    return TensorDiff(name, list(shape), "missing in one run", float("inf"), float("inf"), 0, 1.0)


class SavedState:
    """One run's final state: ``digests`` maps each tensor's name to [dtype,
    shape, digest] (digest None where none could be taken: compared by
    loading); ``load()`` returns the tensors themselves, by name."""

    def __init__(self, digests: dict[str, list], load: Callable[[], dict]):
        self.digests = digests
        self._load = load
        self._tensors: dict | None = None

    @classmethod
    def of_file(cls, path: str, digests: dict[str, list]) -> "SavedState":
        """The state a child saved (``state.save_state``'s payload entries)."""

        def load() -> dict:
            from detaudit.dynamic.record.final_state import load_state

            return load_state(path)

        return cls(digests, load)

    @classmethod
    def of_tensors(cls, tensors: dict) -> "SavedState":
        """A state held in this process (the in-process ``audit()``)."""
        from detaudit.dynamic.record.final_state import state_digests

        return cls(state_digests(tensors), lambda: tensors)

    def __len__(self) -> int:
        return len(self.digests)

    def tensor(self, name: str):
        if self._tensors is None:
            self._tensors = self._load()
        return self._tensors[name]


def compare_saved_states(a: SavedState, b: SavedState) -> list[TensorDiff]:
    """Differing tensors, by name; a tensor present on one side only counts as
    differing.  Tensors whose digests agree are not loaded."""
    diffs = []
    for name in sorted(a.digests.keys() | b.digests.keys()):
        mine, theirs = a.digests.get(name), b.digests.get(name)
        if mine is None or theirs is None:
            diffs.append(missing_diff(name, (mine or theirs)[1]))
        elif mine != theirs or mine[2] is None:
            from detaudit.dynamic.record.final_state import tensor_diff

            diff = tensor_diff(name, a.tensor(name), b.tensor(name))
            if diff:
                diffs.append(diff)
    return diffs
