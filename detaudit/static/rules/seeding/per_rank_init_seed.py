"""The torch RNG seeded from the rank before a model is built, in a file that
never makes the ranks' weights agree: no DDP/FSDP wrapper, no broadcast, no
checkpoint loaded on every run (DET007 per-rank-init-seed).
"""

from __future__ import annotations

import libcst as cst

from detaudit.findings import Severity
from detaudit.knowledge.apis import SEED_PARAMETERS, TORCH
from detaudit.static.analyses.distributed import callee_names, rank_identifiers
from detaudit.static.analyses.rng_apis import Effects, initialises_weights
from detaudit.static.engine.facts import CallFact
from detaudit.static.engine.names import dotted_name
from detaudit.static.rule import Invalid, Rule

#: Rank identifiers that other code uses too (a worker index, a LoRA rank): on
#: their own they mean a process rank only in a file that does distributed work.
_AMBIGUOUS_RANKS = frozenset({"rank", "local_rank", "global_rank", "node_rank", "world_rank", "group_rank"})

#: Importing one of these makes a file distributed code.
_DISTRIBUTED_MODULES = ("torch.distributed", "torch.multiprocessing", "accelerate", "deepspeed", "horovod")


#: Parts of callee names (lower-cased) that make every rank hold rank 0's
#: weights, or may: the DDP and FSDP wrappers (both broadcast from rank 0 when
#: built; a project's ``create_ddp_model`` too), composable ``fully_shard`` and
#: ``replicate``, tensor parallelism (``distribute_tensor`` scatters from one
#: rank), explicit broadcasts, and the frameworks and trainers that wrap the
#: model themselves (Accelerate, Fabric, a project's ``Trainer``).  Matched
#: loosely: precision first.
_SYNCHRONISING_NAME_PARTS = (
    "ddp", "parallel", "fsdp", "fully_shard", "replicate", "distribute_", "broadcast", "sync_param", "sync_model",
    "sync_module", "setup_module", "trainer", "runner", "fabric", "accelerator", "strategy",
)
#: Packages whose entry points wrap the model (``deepspeed.initialize``).
_SYNCHRONISING_PACKAGES = ("deepspeed.",)
#: Parts of callee names that average gradients (or anything) across ranks: a
#: file that never does is not data-parallel training, and ranks that train
#: models of their own (seeds run side by side, ensembles, RL actors) should differ.
_GRADIENT_AVERAGING_NAME_PARTS = ("reduce", "average_grad", "avg_grad", "sync_grad")
#: Loading weights on every rank overwrites the per-rank initialisation.
_WEIGHT_LOADERS = frozenset({"load_state_dict", "from_pretrained", "load_checkpoint"})
#: ``accelerate.utils.set_seed(seed, device_specific=True)`` adds the process index.
_DEVICE_SPECIFIC_SEED = {"accelerate.utils.set_seed": ("device_specific", 1), "accelerate.utils.random.set_seed": ("device_specific", 1)}
#: How many callers up a seed in a helper is followed to the model it seeds.
_MAX_CALLER_DEPTH = 2


