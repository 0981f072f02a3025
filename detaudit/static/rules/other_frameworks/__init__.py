"""Other frameworks (DET040-049): TensorFlow/Keras and JAX training scripts that are never seeded, never ask for deterministic ops, or configure XLA without them.

One module per rule, named after it; what several of them share (what makes a
file TensorFlow/Keras or JAX training code, the ``XLA_FLAGS`` variable) is in
``_common.py``, the only module of ``rules/`` they import.  Purely static:
TensorFlow and JAX are never imported; calls are matched by name.  JAX keys
seeded from the clock or the OS are reported by entropy-seed (DET006), which
knows ``jax.random.PRNGKey``.
"""
