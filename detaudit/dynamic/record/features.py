"""What a launch asks the recording side to do in the child, as launch features.

The parent names them in ``LaunchOptions.features`` (``detaudit.launch
.features`` says how a feature works); this module imports without torch,
and each step imports what it runs in the child:

* ``Tracing``: trace every op (``tracer.py``) and every compiled graph's call
  (``compiled_graphs.py``), written to trace.json; with
  ``capture_ops`` save those records' tensors; with ``keep_first_steps`` /
  ``compare_with`` keep the tensors a comparison with run 1 needs
  (``online_capture.py``);
* ``ReplicaDigests``: digest what the ranks must hold alike, where each
  parallelism makes it alike (``replicas.py``), for the cross-rank check of
  a distributed run (``detaudit.dynamic.verdict.ranks``);
* ``SaveFinalState``: save the final state with its digests (``final_state.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from detaudit.launch.features import ChildFeature


@dataclass
class Tracing(ChildFeature):
    key: ClassVar[str] = "trace"
    capture_ops: tuple[int, ...] = ()  # traced op indices whose tensors are saved; stops after the last
    sampled_ops: tuple[int, ...] = ()  # of capture_ops: save a sample of the outputs only (digests.output_sample)
    allocation_fill: int | None = None  # what torch.empty*'s memory is filled with (OpTracer.allocation_fill)
    # the reference run's trace.json, compared with op by op, keeping the tensors of the ops that differ
    compare_with: str | None = None
    keep_first_steps: bool = False  # keep the tensors of the first steps' ops, for compare_with runs to need
    call_of: int | None = None  # of capture_ops: also keep how its op was called (op_call.py: a repro's)
    first_steps_bytes: int | None = None  # with keep_first_steps: at most this much (default online_capture's)
    # torch.compile'd regions run compiled, one record per graph call (compiled_graphs.py); False: eagerly
    compiled_graphs: bool = True
    # of capture_ops: bisect a captured graph call (graph_bisect.py): "replay" between two compiled
    # replays, "eager" against its nodes run eagerly; None: no bisection
    bisect_graphs: str | None = None

    def prepare(self, session) -> None:
        from detaudit.dynamic.record.tracer import OpTracer

        on_graph_capture = None
        if self.bisect_graphs:
            from detaudit.dynamic.record.graph_bisect import bisector

            on_graph_capture = bisector(self.bisect_graphs)
        tracer = session.tracer = OpTracer(
            capture_ops=self.capture_ops, sampled_ops=self.sampled_ops, allocation_fill=self.allocation_fill,
            call_of=self.call_of, trace_compiled=self.compiled_graphs and _can_trace_compiled(session),
            keep_graphs=bool(self.bisect_graphs), on_graph_capture=on_graph_capture,
        )
        tracer.attach(session.watcher)
        tracer.stream_to(session.output_dir / "trace.json")  # a long run holds its last step's records, not all
        self.online_capture = None
        if self.compare_with or self.keep_first_steps:
            from detaudit.dynamic.record.online_capture import OnlineCapture

            self.online_capture = tracer.observer = OnlineCapture(tracer, self.compare_with, self.first_steps_bytes)

    def after_step(self, session) -> None:
        session.tracer.write_settled()

    def dispatch_mode(self, session):
        return session.tracer

    def finish(self, session) -> None:
        from detaudit.dynamic.record.final_state import watched_state

        tracer = session.tracer
        tracer.note_final_state(watched_state(session.watcher))  # which differences reached the final state
        session.payload.update(tracer.save(session.output_dir))
        session.payload["recorder"] = tracer.recorder
        if self.online_capture is not None:
            session.payload.update(self.online_capture.save(session.output_dir))


def _can_trace_compiled(session) -> bool:
    """Whether this torch lets compiled graphs be traced; when not, they run eagerly and the payload says why."""
    from detaudit.dynamic.record.compiled_graphs import unavailable_reason

    reason = unavailable_reason()
    if reason:
        session.payload["compiled_unavailable"] = reason
    return reason is None


@dataclass
class ReplicaDigests(ChildFeature):
    """Digests of what the ranks of a data-parallel run must hold alike, at
    each step boundary and where each parallelism makes them alike
    (``replicas.py``), with a note of what was compared."""

    key: ClassVar[str] = "replicas"

    def prepare(self, session) -> None:
        from detaudit.dynamic.record.replicas import ReplicaRecorder

        self.recorder = ReplicaRecorder(session.watcher, session.untraced)
        session.payload["replica_digests"] = self.recorder.boundaries
        session.payload["replica_notes"] = self.recorder.notes
        self.started = False

    def before_step(self, session, optimizer) -> None:
        if not self.started:  # the replicas as they start training (step 0): no gradient yet
            self.started = True
            self.recorder.record_boundary(trained=False)

    def after_step(self, session) -> None:
        self.recorder.record_boundary()

    def finish(self, session) -> None:
        self.recorder.close()


@dataclass
class SaveFinalState(ChildFeature):
    """Save params, grads, buffers, optimizer state and loss at the end (state.pt)."""

    key: ClassVar[str] = "final-state"

    def finish(self, session) -> None:
        from detaudit.dynamic.record.final_state import save_state, watched_state

        if session.watcher is not None:
            session.payload.update(save_state(watched_state(session.watcher), session.output_dir / "state.pt"))
