"""``detaudit.status()``: this process's determinism state, and what is still
nondeterministic about it.

The settings are the environment fingerprint plus the RNG seeds torch and
detaudit know; the diagnosis is a pure function of those settings, so it can
also be applied to a fingerprint saved by another process.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from typing import Any

from detaudit.knowledge.apis import (
    CUBLAS_WORKSPACE_CONFIG_REQUIRED_BEFORE,
    CUBLAS_WORKSPACE_CONFIG_VALUES,
    REDUCED_FP32_PRECISIONS,
    REDUCED_MATMUL_PRECISIONS,
)
from detaudit.runtime.environment import fingerprint, version_tuple
from detaudit.runtime.seeding import describe_hash_seed, last_seed

ENABLE = "detaudit.enable_determinism()"


@dataclass(frozen=True)
class Issue:
    """One reason this process may not reproduce: the setting, why, the fix."""

    setting: str
    problem: str
    fix: str


@dataclass
class DeterminismStatus:
    settings: dict[str, Any]
    issues: list[Issue]

    @property
    def reproducible(self) -> bool:
        return not self.issues

    def to_dict(self) -> dict[str, Any]:
        return {"settings": dict(self.settings), "nondeterministic": [asdict(i) for i in self.issues]}

    def __rich__(self):
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        flagged = {issue.setting for issue in self.issues}
        settings = Table(title="detaudit status: determinism of this process", title_justify="left")
        settings.add_column("setting", overflow="fold")
        settings.add_column("value", overflow="fold", min_width=24)
        for name, value in self.settings.items():
            shown = "unset" if value is None else str(value)
            settings.add_row(name, Text(shown, style="red" if name in flagged else ""))
        if not self.issues:
            return Group(settings, "[green]Nothing known to be nondeterministic in this process.[/green]")
        issues = Text("still nondeterministic:\n", style="bold")
        for issue in self.issues:
            issues.append(f"- {issue.setting}", style="red")
            issues.append(f": {issue.problem}\n    fix: {issue.fix}\n")
        return Group(settings, issues)

    def __str__(self) -> str:
        from rich.console import Console

        console = Console(width=120, no_color=True, record=True, file=_Discard())
        console.print(self)
        return console.export_text()


def status(*, initialize_cuda: bool = False) -> DeterminismStatus:
    """The determinism state of this process (never initialises CUDA unless asked)."""
    settings = fingerprint(initialize_cuda=initialize_cuda)
    settings.update(_seeds())
    return DeterminismStatus(settings, diagnose(settings))


def diagnose(settings: dict[str, Any]) -> list[Issue]:
    """What keeps a process with these settings (a fingerprint) from reproducing."""
    issues = []
    cuda = bool(settings.get("torch.cuda.is_available"))
    deterministic = settings.get("torch.are_deterministic_algorithms_enabled")
    if deterministic is False:
        issues.append(Issue(
            "torch.are_deterministic_algorithms_enabled",
            "kernels without a deterministic implementation run freely: e.g. the parallel CPU "
            "index_put_(accumulate) behind x[idx] backward, CUDA scatter/index_add atomics, "
            "cuDNN algorithm choice",
            ENABLE,
        ))
    elif settings.get("torch.is_deterministic_algorithms_warn_only_enabled"):
        issues.append(Issue(
            "torch.is_deterministic_algorithms_warn_only_enabled",
            "nondeterministic ops only warn and still run",
            "detaudit.enable_determinism(strict=True)",
        ))
    if deterministic and settings.get("torch.utils.deterministic.fill_uninitialized_memory") is False:
        issues.append(Issue(
            "torch.utils.deterministic.fill_uninitialized_memory",
            "torch.empty & co. return leftover memory, which differs between runs",
            ENABLE,
        ))
    if cuda and settings.get("torch.backends.cudnn.benchmark"):
        issues.append(Issue(
            "torch.backends.cudnn.benchmark",
            "the cuDNN autotuner may pick a different algorithm in each process",
            ENABLE,
        ))
    issues += _reduced_precision_issues(settings, cuda)
    if _needs_cublas_workspace_config(settings):
        issues.append(Issue(
            "env.CUBLAS_WORKSPACE_CONFIG",
            "this torch raises at the first cuBLAS call under deterministic algorithms without it",
            f"export CUBLAS_WORKSPACE_CONFIG={CUBLAS_WORKSPACE_CONFIG_VALUES[0]} before starting Python",
        ))
    hash_problem = describe_hash_seed(
        settings.get("env.PYTHONHASHSEED"), settings.get("python.hash_randomization", True)
    )
    if hash_problem:
        issues.append(Issue("env.PYTHONHASHSEED", hash_problem, "start Python as `PYTHONHASHSEED=0 python train.py`"))
    if settings.get("rng.seed_everything") is None:
        issues.append(Issue(
            "rng.seed_everything",
            "detaudit.seed_everything was not called here: Python random, NumPy and torch "
            "start from OS entropy unless the script seeds them itself",
            "detaudit.seed_everything(SEED)",
        ))
    return issues


def _reduced_precision_issues(settings: dict[str, Any], cuda: bool) -> list[Issue]:
    """TF32/bf16 for fp32 math: results differ from fp32 and between GPU generations.
    CUDA/cuDNN settings matter only where CUDA is available; oneDNN's on any CPU."""
    reduced = []
    for name, value in settings.items():
        relevant = cuda or name.startswith("torch.backends.mkldnn") or name == "torch.backends.fp32_precision"
        if not relevant:
            continue
        if name.endswith(".fp32_precision") and value in REDUCED_FP32_PRECISIONS:
            reduced.append(name)
        elif name.endswith(".allow_tf32") and value is True:
            reduced.append(name)
        elif name == "torch.get_float32_matmul_precision" and value in REDUCED_MATMUL_PRECISIONS:
            reduced.append(name)
    return [
        Issue(name, f"fp32 math runs in reduced precision ({settings[name]}): bits depend on the GPU/CPU model", ENABLE)
        for name in reduced
    ]


def _needs_cublas_workspace_config(settings: dict[str, Any]) -> bool:
    version = settings.get("torch.version")
    if not version or settings.get("torch.version.cuda") is None:
        return False
    return (
        version_tuple(version) < CUBLAS_WORKSPACE_CONFIG_REQUIRED_BEFORE
        and settings.get("env.CUBLAS_WORKSPACE_CONFIG") not in CUBLAS_WORKSPACE_CONFIG_VALUES
    )


def _seeds() -> dict[str, Any]:
    seeds: dict[str, Any] = {"rng.seed_everything": last_seed()}
    torch = sys.modules.get("torch")
    if torch is not None:
        seeds["rng.torch.initial_seed"] = torch.initial_seed()
        if torch.cuda.is_initialized():
            seeds["rng.torch.cuda.initial_seed"] = torch.cuda.initial_seed()
    return seeds


class _Discard:
    """A file that drops what is written: rich records the text we export."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass
