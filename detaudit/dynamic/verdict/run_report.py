"""The dynamic pass's report: verdict, root causes, differing tensors, environment.

The verdict, and what fails the gate:

* **nondeterministic** (exit 1): a tensor of the final state (parameters,
  gradients, buffers, optimizer state, the loss) differs between runs, or a
  root cause's difference reaches one;
* **latent** (exit 0, exit 1 with ``strict``): the final states are bitwise
  identical, but an op gave different bits that something read (a later op,
  ``.item()``, ``tolist()``...) before the difference vanished; with more
  steps or other data it can come through;
* **deterministic** (exit 0): no difference that anything read.  Outputs
  nobody reads (workspaces, unused outputs of multi-output ops) are never
  compared into the verdict.

Against a reference saved in another environment (``--against``: run 1 is
the reference, ``dynamic/reference/``), the same comparison gives

* **identical** (exit 0): the final states are bitwise the reference's
  (a latent difference fails only with ``strict``);
* **within-tolerance** (exit 0, only with a ``Tolerance``): every differing
  final tensor is within it;
* **drift** (exit 1): otherwise.  Its root causes are the *drift roots*.

One object carries the content; it is written as rich text, JSON (the
``to_dict`` shape), ``Finding`` objects (for SARIF / GitHub annotations) and
JUnit XML.  Imports neither torch nor numpy.
"""

from __future__ import annotations

import io
from dataclasses import asdict, dataclass, field
from xml.etree import ElementTree

from detaudit.dynamic.compare.causes import CauseKind, OtherSide
from detaudit.dynamic.compare.divergence import Divergence
from detaudit.dynamic.verdict.compiled import compiled_line, describe_inside_graph
from detaudit.dynamic.verdict.tolerance import Tolerance
from detaudit.findings import Finding, Severity

DETERMINISTIC = "deterministic"
NONDETERMINISTIC = "nondeterministic"
LATENT = "latent"
# against a reference
IDENTICAL = "identical"
WITHIN_TOLERANCE = "within-tolerance"
DRIFT = "drift"

# what a root cause's difference did (RootCause.effect)
FINAL_STATE = "final-state"  # reached a differing tensor of the final state
# LATENT: read, then vanished before the final state

#: the environment key that says which recorder traced the runs: "compiled", or "python (why)"
RECORDER_KEY = "detaudit.recorder"


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
    max_ulp: int | None = None  # of the same tensors, in units in the last place (floating point; else 0)
    hint: str = ""
    other_side: OtherSide | None = None  # control flow: what the other run did; RNG: where the state changed
    effect: str = FINAL_STATE  # FINAL_STATE or LATENT
    ranks: list[int] = field(default_factory=list)  # distributed runs: the ranks it was found on
    # a compiled graph's call: the first node inside it that departs (verdict/compiled.py's describe_inside_graph)
    inside_graph: dict | None = None
    # the record of run 1's trace whose tensors show it (-1: none; what --repro reruns)
    record: int = field(default=-1, repr=False)

    @property
    def code(self) -> str:
        return self.kind.code

    @property
    def latent(self) -> bool:
        return self.effect == LATENT

    @property
    def fix(self) -> str:
        """What to do: its own hint (the ops table's, for a known op), else its kind's."""
        return self.hint or self.kind.fix_hint

    def to_dict(self) -> dict:
        data = asdict(self)
        data["code"] = self.code
        data["hint"] = self.fix  # what the text and the findings say too
        data.pop("record")  # an index into a trace the report does not carry
        if not self.ranks:
            data.pop("ranks")
        if self.inside_graph is None:
            data.pop("inside_graph")
        if self.other_side is None:
            data.pop("other_side")
        else:
            data["other_side"] = self.other_side.to_dict()
        return data

    def details(self) -> list[str]:
        """What the report says of it beyond its row: what the other run did, what a bisection found inside its graph."""
        details = [self.other_side.describe()] if self.other_side is not None else []
        if self.inside_graph is not None:
            details.append(describe_inside_graph(self.inside_graph))
        return details

    def message(self) -> str:
        where = f" in {self.module}" if self.module else ""
        where += f" on {rank_list(self.ranks)}" if self.ranks else ""
        text = f"{self.kind}: {self.op} ({self.phase}{where}) differed in {self.seen} of {self.pairs} run pairs"
        if self.latent:
            text += " (latent: the difference vanished before the final state)"
        if self.max_abs_diff is not None:
            text += f", max |diff| {self.max_abs_diff:.3g}"
        for detail in self.details():
            text += f"; {detail}"
        if self.hint:
            text += f". {self.hint}"
        return text


