"""From the traces, final states and payloads of R repeats of an N-rank run to one report.

* **Per rank**: each rank's R repeats go through the same analysis as a
  single process (``analysis.build_report``); every root cause carries its
  rank, and a cause found at the same site on several ranks is one line
  ("ranks 0-1").
* **Communication**: a collective whose received data differed while this
  rank sent the same (``causes.COLLECTIVE``) is the collective's own fault
  only when no other rank sent different data either; when another rank
  did, the difference came from that rank (its own root cause is reported
  there) and the receiving side is dropped as propagated, with a note.
* **Replicas**: at every optimizer step boundary (and as training starts:
  step 0) each rank recorded digests of what data parallelism keeps equal
  across ranks, each tensor where its wrapper makes it equal
  (``record/replicas.py``: DDP's buffers after its broadcast, nothing of a
  sharded model).  They must agree across ranks; the first step and tensor where a rank
  disagrees with rank 0 is a ``causes.REPLICA_DIVERGENCE``, localized from
  the comparison of the two ranks' traces: before the first step, at the first
  op whose result differed between them; later, at the optimizer update.
  Ranks that joined no collective carrying data (pipeline stages exchange
  activations point to point) hold no replicas: nothing is compared, and a
  note says so.

Imports neither torch nor numpy.
"""

from __future__ import annotations

from dataclasses import replace

from detaudit.dynamic.compare.causes import COLLECTIVE, EARLY_READ, REPLICA_DIVERGENCE, RankNote
from detaudit.dynamic.compare.classify import Trace, compare_traces, is_communication
from detaudit.dynamic.compare.trace_format import OPTIMIZER
from detaudit.dynamic.verdict.run_report import FINAL_STATE, LATENT, RootCause, RunReport, rank_list


def merge_ranks(
    reports: list[RunReport],
    traces: list[list[Trace]],
    replicas: list[list[list[dict]]],
    early_reads: list[list[list[dict]]],
) -> RunReport:
    """``reports[rank]`` from ``analysis.build_report``; ``traces[rank][repeat]``;
    ``replicas[rank][repeat]``: the digests each rank recorded per step boundary;
    ``early_reads[rank][repeat]``: what the rank's tracer saw read before a wait()."""
    first = reports[0]
    senders = _first_communication_difference(traces, "inputs")
    receivers = _first_communication_difference(traces, "outputs")
    merged: dict[tuple, RootCause] = {}
    notes: list[str] = []
    for rank, report in enumerate(reports):
        for cause in [*report.root_causes, *_early_read_causes(early_reads[rank], bool(report.tensors))]:
            if cause.kind is COLLECTIVE:
                cause = _explain_collective(cause, rank, senders, receivers.get(rank), notes)
                if cause is None:
                    continue
            key = (cause.kind, cause.op, cause.path, cause.line, cause.module, cause.phase)
            known = merged.get(key)
            if known is None:
                merged[key] = replace(cause, ranks=[rank])
                continue
            known.ranks.append(rank)
            known.seen = max(known.seen, cause.seen)
            known.first_step = min(known.first_step, cause.first_step)
            if cause.effect == FINAL_STATE:
                known.effect = FINAL_STATE
            if cause.max_abs_diff is not None:
                known.max_abs_diff = max(known.max_abs_diff or 0.0, cause.max_abs_diff)
    causes = list(merged.values())
    if _replicated(traces):
        causes += replica_divergences(traces, replicas)
    else:
        notes.append(
            "replicas: the ranks exchanged only point-to-point messages (send, recv), as pipeline stages do, or "
            "nothing at all: they hold no replicas of one model, and nothing was compared across ranks"
        )
    causes.sort(key=lambda c: (c.first_step, c.path, c.line, c.ranks))
    tensors = [
        {**tensor, "name": f"rank{rank}/{tensor['name']}"} for rank, report in enumerate(reports) for tensor in report.tensors
    ]
    return RunReport(
        target=first.target,
        repeats=first.repeats,
        steps=first.steps,
        root_causes=causes,
        tensors=tensors,
        environment=first.environment,
        propagated_ops=sum(report.propagated_ops for report in reports),
        traced_ops=first.traced_ops,
        notes=[*dict.fromkeys(note for report in reports for note in report.notes), *notes],
        environment_differences=first.environment_differences,
        ranks=len(reports),
    )


