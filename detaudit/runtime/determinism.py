"""Stabilization mode: every switch that makes torch compute the same bits.

``enable_determinism()`` flips each switch to its deterministic value and
returns a ``DeterminismChanges`` that lists what it changed and can undo it;
``deterministic()`` is the same as a context manager / decorator that restores
every previous setting (and, when it seeded, the RNG states) on exit.

TF32 is turned off through the ``fp32_precision`` API when this torch has it
(2.9+) and through the legacy flags otherwise, never both: torch raises when
the two are mixed.  One torch quirk remains (measured on 2.13): once any
cuDNN ``fp32_precision`` was set, even to ``"ieee"``, the legacy getter
``torch.backends.cudnn.allow_tf32`` raises until the settings are restored.
``detaudit.status()`` and the fingerprint read the new API and cope with it.
"""

from __future__ import annotations

import os
import random
import sys
import warnings
from contextlib import ContextDecorator
from dataclasses import dataclass, field
from typing import Any, Callable

from detaudit.knowledge.apis import (
    CUBLAS_WORKSPACE_CONFIG_REQUIRED_BEFORE,
    CUBLAS_WORKSPACE_CONFIG_VALUES,
    FP32_PRECISION_NAMESPACES,
    FULL_FP32_PRECISION,
    FULL_MATMUL_PRECISION,
)
from detaudit.runtime import DeterminismWarning
from detaudit.runtime.environment import torch_attribute, version_tuple
from detaudit.runtime.seeding import check_seed, seed_everything


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
    """Every switch enable_determinism sets, in order, for this torch and process.
    Reasons for switches left out are appended to ``notes``."""
    switches = [
        # First, so that it is restored last: torch.use_deterministic_algorithms
        # itself sets inductor's flag (torch 2.13 imports inductor's config to do it).
        _inductor_switch(),
        Switch(
            "torch.use_deterministic_algorithms",
            lambda: (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()),
            lambda value: torch.use_deterministic_algorithms(value[0], warn_only=value[1]),
            (True, not strict),
        ),
        _attribute_switch(torch, "torch.backends.cudnn.deterministic", True),
        _attribute_switch(torch, "torch.backends.cudnn.benchmark", False),
    ]
    switches += tf32_switches(torch, use_fp32_precision_api=has_fp32_precision_api(torch))
    switches += _fill_uninitialized_memory_switches(torch, notes)
    switches += _cublas_workspace_switches(torch, notes)
    return switches


def has_fp32_precision_api(torch: Any) -> bool:
    return hasattr(torch.backends.cuda.matmul, "fp32_precision")


def tf32_switches(torch: Any, *, use_fp32_precision_api: bool) -> list[Switch]:
    """TF32 off through one API only (torch raises when the two are mixed).

    New API: every leaf namespace (``cuda.matmul``, ``cudnn.conv``,
    ``cudnn.rnn``, ``mkldnn.*``) is set to ``"ieee"``; parents are left alone
    because setting a parent overwrites its children.  Legacy API: the matmul
    precision (``allow_tf32`` of cuBLAS is a view of it, so restoring both
    would fight) and cuDNN's ``allow_tf32``.
    """
    if use_fp32_precision_api:
        leaves = [
            namespace
            for namespace in sorted(FP32_PRECISION_NAMESPACES)
            if not any(other.startswith(namespace + ".") for other in FP32_PRECISION_NAMESPACES)
        ]
        return [_attribute_switch(torch, f"{namespace}.fp32_precision", FULL_FP32_PRECISION) for namespace in leaves]
    return [
        Switch(
            "torch.set_float32_matmul_precision",
            torch.get_float32_matmul_precision,
            torch.set_float32_matmul_precision,
            FULL_MATMUL_PRECISION,
        ),
        _attribute_switch(torch, "torch.backends.cudnn.allow_tf32", False),
    ]


def _attribute_switch(torch: Any, dotted_name: str, target: Any) -> Switch:
    owner_name, attribute = dotted_name.rsplit(".", 1)
    owner = torch_attribute(torch, owner_name)
    return Switch(
        dotted_name,
        lambda: getattr(owner, attribute),
        lambda value: setattr(owner, attribute, value),
        target,
    )


def _fill_uninitialized_memory_switches(torch: Any, notes: list[str]) -> list[Switch]:
    try:
        import torch.utils.deterministic
    except ImportError:
        notes.append(f"torch.utils.deterministic.fill_uninitialized_memory: not in torch {torch.__version__}")
        return []
    return [_attribute_switch(torch, "torch.utils.deterministic.fill_uninitialized_memory", True)]


def _cublas_workspace_switches(torch: Any, notes: list[str]) -> list[Switch]:
    if torch.version.cuda is None:
        notes.append("CUBLAS_WORKSPACE_CONFIG: not needed (this torch has no CUDA)")
        return []
    if version_tuple(torch.__version__) >= CUBLAS_WORKSPACE_CONFIG_REQUIRED_BEFORE:
        required = ".".join(map(str, CUBLAS_WORKSPACE_CONFIG_REQUIRED_BEFORE))
        notes.append(f"CUBLAS_WORKSPACE_CONFIG: not needed on torch >= {required} (pytorch/pytorch#161749)")
        return []
    if os.environ.get("CUBLAS_WORKSPACE_CONFIG") in CUBLAS_WORKSPACE_CONFIG_VALUES:
        return []
    if torch.cuda.is_initialized():
        warnings.warn(
            "CUDA is already initialised, so cuBLAS handles created so far ignore "
            f"CUBLAS_WORKSPACE_CONFIG={CUBLAS_WORKSPACE_CONFIG_VALUES[0]}; call "
            "enable_determinism() before the first CUDA operation, or export the variable "
            "before starting Python.",
            DeterminismWarning,
            stacklevel=3,
        )
    return [_environment_switch("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG_VALUES[0])]


def _inductor_switch() -> Switch:
    """Inductor's deterministic mode (no on-device benchmarking/autotuning).

    Importing ``torch._inductor`` costs about a second, so when it is not
    imported yet the switch is its environment variable, which inductor reads
    when it is imported; restoring then also resets the config if inductor was
    imported in between.
    """
    config = sys.modules.get("torch._inductor.config")
    if config is not None:
        return Switch(
            "torch._inductor.config.deterministic",
            lambda: config.deterministic,
            lambda value: setattr(config, "deterministic", value),
            True,
        )
    variable = _environment_switch("TORCHINDUCTOR_DETERMINISTIC", "1")

    def write(value: str | None) -> None:
        variable.write(value)
        imported_since = sys.modules.get("torch._inductor.config")
        if imported_since is not None:
            imported_since.deterministic = value == "1"

    return Switch("env.TORCHINDUCTOR_DETERMINISTIC", variable.read, write, "1")


def _environment_switch(name: str, target: str) -> Switch:
    def write(value: str | None) -> None:
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value

    return Switch(f"env.{name}", lambda: os.environ.get(name), write, target)


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
    changes.remember(_environment_switch(seeding.GLOBAL_SEED_ENV_VAR, "").write, os.environ.get(seeding.GLOBAL_SEED_ENV_VAR))
    changes.remember(seeding.set_last_seed, seeding.last_seed())