@dataclass
class RunReport:
    target: str  # the script (or the audited callable)
    repeats: int
    steps: int
    root_causes: list[RootCause]
    tensors: list[dict]  # detaudit.dynamic.record.final_state.TensorDiff dicts, worst pair per tensor
    environment: dict
    propagated_ops: int = 0  # ops that differ only downstream of a root cause
    traced_ops: int = 0
    # {"vary": ..., "settings": [asked, per repeat], "in_effect": [what each run ran with]}
    variation: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    steps_run: list[int] = field(default_factory=list)  # optimizer steps each run completed ([] if not counted)
    warnings: list[str] = field(default_factory=list)  # about how the audit went (no step ran, children killed)
    divergence: Divergence | None = None  # the first differing pair, op by op (the HTML report's chart)
    strict: bool = False  # a latent difference fails too
    # fingerprint keys whose values differ between the runs -> the value of each run
    environment_differences: dict[str, list] = field(default_factory=dict)
    ranks: int = 0  # distributed runs: the ranks each run had on this node (0: one process)
    # torch.compile: {"graphs", "calls", "graph_breaks", "graph_table"} of run 1 (verdict/compiled.py); None: none ran
    compiled: dict | None = None
    # against a reference: what it is (``reference.folder.Reference.summary``), and the tolerance asked for
    reference: dict | None = None
    tolerance: Tolerance | None = None
    # against a reference: per step {step, ops, differing_ops, max_abs_diff (None: not measured)}
    growth: list[dict] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        differs = bool(self.tensors) or any(not cause.latent for cause in self.root_causes)
        if self.reference is not None:
            if not differs and not (self.strict and self.root_causes):
                return IDENTICAL
            within = self.tolerance is not None and all(self.tolerance.allows(diff) for diff in self.tensors)
            return WITHIN_TOLERANCE if within else DRIFT
        if differs:
            return NONDETERMINISTIC
        return LATENT if self.root_causes else DETERMINISTIC

    @property
    def deterministic(self) -> bool:
        """No difference at all that anything read (against a reference: bitwise its result)."""
        return self.verdict in (DETERMINISTIC, IDENTICAL)

    @property
    def passed(self) -> bool:
        """Whether the gate passes: deterministic, or latent without ``strict``;
        against a reference, identical or within the tolerance."""
        if self.reference is not None:
            return self.verdict != DRIFT
        return self.deterministic or (self.verdict == LATENT and not self.strict)

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

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
            "divergence": self.divergence.to_dict() if self.divergence else None,
            "strict": self.strict,
            "exit_code": self.exit_code,
            "environment_differences": self.environment_differences,
            **({"ranks": self.ranks} if self.ranks else {}),
            **({"compiled": self.compiled} if self.compiled else {}),
            **({"reference": self.reference, "tolerance": str(self.tolerance) if self.tolerance else None,
                "growth": self.growth} if self.reference is not None else {}),
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

    def _settings_text(self) -> str:
        """Which settings the runs compared, as they ran: " with threads 1, 1, 2, 4"."""
        if not self.variation:
            return ""
        values = self.variation.get("in_effect") or self.variation["settings"]
        return f" with {self.variation['vary']} " + ", ".join(map(_shown, values))

    def verdict_line(self) -> str:
        if self.reference is not None:
            return self._against_line()
        on_ranks = f" on {self.ranks} ranks" if self.ranks else ""
        runs = f"{self.repeats} runs of {self.target}{on_ranks}{self._steps_text()}{self._settings_text()}"
        if self.deterministic:
            return f"deterministic: {runs} were bitwise identical ({self.traced_ops} ops traced per run)"
        causes = len(self.root_causes)
        if self.verdict == LATENT:
            gate = "fails with --strict" if not self.strict else "fails: --strict"
            return (
                f"latent: {runs} ended with bitwise identical final states, but {causes} root "
                f"cause{'s' if causes != 1 else ''} gave different bits that were read and vanished on the "
                f"way; more steps or other data can bring them through ({gate})"
            )
        # distributed: every rank can repeat itself exactly while the replicas disagree with each other
        differ = "differ" if self.tensors or not self.ranks else "repeated themselves, but their ranks disagree"
        return (
            f"nondeterministic: {runs} {differ}; {causes} root cause{'s' if causes != 1 else ''}, "
            f"{self.propagated_ops} ops differ downstream, {len(self.tensors)} final tensors differ"
        )

    def _against_line(self) -> str:
        """The verdict against a reference (``repeats`` counts the reference as run 1)."""
        runs = self.repeats - 1
        what = f"{runs} run{'s' if runs != 1 else ''} of {self.target}{self._steps_text()}"
        saved = f"the reference in {self.reference['folder']}" + (
            f" (saved {self.reference['created']})" if self.reference.get("created") else ""
        )
        if self.verdict == IDENTICAL:
            return f"identical: {what} matched {saved} bit for bit ({self.traced_ops} ops traced)"
        roots = len(self.root_causes)
        worst = max((diff["max_ulp"] for diff in self.tensors), default=0)
        spread = (
            f"{len(self.tensors)} final tensor{'s' if len(self.tensors) != 1 else ''} differ (max {worst} ULP)"
            if self.tensors else "the final states are bitwise equal"
        )
        if self.verdict == WITHIN_TOLERANCE:
            return f"within-tolerance: {what} departed from {saved}, {spread}, within --tolerance {self.tolerance}"
        return (
            f"drift: {what} departed from {saved}; {roots} drift root{'s' if roots != 1 else ''}, "
            f"{self.propagated_ops} ops differ downstream, {spread}"
            + (f", over --tolerance {self.tolerance}" if self.tolerance is not None else "")
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
                    # a latent cause fails nothing unless --strict, nor a drift within --tolerance: a warning
                    severity=min(kind.severity, Severity.WARNING) if self._passes_anyway(cause) else kind.severity,
                    message=cause.message(),
                    path=cause.path or self.target,
                    line=cause.line,
                    fix_hint=cause.fix,
                    details={
                        "kind": cause.kind,
                        "op": cause.op,
                        "module": cause.module,
                        "phase": cause.phase,
                        "seen": cause.seen,
                        "max_abs_diff": cause.max_abs_diff,
                        "effect": cause.effect,
                        **({"ranks": cause.ranks} if cause.ranks else {}),
                    },
                )
            )
        return findings

    def _passes_anyway(self, cause: RootCause) -> bool:
        """Whether a cause is there but fails no gate: latent without ``strict``, or a drift within the tolerance."""
        return (cause.latent and not self.strict) or (self.reference is not None and self.passed)

    def render(self, console) -> None:
        """Write the report to a rich console.  Nothing in it is markup: tensor
        names (``optimizer.state[model.bias].exp_avg``), paths and messages hold
        brackets, so cells are ``Text`` and lines are printed with markup off."""
        from rich.table import Table
        from rich.text import Text

        def row(*cells: str) -> list[Text]:
            return [Text(cell) for cell in cells]

        style = "bold green" if self.deterministic else "bold yellow" if self.passed else "bold red"
        console.print(self.verdict_line(), style=style, highlight=False, soft_wrap=True, markup=False)
        if self.root_causes:
            table = Table(title="Root causes", title_justify="left")
            columns = ("kind", "op", "location", "module", "phase", "seen", "max |diff|", "step", "effect")
            for column in ("ranks", *columns) if self.ranks else columns:
                table.add_column(column, overflow="fold")
            for cause in self.root_causes:
                table.add_row(*row(
                    *([rank_span(cause.ranks)] if self.ranks else []),
                    cause.kind,
                    cause.op,
                    f"{cause.path}:{cause.line}" if cause.line else cause.path,
                    cause.module or "-",
                    cause.phase,
                    f"{cause.seen}/{cause.pairs} pairs",
                    _deviation_text(cause, ulp=self.reference is not None),
                    str(cause.first_step),
                    "latent" if cause.latent else "final state",
                ))
            console.print(table)
            for details, causes in _details_by_text(self.root_causes).items():
                where = ", ".join(f"{cause.path}:{cause.line} {cause.op}" for cause in causes)
                console.print(f"  {where}: {details}", highlight=False, markup=False)
        if self.growth:
            table = Table(title="How the drift spread, step by step", title_justify="left")
            for column in ("step", "ops", "ops differing", "max |diff| measured"):
                table.add_column(column)
            for step in self.growth:
                shown = "-" if step["max_abs_diff"] is None else f"{step['max_abs_diff']:.3g}"
                table.add_row(*row(str(step["step"]), str(step["ops"]), f"{step['differing_ops']} ({step['differing_ops'] / max(step['ops'], 1):.0%})", shown))
            console.print(table)
        if self.tensors:
            table = Table(title="Differing tensors after the last step", title_justify="left")
            for column in ("tensor", "shape", "dtype", "max |diff|", "max rel", "max ULP", "elements differing"):
                table.add_column(column, overflow="fold")
            for diff in self.tensors:
                table.add_row(*row(
                    diff["name"],
                    str(diff["shape"]),
                    diff["dtype"],
                    f"{diff['max_abs_diff']:.3g}",
                    f"{diff['max_rel_diff']:.3g}",
                    str(diff["max_ulp"]),
                    f"{diff['fraction_differing']:.1%}",
                ))
            console.print(table)
        if self.compiled:
            console.print(compiled_line(self.compiled), highlight=False, markup=False)
        for note in self.notes:
            console.print(f"note: {note}", highlight=False, markup=False)
        for warning in self.warnings:
            console.print(f"warning: {warning}", style="yellow", highlight=False, markup=False)
        if self.environment:
            console.print("Environment: " + self.environment_text(), highlight=False, style="dim", markup=False)

    def environment_text(self) -> str:
        """What matters of the fingerprint: versions, device, threads, hash
        seed, determinism switches, what differs between the runs and which
        recorder traced (the JSON report has all of it)."""
        from detaudit.runtime.environment import summary

        shown = summary(self.environment, also=[*self.environment_differences, RECORDER_KEY])
        parts = [
            f"{key}={', '.join(map(_shown, self.environment_differences[key]))}"
            if key in self.environment_differences
            else f"{key}={_shown(value)}"
            for key, value in shown.items()
        ]
        parts += [  # a key that only some runs had
            f"{key}={', '.join(map(_shown, values))}"
            for key, values in self.environment_differences.items()
            if key not in shown
        ]
        return ", ".join(parts)

    def to_text(self, width: int = 120) -> str:
        """The rendered report as plain text (for assertion messages and logs)."""
        from rich.console import Console

        buffer = io.StringIO()
        self.render(Console(file=buffer, width=width, color_system=None, force_terminal=False))
        return buffer.getvalue()

    def to_junit_xml(self) -> str:
        failure = None if self.passed else self.verdict_line()
        return junit_xml("detaudit run", self.target, failure, self.to_text(), warnings=self.warnings)


