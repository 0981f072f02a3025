"""The verdict of ``detaudit resume`` and its text and JSON (torch-free).

**equivalent** (exit 0): every component equal at every compared step;
**diverges** (exit 1): the components that differ, from the first step where
one does; **error** (exit 2): a run failed, or the resumed run loaded no
checkpoint (the resume arguments had no effect).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from detaudit.findings import Finding, Severity
from detaudit.resume.compare import Difference
from detaudit.resume.components import COMPONENTS

EQUIVALENT, DIVERGES, ERROR = "equivalent", "diverges", "error"
EXIT_CODES = {EQUIVALENT: 0, DIVERGES: 1, ERROR: 2}
SAVES = ("torch.save",)  # checkpoint calls that write; the others read
DOWNSTREAM = "first differs after the differences above, and may follow from them"


@dataclass
class ResumeReport:
    script: str
    interrupt_at: int
    steps: int
    verdict: str
    differences: list[Difference] = field(default_factory=list)
    checkpoint_calls: list[dict] = field(default_factory=list)  # the interrupted and the resumed run's, each marked
    compared_steps: list[int] = field(default_factory=list)
    environment: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    error: str = ""  # what failed, with the run's output
    checkpoint: str = ""  # the newest checkpoint the interrupted run wrote (a file or a folder)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    @property
    def saved_at(self) -> list[dict]:
        return [call for call in self.checkpoint_calls if call["run"] == "interrupted" and call["call"] in SAVES]

    @property
    def loaded_at(self) -> list[dict]:
        return [call for call in self.checkpoint_calls if call["run"] == "resumed" and call["call"] not in SAVES]

    @property
    def compared_range(self) -> str:
        """The compared steps as the text report writes them ("5-8", "none")."""
        return _steps(self.compared_steps)

    def verdict_line(self) -> str:
        """The text report's first line; for an error, the first line of what failed (without the run's output)."""
        if self.verdict == ERROR:
            what_failed = self.error.partition("\n")[0]
            return f"error: {what_failed}"
        name = os.path.basename(self.script)
        if self.verdict == EQUIVALENT:
            return (
                f"equivalent: {name} interrupted after step {self.interrupt_at} and resumed continued exactly as the "
                f"straight run (steps {self.compared_range} compared, every component equal)"
            )
        first = self.differences[0]
        return (
            f"diverges: {name} resumed after step {self.interrupt_at} is not the straight run "
            f"from step {first.step} on ({'as it starts' if first.at == 'start' else 'at its end'})"
        )

    def to_json(self) -> dict:
        site = self.saved_at[0] if self.saved_at else {"path": "", "line": 0}
        return {
            "verdict": self.verdict,
            "script": self.script,
            "interrupt_at": self.interrupt_at,
            "steps": self.steps,
            "compared_steps": self.compared_steps,
            "differences": [
                {
                    "component": d.component,
                    "step": d.step,
                    "at": d.at,
                    "name": d.names[0],
                    "names": d.names,
                    # where the checkpoint is written: what it must also hold
                    "path": site["path"],
                    "line": site["line"],
                    "max_abs_diff": d.max_abs_diff,
                    # the first op that read it after the resume (null where no op reads it, or downstream)
                    "read_by": d.read_by,
                    "downstream": d.downstream,
                    "message": DOWNSTREAM if d.downstream else d.meaning,
                    "fix": "" if d.downstream else d.fix,
                }
                for d in self.differences
            ],
            "checkpoint": {
                "saved_at": [_site(call) for call in self.saved_at],
                "loaded_at": [_site(call) for call in self.loaded_at],
                "resumed_from": self.checkpoint or None,
            },
            "environment": self.environment,
            "warnings": self.warnings,
            "error": self.error or None,
            "exit_code": self.exit_code,
        }

    def findings(self) -> list[Finding]:
        """One finding per differing component, at the line that writes the
        checkpoint (what it must also hold); one that may only follow from an
        earlier difference is a note."""
        site = self.saved_at[0] if self.saved_at else {"path": self.script, "line": 0}
        return [
            Finding(
                code=COMPONENTS[d.component].code,
                name=d.component,
                severity=Severity.INFO if d.downstream else Severity.ERROR,
                message=f"step {d.step} {d.at}: {d.names[0]}"
                + (f" (+{len(d.names) - 1} more)" if len(d.names) > 1 else "")
                + f" differs from the uninterrupted run: {DOWNSTREAM if d.downstream else d.meaning}",
                path=site["path"],
                line=site["line"],
                fix_hint="" if d.downstream else d.fix,
                details={"component": d.component, "step": d.step, "at": d.at, "max_abs_diff": d.max_abs_diff,
                         "read_by": d.read_by},
            )
            for d in self.differences
        ]

    def text(self) -> str:
        # an error's whole text, the run's output with it
        lines = [f"error: {self.error}" if self.verdict == ERROR else self.verdict_line()]
        if self.verdict == DIVERGES:
            for difference in self.differences:
                where = f"step {difference.step} {difference.at}"
                more = f" (+{len(difference.names) - 1} more)" if len(difference.names) > 1 else ""
                deviation = f", max |diff| {difference.max_abs_diff:.3g}" if difference.max_abs_diff is not None else ""
                lines.append(f"  {difference.component:<16} {where:<14} {difference.names[0]}{more}{deviation}")
                if difference.read_by:
                    lines.append(f"  {'':<16} first read by {describe_reader(difference.read_by)}")
                if difference.downstream:
                    lines.append(f"  {'':<16} {DOWNSTREAM}")
                else:
                    lines.append(f"  {'':<16} {difference.meaning}")
                    lines.append(f"  {'':<16} fix: {difference.fix}")
        for label, calls in (("saved at", self.saved_at), ("loaded at", self.loaded_at)):
            if calls:
                lines.append(f"checkpoint {label}: " + ", ".join(f"{c['path']}:{c['line']} ({c['call']})" for c in calls))
        if self.checkpoint and self.verdict != ERROR:
            lines.append(f"resumed from: {_relative(self.checkpoint)}")
        lines += [f"warning: {warning}" for warning in self.warnings]
        return "\n".join(lines)


def describe_reader(read_by: dict) -> str:
    """``aten::native_dropout at train.py:37 (model.drop)``: the first op that read a component that differs."""
    module = f" ({read_by['module']})" if read_by.get("module") else ""
    return f"{read_by['op']} at {read_by['path']}:{read_by['line']}{module}"


def _site(call: dict) -> dict:
    return {"call": call["call"], "path": call["path"], "line": call["line"]}


def _relative(path: str) -> str:
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def _steps(steps: list[int]) -> str:
    if not steps:
        return "none"
    return f"{steps[0]}-{steps[-1]}" if len(steps) > 1 else str(steps[0])
