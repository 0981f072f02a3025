"""``detaudit run --remedy``: the least a nondeterministic script must change
to reproduce, proven by rerunning it, and what each choice costs.

Given the report of a nondeterministic audit:

1. Each root cause gets its candidate remedies (``remedies.candidates``).
2. Each candidate is tried alone: the audit is rerun with it applied through
   the bootstrap (same repeats, seed, step limit and variation; the script is
   not edited).  The causes that no longer show are the ones it fixes; when
   the runs are bitwise identical it is sufficient by itself.
3. Otherwise the smallest combinations of candidates that, by what each fixed
   alone, cover every cause are audited the same way; one that is not enough
   names the cause that remains, and the next is tried.
4. The training step is timed under the default settings, each minimal
   sufficient set and full determinism (``detaudit.enable_determinism()``),
   in untraced runs that alternate between the configurations round by round
   (the order rotating each round), so that load hits all of them alike.  The
   runs of each configuration are compared bitwise at the end.  Step time is
   the time between optimizer steps; the first step, which includes start-up,
   is left out.
5. The cheapest minimal set is written as code to paste (``remedies.paste_code``).
"""

from __future__ import annotations

import itertools
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from detaudit.dynamic.record.features import SaveFinalState
from detaudit.dynamic.remedy.catalogue import (
    FULL_DETERMINISM,
    FULL_DETERMINISM_TITLE,
    REMEDIES,
    Conflict,
    Machine,
    candidates,
    combined_options,
    deterministic_algorithms_raised,
    failure_summary,
    paste_code,
)
from detaudit.dynamic.variations import VARIATIONS
from detaudit.dynamic.verdict.run_report import RootCause, RunReport
from detaudit.launch.options import LaunchOptions
from detaudit.launch.process import run_script

DEFAULT_TITLE = "default"
MAX_MINIMAL_SETS_TIMED = 3  # alternatives of the smallest size that are timed (and combinations tried per size)


def _cause_key(cause: RootCause) -> tuple:
    return (cause.op, cause.path, cause.line)


def describe_cause(cause: RootCause) -> str:
    return f"{cause.kind} {cause.op} at {cause.path}:{cause.line}"


@dataclass
class CauseRemedies:
    cause: RootCause
    remedies: list[str]  # candidate names, most targeted first
    titles: list[str]  # the same, as the tables name them
    advice: list[str]  # what no setting can do (replace an op)

    def to_dict(self) -> dict:
        cause = self.cause
        return {
            "kind": cause.kind.name,
            "op": cause.op,
            "path": cause.path,
            "line": cause.line,
            "candidates": self.remedies,
            "advice": self.advice,
        }


@dataclass
class Trial:
    """One audit under a set of remedies."""

    remedies: tuple[str, ...]
    title: str
    options: dict[str, Any]
    reproducible: bool = False
    fixed: list[int] = field(default_factory=list)  # indices of the causes that no longer showed
    remaining: list[str] = field(default_factory=list)  # the causes that still showed
    error: str | None = None  # the script failed under it
    advice: str | None = None  # what the failure means (deterministic algorithms raised)

    def to_dict(self) -> dict:
        return {
            "remedies": list(self.remedies),
            "title": self.title,
            "options": _jsonable(self.options),
            "reproducible": self.reproducible,
            "fixed": self.fixed,
            "remaining": self.remaining,
            "error": self.error,
            "advice": self.advice,
        }

    def outcome(self, repeats: int) -> str:
        if self.error:
            return f"the script failed: {self.error}"
        if self.reproducible:
            return f"reproducible over {repeats} runs"
        still = "; ".join(self.remaining) or "final tensors still differ"
        return f"not enough: still {still}"


@dataclass
class Timing:
    """One configuration of the cost table."""

    title: str
    remedies: tuple[str, ...] | None  # None for the default and full determinism
    options: dict[str, Any]
    runs: int = 0
    reproducible: bool | None = None  # None: a run failed
    median_step_s: float | None = None
    steps_timed: int = 0
    error: str | None = None
    unseeded_generators: list[dict] = field(default_factory=list)  # where the script made them (seeded runs)

    def to_dict(self) -> dict:
        return {
            "settings": self.title,
            "remedies": None if self.remedies is None else list(self.remedies),
            "options": _jsonable(self.options),
            "runs": self.runs,
            "reproducible": self.reproducible,
            "median_step_s": self.median_step_s,
            "steps_timed": self.steps_timed,
            "error": self.error,
        }


