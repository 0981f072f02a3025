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

from detaudit.knowledge.backend_settings import backend_settings
from detaudit.runtime.environment import fingerprint, risky_here
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
    issues = [
        Issue(setting.key, setting.hazard.problem.format(value=settings.get(setting.key)), setting.hazard.fix or ENABLE)
        for setting in backend_settings().settings
        if setting.reports and risky_here(setting, settings)
    ]
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
