"""From the traces and final states of R repeats to a ``RunReport``.

The final states are compared by their digests (``compare/state_diff.py``): torch
is imported only to measure tensors that differ.

Run 0 is the reference; every other run is compared with it (R-1 pairs).  The
same root cause found in several pairs is one cause seen k times; it reaches
the final state when it did so in any pair, else it is latent (see
``compare/classify.py``).  With a
variation (``variations.py``), run 1 repeats run 0's setting (the control
pair) and later runs change it: a cause that only shows in varied pairs is
attributed to the variation.  The deviation of each cause's tensor is measured
from a targeted capture (``capture(pair, records, sampled)``), supplied by the
caller: the reference's and the other run's tensors at those records, from
reruns of them, or for the other run from what it kept as it ran (``runner.py``).  The first
pair that differed also gives the divergence chart's data
(``compare/divergence.py``): its capture rerun samples the outputs of the records
that differed, so the chart and the root causes come from the same rerun.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from detaudit.dynamic.compare.causes import DRIFTING_KINDS, ENVIRONMENT_DRIFT, NONDETERMINISTIC_OP, RNG, UnseededGenerator
from detaudit.knowledge.apis import RNG_STATE_RESTORERS
from detaudit.dynamic.compare.classify import CauseAt, PairComparison, Site, Trace, compare_traces, first_step
from detaudit.dynamic.compare.divergence import ROOT, Divergence, divergence_of, growth_by_step, root_causes_by_record
from detaudit.dynamic.compare.state_diff import SavedState, TensorDiff, compare_saved_states, tensor_diff
from detaudit.dynamic.variations import Variation
from detaudit.dynamic.verdict.run_report import FINAL_STATE, LATENT, RootCause, RunReport

# capture(k, records, sampled) -> ({record: {"inputs": [...], "outputs": [...]}} of run 0, same of run k);
# the records in ``sampled`` (a subset of ``records``) as {"outputs": [samples], "sampled_from": [numel]}
CaptureFn = Callable[[int, list[int], list[int]], tuple[dict, dict]]


@dataclass
class _Found:
    cause: CauseAt
    pair: int  # first pair (other run index) it was seen in
    site: Site
    seen: int = 0
    seen_in_control: int = 0
    reaches_final: bool = False


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
    states: list[SavedState],
    *,
    steps: int,
    environment: dict,
    capture: CaptureFn | None = None,
    variation: Variation | None = None,
    run_environments: list[dict] | None = None,
    across_environments: bool = False,
) -> RunReport:
    """``environment`` is the reference run's fingerprint; ``run_environments``
    every run's, when each recorded one (they say what differed between runs
    and which setting of a variation each run really ran with).
    ``across_environments``: run 0 is a reference saved in another
    environment (``dynamic/reference/``), so an op that gave other bits from
    the same inputs is an environment drift, not a nondeterministic op."""
    settings = variation.settings(len(traces)) if variation else []
    found: dict[Site, _Found] = {}
    propagated = 0
    worst_tensors: dict[str, dict] = {}
    diverged: tuple[int, PairComparison] | None = None  # the first pair that differed: the chart's
    for other in range(1, len(traces)):
        varied = bool(variation) and settings[other] != settings[0]
        # between environments the op sequences may part (another decomposition) and realign
        pair = compare_traces(traces[0], traces[other], realign=across_environments)
        if pair.causes and diverged is None:
            diverged = (other, pair)
        propagated = max(propagated, pair.propagated)
        state_diffs = compare_saved_states(states[0], states[other])
        # without the final state's digests, no cause can be shown to vanish before it
        reaches_final_unknown = not pair.final_known
        seen_here = set()
        for cause in pair.causes:  # the same site can recur in later steps: count each pair once
            site = cause.site(traces[0])
            entry = found.setdefault(site, _Found(cause, other, site))
            entry.reaches_final |= cause.reaches_final or reaches_final_unknown
            if site in seen_here:
                continue
            seen_here.add(site)
            entry.seen += 1
            entry.seen_in_control += not varied
        for diff in state_diffs:
            known = worst_tensors.get(diff.name)
            if known is None or diff.max_abs_diff > known["max_abs_diff"]:
                worst_tensors[diff.name] = diff.to_dict()

    divergence = divergence_of(traces[0], diverged[1], diverged[0]) if diverged else None
    chart_causes = root_causes_by_record(diverged[1]) if diverged else {}
    deviations = _measure_deviations(list(found.values()), capture, divergence, chart_causes)
    pairs = len(traces) - 1
    causes = []
    for entry in found.values():
        site = entry.site
        kind = site.kind
        if variation and entry.seen_in_control == 0:
            kind = variation.cause
        if across_environments and _drifted(kind, entry.cause):
            kind = ENVIRONMENT_DRIFT
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
                max_abs_diff=deviations[id(entry)].max_abs_diff if id(entry) in deviations else None,
                max_ulp=deviations[id(entry)].max_ulp if id(entry) in deviations else None,
                hint=op_hint(site.op) if kind is NONDETERMINISTIC_OP else "",
                other_side=entry.cause.other_side,
                effect=FINAL_STATE if entry.reaches_final else LATENT,
                record=entry.cause.capture_record,
            )
        )
    causes = _one_cause_per_rng_state(causes)
    causes.sort(key=lambda c: (c.first_step, c.path, c.line))
    # against a reference: how far the drift spread, step by step (the first pair's)
    growth = growth_by_step(traces[0], diverged[1], divergence) if across_environments and diverged else []
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
        variation=_variation_record(variation, settings, run_environments),
        notes=notes,
        divergence=divergence,
        environment_differences=environment_differences(run_environments or []),
        growth=growth,
    )


def _drifted(kind, cause: CauseAt) -> bool:
    """Whether a cause found against a reference saved elsewhere is the
    environment computing an op differently (``DRIFTING_KINDS``): not an RNG
    cause whose generator state a call set differently."""
    return kind in DRIFTING_KINDS and not (kind is RNG and cause.other_side is not None)


def environment_differences(environments: list[dict]) -> dict[str, list]:
    """Fingerprint keys whose values are not the same in every run -> each run's value."""
    if len(environments) < 2:
        return {}
    keys = dict.fromkeys(key for environment in environments for key in environment)
    return {
        key: [environment.get(key) for environment in environments]
        for key in keys
        if any(environment.get(key) != environments[0].get(key) for environment in environments)
    }


