"""The launch feature that carries a fault spec (``spec.py``) to the child."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from detaudit.launch.features import ChildFeature


@dataclass
class InjectFault(ChildFeature):
    """The launch feature: perturb the op call ``spec`` selects (``parse_specs``' form)."""

    key: ClassVar[str] = "fault"
    spec: dict

    def prepare(self, session) -> None:
        self.injector = None

    def dispatch_mode(self, session):
        from detaudit.dynamic.faults.injector import FaultInjector

        # entered before the tracer's mode (the features' order), so the tracer sees the perturbed output
        self.injector = FaultInjector(self.spec, session.tracer)
        return self.injector

    def finish(self, session) -> None:
        session.payload["fault"] = self.injector.done if self.injector is not None else None
