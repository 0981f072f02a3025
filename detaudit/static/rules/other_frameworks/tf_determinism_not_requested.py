"""A TensorFlow/Keras training script that never enables op determinism (DET041 tf-determinism-not-requested)."""

from __future__ import annotations

from detaudit.findings import Severity
from detaudit.knowledge.apis import TRUTHY_ENVIRONMENT_VALUES
from detaudit.static.analyses.helpers import project_helper_named
from detaudit.static.engine.facts import FileFacts
from detaudit.static.rule import Invalid, Rule
from detaudit.static.rules.other_frameworks._common import tf_training_evidence

#: Calls that make TensorFlow ops deterministic (TF >= 2.8; ops without a
#: deterministic GPU kernel raise instead).
TF_DETERMINISM_ENABLERS = frozenset(
    {"tensorflow.config.experimental.enable_op_determinism", "tensorflow.config.enable_op_determinism"}
)

#: Environment variables that request deterministic TF GPU ops (TF 2.1-2.8 spelling,
#: still honoured), with the values that turn them on.
TF_DETERMINISM_ENVIRONMENT = frozenset({"TF_DETERMINISTIC_OPS", "TF_CUDNN_DETERMINISTIC"})


def _requests_tf_determinism(facts: FileFacts) -> bool:
    if any(call.qualname in TF_DETERMINISM_ENABLERS or project_helper_named(call, "determinis") for call in facts.calls):
        return True
    return any(
        facts.evaluate(write.value).value in TRUTHY_ENVIRONMENT_VALUES
        for write in facts.environment_writes(*TF_DETERMINISM_ENVIRONMENT)
    )


class TfDeterminismNotRequested(Rule):
    code = "DET041"
    name = "tf-determinism-not-requested"
    severity = Severity.INFO
    summary = "A TensorFlow/Keras training script never enables op determinism."
    rationale = """
        Seeds fix the random numbers, not the arithmetic: several TensorFlow GPU
        kernels (segment reductions, scatter, some convolution and pooling
        gradients) accumulate with atomics.  Since TF 2.8
        `tf.config.experimental.enable_op_determinism()` makes them
        deterministic or raises (`TF_DETERMINISTIC_OPS=1` on older versions).
        It costs speed, so not requesting it is a choice: informational.
        """
    fix_hint = "Call `tf.config.experimental.enable_op_determinism()` after seeding (TF >= 2.8)."
    VALID = (
        "import tensorflow as tf\ntf.keras.utils.set_random_seed(0)\ntf.config.experimental.enable_op_determinism()\nmodel.fit(x, y)\n",
        "import os\nos.environ['TF_DETERMINISTIC_OPS'] = '1'\nimport tensorflow as tf\nmodel.fit(x, y)\n",
        "import tensorflow as tf\n\ndef train(model, data):\n    model.fit(data)\n",
    )
    INVALID = (
        Invalid(
            "import tensorflow as tf\ntf.random.set_seed(0)\nmodel = tf.keras.Sequential([])\nmodel.fit(x, y)\n",
            line=4,
            message="op determinism",
        ),
        Invalid("import os\nos.environ['TF_DETERMINISTIC_OPS'] = '0'\nimport tensorflow as tf\nmodel.fit(x, y)\n", line=4),
    )

    def finish(self) -> None:
        evidence = tf_training_evidence(self)
        if evidence is not None and not _requests_tf_determinism(self.facts):
            self.report(
                evidence.node,
                "TensorFlow training script never enables op determinism: GPU kernels with atomics run nondeterministically.",
            )
