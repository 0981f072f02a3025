"""``XLA_FLAGS`` that configure a GPU run without deterministic ops (DET042 xla-nondeterministic-ops)."""

from __future__ import annotations

import libcst as cst

from detaudit.findings import Severity
from detaudit.static.engine.facts import FileFacts
from detaudit.static.engine.walk import child_nodes
from detaudit.static.rule import Invalid, Rule
from detaudit.static.rules.other_frameworks._common import XLA_FLAGS_VARIABLE, is_jax_training_call

#: XLA flags that make GPU ops deterministic (openxla/xla docs/determinism.md;
#: ``--xla_gpu_deterministic_ops`` also turns autotuning off, PR #12520).
XLA_DETERMINISM_FLAGS = ("--xla_gpu_deterministic_ops", "--xla_gpu_exclude_nondeterministic_ops")

#: A flag prefix that says the flags configure a GPU run.
XLA_GPU_FLAG_PREFIX = "--xla_gpu_"

_FALSE_FLAG_VALUES = frozenset({"false", "0", "False"})


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
        if not any(is_jax_training_call(self.facts, call) for call in self.facts.calls):
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
