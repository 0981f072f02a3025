"""API facts the static rules, fixes and runtime helpers share: data, not logic.

Names are fully qualified dotted names as the static pass resolves them
(``import torch as T; T.manual_seed`` resolves to ``torch.manual_seed``).
"""

from __future__ import annotations

from dataclasses import dataclass

from detaudit.knowledge.backend_settings import backend_settings

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
            "torch_geometric.seed_everything",
            "torch_geometric.seed.seed_everything",
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

@dataclass(frozen=True)
class DeterminismSwitch:
    """A call that turns deterministic algorithms on or off.

    ``argument``/``position``: where the on/off value goes (``argument=None``: the
    call always turns them on); ``default``: that value when not passed;
    ``warn_value``: a value of it meaning "on, but only warn";
    ``warn_only``: (keyword, position, value) of a separate argument that makes
    nondeterministic ops warn instead of raise;
    ``sets_cublas_workspace``: the helper sets CUBLAS_WORKSPACE_CONFIG itself;
    ``framework``: set for framework options (reported by framework-determinism-off).
    """

    argument: str | None = None
    position: int | None = None
    default: object = None
    warn_value: object = None
    warn_only: tuple[str, int | None, object] | None = None
    sets_cublas_workspace: bool = False
    framework: str | None = None


def _torch_switches() -> dict[str, DeterminismSwitch]:
    """torch's own switch as the settings table spells it on any version: each
    setter taking deterministic algorithms on/off, with the argument of the same
    setter that makes nondeterministic ops only warn.  (The debug-mode setter
    maps modes instead; the determinism rules read it from the table.)"""
    table = backend_settings()
    switches = {}
    for on in table["deterministic-algorithms"].writers:
        if on.values is None:
            warn = next(w for w in table["deterministic-warn-only"].writers if w.write == on.write)
            switches[on.write] = DeterminismSwitch(on.argument, on.position, warn_only=(warn.argument, warn.position, True))
    return switches


_LIGHTNING_TRAINER = DeterminismSwitch(
    "deterministic", warn_value="warn", sets_cublas_workspace=True, framework="Lightning Trainer"
)
_HF_TRAINING_ARGUMENTS = DeterminismSwitch(
    "full_determinism", default=False, sets_cublas_workspace=True, framework="transformers TrainingArguments"
)
#: Every call that switches deterministic algorithms (Lightning 2.6: ``Trainer``
#: calls ``use_deterministic_algorithms(deterministic)`` whenever it is a bool and
#: sets ``CUBLAS_WORKSPACE_CONFIG`` when on; transformers 5: ``set_seed(seed,
#: deterministic)``, ``enable_full_determinism(seed, warn_only)`` which sets
#: ``CUBLAS_WORKSPACE_CONFIG``, ``TrainingArguments(full_determinism=True)`` calls it).
DETERMINISM_SWITCHES: dict[str, DeterminismSwitch] = {
    **_torch_switches(),
    **{
        name: _LIGHTNING_TRAINER
        for name in (
            "lightning.Trainer", "lightning.pytorch.Trainer", "lightning.pytorch.trainer.Trainer",
            "lightning.pytorch.trainer.trainer.Trainer", "pytorch_lightning.Trainer",
            "pytorch_lightning.trainer.Trainer", "pytorch_lightning.trainer.trainer.Trainer",
        )
    },
    **{
        name: _HF_TRAINING_ARGUMENTS
        for name in (
            "transformers.TrainingArguments", "transformers.Seq2SeqTrainingArguments",
            "transformers.training_args.TrainingArguments",
            "transformers.training_args_seq2seq.Seq2SeqTrainingArguments",
            "trl.SFTConfig", "trl.DPOConfig", "trl.GRPOConfig",
        )
    },
    "transformers.set_seed": DeterminismSwitch("deterministic", 1, default=False),
    "transformers.trainer_utils.set_seed": DeterminismSwitch("deterministic", 1, default=False),
    "accelerate.utils.set_seed": DeterminismSwitch("deterministic", 2, default=False),
    "accelerate.utils.random.set_seed": DeterminismSwitch("deterministic", 2, default=False),
    "transformers.enable_full_determinism": DeterminismSwitch(warn_only=("warn_only", 1, True), sets_cublas_workspace=True),
    "transformers.trainer_utils.enable_full_determinism": DeterminismSwitch(warn_only=("warn_only", 1, True), sets_cublas_workspace=True),
    "detaudit.enable_determinism": DeterminismSwitch(warn_only=("strict", 0, False), sets_cublas_workspace=True),
    "detaudit.runtime.determinism.enable_determinism": DeterminismSwitch(warn_only=("strict", 0, False), sets_cublas_workspace=True),
    "detaudit.deterministic": DeterminismSwitch(warn_only=("strict", 1, False), sets_cublas_workspace=True),
    "detaudit.runtime.determinism.deterministic": DeterminismSwitch(warn_only=("strict", 1, False), sets_cublas_workspace=True),
}

