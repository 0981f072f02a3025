"""TensorFlow/Keras and JAX reproducibility rules (DET040-049).

Purely static: TensorFlow and JAX are never imported; calls are matched by the
names in ``detaudit.knowledge.apis``.  JAX keys seeded from the clock or the OS
are reported by entropy-seed (DET006), which knows ``jax.random.PRNGKey``.
"""

from __future__ import annotations

import libcst as cst

from detaudit.findings import Severity
from detaudit.knowledge.apis import (
    TRUTHY_ENVIRONMENT_VALUES,
)
from detaudit.static.analyses.helpers import project_helper_named
from detaudit.static.engine.facts import CallFact, FileFacts
from detaudit.static.engine.walk import child_nodes
from detaudit.static.rule import Invalid, Rule


#: Calls that seed TensorFlow's global RNG (``keras.utils.set_random_seed`` seeds
#: Python, NumPy and the backend).
TF_SEEDING_FUNCTIONS = frozenset(
    {"tensorflow.random.set_seed", "tensorflow.set_random_seed", "tensorflow.compat.v1.set_random_seed",
     "tensorflow.compat.v1.random.set_random_seed", "tensorflow.keras.utils.set_random_seed",
     "keras.utils.set_random_seed", "tf_keras.utils.set_random_seed"}
)

#: Calls that make TensorFlow ops deterministic (TF >= 2.8; ops without a
#: deterministic GPU kernel raise instead).
TF_DETERMINISM_ENABLERS = frozenset(
    {"tensorflow.config.experimental.enable_op_determinism", "tensorflow.config.enable_op_determinism"}
)

#: Environment variables that request deterministic TF GPU ops (TF 2.1-2.8 spelling,
#: still honoured), with the values that turn them on.
TF_DETERMINISM_ENVIRONMENT = frozenset({"TF_DETERMINISTIC_OPS", "TF_CUDNN_DETERMINISTIC"})

#: Calls that make a file TensorFlow/Keras training code.
TF_TRAINING_CALLS = frozenset({"tensorflow.GradientTape"})
TF_TRAINING_PREFIXES = ("tensorflow.keras.optimizers.", "tensorflow.optimizers.", "keras.optimizers.", "tf_keras.optimizers.")

#: ``model.fit(...)``-style methods count only in files that import one of these.
TF_TRAINING_METHODS = frozenset({"fit", "train_on_batch"})
TF_MODULES = ("tensorflow", "keras", "tf_keras")

#: JAX training: gradient transforms and optimiser libraries.
JAX_TRAINING_CALLS = frozenset({"jax.grad", "jax.value_and_grad"})
JAX_TRAINING_PREFIXES = ("optax.",)

#: ``state.apply_gradients(grads=...)`` (flax TrainState) counts in files that import jax.
JAX_TRAINING_METHODS = frozenset({"apply_gradients", "apply_gradient"})

#: XLA flags that make GPU ops deterministic (openxla/xla docs/determinism.md;
#: ``--xla_gpu_deterministic_ops`` also turns autotuning off, PR #12520).
XLA_FLAGS_VARIABLE = "XLA_FLAGS"
XLA_DETERMINISM_FLAGS = ("--xla_gpu_deterministic_ops", "--xla_gpu_exclude_nondeterministic_ops")

#: A flag prefix that says the flags configure a GPU run.
XLA_GPU_FLAG_PREFIX = "--xla_gpu_"

_FALSE_FLAG_VALUES = frozenset({"false", "0", "False"})


def _is_tf_training_call(facts: FileFacts, call: CallFact) -> bool:
    qualname = call.qualname or ""
    if qualname in TF_TRAINING_CALLS:
        return True
    if qualname.startswith(TF_TRAINING_PREFIXES) and qualname.rpartition(".")[2][:1].isupper():
        return True  # an optimizer class, not e.g. optimizers.schedules
    return call.qualname is None and call.method in TF_TRAINING_METHODS and any(facts.imports_module(m) for m in TF_MODULES)


