"""A TensorFlow/Keras training script that never seeds TensorFlow's RNG (DET040 tf-missing-seed)."""

from __future__ import annotations

from detaudit.findings import Severity
from detaudit.static.analyses.helpers import project_helper_named
from detaudit.static.engine.facts import FileFacts
from detaudit.static.rule import Invalid, Rule
from detaudit.static.rules.other_frameworks._common import tf_training_evidence

#: Calls that seed TensorFlow's global RNG (``keras.utils.set_random_seed`` seeds
#: Python, NumPy and the backend).
TF_SEEDING_FUNCTIONS = frozenset(
    {"tensorflow.random.set_seed", "tensorflow.set_random_seed", "tensorflow.compat.v1.set_random_seed",
     "tensorflow.compat.v1.random.set_random_seed", "tensorflow.keras.utils.set_random_seed",
     "keras.utils.set_random_seed", "tf_keras.utils.set_random_seed"}
)


def _seeds_tensorflow(facts: FileFacts) -> bool:
    """A TF seeding call, or a project helper named for seeding that is given a seed."""
    return any(
        call.qualname in TF_SEEDING_FUNCTIONS or (project_helper_named(call, "seed") and call.node.args)
        for call in facts.calls
    )


class TfMissingSeed(Rule):
    code = "DET040"
    name = "tf-missing-seed"
    severity = Severity.WARNING
    summary = "A TensorFlow/Keras training script never seeds TensorFlow's RNG."
    rationale = """
        Keras layers initialise their weights, and dropout, shuffling and
        augmentation draw from TensorFlow's global RNG, which is seeded from the
        OS unless `tf.random.set_seed` (or `keras.utils.set_random_seed`, which
        also seeds Python and NumPy) is called first.  Without it every run
        starts from different weights.
        """
    fix_hint = "Call `keras.utils.set_random_seed(SEED)` (or `tf.random.set_seed(SEED)`) before building the model."
    VALID = (
        "import tensorflow as tf\ntf.random.set_seed(0)\nmodel = tf.keras.Sequential([])\nmodel.fit(x, y)\n",
        "from tensorflow import keras\nkeras.utils.set_random_seed(0)\nmodel.fit(x, y)\n",
        "import keras\nfrom utils import set_seed\nset_seed(42)\nmodel.fit(x, y)\n",
        # a library module: training code only inside functions, no main guard
        "import tensorflow as tf\n\ndef train(model, data):\n    model.fit(data)\n",
    )
    INVALID = (
        Invalid(
            "import tensorflow as tf\nmodel = tf.keras.Sequential([tf.keras.layers.Dense(1)])\nmodel.compile('adam', 'mse')\nmodel.fit(x, y)\n",
            line=4,
            message="never seeds",
        ),
        Invalid(
            "import tensorflow as tf\n\ndef main():\n    opt = tf.keras.optimizers.Adam()\n    with tf.GradientTape() as tape:\n        pass\n\n"
            "if __name__ == '__main__':\n    main()\n",
            line=4,
        ),
    )

    def finish(self) -> None:
        evidence = tf_training_evidence(self)
        if evidence is not None and not _seeds_tensorflow(self.facts):
            self.report(evidence.node, "TensorFlow training script never seeds TensorFlow's RNG: weights and dropout differ per run.")
