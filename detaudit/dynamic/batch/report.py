"""The batch-invariance report: per batch size and position, and root causes.

One object carries the content; it is written as rich text, JSON (the
``to_dict`` shape, read back by ``from_dict``: ``detaudit run --vary batch``
builds the report in the child and prints it in the parent), ``Finding``
objects (SARIF, GitHub annotations) and JUnit XML.  Imports neither torch nor
numpy.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field

from detaudit.dynamic.compare.causes import CauseKind, OtherRunOp, cause_kind
from detaudit.dynamic.verdict.run_report import flat_environment, junit_xml
from detaudit.findings import Finding

INVARIANT = "batch-invariant"
VARIANT = "batch-variant"


@dataclass
class BatchCell:
    """One batch size and position: each sample placed there, against itself alone."""

    batch_size: int
    position: int
    samples: int  # samples checked here
    differing: list[int]  # indices of the samples whose outputs differed
    max_abs_diff: float = 0.0
    max_ulp: int = 0
    fraction_differing: float = 0.0  # of the worst sample's output elements
    causes: list[int] = field(default_factory=list)  # indices into BatchReport.root_causes

    @property
    def matched(self) -> bool:
        return not self.differing

    def to_dict(self) -> dict:
        return {
            "batch_size": self.batch_size,
            "position": self.position,
            "matched": self.matched,
            "samples": self.samples,
            "differing": self.differing,
            "max_abs_diff": self.max_abs_diff,
            "max_ulp": self.max_ulp,
            "fraction_differing": self.fraction_differing,
            "causes": self.causes,
        }

    @classmethod
    def from_dict(cls, data: dict) -> "BatchCell":
        data = dict(data)
        data.pop("matched")
        return cls(**data)


@dataclass
class BatchCause:
    """The first op whose per-sample slice differed, for one or more cells."""

    kind: CauseKind  # batch-variant-op, sample-mixing, rng, control-flow, nondeterministic-op
    op: str
    path: str
    line: int
    module: str
    device: str
    cells: list[tuple[int, int]]  # (batch size, position) where it was the first differing op
    max_abs_diff: float | None = None  # of the op's per-sample output slice; None if not measured
    max_ulp: int | None = None
    why: str = ""  # the knowledge base's reason this op varies on this device ("" if unknown)
    remedies: list[str] = field(default_factory=list)  # what makes it invariant, with the cost
    inputs: str = "match"  # its per-sample input slices: "match", "differs" (state from outside the call) or "not compared"
    other_side: OtherRunOp | None = None  # control flow: what the batch ran instead

    @property
    def code(self) -> str:
        return self.kind.code

    @property
    def hint(self) -> str:
        """How to fix it, in one paragraph: the knowledge base's remedies, else the kind's fix."""
        if not self.remedies:
            return self.kind.fix_hint
        return "Invariant with: " + "; or ".join(self.remedies) + "."

    def where(self) -> str:
        return f"{self.path}:{self.line}" if self.line else (self.path or "-")

    def batch_sizes(self) -> str:
        sizes: dict[int, int] = {}
        for size, _ in self.cells:
            sizes[size] = sizes.get(size, 0) + 1
        return ", ".join(f"{size} ({count} pos.)" if count > 1 else str(size) for size, count in sorted(sizes.items()))

    def message(self) -> str:
        module = f" in {self.module}" if self.module else ""
        text = f"{self.kind}: {self.op}{module} changed a sample's result at batch size {self.batch_sizes()}"
        if self.max_abs_diff is not None:
            text += f", max |diff| {self.max_abs_diff:.3g} ({self.max_ulp} ULP)"
        if self.inputs == "differs":
            text += "; its input already differed: state kept between calls (a cache, a counter) or data from outside torch"
        elif self.inputs == "not compared":
            text += "; some of its inputs had no per-sample slice to compare, so the cause may lie upstream"
        if self.other_side is not None:
            other = self.other_side
            text += (
                f"; alone, the sample's op produced {other.reference_outputs}, in the batch the model ran "
                f"{other.op} {other.outputs} at {other.path}:{other.line}"
            )
        return text

    def to_dict(self) -> dict:
        data = {
            "kind": self.kind.name,
            "code": self.code,
            "op": self.op,
            "path": self.path,
            "line": self.line,
            "module": self.module,
            "device": self.device,
            "cells": [{"batch_size": size, "position": position} for size, position in self.cells],
            "max_abs_diff": self.max_abs_diff,
            "max_ulp": self.max_ulp,
            "why": self.why,
            "remedies": self.remedies,
            "inputs": self.inputs,
        }
        if self.other_side is not None:
            data["other_side"] = self.other_side.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "BatchCause":
        other = data.get("other_side")
        return cls(
            kind=cause_kind(data["kind"]),
            op=data["op"],
            path=data["path"],
            line=data["line"],
            module=data["module"],
            device=data["device"],
            cells=[(cell["batch_size"], cell["position"]) for cell in data["cells"]],
            max_abs_diff=data["max_abs_diff"],
            max_ulp=data["max_ulp"],
            why=data["why"],
            remedies=data["remedies"],
            inputs=data["inputs"],
            other_side=OtherRunOp(**other) if other else None,
        )


@dataclass
class BatchReport:
    target: str  # the audited callable, or the script
    samples: int
    batch_sizes: list[int]
    dim: int
    outputs: list[str]  # the outputs compared per sample
    cells: list[BatchCell]
    root_causes: list[BatchCause]
    environment: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # what detaudit had to do after the child ended

    @property
    def verdict(self) -> str:
        return VARIANT if any(not cell.matched for cell in self.cells) else INVARIANT

    @property
    def invariant(self) -> bool:
        return self.verdict == INVARIANT

    @property
    def exit_code(self) -> int:
        return 0 if self.invariant else 1

    def to_dict(self) -> dict:
        return {
            "verdict": self.verdict,
            "target": self.target,
            "samples": self.samples,
            "batch_sizes": self.batch_sizes,
            "dim": self.dim,
            "outputs": self.outputs,
            "cells": [cell.to_dict() for cell in self.cells],
            "root_causes": [cause.to_dict() for cause in self.root_causes],
            "environment": self.environment,
            "notes": self.notes,
            "warnings": self.warnings,
        }

    @classmethod
    def from_dict(cls, data: dict) -> "BatchReport":
        return cls(
            target=data["target"],
            samples=data["samples"],
            batch_sizes=data["batch_sizes"],
            dim=data["dim"],
            outputs=data["outputs"],
            cells=[BatchCell.from_dict(cell) for cell in data["cells"]],
            root_causes=[BatchCause.from_dict(cause) for cause in data["root_causes"]],
            environment=data.get("environment", {}),
            notes=data.get("notes", []),
            warnings=data.get("warnings", []),
        )

    def verdict_line(self) -> str:
        sizes = ", ".join(str(size) for size in self.batch_sizes)
        if self.invariant:
            return (
                f"batch-invariant: each of {self.samples} samples of {self.target} gave bitwise-identical outputs "
                f"alone and in batches of {sizes} ({len(self.cells)} batch size × position cells)"
            )
        differing = sum(not cell.matched for cell in self.cells)
        causes = len(self.root_causes)
        return (
            f"batch-variant: {self.target} gave a sample different outputs in {differing} of {len(self.cells)} "
            f"batch size × position cells ({self.samples} samples, batch sizes {sizes}); "
            f"{causes} root cause{'s' if causes != 1 else ''}"
        )

    # -- output formats ----------------------------------------------------
    def findings(self) -> list[Finding]:
        return [
            Finding(
                code=cause.code,
                name=cause.kind.name,
                severity=cause.kind.severity,
                message=cause.message(),
                path=cause.path or self.target,
                line=cause.line,
                fix_hint=cause.hint,
                details={
                    "kind": cause.kind.name,
                    "op": cause.op,
                    "module": cause.module,
                    "device": cause.device,
                    "cells": [list(cell) for cell in cause.cells],
                    "max_abs_diff": cause.max_abs_diff,
                    "max_ulp": cause.max_ulp,
                },
            )
            for cause in self.root_causes
        ]

    def render(self, console) -> None:
        """Write the report to a rich console."""
        from rich.markup import escape
        from rich.table import Table

        def row(*cells: str) -> list[str]:  # cells hold brackets ("result[0]"): never markup
            return [escape(cell) for cell in cells]

        style = "bold green" if self.invariant else "bold red"
        console.print(self.verdict_line(), style=style, highlight=False, soft_wrap=True, markup=False)
        compared = ", ".join(self.outputs) or "no output"
        table = Table(title=escape(f"Each sample alone vs in a batch ({compared}, bitwise)"), title_justify="left")
        for column in ("batch", "position", "samples differing", "max |diff|", "max ULP", "elements differing", "root cause"):
            table.add_column(column, overflow="fold")
        for cell in self.cells:
            table.add_row(
                *row(
                    str(cell.batch_size),
                    str(cell.position),
                    f"{len(cell.differing)}/{cell.samples}",
                    "-" if cell.matched else f"{cell.max_abs_diff:.3g}",
                    "-" if cell.matched else str(cell.max_ulp),
                    "-" if cell.matched else f"{cell.fraction_differing:.1%}",
                    ", ".join(f"#{i + 1}" for i in cell.causes) or "-",
                ),
                style=None if cell.matched else "red",
            )
        console.print(table)
        if self.root_causes:
            causes = Table(title="Root causes", title_justify="left")
            for column in ("#", "kind", "op", "location", "module", "device", "batch sizes", "max |diff|", "max ULP"):
                causes.add_column(column, overflow="fold")
            for number, cause in enumerate(self.root_causes, 1):
                causes.add_row(
                    *row(
                        f"#{number}",
                        cause.kind.name,
                        cause.op,
                        cause.where(),
                        cause.module or "-",
                        cause.device,
                        cause.batch_sizes(),
                        "-" if cause.max_abs_diff is None else f"{cause.max_abs_diff:.3g}",
                        "-" if cause.max_ulp is None else str(cause.max_ulp),
                    )
                )
            console.print(causes)
            for number, cause in enumerate(self.root_causes, 1):
                lines = [f"#{number} {cause.where()}: {cause.message()}"]
                if cause.why:
                    lines.append(f"   why: {cause.why}")
                fixes = cause.remedies or [cause.kind.fix_hint]
                lines.append(f"   fix: {fixes[0]}")
                lines.extend(f"     or {fix}" for fix in fixes[1:])
                console.print("\n".join(lines), markup=False, highlight=False)
        for note in self.notes:
            console.print(f"note: {note}", highlight=False, markup=False)
        for warning in self.warnings:
            console.print(f"warning: {warning}", style="yellow", highlight=False, markup=False)
        if self.environment:
            console.print("Environment: " + flat_environment(self.environment), highlight=False, style="dim", markup=False)

    def to_text(self, width: int = 140) -> str:
        from rich.console import Console

        buffer = io.StringIO()
        self.render(Console(file=buffer, width=width, color_system=None, force_terminal=False))
        return buffer.getvalue()

    def to_junit_xml(self) -> str:
        return junit_xml("detaudit batch invariance", self.target, None if self.invariant else self.verdict_line(), self.to_text())
