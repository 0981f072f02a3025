"""The resumed run against the straight one, by digest (torch-free).

Each run's payload holds a list of boundaries, ``{"at": "start"|"end",
"step": s, "digests": {component: {name: digest}}}``, as ``child.py`` records
them.  The resumed run's step ``s`` is the straight run's step ``K + s``.  A
component differs at a boundary where one of its names has another digest
in the two runs, or is in one of them only (a scheduler the resumed run
never made).  Each component is reported once, at its first boundary, and the
differences come in the order they first appear, a boundary's in the order
of ``COMPONENTS`` (what a checkpoint forgets before what that changes).
A component that first differs at a later boundary is *downstream*: it may
only follow from what differed first.
"""

from __future__ import annotations

from dataclasses import dataclass

from detaudit.resume.components import COMPONENTS


@dataclass
class Difference:
    component: str  # a name of COMPONENTS
    step: int  # the overall step (the straight run's)
    at: str  # "start" (the state the step starts from, and its batch) or "end"
    names: list[str]  # what differs, in the straight run's order, then what only the resumed run has
    max_abs_diff: float | None = None  # measured where both runs kept the tensors
    read_by: dict | None = None  # the first op that read it after the resume: {"op", "path", "line", "module"}
    # first seen after the first boundary that differs: it may follow from what differed there
    downstream: bool = False

    @property
    def meaning(self) -> str:
        return COMPONENTS[self.component].meaning

    @property
    def fix(self) -> str:
        return COMPONENTS[self.component].fix


def differences(straight: list[dict], resumed: list[dict], interrupt_at: int) -> list[Difference]:
    reference = {(boundary["at"], boundary["step"]): boundary["digests"] for boundary in straight}
    found: dict[str, Difference] = {}
    for boundary in resumed:
        overall = boundary["step"] + interrupt_at
        theirs = reference.get((boundary["at"], overall))
        if theirs is None:  # the straight run stopped before it
            continue
        for component in COMPONENTS:
            if component in found:
                continue
            names = differing_names(theirs.get(component, {}), boundary["digests"].get(component, {}))
            if names:
                found[component] = Difference(component, overall, boundary["at"], names)
    ordered = sorted(found.values(), key=lambda d: (d.step, d.at != "start", list(COMPONENTS).index(d.component)))
    for difference in ordered:
        difference.downstream = (difference.step, difference.at) != (ordered[0].step, ordered[0].at)
    return ordered


def differing_names(expected: dict, got: dict) -> list[str]:
    """The names of one component whose digests differ: in ``expected``'s order, then those only ``got`` has."""
    return [name for name in expected if got.get(name) != expected[name]] + [name for name in got if name not in expected]


def compared_steps(straight: list[dict], resumed: list[dict], interrupt_at: int) -> list[int]:
    """The overall steps at which both runs have a boundary."""
    theirs = {(b["at"], b["step"]) for b in straight}
    return sorted({b["step"] + interrupt_at for b in resumed if (b["at"], b["step"] + interrupt_at) in theirs})
