"""What several TensorFlow/Keras and JAX rules share: what makes a file
TensorFlow/Keras training code (tf-missing-seed, tf-determinism-not-requested)
or JAX training code (xla-nondeterministic-ops, jax-determinism-not-requested),
and the variable XLA reads its flags from.
"""

from __future__ import annotations

from detaudit.static.engine.facts import CallFact, FileFacts
from detaudit.static.rule import Rule

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

#: The environment variable XLA reads its flags from.
XLA_FLAGS_VARIABLE = "XLA_FLAGS"


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


def is_jax_training_call(facts: FileFacts, call: CallFact) -> bool:
    qualname = call.qualname or ""
    if qualname in JAX_TRAINING_CALLS or qualname.startswith(JAX_TRAINING_PREFIXES):
        return True
    return call.qualname is None and call.method in JAX_TRAINING_METHODS and facts.imports_module("jax")
