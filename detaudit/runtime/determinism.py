"""Stabilization mode: every switch that makes torch compute the same bits.

``enable_determinism()`` flips each switch to its deterministic value and
returns a ``DeterminismChanges`` that lists what it changed and can undo it;
``deterministic()`` is the same as a context manager / decorator that restores
every previous setting (and, when it seeded, the RNG states) on exit.

Which settings, to which values, through which spelling on this torch, is
data: ``detaudit/knowledge/backend_settings.json``.  TF32 is turned off
through the ``fp32_precision`` API when this torch has it (2.9+) and through
the legacy flags otherwise, never both: torch raises when the two are mixed.
One torch quirk remains (measured on 2.13): once any cuDNN ``fp32_precision``
was set, even to ``"ieee"``, the legacy getter ``torch.backends.cudnn.allow_tf32``
raises until the settings are restored.  ``detaudit.status()`` and the
fingerprint read the new API first and cope with it.
"""

from __future__ import annotations

import os
import random
import warnings
from contextlib import ContextDecorator
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from detaudit.knowledge.backend_settings import Setting, backend_settings
from detaudit.knowledge.versions import version_in_range
from detaudit.runtime import DeterminismWarning
from detaudit.runtime.seeding import check_seed, seed_everything
from detaudit.runtime.settings import Access, access, environment_value, environment_writer, exists, torch_attribute

#: The hazard whose settings went through an API change (TF32 flags -> fp32_precision).
REDUCED_PRECISION = "reduced-precision"


@dataclass(frozen=True)
class Switch:
    """One setting: how to read and write it, and its deterministic value."""

    name: str
    read: Callable[[], Any]
    write: Callable[[Any], None]
    target: Any


@dataclass(frozen=True)
class Change:
    name: str
    before: Any
    after: Any


@dataclass
class DeterminismChanges:
    """What ``enable_determinism`` changed (``changes``), what it could not or
    did not need to do (``notes``), and how to undo it (``restore()``)."""

    changes: list[Change] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    _undo: list[tuple[Callable[[Any], None], Any]] = field(default_factory=list, repr=False)

    def apply(self, switch: Switch) -> None:
        before = switch.read()
        # Restored even when unchanged: code inside a `deterministic` block may
        # flip it, and a later switch may overwrite it as a side effect.
        self._undo.append((switch.write, before))
        if before != switch.target:
            switch.write(switch.target)
            self.changes.append(Change(switch.name, before, switch.target))

    def remember(self, write: Callable[[Any], None], before: Any) -> None:
        """Register state to put back on ``restore()`` that is not a setting
        change (RNG states replaced by seeding)."""
        self._undo.append((write, before))

    def restore(self) -> None:
        """Put back the value every switch had on entry, last switch first; idempotent."""
        while self._undo:
            write, before = self._undo.pop()
            write(before)

    def to_dict(self) -> dict[str, Any]:
        return {
            "changes": [{"name": c.name, "before": c.before, "after": c.after} for c in self.changes],
            "notes": list(self.notes),
        }

    def __str__(self) -> str:
        lines = [f"{c.name}: {c.before!r} -> {c.after!r}" for c in self.changes] or ["nothing to change"]
        return "\n".join(lines + [f"note: {note}" for note in self.notes])


def enable_determinism(strict: bool = True) -> DeterminismChanges:
    """Switch this process to deterministic computation.

    ``strict=True``: nondeterministic ops raise; ``strict=False``: they warn
    (``use_deterministic_algorithms(True, warn_only=True)``).
    """
    import torch

    result = DeterminismChanges()
    try:
        for switch in determinism_switches(torch, strict=strict, notes=result.notes):
            result.apply(switch)
    except BaseException:
        result.restore()  # all or nothing: never leave half the switches flipped
        raise
    return result


class deterministic(ContextDecorator):
    """``with detaudit.deterministic(seed=0): ...`` or ``@detaudit.deterministic()``.

    Enables determinism (and seeds every RNG when ``seed`` is given) on entry;
    on exit puts every switch back to its value on entry (also one that code
    inside the block changed) and restores the RNG states it replaced, so the
    process is exactly as before.  Re-entrant: nested uses of one
    instance each restore their own entry state.
    """

    def __init__(self, seed: int | None = None, strict: bool = True):
        self.seed = None if seed is None else check_seed(seed)
        self.strict = strict
        self._active: list[DeterminismChanges] = []

    def __enter__(self) -> DeterminismChanges:
        changes = enable_determinism(strict=self.strict)
        if self.seed is not None:
            _remember_rng_states(changes)
            seed_everything(self.seed)
            changes.notes.append(f"seeded random, numpy and torch with {self.seed} (RNG states restored on exit)")
        self._active.append(changes)
        return changes

    def __exit__(self, *exc_info: object) -> bool:
        self._active.pop().restore()
        return False


def determinism_switches(torch: Any, *, strict: bool, notes: list[str]) -> list[Switch]:
    """Every switch enable_determinism sets, in order, for this torch and process:
    the settings table's settings it is responsible for, in table order, except
    that a setting another one's write also changes comes right before it (so it
    is restored after it).  Reasons for settings left out are appended to ``notes``."""
    chosen = _one_api(torch, _write_order(backend_settings().settings))
    return _switches(torch, chosen, strict=strict, notes=notes)


