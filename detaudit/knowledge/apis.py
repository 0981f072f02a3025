"""API facts the static rules, fixes and runtime helpers share: data, not logic.

Names are fully qualified dotted names as the static pass resolves them
(``import torch as T; T.manual_seed`` resolves to ``torch.manual_seed``).
"""

from __future__ import annotations

# --- random number generators -------------------------------------------------

#: The three global RNGs the seed rules track.
TORCH, NUMPY, PYTHON = "torch", "numpy", "python"
RNGS = (TORCH, NUMPY, PYTHON)

#: Calls that seed global RNGs, and which ones.
SEEDING_FUNCTIONS: dict[str, frozenset[str]] = {
    "torch.manual_seed": frozenset({TORCH}),
    "torch.random.manual_seed": frozenset({TORCH}),
    "numpy.random.seed": frozenset({NUMPY}),
    "random.seed": frozenset({PYTHON}),
    # third-party helpers (random, numpy and torch unless noted)
    **{
        name: frozenset(RNGS)
        for name in (
            "lightning.seed_everything",
            "lightning.pytorch.seed_everything",
            "lightning.fabric.seed_everything",
            "lightning.fabric.utilities.seed.seed_everything",
            "lightning_fabric.seed_everything",
            "lightning_fabric.utilities.seed.seed_everything",
            "pytorch_lightning.seed_everything",
            "pytorch_lightning.utilities.seed.seed_everything",
            "transformers.set_seed",
            "transformers.trainer_utils.set_seed",
            "transformers.enable_full_determinism",
            "transformers.trainer_utils.enable_full_determinism",
            "accelerate.utils.set_seed",
            "accelerate.utils.random.set_seed",
            "timm.utils.random_seed",
            "mmengine.runner.set_random_seed",
            "detaudit.seed_everything",
            "detaudit.runtime.seeding.seed_everything",
        )
    },
    "keras.utils.set_random_seed": frozenset({NUMPY, PYTHON}),
    "tensorflow.keras.utils.set_random_seed": frozenset({NUMPY, PYTHON}),
}

#: Seeding calls that only seed when given an argument (``random.seed()`` with
#: no argument reseeds from the OS: that is entropy, not reproducibility).
SEEDING_NEEDS_ARGUMENT = frozenset({"random.seed", "numpy.random.seed", "torch.manual_seed"})

#: Context managers / decorators that seed when called with ``seed=``.
SEEDING_WHEN_SEED_GIVEN: dict[str, frozenset[str]] = {
    "detaudit.deterministic": frozenset(RNGS),
    "detaudit.runtime.determinism.deterministic": frozenset(RNGS),
}

#: torch functions that draw from the global torch RNG.
TORCH_RANDOM_FUNCTIONS = frozenset(
    f"torch.{name}"
    for name in (
        "rand", "rand_like", "randn", "randn_like", "randint", "randint_like",
        "randperm", "normal", "bernoulli", "multinomial", "poisson", "dropout",
        "feature_dropout", "alpha_dropout", "rrelu",
    )
) | frozenset(
    f"torch.nn.functional.{name}"
    for name in (
        "dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
        "feature_alpha_dropout", "gumbel_softmax", "rrelu",
    )
) | frozenset(
    f"torch.nn.init.{name}"
    for name in (
        "uniform_", "normal_", "trunc_normal_", "xavier_uniform_", "xavier_normal_",
        "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_",
    )
) | frozenset({"torch.utils.data.random_split", "torch.utils.data.RandomSampler"})

#: Tensor methods that draw from the torch RNG (matched by method name in files
#: that import torch).
TORCH_RANDOM_METHODS = frozenset(
    {"normal_", "uniform_", "random_", "bernoulli_", "exponential_", "cauchy_",
     "log_normal_", "geometric_"}
)

#: ``torch.nn`` layers whose parameters are randomly initialised on construction,
#: and random-behaviour layers (dropout).
TORCH_RANDOM_LAYERS = frozenset(
    f"torch.nn.{name}"
    for name in (
        "Linear", "Bilinear", "LazyLinear",
        "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d",
        "LazyConv1d", "LazyConv2d", "LazyConv3d",
        "Embedding", "EmbeddingBag",
        "RNN", "LSTM", "GRU", "RNNCell", "LSTMCell", "GRUCell",
        "MultiheadAttention", "Transformer", "TransformerEncoderLayer", "TransformerDecoderLayer",
        "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout",
        "RReLU",
    )
)

#: Callee prefixes whose calls build randomly initialised models.
TORCH_RANDOM_MODEL_PREFIXES = ("torchvision.models.", "timm.create_model")

#: Random data augmentation (torchvision transforms draw from the torch RNG).
TORCH_RANDOM_TRANSFORM_PREFIXES = (
    "torchvision.transforms.Random",
    "torchvision.transforms.v2.Random",
)
TORCH_RANDOM_TRANSFORMS = frozenset(
    f"torchvision.transforms.{ns}{name}"
    for ns in ("", "v2.")
    for name in ("ColorJitter", "RandAugment", "AutoAugment", "TrivialAugmentWide", "AugMix",
                 "ElasticTransform", "GaussianBlur")
)

#: numpy.random attributes that do not draw from the legacy global RNG.
NUMPY_RANDOM_NON_DRAWING = frozenset(
    {"seed", "get_state", "set_state", "default_rng", "RandomState", "Generator",
     "SeedSequence", "BitGenerator", "PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64",
     "get_bit_generator", "set_bit_generator"}
)