def tf_training_evidence(rule: Rule) -> CallFact | None:
    """The call that makes this file a TensorFlow/Keras training script, or None."""
    facts = rule.facts
    if not any(facts.imports_module(m) for m in TF_MODULES):
        return None
    return rule.analyses.script.evidence(facts.calls, lambda call: _is_tf_training_call(facts, call))


def _seeds_tensorflow(facts: FileFacts) -> bool:
    """A TF seeding call, or a project helper named for seeding that is given a seed."""
    return any(
        call.qualname in TF_SEEDING_FUNCTIONS or (project_helper_named(call, "seed") and call.node.args)
        for call in facts.calls
    )


def _requests_tf_determinism(facts: FileFacts) -> bool:
    if any(call.qualname in TF_DETERMINISM_ENABLERS or project_helper_named(call, "determinis") for call in facts.calls):
        return True
    return any(
        facts.evaluate(write.value).value in TRUTHY_ENVIRONMENT_VALUES
        for write in facts.environment_writes(*TF_DETERMINISM_ENVIRONMENT)
    )


def flag_text(facts: FileFacts, node: cst.BaseExpression | None) -> str:
    """The literal text of an ``XLA_FLAGS`` value: the whole string when it
    evaluates, else its literal pieces (f-strings, concatenations)."""
    value = facts.evaluate(node)
    if isinstance(value.value, str):
        return value.value
    pieces, stack = [], [node] if node is not None else []
    while stack:
        current = stack.pop()
        if isinstance(current, cst.SimpleString):
            text = current.evaluated_value
            pieces.append(text if isinstance(text, str) else "")
        elif isinstance(current, cst.FormattedStringText):
            pieces.append(current.value)
        stack.extend(child_nodes(current))
    return " ".join(pieces)


def xla_determinism(text: str) -> bool | None:
    """True when the flags turn deterministic GPU ops on, False when they turn
    them off explicitly, None when they do not mention them."""
    verdict = None
    for token in text.split():
        name, _, value = token.partition("=")
        if name in XLA_DETERMINISM_FLAGS:
            verdict = value not in _FALSE_FLAG_VALUES
            if verdict:
                return True
    return verdict


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


class XlaNondeterministicOps(Rule):
    code = "DET042"
    name = "xla-nondeterministic-ops"
    severity = Severity.WARNING
    summary = "`XLA_FLAGS` configure a GPU run without `--xla_gpu_deterministic_ops`."
    rationale = """
        On GPU, XLA (JAX, TensorFlow with XLA) compiles scatter,
        select-and-scatter, GEMMs, convolutions and attention to kernels that
        may be nondeterministic, and autotunes kernel choices by timing.
        `--xla_gpu_deterministic_ops=true` (or
        `--xla_gpu_exclude_nondeterministic_ops=true`) in `XLA_FLAGS` switches to
        deterministic implementations.  A JAX training file that sets GPU flags
        in `XLA_FLAGS` but leaves these out, or sets them to false, trains
        nondeterministically.  Flags for CPU runs (XLA on CPU does not need
        them) and files that train nothing (inference or compile benchmarks)
        are not reported.
        """
    fix_hint = "Add `--xla_gpu_deterministic_ops=true` to `XLA_FLAGS` before JAX or TensorFlow initialise the GPU."
    VALID = (
        "import os\nos.environ['XLA_FLAGS'] = '--xla_gpu_deterministic_ops=true --xla_gpu_enable_latency_hiding_scheduler=true'\nimport jax\ng = jax.grad(f)\n",
        # CPU-only flags
        "import os\nos.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count=8'\nimport jax\ng = jax.grad(f)\n",
        "import os\nos.environ['XLA_FLAGS'] = os.environ.get('XLA_FLAGS', '') + ' --xla_gpu_exclude_nondeterministic_ops=true'\nimport jax\ng = jax.grad(f)\n",
        # an inference benchmark: nothing is trained here
        "import os\nos.environ['XLA_FLAGS'] = '--xla_gpu_triton_gemm_any=True'\nimport jax\nout = jax.jit(model.apply)(params, x)\n",
        # a TensorFlow script pointing XLA at CUDA
        "import os\nos.environ['XLA_FLAGS'] = '--xla_gpu_cuda_data_dir=/usr/lib/cuda/'\nimport tensorflow as tf\nmodel.fit(x, y)\n",
    )
    INVALID = (
        Invalid(
            "import os\nos.environ['XLA_FLAGS'] = '--xla_gpu_enable_triton_gemm=false'\nimport jax, optax\nopt = optax.adam(1e-3)\n",
            line=2,
            message="--xla_gpu_deterministic_ops",
        ),
        Invalid("import os\nos.environ['XLA_FLAGS'] = '--xla_gpu_deterministic_ops=false'\nimport jax\nstate = state.apply_gradients(grads=g)\n", line=2, message="turns"),
        Invalid(
            "import os\nos.environ['XLA_FLAGS'] = f\"{os.environ.get('XLA_FLAGS', '')} --xla_gpu_autotune_level=4\"\nimport jax\ng = jax.value_and_grad(f)\n",
            line=2,
        ),
    )

    def finish(self) -> None:
        # flags in an inference or compile-analysis script, or a TensorFlow script that
        # does not compile with XLA, are not a training hazard
        if not any(_is_jax_training_call(self.facts, call) for call in self.facts.calls):
            return
        for write in self.facts.environment_writes(XLA_FLAGS_VARIABLE):
            text = flag_text(self.facts, write.value)
            verdict = xla_determinism(text)
            if verdict is False:
                self.report(write.node, "XLA_FLAGS turns deterministic GPU ops off: scatter, GEMM and convolution kernels may differ per run.")
            elif verdict is None and XLA_GPU_FLAG_PREFIX in text:
                self.report(
                    write.node,
                    "XLA_FLAGS configure the GPU without --xla_gpu_deterministic_ops=true: "
                    "scatter, GEMM and convolution kernels may differ per run.",
                )


