"""The dynamic pass's report: verdict, root causes, differing tensors, environment.

One object carries the content; it is written as rich text, JSON (the
``to_dict`` shape), ``Finding`` objects (for SARIF / GitHub annotations) and
JUnit XML.  Imports neither torch nor numpy.
"""

from __future__ import annotations

import io
from dataclasses import asdict, dataclass, field
from xml.etree import ElementTree

from detaudit.dynamic.causes import CauseKind, OtherSide
from detaudit.findings import Finding

DETERMINISTIC = "deterministic"
NONDETERMINISTIC = "nondeterministic"


@dataclass
class RootCause:
    kind: CauseKind  # equal to its name ("nondeterministic-op")
    op: str
    path: str
    line: int
    module: str
    phase: str
    seen: int  # pairs of runs in which it was found
    pairs: int  # pairs compared
    first_step: int
    max_abs_diff: float | None = None  # of the tensor it produced (or that entered); None if not measured
    hint: str = ""
    other_side: OtherSide | None = None  # control flow: what the other run did; RNG: where the state changed

    @property
    def code(self) -> str:
        return self.kind.code

    def to_dict(self) -> dict:
        data = asdict(self)
        data["code"] = self.code
        if self.other_side is None:
            data.pop("other_side")
        else:
            data["other_side"] = self.other_side.to_dict()
        return data

    def message(self) -> str:
        where = f" in {self.module}" if self.module else ""
        text = f"{self.kind}: {self.op} ({self.phase}{where}) differed in {self.seen} of {self.pairs} run pairs"
        if self.max_abs_diff is not None:
            text += f", max |diff| {self.max_abs_diff:.3g}"
        if self.other_side is not None:
            text += f"; {self.other_side.describe()}"
        if self.hint:
            text += f". {self.hint}"
        return text


@dataclass
class RunReport:
    target: str  # the script (or the audited callable)
    repeats: int
    steps: int
    root_causes: list[RootCause]
    tensors: list[dict]  # detaudit.dynamic.state.TensorDiff dicts, worst pair per tensor
    environment: dict
    propagated_ops: int = 0  # ops that differ only downstream of a root cause
    traced_ops: int = 0
    variation: dict = field(default_factory=dict)  # {"vary": ..., "settings": [per repeat]}
    notes: list[str] = field(default_factory=list)
    steps_run: list[int] = field(default_factory=list)  # optimizer steps each run completed ([] if not counted)
    warnings: list[str] = field(default_factory=list)  # about how the audit went (no step ran, children killed)

    @property
    def verdict(self) -> str:
        return NONDETERMINISTIC if self.root_causes or self.tensors else DETERMINISTIC

    @property
    def deterministic(self) -> bool:
        return self.verdict == DETERMINISTIC

    @property
    def exit_code(self) -> int:
        return 0 if self.deterministic else 1

    def to_dict(self) -> dict:
        return {
            "verdict": self.verdict,
            "target": self.target,
            "repeats": self.repeats,
            "steps": self.steps,
            "root_causes": [cause.to_dict() for cause in self.root_causes],
            "tensors": self.tensors,
            "environment": self.environment,
            "propagated_ops": self.propagated_ops,
            "traced_ops": self.traced_ops,
            "variation": self.variation,
            "notes": self.notes,
            "steps_run": self.steps_run,
            "warnings": self.warnings,
        }

    def _steps_text(self) -> str:
        """How far the runs went: what they did, else the step limit they had."""
        done = sorted(set(self.steps_run))
        if done == [0]:
            return " (no optimizer step ran)"
        if len(done) > 1:
            return f" ({done[0]} to {done[-1]} steps)"
        count = done[0] if done else self.steps
        return f" ({count} step{'s' if count != 1 else ''} each)" if count else ""

    def verdict_line(self) -> str:
        runs = f"{self.repeats} runs of {self.target}{self._steps_text()}"
        if self.deterministic:
            return f"deterministic: {runs} were bitwise identical ({self.traced_ops} ops traced per run)"
        causes = len(self.root_causes)
        return (
            f"nondeterministic: {runs} differ; {causes} root cause{'s' if causes != 1 else ''}, "
            f"{self.propagated_ops} ops differ downstream, {len(self.tensors)} final tensors differ"
        )

    # -- output formats ----------------------------------------------------
    def findings(self) -> list[Finding]:
        findings = []
        for cause in self.root_causes:
            kind = cause.kind
            findings.append(
                Finding(
                    code=kind.code,
                    name=kind.name,
                    severity=kind.severity,
                    message=cause.message(),
                    path=cause.path or self.target,
                    line=cause.line,
                    fix_hint=cause.hint or kind.fix_hint,
                    details={
                        "kind": cause.kind,
                        "op": cause.op,
                        "module": cause.module,
                        "phase": cause.phase,
                        "seen": cause.seen,
                        "max_abs_diff": cause.max_abs_diff,
                    },
                )
            )
        return findings

    def render(self, console) -> None:
        """Write the report to a rich console."""
        from rich.table import Table

        style = "bold green" if self.deterministic else "bold red"
        console.print(self.verdict_line(), style=style, highlight=False, soft_wrap=True)
        if self.root_causes:
            table = Table(title="Root causes", title_justify="left")
            for column in ("kind", "op", "location", "module", "phase", "seen", "max |diff|", "step"):
                table.add_column(column, overflow="fold")
            for cause in self.root_causes:
                table.add_row(
                    cause.kind,
                    cause.op,
                    f"{cause.path}:{cause.line}" if cause.line else cause.path,
                    cause.module or "-",
                    cause.phase,
                    f"{cause.seen}/{cause.pairs} pairs",
                    "-" if cause.max_abs_diff is None else f"{cause.max_abs_diff:.3g}",
                    str(cause.first_step),
                )
            console.print(table)
            for cause in self.root_causes:
                details = [cause.hint or cause.kind.fix_hint]
                if cause.other_side is not None:
                    details.insert(0, cause.other_side.describe())
                console.print(f"  {cause.path}:{cause.line} {cause.op}: " + " ".join(details), highlight=False)
        if self.tensors:
            table = Table(title="Differing tensors after the last step", title_justify="left")
            for column in ("tensor", "shape", "dtype", "max |diff|", "max rel", "max ULP", "elements differing"):
                table.add_column(column, overflow="fold")
            for diff in self.tensors:
                table.add_row(
                    diff["name"],
                    str(diff["shape"]),
                    diff["dtype"],
                    f"{diff['max_abs_diff']:.3g}",
                    f"{diff['max_rel_diff']:.3g}",
                    str(diff["max_ulp"]),
                    f"{diff['fraction_differing']:.1%}",
                )
            console.print(table)
        for note in self.notes:
            console.print(f"note: {note}", highlight=False)
        for warning in self.warnings:
            console.print(f"warning: {warning}", style="yellow", highlight=False)
        if self.environment:
            console.print("Environment: " + _flat_environment(self.environment), highlight=False, style="dim")

    def to_text(self, width: int = 120) -> str:
        """The rendered report as plain text (for assertion messages and logs)."""
        from rich.console import Console

        buffer = io.StringIO()
        self.render(Console(file=buffer, width=width, color_system=None, force_terminal=False))
        return buffer.getvalue()

    def to_junit_xml(self) -> str:
        suite = ElementTree.Element(
            "testsuite",
            name="detaudit run",
            tests="1",
            failures="0" if self.deterministic else "1",
            errors="0",
        )
        case = ElementTree.SubElement(suite, "testcase", classname="detaudit.run", name=self.target)
        if not self.deterministic:
            failure = ElementTree.SubElement(case, "failure", message=self.verdict_line())
            failure.text = self.to_text()
        if self.warnings:
            ElementTree.SubElement(case, "system-err").text = "\n".join(f"warning: {w}" for w in self.warnings)
        return ElementTree.tostring(suite, encoding="unicode", xml_declaration=True)


