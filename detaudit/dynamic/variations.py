"""What ``detaudit run --vary`` can change between repeats, as one table.

Runs 1 and 2 keep a variation's control setting (the control pair) and later
runs take varied ones; a root cause seen only in pairs whose setting differed
is reported as the variation's cause kind.  Each entry names the
``LaunchOptions`` field its setting goes to; ``launch.py`` and the bootstrap
apply it in the child.  The CLI's choices and help, the runner and the
analysis all read this table.  Imports neither torch nor numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from detaudit.dynamic.causes import HASH_ORDER, THREAD_COUNT, CauseKind


@dataclass(frozen=True)
class Variation:
    name: str  # the --vary value
    help: str  # what it varies, for --help
    launch_option: str  # the LaunchOptions field that carries the setting to the child
    control: Any  # the setting of runs 1 and 2
    varied: Callable[[int], Any]  # the setting of the k-th varied run, k = 1, 2, ...
    cause: CauseKind  # what a difference that only shows when the setting changes is

    def settings(self, repeats: int) -> list:
        """The setting of each repeat."""
        return [self.control, self.control] + [self.varied(k) for k in range(1, repeats - 1)]


VARIATIONS: dict[str, Variation] = {
    variation.name: variation
    for variation in (
        Variation("threads", "intra-op threads", "threads", 1, lambda k: 2 * k, THREAD_COUNT),
        Variation("hashseed", "PYTHONHASHSEED", "hash_seed", "0", str, HASH_ORDER),
    )
}
