"""The launch feature of ``detaudit resume`` (torch-free: the parent builds it).

``ResumeState`` digests every component (``components.py``) as each optimizer
step starts and ends, notes where the script saved and loaded its
checkpoint, and, for the interrupted run, stops the script as its
``stop_before_step``-th step starts: everything it saved after the step
before is on disk, as after a preemption.  ``keep_step``: the step whose
start's tensors are saved too (the first compared, where a forgotten
component shows first); ``measure_against``: the tensors another run saved
there, each one that differs measured against them (max |diff|), so that
the parent need not load torch.
The work is ``child.py``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from detaudit.launch.features import ChildFeature

STATE_FILE = "resume_state.pt"  # the tensors of the keep_step's start, in the run's output folder


@dataclass
class ResumeState(ChildFeature):
    key: ClassVar[str] = "resume"
    stop_before_step: int = 0  # stop as this step (from 1) starts; 0: never
    keep_step: int = 0  # save the tensors of this step's start (0: none)
    measure_against: str | None = None  # another run's tensors of its keep_step
    resume_through: str = ""  # a frameworks.py entry: that framework resumes from ``checkpoint``
    checkpoint: str = ""
    point_step: int = 0  # digest the state at this step's first forward (the point the resumed run continues from)
    point_expected: dict | None = None  # the straight run's digests there: name the first op reading what differs

    def prepare(self, session) -> None:
        from detaudit.resume.child import BoundaryRecorder

        self.recorder = BoundaryRecorder(
            session, self.keep_step, Path(session.output_dir) / STATE_FILE, self.measure_against,
            self.resume_through, self.checkpoint, self.point_step, self.point_expected,
        )

    def before_step(self, session, optimizer) -> None:
        from detaudit.launch.watcher import StopRun

        if self.stop_before_step and session.watcher.steps + 1 >= self.stop_before_step:
            raise StopRun()

    def before_update(self, session, optimizer) -> None:
        self.recorder.record("start")

    def after_step(self, session) -> None:
        self.recorder.record("end")

    def finish(self, session) -> None:
        session.payload.update(self.recorder.close())