def _early_read_causes(runs: list[list[dict]], differed: bool) -> list[RootCause]:
    """One cause per site that read a collective's result before its wait(),
    in any run (it reaches the final state when this rank's final state differed)."""
    sites: dict[tuple, list] = {}
    for run in runs:
        first_reads: dict[tuple, dict] = {}
        for read in run:
            first_reads.setdefault((read["op"], read["path"], read["line"]), read)
        for site, read in first_reads.items():
            sites.setdefault(site, []).append(read)
    return [
        RootCause(
            kind=EARLY_READ,
            op=reads[0]["op"],
            path=reads[0]["path"],
            line=reads[0]["line"],
            module=reads[0]["module"],
            phase=reads[0]["phase"],
            seen=len(reads),  # (runs that read early, of all runs)
            pairs=len(runs),
            first_step=min(read["step"] for read in reads),
            other_side=RankNote(
                f"it read the result of {reads[0]['collective']} (line {reads[0]['collective_line']}) before "
                "that work's wait()."
            ),
            effect=FINAL_STATE if differed else LATENT,
        )
        for reads in sites.values()
    ]


def _first_communication_difference(traces: list[list[Trace]], side: str) -> dict[int, tuple[int, str, int]]:
    """rank -> (step, op, line) of its first communication op whose ``side``
    ("inputs": what it sent; "outputs": what it received) differed between
    the first repeat and another; the step as rank 0 counts them
    (``_steps_as_rank_0_counts``)."""
    found = {}
    steps = _steps_as_rank_0_counts([repeats[0] for repeats in traces])
    for rank, repeats in enumerate(traces):
        reference = repeats[0]
        for other in repeats[1:]:
            for index, (a, b) in enumerate(zip(reference.ops, other.ops)):
                if a.op != b.op:
                    break
                ours, theirs = getattr(a, side), getattr(b, side)
                if not is_communication(a.op) or len(ours) != len(theirs):
                    continue
                if any(reference.value(x) != other.value(y) for x, y in zip(ours, theirs)):
                    step = steps[rank][index]
                    if rank not in found or (step, index) < found[rank][0]:
                        found[rank] = ((step, index), a.op, a.line)
                    break
    return {rank: (step_index[0], op, line) for rank, (step_index, op, line) in found.items()}


#: ops that pair two ranks: their order on one rank says nothing of where the others are
_POINT_TO_POINT = ("c10d.send", "c10d.recv_", "c10d.recv_any_source_", "_c10d_functional.wait_tensor")


def _steps_as_rank_0_counts(traces: list[Trace]) -> list[list[int]]:
    """``[rank][op index]``: the step each op of each rank ran in, as rank 0
    counts steps.  Every rank calls a group's collectives in the same order,
    so a rank's k-th collective ran when rank 0 ran its k-th: after it, the
    rank is at least at rank 0's step there.  A rank that makes no optimizer
    step of its own (only rank 0 trains) would otherwise have every op at
    step 1, and its later sends would seem to come before rank 0's first
    difference.  Ranks whose collectives do not line up with rank 0's keep
    their own count."""
    def collectives(trace: Trace) -> list[int]:
        return [i for i, op in enumerate(trace.ops) if is_communication(op.op) and not op.op.startswith(_POINT_TO_POINT)]

    reference = collectives(traces[0]) if traces else []
    steps = []
    for trace in traces:
        own = [op.step for op in trace.ops]
        matched = collectives(trace)
        count = min(len(matched), len(reference))
        if [trace.ops[i].op for i in matched[:count]] != [traces[0].ops[i].op for i in reference[:count]]:
            steps.append(own)
            continue
        at_least, k = 0, 0
        for index in range(len(own)):
            if k < count and matched[k] == index:
                at_least = traces[0].ops[reference[k]].step
                k += 1
            own[index] = max(own[index], at_least)
        steps.append(own)
    return steps


