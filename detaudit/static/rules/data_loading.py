"""What still breaks data order across runs in DataLoader workers (DET030 dataloader-worker-seed).

torch already reseeds Python ``random``, numpy's global RNG and torch in every
DataLoader worker from the main process's torch seed, so a missing
``worker_init_fn`` is not a hazard by itself (older linters report it
everywhere).  This rule reports what still breaks:

- shuffling (``DataLoader(shuffle=True)``, ``random_split``) with neither a
  ``generator=`` nor a seeded main torch RNG: the order and the worker seeds
  differ per run;
- workers inheriting RNG state torch does not reseed (OpenCV, imgaug, a
  module-level ``random.Random``/``np.random.RandomState``/``default_rng``
  instance used by the file's code) with no ``worker_init_fn``: every worker
  draws the same "random" augmentations;
- ``DistributedSampler`` shuffling without ``set_epoch`` (the same order every
  epoch) or seeded from the rank (ranks draw overlapping samples).

Only datasets and samplers defined in the checked file are seen.
"""

from __future__ import annotations

import libcst as cst

from detaudit.findings import Severity
from detaudit.knowledge.apis import (
    DATA_API_ALIASES,
    DATALOADER,
    DATALOADER_SHUFFLE_PARAMETER,
    DISTRIBUTED_SAMPLER,
    GENERATOR_KEYWORD,
    RANDOM_SPLIT,
    RANK_NAMES,
    RNG_INSTANCE_CONSTRUCTORS,
    TORCH,
    UNRESEEDED_WORKER_RNG_CALLS,
    UNRESEEDED_WORKER_RNG_MODULES,
)
from detaudit.static.edits import seeded_loader_fix
from detaudit.static.facts import CallFact
from detaudit.static.names import dotted_name
from detaudit.static.rule import Invalid, Rule
from detaudit.static.rules.seeds import analyse

#: ``DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn, pin_memory, drop_last, timeout, worker_init_fn, ...)``
_NUM_WORKERS = ("num_workers", 5)
_WORKER_INIT_FN = ("worker_init_fn", 10)
_LOADER_GENERATOR = (GENERATOR_KEYWORD, 12)
#: ``random_split(dataset, lengths, generator)``
_SPLIT_GENERATOR = (GENERATOR_KEYWORD, 2)
#: ``DistributedSampler(dataset, num_replicas, rank, shuffle=True, seed=0, drop_last)``
_SAMPLER_SHUFFLE = ("shuffle", 3)
_SAMPLER_SEED = ("seed", 4)


