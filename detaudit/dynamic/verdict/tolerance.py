"""``--tolerance``: how far a run may depart from its reference and still pass.

Written ``4ulp`` (units in the last place of each element's dtype) or a
relative difference (``1e-6``).  It is judged on the final state's tensors,
the numbers training goes on from: a run whose every differing final tensor
is within it is *within-tolerance* against its reference, else it *drifts*.
A tensor computed in another precision (``float64->float32``) is judged
rounded to the narrower one (``compare/state_diff.tensor_diff``).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Tolerance:
    ulp: int | None = None  # at most this many ULP per element
    rel: float | None = None  # at most this relative difference per element

    @classmethod
    def parse(cls, text: str) -> "Tolerance":
        """``4ulp`` or ``1e-6``; ``ValueError`` with the reason otherwise."""
        value = text.strip().lower()
        if value.endswith("ulp"):
            number = value.removesuffix("ulp").strip()
            if not number.isdigit():
                raise ValueError(f"expected a whole number of ULP such as 4ulp, got {text!r}")
            return cls(ulp=int(number))
        try:
            rel = float(value)
        except ValueError:
            raise ValueError(f"expected ULP (4ulp) or a relative difference (1e-6), got {text!r}") from None
        if not (math.isfinite(rel) and rel >= 0):
            raise ValueError(f"a relative tolerance must be a finite number >= 0, got {text!r}")
        return cls(rel=rel)

    def allows(self, diff: dict) -> bool:
        """Whether a final tensor's difference (a ``TensorDiff`` dict) is within it."""
        if "float" not in diff["dtype"] or diff["max_abs_diff"] == float("inf"):
            return False  # integers (a step count), another shape, a tensor one side lacks: never close
        if self.ulp is not None:
            return diff["max_ulp"] <= self.ulp
        return diff["max_rel_diff"] <= self.rel

    def __str__(self) -> str:
        return f"{self.ulp}ulp" if self.ulp is not None else f"{self.rel:g}"


def tolerance_argument(text: str) -> Tolerance:
    """argparse ``type=`` for ``--tolerance``."""
    try:
        return Tolerance.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