@dataclass
class RemedyReport:
    script: str
    repeats: int
    causes: list[CauseRemedies]
    trials: list[Trial]
    minimal: list[tuple[str, ...]]  # the sufficient sets of the smallest size found
    chosen: tuple[str, ...] | None  # the cheapest of them (by median step time), whose code is pasted
    timings: list[Timing]
    timing_repeats: int
    code: str  # to paste at the top of the script ("" when nothing was found)
    in_code: list[str]  # the same changes made in the script's own code, pointing at lines
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        default = self.timings[0].median_step_s if self.timings else None
        return {
            "causes": [c.to_dict() for c in self.causes],
            "trials": [t.to_dict() for t in self.trials],
            "minimal": [list(s) for s in self.minimal],
            "chosen": None if self.chosen is None else list(self.chosen),
            "timing": [
                {**t.to_dict(), "cost_vs_default": _ratio(t.median_step_s, default)} for t in self.timings
            ],
            "timing_repeats": self.timing_repeats,
            "code": self.code,
            "in_code": self.in_code,
            "notes": self.notes,
        }

    def render(self, console) -> None:
        from rich.markup import escape
        from rich.table import Table

        console.print(f"Remedies, smallest set first (each audited over {self.repeats} runs as above)", style="bold")
        for entry in self.causes:
            names = ", ".join(entry.titles) or "none detaudit can apply"
            console.print(f"  {escape(describe_cause(entry.cause))}: try {names}", highlight=False)
            for advice in entry.advice:
                console.print(f"    {escape(advice)}", highlight=False)
        for trial in self.trials:
            console.print(f"  {trial.title}: {escape(trial.outcome(self.repeats))}", highlight=False)
            if trial.advice:
                console.print(f"    {escape(trial.advice)}", highlight=False)
        if self.minimal:
            chosen = " | ".join(self._title(s) for s in self.minimal)
            console.print(f"Minimal sufficient set{'s' if len(self.minimal) > 1 else ''}: {chosen}", style="bold green", highlight=False)
        for note in self.notes:
            console.print(f"note: {escape(note)}", highlight=False)
        if self.timings:
            table = Table(
                title=f"Cost ({self.timing_repeats} untraced runs each, alternating; step = time between optimizer "
                "steps, the first step left out)",
                title_justify="left",
            )
            for column in ("settings", f"reproducible over {self.timing_repeats} runs", "median step", "cost vs default"):
                table.add_column(column, overflow="fold")
            default = self.timings[0].median_step_s
            for timing in self.timings:
                if timing.error:
                    reproducible, step, cost = "failed", escape(timing.error), "-"
                else:
                    reproducible = {True: "yes", False: "no", None: "-"}[timing.reproducible]
                    step = _duration(timing.median_step_s)
                    ratio = _ratio(timing.median_step_s, default)
                    cost = "-" if ratio is None else f"{ratio:.2f}x"
                table.add_row(timing.title, reproducible, step, cost)
            console.print(table)
        if self.code:
            why = "the cheapest sufficient set" if len(self.minimal) > 1 else "the minimal sufficient set"
            console.print(
                f"Code to paste at the top of {self.script} ({self._title(self.chosen)}: {why}; plain Python, no detaudit):",
                style="bold",
                highlight=False,
            )
            for line in self.code.splitlines():
                console.print(f"    {escape(line)}" if line else "", highlight=False, soft_wrap=True)
            for line in self.in_code:
                console.print(f"  {escape(line)}", highlight=False)

    def _title(self, names: tuple[str, ...] | None) -> str:
        for timing in self.timings:
            if timing.remedies == names:
                return timing.title
        for trial in self.trials:
            if trial.remedies == names:
                return trial.title
        return " + ".join(names or ())