def _variation_record(variation: Variation | None, settings: list, environments: list[dict] | None) -> dict:
    """What a variation asked each run for and, when the runs recorded it, what each ran with."""
    if variation is None:
        return {}
    record = {"vary": variation.name, "settings": settings}
    if environments and len(environments) == len(settings):
        record["in_effect"] = [variation.in_effect(environment) for environment in environments]
    return record


def _one_cause_per_rng_state(causes: list[RootCause]) -> list[RootCause]:
    """Draws from one generator state that differed are one hazard: one cause,
    at the first draw, naming the others.  The state a call set differently
    (``torch.seed()`` before a model's normal_ and uniform_) is one; a
    generator never seeded is one, with every state restored from it later
    (``torch.set_rng_state``: Lightning's ``isolate_rng`` puts back the state it
    saved, which differed because nothing seeded it)."""
    unseeded = any(cause.kind is RNG and cause.other_side is None for cause in causes)

    def hazard(cause: RootCause):
        if cause.kind is not RNG:
            return None
        change = cause.other_side
        if unseeded and (change is None or change.call in RNG_STATE_RESTORERS):
            return UnseededGenerator
        return change

    merged: dict[object, RootCause] = {}
    kept = []
    for cause in causes:
        key = hazard(cause)
        if key is None:
            kept.append(cause)
            continue
        first = merged.get(key)
        if first is None:
            if key is UnseededGenerator:
                cause.other_side = UnseededGenerator()
            merged[key] = cause
            kept.append(cause)
            continue
        first.other_side = replace(first.other_side, also=(*first.other_side.also, f"{cause.op} at {cause.path}:{cause.line}"))
        first.seen = max(first.seen, cause.seen)
        if cause.effect == FINAL_STATE:
            first.effect = FINAL_STATE
    return kept


