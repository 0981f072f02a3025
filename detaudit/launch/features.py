"""What the bootstrap does around a script, feature by feature, as one table.

A feature is a ``ChildFeature``: a dataclass whose fields are its options
(set by the parent, written to the child as JSON; what a step keeps in the
child is a plain attribute, not a field) and whose methods are its steps in
the child, each called by the bootstrap's ``ChildSession`` with the
session (its payload, output folder, seed, watcher, tracer):

* ``prepare`` before the script runs (after the seed, the child settings and
  the watcher, where the run needs torch: ``needs_torch``);
* ``before_step`` / ``after_step`` around each optimizer step of the run
  (``after_step`` before the step limit can stop it), and ``before_update``
  between them, once the step's forward and backward are done (they run
  inside ``step()`` when it is given a closure, as in Lightning);
* ``dispatch_mode``: a ``TorchDispatchMode`` to run the script under;
* ``run_instead``: a feature that does something else than run the script
  (returns the payload entries);
* ``finish`` after the script ended, to put its results in the payload.

``FEATURES`` names every feature, by "module:class", in the order the
bootstrap applies them: their hooks run in this order, and the dispatch
modes are entered in it (so a mode listed later sees the outputs of the
modes listed before it).  A feature lives in the package whose work it is;
its module must import without torch (the parent builds the options) and
import torch in its steps.  The launch layer imports none of them: only the
child imports the features a run asks for.  Adding a feature is its class
and its line here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, ClassVar

FEATURES: dict[str, str] = {
    "environment": "detaudit.launch.features:RecordEnvironment",
    "perturb": "detaudit.stats.perturbation:PerturbOneUlp",
    "fault": "detaudit.dynamic.faults.feature:InjectFault",  # before the tracer: its mode is below the tracer's
    "trace": "detaudit.dynamic.record.features:Tracing",
    "replicas": "detaudit.dynamic.record.features:ReplicaDigests",
    "final-state": "detaudit.dynamic.record.features:SaveFinalState",
    "batch": "detaudit.dynamic.batch.vary:BatchAudit",
    "rank-metrics": "detaudit.stats.metrics:RankMetrics",
    "resume": "detaudit.resume.feature:ResumeState",
}


class ChildFeature:
    """The base of every feature (see the module docstring); every step does nothing."""

    key: ClassVar[str]  # its name in FEATURES and in the child's config
    needs_torch: ClassVar[bool] = True  # whether the child prepares torch (seeds it, watches the training) for it

    def prepare(self, session) -> None:
        pass

    def before_step(self, session, optimizer) -> None:
        pass

    def before_update(self, session, optimizer) -> None:
        """The step's forward and backward are done (a closure's too): its update starts."""

    def after_step(self, session) -> None:
        pass

    def dispatch_mode(self, session):
        return None

    def run_instead(self, session, script: str) -> dict | None:
        """Payload entries, having done something else than run the script; None: run it."""
        return None

    def finish(self, session) -> None:
        pass


def feature_class(key: str) -> type[ChildFeature]:
    """The feature named ``key`` in ``FEATURES`` (imports its module)."""
    module, _, name = FEATURES[key].partition(":")
    return getattr(importlib.import_module(module), name)


def features_from_config(config: dict[str, dict[str, Any]]) -> list[ChildFeature]:
    """The features a child's config asks for, in ``FEATURES`` order."""
    return [feature_class(key)(**config[key]) for key in FEATURES if key in config]


@dataclass
class RecordEnvironment(ChildFeature):
    """Put ``detaudit.runtime.environment.fingerprint()`` in the payload, as of
    the end of the first optimizer step (the settings the run trained with,
    after the script's own start-up), else as of the end of the run."""

    key: ClassVar[str] = "environment"

    def after_step(self, session) -> None:
        self._record(session)

    def finish(self, session) -> None:
        self._record(session)

    @staticmethod
    def _record(session) -> None:
        if "environment" in session.payload:
            return
        with session.untraced():  # reading settings is detaudit's business, not the trace's
            try:
                from detaudit.runtime.environment import fingerprint
            except ImportError:
                session.payload["environment"] = {}
                return
            session.payload["environment"] = fingerprint()