#: Calls that turn on deterministic algorithms (whatever their arguments say).
DETERMINISM_ENABLERS = frozenset(name for name, switch in DETERMINISM_SWITCHES.items() if switch.argument is None)

#: Framework options that turn cuDNN autotuning on (Lightning ``Trainer(benchmark=True)``).
FRAMEWORK_BENCHMARK_OPTIONS: dict[str, str] = {name: "benchmark" for name, s in DETERMINISM_SWITCHES.items() if s is _LIGHTNING_TRAINER}

#: Context managers under which no autograd graph is built (backward-only hazards cannot occur).
NO_GRAD_CONTEXTS = frozenset(
    {"torch.no_grad", "torch.inference_mode", "torch.autograd.no_grad", "torch.autograd.inference_mode",
     "torch.autograd.grad_mode.no_grad", "torch.autograd.grad_mode.inference_mode"}
)

#: Factories that put a tensor on the CPU unless given ``device=`` (or unless
#: ``torch.set_default_device`` changed the default): a CUDA-only hazard cannot hit it.
CPU_DEFAULT_TENSOR_FACTORIES = frozenset(
    f"torch.{name}" for name in ("tensor", "as_tensor", "from_numpy", "zeros", "ones", "full", "arange", "linspace", "rand", "randn", "randint")
)
DEFAULT_DEVICE_SETTER = "torch.set_default_device"

#: Where a training script builds its optimiser: ``torch.optim.<Class>(...)``.
TORCH_OPTIMIZER_NAMESPACE = "torch.optim"
#: Framework trainers: constructing one makes a file a training script.
TRAINER_CLASSES = frozenset(
    {name for name, s in DETERMINISM_SWITCHES.items() if s is _LIGHTNING_TRAINER}
    | {"transformers.Trainer", "transformers.Seq2SeqTrainer", "trl.SFTTrainer", "accelerate.Accelerator"}
)

# --- entropy, unseeded generators, worker RNGs (entropy-seed, dataloader-worker-seed) ---

#: Calls whose value differs on every run: a seed derived from one is no seed.
ENTROPY_CALLS = frozenset(
    {
        "time.time", "time.time_ns", "time.perf_counter", "time.perf_counter_ns",
        "time.monotonic", "time.monotonic_ns", "time.process_time", "time.process_time_ns",
        "datetime.datetime.now", "datetime.datetime.utcnow", "datetime.datetime.today",
        "datetime.date.today", "os.urandom", "os.getrandom", "os.getpid",
        "uuid.uuid1", "uuid.uuid4", "random.SystemRandom",
        "torch.seed", "torch.random.seed", "torch.cuda.seed", "torch.cuda.seed_all",
    }
)
#: Every function of these modules draws from the OS entropy pool.
ENTROPY_MODULE_PREFIXES = ("secrets.",)

#: Calls that reseed a global RNG from the OS (or a random number) on every run.
RESEED_FROM_ENTROPY = frozenset(
    {"torch.seed", "torch.random.seed", "torch.cuda.seed", "torch.cuda.seed_all"}
)