def _measure_deviations(
    entries: list[_Found],
    capture: CaptureFn | None,
    divergence: Divergence | None = None,
    chart_causes: dict[int, CauseAt] | None = None,
) -> dict[int, TensorDiff]:
    """How each cause's tensor differs (max |diff|, max ULP), from one
    targeted capture per pair; the chart's pair also measures the
    divergence's records (in place)."""
    measurable = [e for e in entries if e.cause.capture_record >= 0]
    chart_records = divergence.records_to_measure() if divergence else []
    chart_pair = divergence.other_run if chart_records else None
    if capture is None or not (measurable or chart_records):
        return {}
    deviations: dict[int, TensorDiff] = {}
    for pair in sorted({e.pair for e in measurable} | ({chart_pair} if chart_pair else set())):
        in_pair = [e for e in measurable if e.pair == pair]
        full = {e.cause.capture_record for e in in_pair}
        sampled = sorted(set(chart_records) - full) if pair == chart_pair else []
        reference, other = capture(pair, sorted(full | set(sampled)), sampled)
        for entry in in_pair:
            value = _cause_deviation(reference, other, entry.cause)
            if value is not None:
                deviations[id(entry)] = value
        if pair == chart_pair:
            _measure_divergence(divergence, reference, other, chart_causes or {})
    return deviations


def _cause_deviation(reference: dict, other: dict, cause: CauseAt) -> TensorDiff | None:
    """The worst difference (max |diff|, max ULP) of the tensors that show a
    cause (None when not captured)."""
    tensors_a = reference.get(cause.capture_record, {}).get(cause.capture_side, [])
    tensors_b = other.get(cause.capture_record, {}).get(cause.capture_side, [])
    if cause.capture_position is not None:
        position = cause.capture_position
        tensors_a, tensors_b = tensors_a[position : position + 1], tensors_b[position : position + 1]
    elif cause.capture_outputs is not None and len(cause.capture_outputs) == len(tensors_a) == len(tensors_b):
        # (a view op's outputs have no digests: then the two lists differ in length, and every output counts)
        tensors_a = [t for t, shown in zip(tensors_a, cause.capture_outputs) if shown]
        tensors_b = [t for t, shown in zip(tensors_b, cause.capture_outputs) if shown]
    if not (tensors_a and tensors_b):
        return None
    diffs = [d for d in (tensor_diff("", a, b) for a, b in zip(tensors_a, tensors_b)) if d]
    if not diffs:
        return TensorDiff("", [], "", 0.0, 0.0, 0, 0.0)
    worst = max(diffs, key=lambda d: d.max_abs_diff)
    return replace(worst, max_ulp=max(d.max_ulp for d in diffs))


def _measure_divergence(divergence: Divergence, reference: dict, other: dict, causes: dict[int, CauseAt]) -> None:
    """Each chart point's max |diff|: a root cause captured in full as its
    cause is measured, any other record over its (sampled) outputs."""
    for point in divergence.points:
        captured_a, captured_b = reference.get(point.record), other.get(point.record)
        if captured_a is None or captured_b is None:
            continue
        cause = causes.get(point.record)
        if point.status == ROOT and cause is not None and "inputs" in captured_a:
            deviation = _cause_deviation(reference, other, cause)
            point.max_abs_diff = deviation.max_abs_diff if deviation else None
            continue
        pairs = [(a, b) for a, b in zip(captured_a["outputs"], captured_b["outputs"]) if a.numel() and b.numel()]
        if not pairs:
            continue
        diffs = [tensor_diff("", a, b) for a, b in pairs]
        point.max_abs_diff = max((d.max_abs_diff for d in diffs if d), default=0.0)
        sizes = captured_a.get("sampled_from", [])
        point.sampled = any(size > sample.numel() for size, sample in zip(sizes, captured_a["outputs"]))