class DataloaderWorkerSeed(Rule):
    code = "DET030"
    name = "dataloader-worker-seed"
    severity = Severity.WARNING
    summary = "Data order or worker randomness that torch's own worker seeding does not make reproducible."
    rationale = """
        Since torch 1.9 every DataLoader worker reseeds Python `random`, numpy's
        global RNG and torch from the main process's torch seed, so a
        `worker_init_fn` is not needed for those.  What still differs between
        runs: a shuffling DataLoader or `random_split` when neither a seeded
        `generator=` nor a seeded main torch RNG fixes the order; RNG state
        torch does not reseed (OpenCV's `cv2.randu`/`randn`/`randShuffle`,
        imgaug, a module-level `random.Random` / `np.random.RandomState` /
        `default_rng` instance), which forked workers inherit identically, so
        each worker repeats the same augmentations; and a `DistributedSampler`
        that shuffles without `set_epoch(epoch)` each epoch (the same order every
        epoch) or is seeded from the rank (ranks' shards overlap).
        """
    fix_hint = (
        "Pass `generator=torch.Generator().manual_seed(SEED)` (or seed torch); reseed non-torch RNGs in a "
        "`worker_init_fn`; call `sampler.set_epoch(epoch)` every epoch and give every rank the same sampler seed."
    )
    VALID = (
        # the main torch RNG is seeded: shuffle order and worker seeds follow from it
        "import torch\nfrom torch.utils.data import DataLoader\ntorch.manual_seed(0)\nloader = DataLoader(range(10), batch_size=2, shuffle=True, num_workers=4)\n",
        "import torch\nfrom torch.utils.data import DataLoader\ng = torch.Generator()\ng.manual_seed(0)\nloader = DataLoader(range(10), shuffle=True, generator=g)\n",
        "import torch\nfrom torch.utils.data import random_split\nparts = random_split(range(10), [8, 2], generator=torch.Generator().manual_seed(42))\n",
        # workers without a worker_init_fn are fine when only random/numpy/torch are used
        "import random, torch\nfrom torch.utils.data import DataLoader, Dataset\ntorch.manual_seed(0)\n"
        "class Noisy(Dataset):\n    def __getitem__(self, i):\n        return i + random.random()\n    def __len__(self):\n        return 10\n"
        "loader = DataLoader(Noisy(), num_workers=4)\n",
        # a module-level generator with a worker_init_fn that reseeds it
        "import numpy as np, torch\nfrom torch.utils.data import DataLoader\ntorch.manual_seed(0)\nrng = np.random.default_rng(0)\n"
        "def augment(x):\n    return x + rng.normal()\ndef reseed(worker_id):\n    global rng\n    rng = np.random.default_rng(torch.initial_seed() % 2**32)\n"
        "loader = DataLoader(range(10), num_workers=2, worker_init_fn=reseed)\n",
        "import torch\nfrom torch.utils.data import DataLoader, DistributedSampler\ntorch.manual_seed(0)\n"
        "def train(ds, epochs):\n    sampler = DistributedSampler(ds, seed=0)\n    loader = DataLoader(ds, sampler=sampler)\n"
        "    for epoch in range(epochs):\n        sampler.set_epoch(epoch)\n",
        # a library helper: the calling script seeds
        "from torch.utils.data import DataLoader\ndef make_loader(ds):\n    return DataLoader(ds, shuffle=True)\n",
    )
    INVALID = (
        Invalid(
            "import torch\nfrom torch.utils.data import DataLoader\nloader = DataLoader(range(10), batch_size=2, shuffle=True)\n",
            line=3,
            message="generator=",
        ),
        Invalid("import torch\nfrom torch.utils.data import random_split\ntrain, val = random_split(range(10), [8, 2])\n", line=3),
        Invalid(
            "import cv2, torch\nfrom torch.utils.data import DataLoader, Dataset\ntorch.manual_seed(0)\n"
            "class Noise(Dataset):\n    def __getitem__(self, i):\n        img = cv2.imread(f'{i}.png')\n        cv2.randn(img, 0, 25)\n        return img\n"
            "loader = DataLoader(Noise(), batch_size=8, num_workers=4)\n",
            line=9,
            message="cv2.randn",
        ),
        Invalid(
            "import numpy as np, torch\nfrom torch.utils.data import DataLoader\ntorch.manual_seed(0)\nRNG = np.random.RandomState(0)\n"
            "def jitter(x):\n    return x + RNG.randn()\nloader = DataLoader(range(10), num_workers=2, collate_fn=jitter)\n",
            line=7,
            message="RNG",
        ),
        Invalid(
            "import torch\nfrom torch.utils.data import DataLoader, DistributedSampler\ntorch.manual_seed(0)\n"
            "if __name__ == '__main__':\n    sampler = DistributedSampler(range(10))\n    loader = DataLoader(range(10), sampler=sampler)\n"
            "    for epoch in range(3):\n        for batch in loader:\n            pass\n",
            line=5,
            message="set_epoch",
        ),
        Invalid(
            "import torch, torch.distributed as dist\nfrom torch.utils.data import DistributedSampler\ntorch.manual_seed(0)\n"
            "sampler = DistributedSampler(range(10), seed=42 + dist.get_rank())\nsampler.set_epoch(0)\n",
            line=4,
            message="rank",
        ),
    )

    def finish(self) -> None:
        facts = self.facts
        relevant = [c for c in facts.calls if DATA_API_ALIASES.get(c.qualname, c.qualname) in (DATALOADER, RANDOM_SPLIT, DISTRIBUTED_SAMPLER)]
        if not relevant:
            return
        worker_rngs: list[str] | None = None
        for call in relevant:
            kind = DATA_API_ALIASES.get(call.qualname, call.qualname)
            if kind == DATALOADER:
                shuffles = facts.evaluate(call.value_node(*DATALOADER_SHUFFLE_PARAMETER)).truthy
                self._unseeded_shuffle(call, "DataLoader(shuffle=True)", shuffles, _LOADER_GENERATOR)
                if self._starts_workers(call):
                    worker_rngs = self._unreseeded_worker_rngs() if worker_rngs is None else worker_rngs
                    if worker_rngs:
                        self.report(
                            call.node,
                            f"DataLoader workers inherit {', '.join(worker_rngs)} without a worker_init_fn: torch does not "
                            "reseed it, so every worker draws the same numbers.",
                        )
            elif kind == RANDOM_SPLIT:
                self._unseeded_shuffle(call, "random_split", True, _SPLIT_GENERATOR)
            else:
                self._distributed_sampler(call)

    def _runs_as_script(self, call: CallFact) -> bool:
        """A library helper's caller decides the seed; a script's own code is checked."""
        return call.scope.at_module_level or self.facts.has_main_guard

    def _unseeded_shuffle(self, call: CallFact, what: str, shuffles: bool, generator_parameter: tuple) -> None:
        if not shuffles or not self._runs_as_script(call):
            return
        generator = call.value_node(*generator_parameter)
        if generator is not None and not self.facts.evaluate(generator).is_(None):
            return
        if TORCH in analyse(self).seeded:
            return
        self.report(
            call.node,
            f"{what} draws its order from the torch RNG, which this file never seeds, and has no seeded generator=: "
            "the order (and the worker seeds) differ per run.",
            fix=seeded_loader_fix(call, generator_parameter, _WORKER_INIT_FN if generator_parameter == _LOADER_GENERATOR else None),
        )

    def _starts_workers(self, call: CallFact) -> bool:
        workers = self.facts.evaluate(call.value_node(*_NUM_WORKERS))
        if not (workers.known and isinstance(workers.value, int) and workers.value > 0):
            return False
        init = call.value_node(*_WORKER_INIT_FN)
        return init is None or self.facts.evaluate(init).is_(None)

    def _unreseeded_worker_rngs(self) -> list[str]:
        """RNG state this file's code draws from that torch does not reseed in workers."""
        facts = self.facts
        found: list[str] = []
        if any(facts.imports_module(module) for module in UNRESEEDED_WORKER_RNG_MODULES):
            found.append("imgaug's global RNG")
        found += sorted({f"{c.qualname}'s RNG" for c in facts.calls if c.qualname in UNRESEEDED_WORKER_RNG_CALLS})
        module_instances = {
            name
            for name, values in facts.simple_assignments.items()
            for value in values
            if isinstance(value, cst.Call) and facts.names.resolve(value.func) in RNG_INSTANCE_CONSTRUCTORS
        }
        module_instances &= {
            dotted_name(c.node.func.value)
            for c in facts.calls
            if c.scope.function is not None and isinstance(c.node.func, cst.Attribute)
        }
        found += [f"the module-level generator `{name}`" for name in sorted(module_instances) if self._created_at_module_level(name)]
        return found

    def _created_at_module_level(self, name: str) -> bool:
        values = {id(v) for v in self.facts.simple_assignments.get(name, ())}
        return any(id(c.node) in values and c.scope.function is None for c in self.facts.calls)

    def _distributed_sampler(self, call: CallFact) -> None:
        seed = call.value_node(*_SAMPLER_SEED)
        rank_names = set(_identifiers_in(seed)) & RANK_NAMES if seed is not None else set()
        if rank_names:
            self.report(
                call.node,
                f"DistributedSampler seeded from the rank ({', '.join(sorted(rank_names))}): each rank shuffles "
                "differently, so shards overlap and some samples are skipped.",
            )
            return
        shuffle = call.value_node(*_SAMPLER_SHUFFLE)
        shuffles = shuffle is None or self.facts.evaluate(shuffle).truthy
        if shuffles and self._runs_as_script(call) and not any(c.method == "set_epoch" for c in self.facts.calls):
            self.report(
                call.node,
                "DistributedSampler shuffles but set_epoch() is never called: every epoch repeats the first epoch's order.",
            )


def _identifiers_in(node: cst.CSTNode):
    """Lower-cased names, attributes and string keys (``os.environ["RANK"]``) in ``node``."""
    if isinstance(node, cst.Name):
        yield node.value.lower()
    elif isinstance(node, cst.Attribute):
        yield node.attr.value.lower()
    elif isinstance(node, cst.SimpleString) and isinstance(node.evaluated_value, str):
        yield node.evaluated_value.lower()
    for child in node.children:
        yield from _identifiers_in(child)
