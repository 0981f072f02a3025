"""What ``detaudit run --remedy`` can change to make a script reproducible, as
one table, and which of those fit a root cause.

A remedy names the child settings it makes (``detaudit.launch
.child_settings``), the way a variation does (``variations.py``): the
bootstrap makes them in the child before the script runs, as code pasted at
the top of the script would, and after the variation's own setting (pinning
the thread count overrides a varied one, as ``torch.set_num_threads`` at the
top of a script overrides the machine's default).  ``paste_code`` writes the
same changes as plain torch / numpy / random code, each child setting as its
table entry pastes it.  Backend settings are named by their id in the
settings table (``knowledge/backend_settings.json``) and take its safe
values where they matter on the audited machine.

Which remedies fit a cause (``candidates``): its kind's ``remedies``
(``compare/causes.py``), except for a nondeterministic op the ops table knows: then
the table's entry says what fixes it (deterministic algorithms where they
switch the op to a deterministic kernel, one CPU thread, settings such as
cuDNN's), and where deterministic algorithms raise, what to compute instead.

Imports neither torch nor numpy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from detaudit.dynamic.compare.causes import CAUSE_KINDS, NONDETERMINISTIC_OP
from detaudit.knowledge.backend_settings import Setting, backend_settings
from detaudit.knowledge.versions import version_in_range
from detaudit.launch.child_settings import PasteContext, child_setting, paste_settings


@dataclass(frozen=True)
class Machine:
    """What the audited process was: it decides a few options' values, and which remedies can help."""

    environment: Mapping[str, Any]  # the run report's fingerprint
    default_threads: int  # torch's intra-op thread count on this machine when nothing pins it
    seeded: bool = True  # whether detaudit seeded the global generators before the script (not with --no-seed)

    @property
    def torch_version(self) -> str | None:
        return self.environment.get("torch.version")

    @property
    def devices(self) -> tuple[str, ...]:
        return ("cpu", "cuda") if self.environment.get("torch.cuda.is_available") else ("cpu",)

    def needs(self, setting: Setting) -> bool:
        """Whether the setting matters on this machine (its ``matters`` devices and torch versions)."""
        matters = setting.matters
        if matters.devices is not None and not set(matters.devices) & set(self.devices):
            return False
        version = self.torch_version
        return matters.torch is None or version is None or version_in_range(version, matters.torch)


@dataclass(frozen=True)
class Remedy:
    name: str
    title: str  # for tables; "{threads}" is replaced by the thread count
    # child settings it makes: name -> value, or a function of the machine giving it
    settings: Mapping[str, Any] = field(default_factory=dict)
    backend: tuple[str, ...] = ()  # settings-table ids, set to their safe values where they matter
    in_code: str = ""  # the change in the script's own code that does the same, "{where}" = the lines
    unseeded_only: bool = False  # helps only a run detaudit did not seed (--no-seed): elsewhere it changes nothing

    def __post_init__(self) -> None:
        for name in self.settings:
            child_setting(name)

    def options(self, machine: Machine) -> dict[str, Any]:
        """The child settings it makes on this machine."""
        options = {name: value(machine) if callable(value) else value for name, value in self.settings.items()}
        table = backend_settings()
        chosen = {i: table[i].safe for i in self.backend if machine.needs(table[i])}
        if chosen:
            options["backend"] = chosen
        return options

    def label(self, machine: Machine) -> str:
        return self.title.format(threads=self.options(machine).get("threads"))


REMEDIES: dict[str, Remedy] = {
    remedy.name: remedy
    for remedy in (
        Remedy("one-thread", "one thread", settings={"threads": 1}),
        Remedy("pin-threads", "threads pinned to {threads}", settings={"threads": lambda machine: machine.default_threads}),
        Remedy(
            "seed-globals",
            "torch, NumPy and Python seeded at start-up",
            settings={"seed-globals": 0},
            in_code="or seed once at the top of the script, before the model and the data are made "
            "(what the draws at {where} read)",
            unseeded_only=True,
        ),
        Remedy(
            "seed-generators",
            "seeded generators",
            settings={"seed-generators": True},
            in_code="or pass a seed where each generator is made: {where}",
        ),
        Remedy(
            "hash-seed",
            "PYTHONHASHSEED=0",
            settings={"hash-seed": "0"},
            in_code="or make the data independent of hash order: sorted(...) instead of a set's order, "
            "hashlib instead of hash(), where it is built ({where})",
        ),
        Remedy(
            "pin-cpu-capability",
            "ATEN_CPU_CAPABILITY=default",
            settings={"cpu-capability": "default"},
            in_code="or export ATEN_CPU_CAPABILITY=default where the job starts, on every machine that must agree; "
            "or accept the difference: {where} rounds differently per instruction set",
        ),
        Remedy("cudnn-deterministic", "cuDNN deterministic, no autotuning", backend=("cudnn-benchmark", "cudnn-deterministic")),
        Remedy("deterministic-algorithms", "deterministic algorithms", backend=("deterministic-algorithms", "cublas-workspace-config")),
    )
}
#: what ``detaudit.enable_determinism()`` does, as a child setting (the bootstrap calls it)
FULL_DETERMINISM = {"deterministic": True}
FULL_DETERMINISM_TITLE = "full determinism (detaudit.enable_determinism())"


def remedy_with_settings(setting_ids: Iterable[str]) -> Remedy | None:
    """The remedy that sets exactly these settings (an ops-table entry's ``deterministic_settings``)."""
    wanted = set(setting_ids)
    return next((r for r in REMEDIES.values() if r.backend and set(r.backend) == wanted), None)


