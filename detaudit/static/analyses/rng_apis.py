"""What known APIs do to the global RNGs: which seed, which draw, what trains.

The tables below (seeding calls that need an argument, torch's random
functions, layers and transforms, NumPy and Python draws, optimisers) and
``api_effects`` answer "what does this call do to the RNGs?" for a callee that
is a known library API; ``project.py`` answers it for the file's own and the
project's code, and falls back to this module.  Seeding functions and RNG state
restorers shared with the rules, the fixes and the dynamic tracer live in
``detaudit.knowledge.apis``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import libcst as cst

from detaudit.knowledge.apis import (
    DATA_API_ALIASES,
    DATALOADER,
    DATALOADER_SHUFFLE_PARAMETER,
    GENERATOR_KEYWORD,
    NUMPY,
    PYTHON,
    RANDOM_SAMPLER,
    RANDOM_SPLIT,
    RNG_STATE_RESTORERS,
    RNGS,
    SEEDING_CONSTRUCTORS,
    SEEDING_FUNCTIONS,
    TORCH,
)
from detaudit.knowledge.layers import derived_layers
from detaudit.static.engine.facts import CallFact, FileFacts

# (seeding functions and RNG state restorers are shared with the rules, the fixes
# and the dynamic tracer: detaudit.knowledge.apis)

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
) | frozenset({RANDOM_SPLIT, RANDOM_SAMPLER})

#: What a shuffling DataLoader's draw is called (it draws its order from the torch RNG).
SHUFFLING_LOADER = "DataLoader(shuffle=True)"
#: Draws that decide data order: a finding about the unseeded torch RNG names them as its consequence.
DATA_ORDER_DRAWS = frozenset({SHUFFLING_LOADER, RANDOM_SPLIT, RANDOM_SAMPLER})

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


def builds_transformers_model(qualname: str) -> bool:
    """``transformers.GPT2LMHeadModel(config)``, ``BertForMaskedLM(config)``,
    ``AutoModelForCausalLM.from_config(config)``: a transformers model built from
    a config initialises its weights from the torch RNG (``from_pretrained``
    loads them instead; TF and Flax classes are not torch's)."""
    parts = qualname.split(".")
    if parts[0] != "transformers" or len(parts) < 2:
        return False
    if parts[-1] == "from_config":
        return len(parts) >= 3 and parts[-2].startswith("AutoModel")
    name = parts[-1]
    return (
        name[:1].isupper()
        and (name.endswith("Model") or "For" in name)
        and not name.startswith(("Auto", "TF", "Flax", "PreTrained"))
    )

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

def initialises_weights(api: str) -> bool:
    """Whether a draw by ``api`` builds layers or models (their initial weights),
    rather than drawing data, noise or an order."""
    if api in TORCH_RANDOM_LAYERS or api.startswith(TORCH_RANDOM_MODEL_PREFIXES) or api.startswith("torch.nn.init."):
        return True
    layer = derived_layers().find(api)
    return layer is not None and "construction" in layer.draws


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

#: A model builder given one of these loads weights instead of drawing random ones
#: (``resnet50(weights="DEFAULT")``, ``timm.create_model(name, pretrained=True)``).
PRETRAINED_WEIGHTS_KEYWORDS = ("weights", "pretrained")

#: Names under TORCH_RANDOM_MODEL_PREFIXES that build no model.
TORCH_MODEL_NON_BUILDERS = frozenset({"list_models", "get_model_weights", "get_weight", "get_model_builder"})

@dataclass(frozen=True)
class Effects:
    """What running a call does to the global RNGs (in a default run)."""

    seeds: frozenset[str] = frozenset()
    #: RNG -> the API that draws from it (``"torch.nn.Linear"``), first one found
    draws: tuple[tuple[str, str], ...] = ()
    #: project files this answer was read from: (path, content hash)
    files: frozenset[tuple[str, str]] = frozenset()

    def draw_of(self, rng: str) -> str | None:
        return next((api for r, api in self.draws if r == rng), None)

    def __or__(self, other: "Effects") -> "Effects":
        draws = self.draws + tuple(d for d in other.draws if self.draw_of(d[0]) is None)
        return Effects(self.seeds | other.seeds, draws, self.files | other.files)


NOTHING = Effects()


def draw(rng: str, api: str) -> Effects:
    """A call that draws from ``rng`` through ``api``."""
    return Effects(draws=((rng, api),))


def combine(effects: Iterable[Effects]) -> Effects:
    total = NOTHING
    for effect in effects:
        total = total | effect
    return total


# --- one call to a known API ----------------------------------------------------


def api_effects(call: CallFact, facts: FileFacts, imports_torch: bool) -> Effects | None:
    """Effects of ``call`` when its callee is a known API, else None."""
    qualname = call.qualname
    if qualname is not None:
        seeded = SEEDING_FUNCTIONS.get(qualname) or RNG_STATE_RESTORERS.get(qualname)
        if seeded is not None:
            return Effects(seeds=seeded) if _seed_is_given(call, qualname, facts) else NOTHING
        if qualname in SEEDING_CONSTRUCTORS:
            return Effects(seeds=frozenset(RNGS))
        seeded = SEEDING_WHEN_SEED_GIVEN.get(qualname)
        if seeded is not None:
            seed = call.value_node("seed")
            return Effects(seeds=seeded) if seed is not None and not _is_literal_none(seed, facts) else NOTHING
        drawn = _knowndraw(call, qualname, facts)
        if drawn is not None:
            return drawn
    if imports_torch and call.method in TORCH_RANDOM_METHODS and not _uses_own_generator(call, facts):
        if qualname is None or qualname.startswith("torch."):
            return draw(TORCH, f".{call.method}()")
    return None


def _seed_is_given(call: CallFact, qualname: str, facts: FileFacts) -> bool:
    """``random.seed()`` without a value (or with ``None``) seeds from the OS."""
    if qualname not in SEEDING_NEEDS_ARGUMENT:
        return True
    return bool(call.node.args) and not _is_literal_none(call.node.args[0].value, facts)


def _is_literal_none(node: cst.BaseExpression, facts: FileFacts) -> bool:
    """None written in the code; a flag's ``None`` default is usually guarded by
    ``if args.seed is not None`` (conditional-seed's business)."""
    value = facts.evaluate(node)
    return value.is_(None) and value.flag is None


def _uses_own_generator(call: CallFact, facts: FileFacts) -> bool:
    generator = call.value_node(GENERATOR_KEYWORD)
    return generator is not None and not facts.evaluate(generator).is_(None)


def _knowndraw(call: CallFact, qualname: str, facts: FileFacts) -> Effects | None:
    head, _, attribute = qualname.rpartition(".")
    if head == "numpy.random" and attribute not in NUMPY_RANDOM_NON_DRAWING and not attribute.startswith("_"):
        return draw(NUMPY, qualname)
    if head == "random" and attribute not in PYTHON_RANDOM_NON_DRAWING and not attribute.startswith("_"):
        return draw(PYTHON, qualname)
    layer = derived_layers().find(qualname)
    if layer is not None:  # a third-party layer: its derived table says whether it draws
        return draw(TORCH, qualname) if layer.draws else NOTHING
    if builds_transformers_model(qualname):
        return draw(TORCH, qualname)
    if not qualname.startswith(("torch", "timm")):
        return None
    if _uses_own_generator(call, facts):
        return NOTHING
    if qualname in TORCH_RANDOM_FUNCTIONS or qualname in TORCH_RANDOM_LAYERS or qualname in TORCH_RANDOM_TRANSFORMS:
        return draw(TORCH, qualname)
    if qualname.startswith(TORCH_RANDOM_TRANSFORM_PREFIXES):
        return draw(TORCH, qualname)
    if DATA_API_ALIASES.get(qualname, qualname) == DATALOADER:
        shuffle = facts.evaluate(call.value_node(*DATALOADER_SHUFFLE_PARAMETER))
        return draw(TORCH, SHUFFLING_LOADER) if shuffle.truthy else NOTHING
    if qualname.startswith(TORCH_RANDOM_MODEL_PREFIXES) and _builds_random_model(call, qualname, facts):
        return draw(TORCH, qualname)
    return None


def _builds_random_model(call: CallFact, qualname: str, facts: FileFacts) -> bool:
    parts = qualname.split(".")
    if parts[-1] in TORCH_MODEL_NON_BUILDERS or any("Weights" in part for part in parts):
        return False
    for keyword in PRETRAINED_WEIGHTS_KEYWORDS:
        value = call.value_node(keyword)
        # an unknown value may well load weights: only a known "no weights" draws
        if value is not None and not facts.evaluate(value).falsy:
            return False
    return True


#: Where a training script builds its optimiser: ``torch.optim.<Class>(...)``.
TORCH_OPTIMIZER_NAMESPACE = "torch.optim"


def trains_here(call: CallFact, imports_torch: bool) -> bool:
    """The call builds a torch optimiser or runs ``.backward()``: training happens here."""
    namespace, _, name = (call.qualname or "").rpartition(".")
    if namespace == TORCH_OPTIMIZER_NAMESPACE and name[:1].isupper():
        return True
    return call.method == "backward" and imports_torch