class PerRankInitSeed(Rule):
    code = "DET007"
    name = "per-rank-init-seed"
    severity = Severity.WARNING
    summary = (
        "Hand-written data-parallel training seeds the torch RNG from the rank before building the model, "
        "and nothing makes the ranks' weights agree."
    )
    rationale = """
        Data-parallel training assumes that every rank holds the same weights:
        each computes a gradient on its shard, the gradients are averaged, and
        every rank applies the same update.  Seeding the torch RNG from the rank
        (`torch.manual_seed(seed + rank)`) before the model is built gives each
        rank different initial weights.  `DistributedDataParallel` and FSDP copy
        rank 0's weights to every rank when they wrap the model, so there the
        per-rank seed is harmless; without them (hand-written data parallelism,
        averaging gradients with `all_reduce`) nothing ever makes the ranks
        agree: they train different models from step 0, the averaged gradient
        belongs to none of them, and which rank's model is saved decides the
        result.  Per-rank seeds are right for what should differ between ranks
        (augmentation, dropout): seed those after the model is built.  The rule
        speaks only where the file averages something across ranks (an
        `all_reduce`, an `average_gradients` helper) and nothing in it wraps,
        broadcasts or loads the weights: ranks that train models of their own
        (seeds run side by side, RL actors) are meant to differ.
        """
    fix_hint = (
        "Seed with the same value on every rank before building the model (and reseed per rank after it, "
        "for augmentation), or broadcast the initial weights: `for p in model.parameters(): dist.broadcast(p.data, src=0)`; "
        "`DistributedDataParallel` does that when it wraps the model."
    )
    VALID = (
        "import torch, torch.distributed as dist\n\ndef main(args):\n    dist.init_process_group('gloo')\n"
        "    torch.manual_seed(args.seed)\n    model = torch.nn.Linear(8, 2)\n"
        "    torch.manual_seed(args.seed + dist.get_rank())  # augmentation differs per rank\n"
        "    for p in model.parameters():\n        dist.all_reduce(p.grad)\n",
        # DDP broadcasts rank 0's weights when it wraps the model
        "import torch, torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n\n"
        "def main(args):\n    rank = dist.get_rank()\n    torch.manual_seed(args.seed + rank)\n"
        "    model = DDP(torch.nn.Linear(8, 2))\n    return model\n",
        # the initial weights are broadcast by hand
        "import torch, torch.distributed as dist\n\ndef main(seed):\n    torch.manual_seed(seed + dist.get_rank())\n"
        "    model = torch.nn.Linear(8, 2)\n    for p in model.parameters():\n        dist.broadcast(p.data, src=0)\n"
        "    dist.all_reduce(model.weight.grad)\n",
        # reseeded alike on every rank before the model is built
        "import os, torch\nimport torch.distributed as dist\nrank = int(os.environ['RANK'])\ntorch.manual_seed(rank)\n"
        "torch.manual_seed(0)\nmodel = torch.nn.Linear(8, 2)\ndist.all_reduce(model.weight.grad)\n",
        # the weights come from a checkpoint on every rank
        "import torch, torch.distributed as dist\ntorch.manual_seed(dist.get_rank())\nmodel = torch.nn.Linear(8, 2)\n"
        "model.load_state_dict(torch.load('init.pt'))\ndist.all_reduce(model.weight.grad)\n",
        # each rank trains a model of its own (nothing is averaged across ranks)
        "import torch, torch.distributed as dist\n\ndef worker(seed):\n    torch.manual_seed(seed + dist.get_rank())\n"
        "    return torch.nn.Linear(8, 2)\n",
        # a project's trainer that may wrap the model in DDP
        "import torch, torch.distributed as dist\nfrom engine import Trainer\n\ndef main(seed):\n"
        "    torch.manual_seed(seed + dist.get_rank())\n    model = torch.nn.Linear(8, 2)\n    Trainer(model).fit()\n"
        "    dist.all_reduce(torch.ones(1))\n",
    )
    INVALID = (
        Invalid(
            "import torch, torch.distributed as dist\n\ndef main(seed):\n    dist.init_process_group('gloo')\n"
            "    torch.manual_seed(seed + dist.get_rank())\n    model = torch.nn.Linear(8, 2)\n"
            "    for p in model.parameters():\n        dist.all_reduce(p.grad)\n",
            line=5,
            message="get_rank",
        ),
        Invalid(
            "import os, torch\nimport torch.nn as nn\n\nclass Net(nn.Module):\n    def __init__(self):\n"
            "        super().__init__()\n        self.fc = nn.Linear(4, 2)\n\n"
            "local_rank = int(os.environ['LOCAL_RANK'])\ntorch.manual_seed(1234 + local_rank)\nnet = Net()\n"
            "average_gradients(net)\n",
            line=10,
            message="Net",
        ),
        # seeded in a helper, the model built by its caller
        Invalid(
            "import torch, torch.distributed as dist\n\ndef setup(args):\n    torch.manual_seed(args.seed + args.rank)\n\n"
            "def main(args):\n    setup(args)\n    model = torch.nn.Conv2d(3, 8, 3)\n    for p in model.parameters():\n"
            "        dist.all_reduce(p.grad)\n",
            line=4,
            message="rank",
        ),
        Invalid(
            "import torch, torch.distributed as dist\nfrom accelerate.utils import set_seed\nset_seed(42, device_specific=True)\n"
            "model = torch.nn.Linear(8, 2)\ndist.all_reduce(model.weight.grad)\n",
            line=3,
            message="device_specific",
        ),
    )

    def finish(self) -> None:
        if not self._averages_across_ranks():  # file-level, and cheaper than the seeds' rank analysis
            return
        seeds = [(call, ranks) for call in self.facts.calls if (ranks := self._per_rank_seed(call))]
        if not seeds or self._weights_made_equal():
            return
        for call, ranks in seeds:
            built = self._model_built_after(call, 0)
            if built is not None:
                build, api = built
                written = dotted_name(build.node.func) or api
                how = written if written == api else f"{written}, through {api}"
                self.report(
                    call.node,
                    f"The torch RNG is seeded from the rank ({', '.join(sorted(ranks))}) and then the model's weights are "
                    f"initialised ({how}): every rank starts from different weights, and nothing in this file "
                    "(DistributedDataParallel, FSDP, a broadcast) makes them agree; seed alike on every rank before "
                    "building the model, or broadcast its parameters from rank 0.",
                )

    def _effects(self, call: CallFact) -> Effects:
        """What ``call`` does to the global RNGs; the project files read to know it
        become dependencies of the file's result (the cache must see them change)."""
        summary = self.analyses.rng_effects
        effects = summary.call_effects(call)
        self.context.dependencies.update(effects.files)
        return summary.as_run(call, effects)

    def _per_rank_seed(self, call: CallFact) -> set[str]:
        """The rank identifiers the torch seed of ``call`` is computed from (none:
        it does not seed torch, or not from the rank, or the file is not distributed)."""
        facts = self.facts
        ranks = set()
        device_specific = _DEVICE_SPECIFIC_SEED.get(call.qualname or "")
        if device_specific is not None and facts.evaluate(call.value_node(*device_specific)).truthy:
            ranks.add("device_specific=True")
        ranks |= rank_identifiers(facts, call.value_node(*SEED_PARAMETERS.get(call.qualname or "", ("seed", 0))))
        # the effects last: they ask the project about the callee, which costs
        # more than reading the few calls that pass a rank at all
        if not ranks or TORCH not in self._effects(call).seeds:
            return set()
        distributed = ranks - _AMBIGUOUS_RANKS or any(facts.imports_module(m) for m in _DISTRIBUTED_MODULES)
        return ranks if distributed else set()

    def _averages_across_ranks(self) -> bool:
        """Whether the file averages something across ranks (gradients, by hand):
        hand-written data parallelism, whose ranks must hold one model."""
        # a callee's name is spelled in the file (at the call, or in the import
        # that binds it): most files are settled by their text, without a look at each call
        text = self.context.source.text.lower()
        if not any(part in text for part in _GRADIENT_AVERAGING_NAME_PARTS):
            return False
        return any(
            call.qualname != "functools.reduce"
            and any(part in " ".join(callee_names(call)).lower() for part in _GRADIENT_AVERAGING_NAME_PARTS)
            for call in self.facts.calls
        )

    def _weights_made_equal(self) -> bool:
        """Whether something in the file makes the ranks' weights agree
        (flow-insensitive: a wrapper or broadcast anywhere, weights loaded outside any ``if``)."""
        for call in self.facts.calls:
            names = callee_names(call)
            spelled = " ".join(names).lower()
            if any(part in spelled for part in _SYNCHRONISING_NAME_PARTS) or (call.qualname or "").startswith(_SYNCHRONISING_PACKAGES):
                return True
            if names & _WEIGHT_LOADERS and not any(isinstance(c, (cst.If, cst.Try)) for c in call.scope.conditions):
                return True
        return False

    def _model_built_after(self, seed: CallFact, depth: int) -> tuple[CallFact, str] | None:
        """The first call after ``seed`` in its function that initialises weights
        from the torch RNG, with the API that draws them; None when the torch RNG
        is reseeded alike first.  A seed in a helper is followed to its callers."""
        summary = self.analyses.rng_effects
        for call in summary.calls_of(seed.scope.function):
            if call.order <= seed.order:
                continue
            effects = self._effects(call)
            if TORCH in effects.seeds and not self._per_rank_seed(call):
                return None
            api = effects.draw_of(TORCH)
            if api is not None and initialises_weights(api):
                return call, api
        if seed.scope.function is None or depth >= _MAX_CALLER_DEPTH:
            return None
        target = ("function", seed.scope.function)
        for caller in self.facts.calls:
            if summary.local_target(caller) == target:
                found = self._model_built_after(caller, depth + 1)
                if found is not None:
                    return found
        return None
