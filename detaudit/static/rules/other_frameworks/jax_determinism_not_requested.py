"""A JAX training script that never asks XLA for deterministic GPU ops (DET043 jax-determinism-not-requested)."""

from __future__ import annotations

from detaudit.findings import Severity
from detaudit.static.analyses.helpers import project_helper_named
from detaudit.static.rule import Invalid, Rule
from detaudit.static.rules.other_frameworks._common import XLA_FLAGS_VARIABLE, is_jax_training_call


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
        evidence = self.analyses.script.evidence(facts.calls, lambda call: is_jax_training_call(facts, call))
        if evidence is not None and not any(project_helper_named(call, "determinis") for call in facts.calls):
            self.report(
                evidence.node,
                "JAX training script never sets XLA_FLAGS=--xla_gpu_deterministic_ops=true: on GPU, "
                "XLA may pick nondeterministic kernels.",
            )