def tf32_switches(torch: Any, *, use_fp32_precision_api: bool) -> list[Switch]:
    """TF32 off through one API only: the ``fp32_precision`` leaves (parents are
    left alone, setting one overwrites its children), or the legacy matmul
    precision and cuDNN flag (cuBLAS's ``allow_tf32`` is a view of the former,
    so restoring both would fight)."""
    settings = backend_settings().in_hazard(REDUCED_PRECISION)
    return _switches(torch, _one_api(torch, settings, newer_api=use_fp32_precision_api), strict=True, notes=[])


def deterministic_algorithms_switch(torch: Any) -> Switch:
    """torch's deterministic-algorithms switch alone: its value is (on, warn only)."""
    table = backend_settings()
    (switch,) = _switches(torch, [table["deterministic-algorithms"], table["deterministic-warn-only"]], strict=True, notes=[])
    return switch


def _write_order(settings: Iterable[Setting]) -> list[Setting]:
    table = backend_settings()
    ordered: list[Setting] = []
    for setting in settings:
        for also_set in (*(table[i] for i in setting.also_sets), setting):
            if also_set not in ordered:
                ordered.append(also_set)
    return ordered


def _one_api(torch: Any, settings: Iterable[Setting], newer_api: bool | None = None) -> list[Setting]:
    """Within a hazard whose settings went through an API change, the legacy
    ones (``superseded_by``) where the newer API is missing, the others where it
    exists (``newer_api``: as if it did or did not)."""
    table = backend_settings()
    chosen = []
    for setting in settings:
        legacy = [s for s in table.in_hazard(setting.hazard.id) if s.superseded_by]
        if legacy:
            newer = newer_api
            if newer is None:
                newer = any(exists(torch, table[successor]) for s in legacy for successor in s.superseded_by)
            if bool(setting.superseded_by) == newer:
                continue
        chosen.append(setting)
    return chosen


def _switches(torch: Any, settings: list[Setting], *, strict: bool, notes: list[str]) -> list[Switch]:
    """One switch per setting, except that settings written by one function
    call (``use_deterministic_algorithms(mode, warn_only=...)``) share a switch."""
    targets: list[tuple[Access, Any]] = []
    for setting in settings:
        if setting.enable_determinism == "never":
            continue
        if setting.enable_determinism == "when-needed" and not _needed(torch, setting, notes):
            continue
        found = access(torch, setting)
        if found is None:
            notes.append(f"{setting.key}: not in torch {torch.__version__}")
            continue
        target = setting.lenient if not strict and setting.lenient is not None else setting.safe
        if found.spelling.environment is not None:
            target = environment_value(target)
        if setting.enable_determinism == "when-needed" and not setting.is_risky(found.read()):
            continue
        if found.spelling.environment is not None:
            _warn_if_cuda_started(torch, setting, found, target)
        targets.append((found, target))
    groups: dict[str, list[tuple[Access, Any]]] = {}  # by setter function, else by name
    for found, target in targets:
        groups.setdefault(found.spelling.write or found.name, []).append((found, target))
    return [_switch(torch, name, members) for name, members in groups.items()]


def _switch(torch: Any, name: str, arguments: list[tuple[Access, Any]]) -> Switch:
    """One switch for the settings one setter writes (a single one keeps its plain value)."""
    if len(arguments) == 1:
        found, target = arguments[0]
        return Switch(name, found.read, found.write, target)
    call = torch_attribute(torch, name)

    def write(values: tuple) -> None:
        positional = [v for (found, _), v in zip(arguments, values) if found.spelling.position is not None]
        keywords = {found.spelling.argument: v for (found, _), v in zip(arguments, values) if found.spelling.position is None}
        call(*positional, **keywords)

    return Switch(
        name,
        lambda: tuple(found.read() for found, _ in arguments),
        write,
        tuple(target for _, target in arguments),
    )


def _needed(torch: Any, setting: Setting, notes: list[str]) -> bool:
    """Whether the setting matters for this torch build and version."""
    name = setting.spellings[0].environment or setting.key
    devices = setting.matters.devices
    if devices is not None and "cpu" not in devices and torch.version.cuda is None:
        notes.append(f"{name}: not needed (this torch has no CUDA)")
        return False
    if setting.matters.torch is not None and not version_in_range(torch.__version__, setting.matters.torch):
        notes.append(f"{name}: not needed on torch {torch.__version__} (only on torch {setting.matters.torch})")
        return False
    return True


def _warn_if_cuda_started(torch: Any, setting: Setting, found: Access, target: Any) -> None:
    """A variable that CUDA libraries read when they start is too late once CUDA is initialised."""
    devices = setting.matters.devices
    if devices is not None and "cuda" in devices and torch.cuda.is_initialized():
        warnings.warn(
            f"CUDA is already initialised, so what it set up so far ignores {found.spelling.environment}={target}; "
            "call enable_determinism() before the first CUDA operation, or export the variable before "
            "starting Python.",
            DeterminismWarning,
            stacklevel=5,
        )


def _remember_rng_states(changes: DeterminismChanges) -> None:
    import torch

    from detaudit.runtime import seeding

    changes.remember(random.setstate, random.getstate())
    numpy = seeding.numpy_or_none()
    if numpy is not None:
        changes.remember(numpy.random.set_state, numpy.random.get_state())
    changes.remember(torch.set_rng_state, torch.get_rng_state())
    if torch.cuda.is_initialized():
        changes.remember(torch.cuda.set_rng_state_all, torch.cuda.get_rng_state_all())
    changes.remember(environment_writer(seeding.GLOBAL_SEED_ENV_VAR), os.environ.get(seeding.GLOBAL_SEED_ENV_VAR))
    changes.remember(seeding.set_last_seed, seeding.last_seed())