#: Calls that take a seed, and where it goes (keyword, position); a missing or
#: ``None`` seed means "seed from the OS" for the ones in SEEDED_BY_OS_WHEN_NONE.
SEED_PARAMETERS: dict[str, tuple[str, int]] = {
    "torch.manual_seed": ("seed", 0),
    "torch.random.manual_seed": ("seed", 0),
    "torch.cuda.manual_seed": ("seed", 0),
    "torch.cuda.manual_seed_all": ("seed", 0),
    "random.seed": ("a", 0),
    "random.Random": ("x", 0),
    "numpy.random.seed": ("seed", 0),
    "numpy.random.default_rng": ("seed", 0),
    "numpy.random.RandomState": ("seed", 0),
    "numpy.random.SeedSequence": ("entropy", 0),
    "numpy.random.PCG64": ("seed", 0),
    "numpy.random.MT19937": ("seed", 0),
    "numpy.random.Philox": ("seed", 0),
    "numpy.random.SFC64": ("seed", 0),
    "tensorflow.random.set_seed": ("seed", 0),
    "tensorflow.keras.utils.set_random_seed": ("seed", 0),
    "keras.utils.set_random_seed": ("seed", 0),
    "jax.random.PRNGKey": ("seed", 0),
    "jax.random.key": ("seed", 0),
    **{name: ("seed", 0) for name in SEEDING_FUNCTIONS if name.split(".")[-1] in ("seed_everything", "set_seed", "set_random_seed", "random_seed")},
}
SEEDED_BY_OS_WHEN_NONE = frozenset(
    {
        "random.seed", "random.Random", "numpy.random.seed", "numpy.random.default_rng",
        "numpy.random.RandomState", "numpy.random.SeedSequence", "numpy.random.PCG64",
        "numpy.random.MT19937", "numpy.random.Philox", "numpy.random.SFC64",
    }
)
#: Methods that seed a generator object in place (``rng.seed(0)``, ``g.manual_seed(0)``).
SEEDING_METHODS = frozenset({"seed", "manual_seed"})

#: Global RNG state torch does NOT reseed in DataLoader workers (it reseeds
#: ``random``, numpy's legacy global RNG and torch; worker.py since torch 1.9).
#: Forked workers inherit these states, so every worker draws the same numbers.
UNRESEEDED_WORKER_RNG_CALLS = frozenset({"cv2.randu", "cv2.randn", "cv2.randShuffle"})
UNRESEEDED_WORKER_RNG_MODULES = ("imgaug",)
#: Generator objects whose state a worker inherits when created at module level.
RNG_INSTANCE_CONSTRUCTORS = frozenset(
    {"random.Random", "numpy.random.RandomState", "numpy.random.default_rng", "numpy.random.Generator"}
)

DATALOADER = "torch.utils.data.DataLoader"
RANDOM_SPLIT = "torch.utils.data.random_split"
RANDOM_SAMPLER = "torch.utils.data.RandomSampler"
DISTRIBUTED_SAMPLER = "torch.utils.data.DistributedSampler"
#: Other spellings of the same classes, resolved to the names above.
DATA_API_ALIASES = {
    "torch.utils.data.dataloader.DataLoader": DATALOADER,
    "torch.utils.data.dataset.random_split": RANDOM_SPLIT,
    "torch.utils.data.sampler.RandomSampler": RANDOM_SAMPLER,
    "torch.utils.data.distributed.DistributedSampler": DISTRIBUTED_SAMPLER,
}
#: Names whose presence in a sampler's ``seed=`` means each rank shuffles differently.
RANK_NAMES = frozenset({"rank", "local_rank", "global_rank", "process_index", "get_rank"})

# --- ordering (unordered-file-listing, set-iteration-order) -------------------

