"""What ``detaudit run --vary`` can change, as one table.

A variation is one of two shapes:

* a *setting changed between repeats* of the script (threads, hash seed,
  CPU capability): runs 1 and 2 keep its control setting (the control pair)
  and later runs take varied ones; a root cause seen only in pairs whose
  setting differed is reported as the variation's cause kind.  The entry
  names the child setting (``detaudit.launch.child_settings``) that carries
  the setting to the child, which says how it is made there and which
  fingerprint key shows what a run ran with.
* an *audit of its own* in place of the repeats (batch): ``audit`` names the
  function, as "module:function", that runs it and returns its report; the
  runner calls it with the script, its arguments, the run options and the
  options the entry names (``options``: the command line adds those flags).

The CLI's choices and help, the runner and the analysis all read this table.
Imports neither torch nor numpy.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from detaudit.dynamic.compare.causes import BATCH_VARIANT_OP, CPU_CAPABILITY, HASH_ORDER, THREAD_COUNT, CauseKind
from detaudit.launch.child_settings import child_setting


@dataclass(frozen=True)
class Variation:
    name: str  # the --vary value
    help: str  # what it varies, for --help
    cause: CauseKind  # what a difference it brings out is reported as
    # a setting changed between repeats:
    setting: str = ""  # the child setting (launch/child_settings.py) that carries it to the child
    control: Any = None  # the setting of runs 1 and 2
    varied: Callable[[int], Any] | None = None  # the setting of the k-th varied run, k = 1, 2, ...
    # or an audit of its own, "module:function", in place of the repeats
    audit: str = ""
    options: tuple[str, ...] = ()  # the run options (command-line flags) its audit takes

    @property
    def repeats_script(self) -> bool:
        """Whether it is a setting changed between repeats (else an audit of its own)."""
        return not self.audit

    def settings(self, repeats: int) -> list:
        """The setting of each repeat."""
        return [self.control, self.control] + [self.varied(k) for k in range(1, repeats - 1)]

    def audit_function(self) -> Callable:
        module, function = self.audit.split(":")
        return getattr(importlib.import_module(module), function)

    def in_effect(self, environment: dict) -> Any:
        """The setting a run ran with, from its fingerprint (the script may have set its own)."""
        return environment.get(child_setting(self.setting).fingerprint_key)


VARIATIONS: dict[str, Variation] = {
    variation.name: variation
    for variation in (
        Variation("threads", "intra-op threads", THREAD_COUNT, setting="threads", control=1, varied=lambda k: 2 * k),
        Variation("hashseed", "PYTHONHASHSEED", HASH_ORDER, setting="hash-seed", control="0", varied=str),
        # the machine's best (the variable unset) against the vector-free kernels: the closest a CPU
        # comes to running the same code on another machine
        Variation(
            "cpu-capability", "the CPU's vector instructions (ATEN_CPU_CAPABILITY=default against the machine's best)",
            CPU_CAPABILITY, setting="cpu-capability", control=None, varied=lambda k: "default",
        ),
        Variation(
            "batch",
            "the batch a sample is in (calls the script's detaudit_batch_entry on detaudit_batch_samples)",
            BATCH_VARIANT_OP,
            audit="detaudit.dynamic.batch.vary:audit_batch_script",
            options=("batch_sizes", "positions"),
        ),
    )
}