def _explain_collective(
    cause: RootCause, rank: int, senders: dict, received: tuple[int, str, int] | None, notes: list[str]
) -> RootCause | None:
    """None when another rank sent different data into it by then (the
    difference is that rank's).  ``received``: this rank's first received
    difference, whose step is counted as rank 0 counts them (the cause's own
    step is this rank's count, which stays at 1 on a rank that never steps)."""
    step_now = received[0] if received is not None and received[1:] == (cause.op, cause.line) else cause.first_step
    sent = sorted(other for other, (step, _, _) in senders.items() if other != rank and step <= step_now)
    if sent:
        step, op, line = senders[sent[0]]
        notes.append(
            f"rank {rank} received a difference through {cause.op} at {cause.path}:{cause.line} (step "
            f"{step_now}): {rank_list(sent)} sent different data first ({op} at line {line}, step {step})"
        )
        return None
    return replace(
        cause,
        other_side=RankNote(
            "every rank sent identical data into it in every run: the communication decided the result."
        ),
    )


#: torch.distributed ops by which ranks exchange no data or each rank's own: no sign of data parallelism
_NOT_REPLICATING = frozenset({"send", "recv_", "recv_any_source_", "barrier", "monitored_barrier"})


def _replicated(traces: list[list[Trace]]) -> bool:
    """Whether the ranks keep replicas of one model: some rank joined a collective that
    carries data (DDP's broadcast and all-reduce, the script's own gradient averaging)."""
    return any(
        is_communication(record.op) and record.op.split(".")[1] not in _NOT_REPLICATING
        for rank_traces in traces
        for record in rank_traces[0].ops
    )


def replica_divergences(traces: list[list[Trace]], replicas: list[list[list[dict]]]) -> list[RootCause]:
    """One cause per rank that disagreed with rank 0 at a step boundary: the first such step and tensor."""
    causes = []
    repeats = len(replicas[0]) if replicas else 0
    for rank in range(1, len(replicas)):
        found = [
            (repeat, disagreement)
            for repeat in range(repeats)
            if (disagreement := _first_disagreement(replicas[0][repeat], replicas[rank][repeat])) is not None
        ]
        if found:
            repeat, (step, name) = found[0]
            causes.append(_replica_cause(traces[0][repeat], traces[rank][repeat], rank, step, name, len(found), repeats))
    return causes


def _first_disagreement(reference: list[dict], other: list[dict]) -> tuple[int, str] | None:
    for step, (digests_a, digests_b) in enumerate(zip(reference, other)):
        for name in sorted(set(digests_a) & set(digests_b)):
            if digests_a[name] != digests_b[name]:
                return step, name
    return None


def _replica_cause(
    reference: Trace, other: Trace, rank: int, step: int, name: str, seen: int, repeats: int
) -> RootCause:
    """Where rank ``rank`` started to differ from rank 0 (see the module's doc)."""
    record = None
    if step == 0:
        pair = compare_traces(reference, other)
        record = pair.differing[0] if pair.differing else None
        what = "the replicas started training from different values"
    else:
        record = next(
            (index for index, op in enumerate(other.ops) if op.step == step and op.phase == OPTIMIZER and op.line),
            None,
        )
        what = f"the optimizer update of step {step} left them different"
    op = other.ops[record] if record is not None else None
    return RootCause(
        kind=REPLICA_DIVERGENCE,
        op=op.op if op else "",
        path=op.path if op else "",
        line=op.line if op else 0,
        module=op.module if op else "",
        phase=op.phase if op else OPTIMIZER,
        seen=seen,  # (runs in which the replicas disagreed, of all runs)
        pairs=repeats,
        first_step=step,
        other_side=RankNote(
            f"rank {rank} held a different {name} than rank 0 at step {step} ({what}); data-parallel replicas "
            "must be identical at every step boundary."
        ),
        effect=FINAL_STATE,
        ranks=[rank],
    )