def find_remedy(
    script: str,
    script_args: Sequence[str],
    report: RunReport,
    *,
    steps: int = 2,
    repeats: int = 3,
    seed: int | None = 0,
    vary: str | None = None,
    timeout: float | None = None,
    cwd: str | None = None,
    timing_repeats: int | None = None,
    timing_steps: int = 10,
    progress: Callable[[str], None] = lambda message: None,
) -> RemedyReport:
    """The remedy search and cost table for a script whose audit gave ``report``."""
    import torch

    machine = Machine(report.environment, torch.get_num_threads(), seeded=seed is not None)
    audit = _Auditor(script, script_args, steps=steps, repeats=repeats, seed=seed, vary=vary, timeout=timeout, cwd=cwd)
    causes = []
    for cause in report.root_causes:
        found = candidates(cause, machine)
        titles = [REMEDIES[name].label(machine) for name in found.remedies]
        causes.append(CauseRemedies(cause, found.remedies, titles, found.advice))
    if report.tensors and not report.root_causes:
        causes_note = ["final tensors differ but no traced op did: no cause to derive a remedy from"]
    else:
        causes_note = []

    search = _Search(causes, machine, audit, progress)
    minimal = search.run()
    notes = causes_note + search.notes

    timing_repeats = timing_repeats or repeats
    timings = _time_configurations(
        script,
        script_args,
        [(search.title(names), names, search.options(names)) for names in minimal[:MAX_MINIMAL_SETS_TIMED]],
        machine,
        seed=seed,
        vary=vary,
        repeats=timing_repeats,
        steps=timing_steps,
        timeout=timeout,
        cwd=cwd,
        progress=progress,
    )
    chosen = _cheapest(minimal, timings)
    code, in_code = "", []
    if chosen is not None:
        chosen_timing = next((t for t in timings if t.remedies == chosen), None)
        made = chosen_timing.unseeded_generators if chosen_timing else []
        code = paste_code(search.options(chosen), machine, seed=seed, generators=[m["call"] for m in made])
        in_code = _in_code(chosen, causes, search, made)
    return RemedyReport(
        script=script,
        repeats=repeats,
        causes=causes,
        trials=search.trials,
        minimal=minimal,
        chosen=chosen,
        timings=timings,
        timing_repeats=timing_repeats,
        code=code,
        in_code=in_code,
        notes=notes,
    )


class _Auditor:
    """Reruns the audit with remedy options applied."""

    def __init__(self, script, script_args, **options):
        self.script, self.script_args, self.options = script, script_args, options

    def __call__(self, remedy_options: dict[str, Any]) -> RunReport:
        from detaudit.dynamic.runner import audit_script

        return audit_script(self.script, self.script_args, remedy_options=remedy_options, measure=False, **self.options)


class _Search:
    def __init__(self, causes: list[CauseRemedies], machine: Machine, audit: _Auditor, progress):
        self.causes, self.machine, self.audit, self.progress = causes, machine, audit, progress
        self.trials: list[Trial] = []
        self.notes: list[str] = []

    def options(self, names: tuple[str, ...]) -> dict[str, Any]:
        return combined_options([REMEDIES[name] for name in names], self.machine)

    def title(self, names: tuple[str, ...]) -> str:
        return " + ".join(REMEDIES[name].label(self.machine) for name in names)

    def run(self) -> list[tuple[str, ...]]:
        names = list(dict.fromkeys(name for entry in self.causes for name in entry.remedies))
        if not names:
            self.notes.append("no remedy detaudit can apply fits these causes")
            return []
        singles = {name: self.trial((name,)) for name in names}
        sufficient = [trial.remedies for trial in singles.values() if trial.reproducible]
        if sufficient:
            return sufficient
        usable = [name for name, trial in singles.items() if not trial.error and trial.fixed]
        everything = set(range(len(self.causes)))
        unfixed = everything - {i for name in usable for i in singles[name].fixed}
        if unfixed:
            self.notes += [
                f"no remedy detaudit tried fixed {describe_cause(self.causes[i].cause)}" for i in sorted(unfixed)
            ]
            return []
        for size in range(2, len(usable) + 1):
            found = []
            for names_ in self._covers(usable, singles, size):
                trial = self.trial(names_)
                if trial.reproducible:
                    found.append(names_)
            if found:
                return found
        self.notes.append("no combination of the remedies that each fixed a cause made the runs reproducible")
        return []

    def _covers(self, usable: list[str], singles: dict[str, Trial], size: int):
        """Combinations of ``size`` remedies that together fixed every cause,
        none of them redundant, whose options do not conflict."""
        everything = set(range(len(self.causes)))
        tried = 0
        for names in itertools.combinations(usable, size):
            fixed = [set(singles[name].fixed) for name in names]
            if set().union(*fixed) != everything:
                continue
            if any(set().union(*(f for j, f in enumerate(fixed) if j != i)) == everything for i in range(size)):
                continue  # a member adds nothing: a smaller set covers too
            try:
                self.options(names)
            except Conflict:
                continue
            yield names
            tried += 1
            if tried >= MAX_MINIMAL_SETS_TIMED:
                return

    def trial(self, names: tuple[str, ...]) -> Trial:
        from detaudit.dynamic.runner import ScriptFailed

        trial = Trial(names, self.title(names), self.options(names))
        self.progress(f"remedy: trying {trial.title}")
        try:
            result = self.audit(trial.options)
        except ScriptFailed as failed:
            message = failed.failure.output_tail
            trial.error = "timed out" if failed.failure.timed_out else failure_summary(message)
            trial.advice = deterministic_algorithms_raised(message)
        else:
            trial.reproducible = result.deterministic
            still = {_cause_key(c) for c in result.root_causes}
            trial.fixed = [i for i, entry in enumerate(self.causes) if _cause_key(entry.cause) not in still]
            trial.remaining = [describe_cause(c) for c in result.root_causes]
        self.trials.append(trial)
        return trial