# -- which remedies fit a cause ----------------------------------------------------------
@dataclass
class Candidates:
    """The remedies to try for one cause, most targeted first, and what the
    knowledge base says that no setting can do (``advice``)."""

    remedies: list[str] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)


def candidates(cause, machine: Machine) -> Candidates:
    """For a ``RootCause`` of the run report."""
    if cause.kind is NONDETERMINISTIC_OP:
        known = _ops_table_candidates(cause.op, machine)
        if known is not None:
            return known
    return Candidates([name for name in cause.kind.remedies if not (REMEDIES[name].unseeded_only and machine.seeded)])


def _ops_table_candidates(op: str, machine: Machine) -> Candidates | None:
    from detaudit.knowledge.ops import load_ops_table

    entries = load_ops_table().entries_for_aten(op)
    if not entries:
        return None
    found = Candidates()
    for entry in entries:
        behaviours = [
            b for device in machine.devices for b in entry.behaviours_for(device, machine.torch_version)
        ]
        if not behaviours:
            continue
        modes = {b.deterministic_mode for b in behaviours}
        names = []
        if entry.deterministic_settings:
            remedy = remedy_with_settings(entry.deterministic_settings)
            names.append(remedy.name)
        if entry.one_thread_deterministic and any("cpu" in b.devices for b in behaviours):
            names.append("one-thread")
        if "switches" in modes:
            names.append("deterministic-algorithms")
        if modes & {"raises", "nothing"}:
            found.advice.append(no_deterministic_kernel(entry))
        found.remedies += [name for name in names if name not in found.remedies]
    return found


def no_deterministic_kernel(entry) -> str:
    """What to do about an op deterministic algorithms cannot fix."""
    replacement = entry.replacement or "the ops table knows no replacement; keep it out of runs that must reproduce"
    return f"{entry.summary}: no deterministic kernel: replace the op. {replacement}"


_EXCEPTION_PREFIX = re.compile(r"^\s*[\w.]*(Error|Exception): ")  # "RuntimeError: " before torch's message


def failure_summary(output: str) -> str:
    """One short line for a run that failed: torch's alert reduced to its first
    clause, else the last line of the output."""
    from detaudit.knowledge.ops import alert_caller

    lines = output.strip().splitlines() or ["no output"]
    for line in reversed(lines):
        caller = alert_caller(_EXCEPTION_PREFIX.sub("", line))
        if caller:
            return f"{caller} does not have a deterministic implementation"
    return lines[-1] if len(lines[-1]) <= 160 else lines[-1][:157] + "..."


def deterministic_algorithms_raised(error: str) -> str | None:
    """Advice when a run under deterministic algorithms failed with torch's
    "X does not have a deterministic implementation" error (else None)."""
    from detaudit.knowledge.ops import alert_caller, load_ops_table

    raised = [line for line in error.splitlines() if alert_caller(line)]
    if not raised:
        return None
    caller = alert_caller(_EXCEPTION_PREFIX.sub("", raised[-1]))
    entry = load_ops_table().lookup_alert(caller)
    if entry is None:
        return f"{caller} has no deterministic implementation: no deterministic kernel: replace the op"
    return f"deterministic algorithms raise in {caller}: " + no_deterministic_kernel(entry)


# -- combining remedies, and writing them as code -------------------------------------
class Conflict(ValueError):
    """Two remedies set the same option to different values."""


def combined_options(remedies: Iterable[Remedy], machine: Machine) -> dict[str, Any]:
    """The child settings of several remedies together: backend settings add up;
    any other setting two of them make must get the same value."""
    options: dict[str, Any] = {}
    for remedy in remedies:
        for key, value in remedy.options(machine).items():
            if isinstance(value, dict):
                options.setdefault(key, {}).update(value)
            elif key in options and options[key] != value:
                raise Conflict(f"{key} {options[key]!r} and {value!r}")
            else:
                options[key] = value
    return options


def _seeding_code(seed: int) -> tuple[list[str], list[str]]:
    """What detaudit ran before each run when it seeded (``--seed``)."""
    return ["import random", "import numpy as np", "import torch"], [
        f"# the seeds every audited run started from (--seed {seed})",
        f"random.seed({seed})",
        f"np.random.seed({seed})",
        f"torch.manual_seed({seed})",
    ]


def paste_code(options: Mapping[str, Any], machine: Machine, *, seed: int | None, generators: Iterable[str]) -> str:
    """Plain Python, no detaudit import, that makes a script run as the
    remedy's options made it run: to paste at the top of the script.
    ``generators``: those the script made without a seed (only they are
    seeded); ``seed``: detaudit's seed, also seeded (None with ``--no-seed``)."""
    parts: list[tuple[list[str], list[str]]] = []  # (imports, statements)
    if seed is not None:
        parts.append(_seeding_code(seed))
    pasted = paste_settings(options, PasteContext(machine.torch_version, seed, tuple(generators)))
    parts += [(list(p.imports), list(p.statements)) for p in pasted if p.imports or p.statements]
    lines = [line for p in pasted for line in p.before_imports]
    lines += [""] if lines else []
    lines += dict.fromkeys(line for imports, _ in parts for line in imports)
    for _, statements in parts:
        lines += ["", *statements]
    return "\n".join(lines) + "\n"


def check_registry() -> None:
    """Every remedy a cause kind names exists (run by the tests)."""
    for kind in CAUSE_KINDS.values():
        for name in kind.remedies:
            if name not in REMEDIES:
                raise LookupError(f"cause kind {kind.name} names remedy {name!r}, which remedy/catalogue.py lacks")
