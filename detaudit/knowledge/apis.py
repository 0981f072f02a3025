"""API facts that several parts of detaudit share: data, not logic.

Readers are the static rules and analyses, their fixes, the runtime helpers and
the dynamic tracer.  A list that one module alone reads lives in that module
(a rule's private lists with its rule).

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
#: How messages name each global RNG.
RNG_LABELS = {TORCH: "torch RNG", NUMPY: "NumPy global RNG", PYTHON: "Python `random` RNG"}

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
            # libzero (Yandex Research's tabular-DL repositories)
            "zero.set_randomness",
            "zero.random.set_randomness",
            "zero.improve_reproducibility",
            "zero.random.improve_reproducibility",
        )
    },
    "keras.utils.set_random_seed": frozenset({NUMPY, PYTHON}),
    "tensorflow.keras.utils.set_random_seed": frozenset({NUMPY, PYTHON}),
}

#: Classes whose construction seeds every global RNG, always (not seeding
#: helpers to call: the fixes never write them).  transformers' ``Trainer``
#: calls ``set_seed(args.seed)`` (42 by default) in its ``__init__``.
SEEDING_CONSTRUCTORS: frozenset[str] = frozenset(
    {
        "transformers.Trainer", "transformers.trainer.Trainer", "transformers.Seq2SeqTrainer",
        "transformers.trainer_seq2seq.Seq2SeqTrainer", "trl.SFTTrainer", "trl.DPOTrainer", "trl.RewardTrainer",
    }
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
    maps modes instead; the determinism analysis reads it from the table.)"""
    table = backend_settings()
    switches = {}
    for on in table["deterministic-algorithms"].writers:
        if on.values is None:
            warn = next(w for w in table["deterministic-warn-only"].writers if w.write == on.write)
            switches[on.write] = DeterminismSwitch(on.argument, on.position, warn_only=(warn.argument, warn.position, True))
    return switches


LIGHTNING_TRAINER = DeterminismSwitch(
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
        name: LIGHTNING_TRAINER
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

#: Framework options that turn cuDNN autotuning on (Lightning ``Trainer(benchmark=True)``).
FRAMEWORK_BENCHMARK_OPTIONS: dict[str, str] = {name: "benchmark" for name, s in DETERMINISM_SWITCHES.items() if s is LIGHTNING_TRAINER}

#: Framework entry points that build a Lightning Trainer from a dictionary of its
#: keyword arguments, and the argument that holds it (``LightningCLI(trainer_defaults=
#: {"benchmark": True})``; the command line or a config file may still override them).
TRAINER_DEFAULTS_ARGUMENTS: dict[str, str] = {
    name: "trainer_defaults"
    for name in (
        "lightning.pytorch.cli.LightningCLI", "lightning.pytorch.LightningCLI",
        "pytorch_lightning.cli.LightningCLI", "pytorch_lightning.utilities.cli.LightningCLI",
    )
}

#: Inductor options (``torch._inductor.config``) that benchmark candidate kernels
#: and keep the fastest: DET017 looks for them in code, ``detaudit run`` reads
#: them as each graph is compiled.
INDUCTOR_AUTOTUNE_OPTIONS = frozenset(
    {"max_autotune", "max_autotune_gemm", "max_autotune_pointwise", "coordinate_descent_tuning"}
)

#: Framework trainers: constructing one makes a file a training script.
TRAINER_CLASSES = frozenset(
    {name for name, s in DETERMINISM_SWITCHES.items() if s is LIGHTNING_TRAINER}
    | {"transformers.Trainer", "transformers.Seq2SeqTrainer", "trl.SFTTrainer", "accelerate.Accelerator"}
)

# --- seeds and entropy (entropy-seed, the dynamic tracer) ------------------------

#: Calls that reseed a global RNG from the OS (or a random number) on every run.
RESEED_FROM_ENTROPY = frozenset(
    {"torch.seed", "torch.random.seed", "torch.cuda.seed", "torch.cuda.seed_all"}
)

#: Calls that take a seed, and where it goes (keyword, position); for some of them
#: a missing or ``None`` seed means "seed from the OS" (entropy-seed knows which).
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

# --- torch.utils.data (dataloader-worker-seed, the RNG effects of calls) ----------

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

# --- environment variables ----------------------------------------------------

#: Values of a switch variable that turn it on (TF_DETERMINISTIC_OPS, TORCHINDUCTOR_*).
TRUTHY_ENVIRONMENT_VALUES = frozenset({"1", "true", "True", "TRUE", "yes"})

# --- RNG state and generators (seed rules, dataloader-worker-seed, the tracer) ----

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
#: ``DataLoader(dataset, batch_size, shuffle, ...)``: where ``shuffle`` goes.
DATALOADER_SHUFFLE_PARAMETER = ("shuffle", 2)
#: ``DataLoader(..., worker_init_fn)``: what runs first in each worker process (keyword, position)
DATALOADER_WORKER_INIT_PARAMETER = ("worker_init_fn", 10)

# --- what ``detaudit check --fix`` inserts -----------------------------------------

#: The seed a fix passes when the file names none.
FIX_DEFAULT_SEED = 0