#: random-module attributes that do not draw from the global Python RNG.
PYTHON_RANDOM_NON_DRAWING = frozenset(
    {"seed", "getstate", "setstate", "Random", "SystemRandom"}
)

# --- determinism switches -----------------------------------------------------

#: Calls that turn on deterministic algorithms (argument checks live in rules).
DETERMINISM_ENABLERS = frozenset(
    {
        "detaudit.enable_determinism",
        "detaudit.deterministic",
        "detaudit.runtime.determinism.enable_determinism",
        "detaudit.runtime.determinism.deterministic",
        "transformers.enable_full_determinism",
        "transformers.trainer_utils.enable_full_determinism",
    }
)

# --- backend settings ---------------------------------------------------------

CUDNN = "torch.backends.cudnn"

#: Positional parameter order of ``torch.backends.<ns>.flags(...)`` context managers.
BACKEND_FLAGS_PARAMETERS: dict[str, tuple[str, ...]] = {
    "torch.backends.cudnn": ("enabled", "benchmark", "benchmark_limit", "deterministic", "allow_tf32", "fp32_precision"),
    "torch.backends.mkldnn": ("enabled", "deterministic"),
    "torch.backends.nnpack": ("enabled",),
    "torch.backends.opt_einsum": ("enabled", "strategy"),
}

#: Settings that enable TF32 / reduced-precision fp32 when set to a truthy value.
TF32_BOOLEAN_SETTINGS = frozenset(
    {"torch.backends.cuda.matmul.allow_tf32", "torch.backends.cudnn.allow_tf32"}
)

#: Namespaces with an ``fp32_precision`` setting (torch >= 2.9).
FP32_PRECISION_NAMESPACES = frozenset(
    {
        "torch.backends",
        "torch.backends.cuda.matmul",
        "torch.backends.cudnn",
        "torch.backends.cudnn.conv",
        "torch.backends.cudnn.rnn",
        "torch.backends.mkldnn",
        "torch.backends.mkldnn.matmul",
        "torch.backends.mkldnn.conv",
        "torch.backends.mkldnn.rnn",
    }
)
#: ``fp32_precision`` values that reduce precision (``"ieee"`` and ``"none"`` do not).
REDUCED_FP32_PRECISIONS = frozenset({"tf32", "bf16"})

#: ``torch.set_float32_matmul_precision`` values that allow TF32/bf16 matmuls.
REDUCED_MATMUL_PRECISIONS = frozenset({"high", "medium"})
#: ... and the values that turn it off, per API, for fixes.
FULL_MATMUL_PRECISION = "highest"
FULL_FP32_PRECISION = "ieee"

#: Attributes that exist on each ``torch.backends`` namespace (torch 2.4-2.13).
#: Assigning anything else is a silent no-op (``cudnn.benchmarks = False``).
BACKEND_ATTRIBUTES: dict[str, frozenset[str]] = {
    "torch.backends": frozenset(
        {"fp32_precision", "cudnn", "cuda", "mkldnn", "mkl", "mps", "openmp", "opt_einsum",
         "xeon", "cpu", "quantized", "nnpack", "mha", "cusparselt", "kleidiai", "xnnpack",
         "flags", "disable_global_flags", "flags_frozen"}
    ),
    "torch.backends.cudnn": frozenset(
        {"enabled", "benchmark", "benchmark_limit", "deterministic", "allow_tf32",
         "fp32_precision", "conv", "rnn", "version", "is_available", "is_acceptable", "flags",
         "set_flags"}
    ),
    "torch.backends.cudnn.conv": frozenset({"fp32_precision"}),
    "torch.backends.cudnn.rnn": frozenset({"fp32_precision"}),
    "torch.backends.cuda.matmul": frozenset(
        {"allow_tf32", "allow_fp16_reduced_precision_reduction",
         "allow_bf16_reduced_precision_reduction", "allow_fp16_accumulation", "fp32_precision"}
    ),
    "torch.backends.mkldnn": frozenset(
        {"enabled", "deterministic", "fp32_precision", "matmul", "conv", "rnn", "flags",
         "set_flags", "is_available", "VERBOSE_OFF", "VERBOSE_ON", "VERBOSE_ON_CREATION",
         "verbose"}
    ),
    "torch.backends.opt_einsum": frozenset({"enabled", "strategy", "is_available", "get_opt_einsum", "flags", "set_flags"}),
    "torch.backends.nnpack": frozenset({"enabled", "is_available", "flags", "set_flags"}),
}

# --- version-dependent runtime requirements -------------------------------------

#: ``torch.use_deterministic_algorithms(True)`` needs ``CUBLAS_WORKSPACE_CONFIG``
#: on CUDA builds of torch older than this (it raised "... you have CUDA >= 10.2
#: ... CUBLAS_WORKSPACE_CONFIG=:4096:8 or :16:8"). pytorch/pytorch PR #161749
#: (landed Oct 2025, first released in 2.10) removed the check: per-handle/stream
#: cuBLAS workspaces (PR #85447) are deterministic without it.
CUBLAS_WORKSPACE_CONFIG_REQUIRED_BEFORE = (2, 10)
#: The values torch's old check accepted; the first is what fixes set.
CUBLAS_WORKSPACE_CONFIG_VALUES = (":4096:8", ":16:8")