def junit_xml(
    suite_name: str, target: str, failure: str | None, details: str, *, warnings: list[str] = (), error: bool = False
) -> str:
    """A one-test JUnit XML result: passed, or failed with ``failure`` as its message
    (an ``<error>`` rather than a ``<failure>`` when the audit itself could not run)."""
    failed = "0" if failure is None or error else "1"
    suite = ElementTree.Element(
        "testsuite", name=suite_name, tests="1", failures=failed, errors="1" if error else "0"
    )
    case = ElementTree.SubElement(suite, "testcase", classname="detaudit.run", name=target)
    if failure is not None:
        element = ElementTree.SubElement(case, "error" if error else "failure", message=failure)
        element.text = details
    if warnings:
        ElementTree.SubElement(case, "system-err").text = "\n".join(f"warning: {w}" for w in warnings)
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
        return junit_xml("detaudit run", self.target, self.message, self.output_tail, error=True)


def rank_span(ranks: list[int]) -> str:
    """"1", "0-3", "0, 2-3"."""
    spans: list[list[int]] = []
    for rank in sorted(set(ranks)):
        if spans and rank == spans[-1][1] + 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def rank_list(ranks: list[int]) -> str:
    """"rank 1", "ranks 0-3", "ranks 0, 2-3"."""
    return f"{'rank' if len(set(ranks)) == 1 else 'ranks'} {rank_span(ranks)}"


def flat_environment(environment: dict, prefix: str = "") -> str:
    parts = []
    for key, value in environment.items():
        if isinstance(value, dict):
            parts.append(flat_environment(value, f"{prefix}{key}."))
        elif value is not None:  # unset settings would only add noise
            parts.append(f"{prefix}{key}={value}")
    return ", ".join(part for part in parts if part)


def _deviation_text(cause: RootCause, *, ulp: bool) -> str:
    """The max |diff| cell: "1.2e-07", with its ULP against a reference ("1.2e-07 (3 ULP)")."""
    if cause.max_abs_diff is None:
        return "-"
    return f"{cause.max_abs_diff:.3g}" + (f" ({cause.max_ulp} ULP)" if ulp and cause.max_ulp is not None else "")


def _details_by_text(causes: list[RootCause]) -> dict[str, list[RootCause]]:
    """Each cause's details (what the other run did, the fix), the causes that
    share a text once: a drift's roots all say the same."""
    grouped: dict[str, list[RootCause]] = {}
    for cause in causes:
        details = [*cause.details(), cause.fix]
        grouped.setdefault(" ".join(details), []).append(cause)
    return grouped


def _shown(value) -> str:
    return "unset" if value is None else str(value)
