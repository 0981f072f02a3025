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
        """The state a child saved (``final_state.save_state``'s payload entries)."""

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
            diff = tensor_diff(name, a.tensor(name), b.tensor(name))
            if diff:
                diffs.append(diff)
    return diffs


def _ordered_bits(tensor):
    """Float bits mapped to int64 so that adjacent floats differ by 1."""
    import torch

    int_type = {2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]
    bits = tensor.contiguous().view(int_type).to(torch.int64)
    sign_mask = torch.iinfo(int_type).max
    return torch.where(bits < 0, -(bits & sign_mask), bits)


def tensor_diff(name: str, a, b) -> TensorDiff | None:
    """How tensor ``b`` differs from tensor ``a`` bit for bit; None when they are identical."""
    import torch

    label = None
    if a.shape == b.shape and a.dtype != b.dtype and a.dtype.is_floating_point and b.dtype.is_floating_point:
        # another precision (a float64 reference, a float32 run): compared rounded to the narrower dtype
        label = f"{str(a.dtype).removeprefix('torch.')}->{str(b.dtype).removeprefix('torch.')}"
        narrower = min(a.dtype, b.dtype, key=lambda dtype: torch.finfo(dtype).bits)
        a, b = a.to(narrower), b.to(narrower)
    if a.shape != b.shape or a.dtype != b.dtype:
        return TensorDiff(name, list(b.shape), f"{a.dtype}->{b.dtype}", float("inf"), float("inf"), 0, 1.0)
    a_bits, b_bits = (t.contiguous().view(-1) for t in (a, b))
    if a.dtype.is_floating_point and a.element_size() in (2, 4, 8):
        int_type = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        differing = a_bits.view(int_type) != b_bits.view(int_type)
    elif a.dtype.is_complex:
        differing = (torch.view_as_real(a_bits) != torch.view_as_real(b_bits)).any(-1)
    else:
        differing = a_bits != b_bits
    count = int(differing.sum())
    if count == 0:
        return None
    max_ulp = 0
    if a.dtype.is_floating_point and a.element_size() in (2, 4, 8):
        max_ulp = int((_ordered_bits(a_bits) - _ordered_bits(b_bits)).abs().max())
    wide_a, wide_b = a_bits.to(torch.float64), b_bits.to(torch.float64)
    abs_diff = (wide_a - wide_b).abs()
    rel_diff = abs_diff / wide_a.abs().clamp_min(torch.finfo(torch.float64).tiny)
    return TensorDiff(
        name=name,
        shape=list(a.shape),
        dtype=label or str(a.dtype).removeprefix("torch."),
        max_abs_diff=float(abs_diff.nan_to_num(nan=float("inf")).max()),
        max_rel_diff=float(rel_diff.nan_to_num(nan=float("inf")).max()),
        max_ulp=max_ulp,
        fraction_differing=count / max(a.numel(), 1),
    )
