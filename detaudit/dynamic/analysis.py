"""From the traces and final states of R repeats to a ``RunReport``.

Run 0 is the reference; every other run is compared with it (R-1 pairs).  The
same root cause found in several pairs is one cause seen k times.  With a
variation (``variations.py``), run 1 repeats run 0's setting (the control
pair) and later runs change it: a cause that only shows in varied pairs is
attributed to the variation.  The deviation of each cause's tensor is measured
from a targeted capture (``capture(pair, records)``), supplied by the caller,
which reruns the reference and the other run of that pair.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from detaudit.dynamic.causes import NONDETERMINISTIC_OP
from detaudit.dynamic.compare import CauseAt, Site, Trace, compare_traces, first_step
from detaudit.dynamic.report import RootCause, RunReport
from detaudit.dynamic.variations import Variation

# capture(k, records) -> ({record: {"inputs": [...], "outputs": [...]}} of run 0, same of run k)
CaptureFn = Callable[[int, list[int]], tuple[dict, dict]]


@dataclass
class _Found:
    cause: CauseAt
    pair: int  # first pair (other run index) it was seen in
    site: Site
    seen: int = 0
    seen_in_control: int = 0


def op_hint(op: str) -> str:
    """The knowledge base's hint for a known nondeterministic op ("" if unknown)."""
    try:
        from detaudit.knowledge.ops import load_ops_table
    except ImportError:  # the knowledge base's op table is optional
        return ""
    entry = load_ops_table().lookup_aten(op)
    return entry.hint() if entry is not None else ""


def build_report(
    target: str,
    traces: list[Trace],
    states: list[dict],
    *,
    steps: int,
    environment: dict,
    capture: CaptureFn | None = None,
    variation: Variation | None = None,
) -> RunReport:
    from detaudit.dynamic.state import compare_states

    settings = variation.settings(len(traces)) if variation else []
    found: dict[Site, _Found] = {}
    propagated = 0
    worst_tensors: dict[str, dict] = {}
    for other in range(1, len(traces)):
        varied = bool(variation) and settings[other] != settings[0]
        pair = compare_traces(traces[0], traces[other])
        propagated = max(propagated, pair.propagated)
        seen_here = set()
        for cause in pair.causes:  # the same site can recur in later steps: count each pair once
            site = cause.site(traces[0])
            if site in seen_here:
                continue
            seen_here.add(site)
            entry = found.setdefault(site, _Found(cause, other, site))
            entry.seen += 1
            entry.seen_in_control += not varied
        for diff in compare_states(states[0], states[other]):
            known = worst_tensors.get(diff.name)
            if known is None or diff.max_abs_diff > known["max_abs_diff"]:
                worst_tensors[diff.name] = diff.to_dict()

    deviations = _measure_deviations(list(found.values()), capture)
    pairs = len(traces) - 1
    causes = []
    for entry in found.values():
        site = entry.site
        kind = site.kind
        if variation and entry.seen_in_control == 0:
            kind = variation.cause
        causes.append(
            RootCause(
                kind=kind,
                op=site.op,
                path=site.path,
                line=site.line,
                module=site.module,
                phase=site.phase,
                seen=entry.seen,
                pairs=pairs,
                first_step=first_step(traces[0], entry.cause.record),
                max_abs_diff=deviations.get(id(entry)),
                hint=op_hint(site.op) if kind is NONDETERMINISTIC_OP else "",
                other_side=entry.cause.other_side,
            )
        )
    causes.sort(key=lambda c: (c.first_step, c.path, c.line))
    notes = []
    if worst_tensors and not causes:
        notes.append("final tensors differ but no traced op did: the difference comes from outside the trace")
    return RunReport(
        target=target,
        repeats=len(traces),
        steps=steps,
        root_causes=causes,
        tensors=sorted(worst_tensors.values(), key=lambda d: d["name"]),
        environment=environment,
        propagated_ops=propagated,
        traced_ops=len(traces[0].ops),
        variation={"vary": variation.name, "settings": settings} if variation else {},
        notes=notes,
    )


def _measure_deviations(entries: list[_Found], capture: CaptureFn | None) -> dict[int, float]:
    """max |diff| of each cause's tensor, from one targeted rerun per pair."""
    from detaudit.dynamic.state import tensor_diff

    measurable = [e for e in entries if e.cause.capture_record >= 0]
    if capture is None or not measurable:
        return {}
    deviations: dict[int, float] = {}
    for pair in sorted({e.pair for e in measurable}):
        in_pair = [e for e in measurable if e.pair == pair]
        reference, other = capture(pair, sorted({e.cause.capture_record for e in in_pair}))
        for entry in in_pair:
            cause = entry.cause
            tensors_a = reference.get(cause.capture_record, {}).get(cause.capture_side, [])
            tensors_b = other.get(cause.capture_record, {}).get(cause.capture_side, [])
            if cause.capture_position is not None:
                position = cause.capture_position
                tensors_a, tensors_b = tensors_a[position : position + 1], tensors_b[position : position + 1]
            diffs = [tensor_diff("", a, b) for a, b in zip(tensors_a, tensors_b)]
            if tensors_a and tensors_b:
                deviations[id(entry)] = max((d.max_abs_diff for d in diffs if d), default=0.0)
    return deviations