#: Directory listings in the order the filesystem returns (not sorted).
FILE_LISTING_CALLS = frozenset(
    {"os.listdir", "os.scandir", "os.walk", "os.fwalk", "glob.glob", "glob.iglob",
     "tensorflow.io.gfile.listdir", "tensorflow.io.gfile.glob", "tensorflow.io.gfile.walk"}
)
#: ``pathlib.Path`` methods that list a directory (matched by method name).
FILE_LISTING_METHODS = frozenset({"glob", "rglob", "iterdir"})
#: Consumers whose result does not depend on the order of their argument.
ORDER_INSENSITIVE_CALLS = frozenset(
    {"sorted", "set", "frozenset", "len", "any", "all", "sum", "min", "max", "bool", "print",
     "collections.Counter", "natsort.natsorted", "natsort.os_sorted", "natsort.humansorted",
     "natsort.realsorted", "numpy.sort", "os.path.exists", "os.path.isdir", "os.path.isfile"}
)
#: Wrappers that keep their argument's order (the order-dependent use is further out).
ORDER_PRESERVING_CALLS = frozenset(
    {"list", "tuple", "iter", "map", "filter", "reversed", "dict.fromkeys", "itertools.chain",
     "itertools.islice"}
)
#: Consumers that turn an iteration order into data: positions, first match, text.
ORDER_CAPTURING_CALLS = frozenset({"enumerate", "zip", "next", "random.shuffle", "random.choice"})
#: String methods whose result is a ``str`` / a list of ``str`` (set-iteration-order
#: only reports sets whose elements are syntactically strings or bytes).
STRING_METHODS = frozenset(
    {"lower", "upper", "strip", "lstrip", "rstrip", "replace", "format", "join", "title",
     "casefold", "capitalize", "decode", "encode", "removeprefix", "removesuffix", "zfill"}
)
STRING_LIST_METHODS = frozenset({"split", "rsplit", "splitlines", "readlines"})
STRING_FUNCTIONS = frozenset(
    {"str", "repr", "os.path.basename", "os.path.join", "os.path.dirname", "os.fspath"}
)
STRING_LIST_FUNCTIONS = frozenset({"re.findall", "re.split", "os.listdir"})

# --- uninitialised memory (uninitialized-memory) ---------------------------------

#: Allocators whose result holds whatever the memory held before.
EMPTY_ALLOCATORS = frozenset(
    {"torch.empty", "torch.empty_like", "torch.empty_strided", "torch.empty_permuted"}
)
EMPTY_ALLOCATOR_METHODS = frozenset({"new_empty", "new_empty_strided"})
#: In-place methods that overwrite every element without reading it.
FULL_WRITE_METHODS = frozenset(
    {"copy_", "fill_", "zero_", "normal_", "uniform_", "random_", "bernoulli_", "exponential_",
     "cauchy_", "log_normal_", "geometric_", "set_"}
)
#: In-place methods that write only some elements.
PARTIAL_WRITE_METHODS = frozenset(
    {"masked_fill_", "index_fill_", "index_copy_", "index_put_", "scatter_", "masked_scatter_",
     "fill_diagonal_", "index_add_", "scatter_add_", "scatter_reduce_", "put_"}
)
#: Methods that read only metadata, never element values.
METADATA_METHODS = frozenset(
    {"size", "dim", "numel", "nelement", "stride", "element_size", "data_ptr", "is_contiguous",
     "storage_offset", "untyped_storage", "get_device", "type", "ndimension", "new_empty", "new_zeros",
     "new_ones", "new_full", "new_empty_strided", "is_floating_point", "is_complex"}
)
#: Functions that initialise a tensor in place (``nn.init.*``, the full write of a parameter).
IN_PLACE_INIT_PREFIX = "torch.nn.init."

# --- torch.compile autotuning (compile-autotune) ----------------------------------

#: ``torch.compile`` modes that pick kernels by timing them (torch 2.13
#: ``torch._inductor.list_mode_options``: max_autotune + coordinate_descent_tuning).
COMPILE_AUTOTUNE_MODES = frozenset({"max-autotune", "max-autotune-no-cudagraphs"})
INDUCTOR_CONFIG = "torch._inductor.config"
#: Inductor options that benchmark candidate kernels and keep the fastest.
INDUCTOR_AUTOTUNE_OPTIONS = frozenset(
    {"max_autotune", "max_autotune_gemm", "max_autotune_pointwise", "coordinate_descent_tuning"}
)
#: Environment variables that turn those options on ("1").
INDUCTOR_AUTOTUNE_ENVIRONMENT = frozenset(
    {"TORCHINDUCTOR_MAX_AUTOTUNE", "TORCHINDUCTOR_MAX_AUTOTUNE_GEMM",
     "TORCHINDUCTOR_MAX_AUTOTUNE_POINTWISE", "TORCHINDUCTOR_COORDINATE_DESCENT_TUNING"}
)