class JaxDeterminismNotRequested(Rule):
    code = "DET043"
    name = "jax-determinism-not-requested"
    severity = Severity.INFO
    summary = "A JAX training script never asks XLA for deterministic GPU ops."
    rationale = """
        JAX's PRNG is explicit and reproducible, but on GPU the compiled
        kernels are not: XLA may pick nondeterministic scatter, GEMM and
        convolution implementations and autotunes by timing unless `XLA_FLAGS`
        contains `--xla_gpu_deterministic_ops=true`.  The flag may also be set by
        the launcher, and runs on CPU do not need it, so this is informational.
        """
    fix_hint = "Set `os.environ['XLA_FLAGS'] = '--xla_gpu_deterministic_ops=true'` before importing JAX (or in the launcher)."
    VALID = (
        "import os\nos.environ['XLA_FLAGS'] = '--xla_gpu_deterministic_ops=true'\nimport jax\ngrads = jax.grad(loss)(params)\n",
        # any XLA_FLAGS written here is xla-nondeterministic-ops' business
        "import os\nos.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count=8'\nimport jax\ngrads = jax.grad(loss)(params)\n",
        "import jax\n\ndef update(params, batch):\n    return jax.grad(loss)(params, batch)\n",
    )
    INVALID = (
        Invalid(
            "import jax, optax\nopt = optax.adam(1e-3)\ngrads = jax.grad(loss)(params)\n",
            line=2,
            message="--xla_gpu_deterministic_ops",
        ),
    )

    def finish(self) -> None:
        facts = self.facts
        if not facts.imports_module("jax") or any(facts.environment_writes(XLA_FLAGS_VARIABLE)):
            return
        evidence = self.analyses.script.evidence(facts.calls, lambda call: _is_jax_training_call(facts, call))
        if evidence is not None and not any(project_helper_named(call, "determinis") for call in facts.calls):
            self.report(
                evidence.node,
                "JAX training script never sets XLA_FLAGS=--xla_gpu_deterministic_ops=true: on GPU, "
                "XLA may pick nondeterministic kernels.",
            )


def _is_jax_training_call(facts: FileFacts, call: CallFact) -> bool:
    qualname = call.qualname or ""
    if qualname in JAX_TRAINING_CALLS or qualname.startswith(JAX_TRAINING_PREFIXES):
        return True
    return call.qualname is None and call.method in JAX_TRAINING_METHODS and facts.imports_module("jax")