def _time_configurations(
    script: str,
    script_args: Sequence[str],
    minimal: list[tuple[str, tuple[str, ...], dict[str, Any]]],
    machine: Machine,
    *,
    seed: int | None,
    vary: str | None,
    repeats: int,
    steps: int,
    timeout: float | None,
    cwd: str | None,
    progress: Callable[[str], None],
) -> list[Timing]:
    from detaudit.dynamic.compare.state_diff import SavedState, compare_saved_states

    configurations = [
        Timing(DEFAULT_TITLE, None, {}),
        *(Timing(title, names, options) for title, names, options in minimal),
        Timing(FULL_DETERMINISM_TITLE, None, dict(FULL_DETERMINISM)),
    ]
    variation = VARIATIONS[vary] if vary else None
    settings = variation.settings(repeats) if variation else []
    step_times: dict[int, list[float]] = {i: [] for i in range(len(configurations))}
    states: dict[int, list[SavedState]] = {i: [] for i in range(len(configurations))}
    with tempfile.TemporaryDirectory(prefix="detaudit-remedy-") as workdir:
        for round_ in range(repeats):
            order = list(range(len(configurations)))
            order = order[round_ % len(order) :] + order[: round_ % len(order)]  # rotate: no configuration always first
            for index in order:
                timing = configurations[index]
                if timing.error:
                    continue
                progress(f"timing: {timing.title} (round {round_ + 1}/{repeats})")
                options = LaunchOptions(
                    seed=seed, max_steps=steps, output_dir=Path(workdir) / f"{index}-{round_}",
                    settings={**({variation.setting: settings[round_]} if variation else {}), **timing.options},
                    features=(SaveFinalState(),),
                )
                result = run_script(script, script_args, options=options, timeout=timeout, cwd=cwd)
                if result.failed:
                    timing.error = "timed out" if result.timed_out else failure_summary(result.stderr or result.stdout)
                    continue
                timing.runs += 1
                ends = result.payload.get("step_ends", [])
                step_times[index] += [later - earlier for earlier, later in zip(ends, ends[1:])]
                if "state_file" in result.payload:
                    states[index].append(SavedState.of_file(result.payload["state_file"], result.payload["state_digests"]))
                for made in result.payload.get("unseeded_generators", []):
                    site = {key: made[key] for key in ("call", "path", "line")}
                    if site not in timing.unseeded_generators:  # every timed run makes the same ones
                        timing.unseeded_generators.append(site)
        for index, timing in enumerate(configurations):
            if timing.error:
                continue
            times = step_times[index]
            timing.steps_timed = len(times)
            timing.median_step_s = statistics.median(times) if times else None
            saved = states[index]
            timing.reproducible = all(not compare_saved_states(saved[0], other) for other in saved[1:]) if saved else None
    return configurations


def _cheapest(minimal: list[tuple[str, ...]], timings: list[Timing]) -> tuple[str, ...] | None:
    """The minimal set that reproduced in the timing runs and took the least time per step."""
    if not minimal:
        return None
    measured = {t.remedies: t for t in timings if t.remedies is not None and t.reproducible and t.median_step_s is not None}
    ranked = sorted(minimal, key=lambda names: measured[names].median_step_s if names in measured else float("inf"))
    return ranked[0]


def _in_code(chosen: tuple[str, ...], causes: list[CauseRemedies], search: _Search, made: list[dict]) -> list[str]:
    """The chosen remedies as changes in the script's own code, pointing at lines."""
    lines = []
    for name in chosen:
        remedy = REMEDIES[name]
        if not remedy.in_code:
            continue
        if "seed-generators" in remedy.settings:
            where = ", ".join(f"{m['call']}() at {m['path']}:{m['line']}" for m in made)
        else:
            fixed = {i for trial in search.trials if trial.remedies == (name,) for i in trial.fixed}
            where = ", ".join(f"{causes[i].cause.path}:{causes[i].cause.line}" for i in sorted(fixed))
        if where:
            lines.append(remedy.in_code.format(where=where))
    return lines


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1e3:.3g} ms"


def _ratio(value: float | None, default: float | None) -> float | None:
    if value is None or not default:
        return None
    return value / default


def _jsonable(options: dict[str, Any]) -> dict[str, Any]:
    return {key: list(value) if isinstance(value, tuple) else value for key, value in options.items()}