# --- TensorFlow / Keras and JAX (DET040-049; never imported, matched by name) ------

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
TRUTHY_ENVIRONMENT_VALUES = frozenset({"1", "true", "True", "TRUE", "yes"})
#: Top-level modules whose functions are library APIs, never project helpers
#: (a helper named ``set_seed`` from one of these is matched by its real name).
WELL_KNOWN_LIBRARIES = frozenset(
    {"random", "numpy", "torch", "tensorflow", "keras", "tf_keras", "jax", "flax", "optax",
     "lightning", "pytorch_lightning", "transformers", "accelerate", "sklearn"}
)
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

# --- seed rules (missing-*-seed, conditional-seed, seed-after-use) ---------------

#: Restoring a saved RNG state (resuming from a checkpoint) makes the following
#: draws as reproducible as seeding does.
RNG_STATE_RESTORERS: dict[str, frozenset[str]] = {
    "torch.set_rng_state": frozenset({TORCH}),
    "torch.random.set_rng_state": frozenset({TORCH}),
    "numpy.random.set_state": frozenset({NUMPY}),
    "random.setstate": frozenset({PYTHON}),
}
#: A torch draw given ``generator=`` draws from that generator, not the global RNG.
GENERATOR_KEYWORD = "generator"
#: A model builder given one of these loads weights instead of drawing random ones
#: (``resnet50(weights="DEFAULT")``, ``timm.create_model(name, pretrained=True)``).
PRETRAINED_WEIGHTS_KEYWORDS = ("weights", "pretrained")
#: Names under TORCH_RANDOM_MODEL_PREFIXES that build no model.
TORCH_MODEL_NON_BUILDERS = frozenset({"list_models", "get_model_weights", "get_weight", "get_model_builder"})
#: ``DataLoader(dataset, batch_size, shuffle, ...)``: where ``shuffle`` goes.
DATALOADER_SHUFFLE_PARAMETER = ("shuffle", 2)

# --- what ``detaudit check --fix`` inserts (detaudit's runtime helpers) ------------

#: The module fixes import, and its helpers they call.
FIX_MODULE = "detaudit"
FIX_SEEDING_CALL = "detaudit.seed_everything"  # seeds random, numpy and torch
FIX_DETERMINISM_CALL = "detaudit.enable_determinism"
FIX_WORKER_INIT_FN = "detaudit.seed_worker"
FIX_GENERATOR_FACTORY = "detaudit.make_generator"
#: The seed a fix passes when the file names none.
FIX_DEFAULT_SEED = 0
#: Tensor methods and ``torch.*`` functions returning a view (an alias that may
#: then be written): the linter stops following a tensor once it is viewed.
TENSOR_VIEW_FUNCTIONS = frozenset(
    {"view", "view_as", "reshape", "reshape_as", "narrow", "select", "chunk", "split", "tensor_split",
     "unbind", "unsqueeze", "squeeze", "transpose", "t", "permute", "flatten", "unflatten", "expand",
     "expand_as", "as_strided", "diagonal", "movedim", "moveaxis", "swapaxes", "swapdims", "unfold",
     "contiguous", "detach", "view_as_real", "view_as_complex", "split_with_sizes", "hsplit", "vsplit",
     "dsplit", "real", "imag", "to", "type_as", "untyped_storage", "storage", "data_ptr"}
)
#: Methods that seed or restore a generator object's state (``rng.setstate(saved)``).
STATE_RESTORING_METHODS = frozenset({"setstate", "set_state", "set_rng_state"})