@dataclass
class RunFailure:
    """A ``detaudit run`` that could not be audited: one run of the script
    crashed, was killed by a signal, timed out or wrote no results.  Written
    in every output format, so that CI tooling reads an error, not silence."""

    target: str
    run: str  # which run: "run 2", "the capture rerun of run 1"
    ended: str  # how it ended: "was killed by SIGSEGV (...)", "exited with code 1"
    returncode: int | None  # None when it timed out
    signal: str | None  # "SIGSEGV" when a signal killed it
    timed_out: bool
    output_tail: str  # the end of its stderr (else stdout)
    repeats: int
    steps: int

    verdict = "error"
    exit_code = 2

    @classmethod
    def of(cls, target: str, run: str, result, *, repeats: int, steps: int, tail_lines: int = 40) -> "RunFailure":
        """From a ``launch.ScriptResult``."""
        return cls(
            target=target,
            run=run,
            ended=result.describe_exit(),
            returncode=result.returncode,
            signal=result.signal_name,
            timed_out=result.timed_out,
            output_tail=result.output_tail(tail_lines),
            repeats=repeats,
            steps=steps,
        )

    @property
    def message(self) -> str:
        return f"{self.run} of the script {self.ended}"

    def to_dict(self) -> dict:
        return {
            "verdict": self.verdict,
            "target": self.target,
            "repeats": self.repeats,
            "steps": self.steps,
            "error": {
                "message": self.message,
                "run": self.run,
                "returncode": self.returncode,
                "signal": self.signal,
                "timed_out": self.timed_out,
                "output_tail": self.output_tail,
            },
        }

    def to_junit_xml(self) -> str:
        suite = ElementTree.Element("testsuite", name="detaudit run", tests="1", failures="0", errors="1")
        case = ElementTree.SubElement(suite, "testcase", classname="detaudit.run", name=self.target)
        error = ElementTree.SubElement(case, "error", message=self.message)
        error.text = self.output_tail
        return ElementTree.tostring(suite, encoding="unicode", xml_declaration=True)


def _flat_environment(environment: dict, prefix: str = "") -> str:
    parts = []
    for key, value in environment.items():
        if isinstance(value, dict):
            parts.append(_flat_environment(value, f"{prefix}{key}."))
        elif value is not None:  # unset settings would only add noise
            parts.append(f"{prefix}{key}={value}")
    return ", ".join(part for part in parts if part)
