"""What still breaks data order across runs in DataLoader workers (DET030 dataloader-worker-seed).

torch already reseeds Python ``random``, numpy's global RNG and torch in every
DataLoader worker from the main process's torch seed, so a missing
``worker_init_fn`` is not a hazard by itself (older linters report it
everywhere).  This rule reports what still breaks:

- shuffling (``DataLoader(shuffle=True)``, ``random_split``) with neither a
  ``generator=`` nor a seeded main torch RNG: the order and the worker seeds
  differ per run.  In a script that draws from the unseeded torch RNG this is
  part of its one missing-torch-seed finding (one cause, one fix), so it is
  reported here only where no seed rule speaks (a module that only builds a loader);
- workers inheriting RNG state torch does not reseed (OpenCV, imgaug, a
  module-level ``random.Random``/``np.random.RandomState``/``default_rng``
  instance used by the file's code) with no ``worker_init_fn``: every worker
  draws the same "random" augmentations;
- ``DistributedSampler`` shuffling without ``set_epoch`` (the same order every
  epoch);
- a worker count that differs between machines (``num_workers=os.cpu_count()``)
  while the workers draw random augmentation: torch seeds worker *i* with
  base_seed + *i*, so the same run on another machine augments differently.  A sampler seeded from the rank is distributed-sampler-rank-seed's.

Only datasets and samplers defined in the checked file are seen.
"""

from __future__ import annotations

import libcst as cst

from detaudit.findings import Severity
from detaudit.knowledge.apis import (
    DATA_API_ALIASES,
    DATALOADER,
    DATALOADER_SHUFFLE_PARAMETER,
    DATALOADER_WORKER_INIT_PARAMETER,
    DISTRIBUTED_SAMPLER,
    GENERATOR_KEYWORD,
    RANDOM_SPLIT,
    TORCH,
)
from detaudit.static.analyses.helpers import helper_calls
from detaudit.static.engine.facts import CallFact
from detaudit.static.engine.names import dotted_name
from detaudit.static.fixes.code import seeded_generator
from detaudit.static.fixes.edits import Replace, with_keyword_arguments
from detaudit.static.rule import Invalid, Rule


#: Global RNG state torch does NOT reseed in DataLoader workers (it reseeds
#: ``random``, numpy's legacy global RNG and torch; worker.py since torch 1.9).
#: Forked workers inherit these states, so every worker draws the same numbers.
UNRESEEDED_WORKER_RNG_CALLS = frozenset({"cv2.randu", "cv2.randn", "cv2.randShuffle"})
UNRESEEDED_WORKER_RNG_MODULES = ("imgaug",)

#: Generator objects whose state a worker inherits when created at module level.
RNG_INSTANCE_CONSTRUCTORS = frozenset(
    {"random.Random", "numpy.random.RandomState", "numpy.random.default_rng", "numpy.random.Generator"}
)

#: Counts that differ from machine to machine.  torch seeds DataLoader worker *i*
#: with base_seed + *i* and deals batches to the workers in turn, so a worker count
#: taken from them hands each batch's augmentation to another RNG stream on another machine.
MACHINE_DEPENDENT_COUNTS = frozenset(
    {"os.cpu_count", "multiprocessing.cpu_count", "os.sched_getaffinity", "psutil.cpu_count", "torch.cuda.device_count"}
)
#: Random augmentation classes, by the module they come from and their name (``transforms.RandomResizedCrop``).
_RANDOM_TRANSFORM_MODULES = ("torchvision.transforms.", "torchvision.transforms.v2.", "albumentations.")
_MAX_DEPTH = 4

#: ``DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn, pin_memory, drop_last, timeout, worker_init_fn, ...)``
_NUM_WORKERS = ("num_workers", 5)
_LOADER_GENERATOR = (GENERATOR_KEYWORD, 12)
#: ``random_split(dataset, lengths, generator)``
_SPLIT_GENERATOR = (GENERATOR_KEYWORD, 2)
#: ``DistributedSampler(dataset, num_replicas, rank, shuffle=True, seed=0, drop_last)``
_SAMPLER_SHUFFLE = ("shuffle", 3)


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
        epoch), unless it serves evaluation (built in a `no_grad()` block or in
        a function that puts the model in eval mode and never steps), where
        the order changes no update.  A worker count taken from the machine (`num_workers=os.cpu_count()`)
        with random augmentation in the workers is reproducible on one machine
        only: torch seeds worker i with base_seed + i and deals batches to the
        workers in turn, so another count gives each batch another RNG stream.  A shuffling loader in a script that draws from the unseeded torch
        RNG anyway is named in that script's missing-torch-seed finding: one
        cause, one fix, one finding.  In a script that never trains (inference,
        evaluation, export) the order it evaluates in changes no result, as
        for the seed rules.
        """
    fix_hint = (
        "Pass `generator=torch.Generator().manual_seed(SEED)` (or seed torch); reseed non-torch RNGs in a "
        "`worker_init_fn`; call `sampler.set_epoch(epoch)` every epoch; use a fixed `num_workers`."
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
        # a validation loader's sampler: evaluation, no update depends on its order
        "import torch\nfrom torch.utils.data import DataLoader, DistributedSampler\ntorch.manual_seed(0)\n"
        "def validate(model, valset):\n    model.eval()\n    with torch.no_grad():\n"
        "        loader = DataLoader(valset, sampler=DistributedSampler(valset))\n        return sum(model(x).sum() for x in loader)\n",
        # a script that never seeds torch: its one missing-torch-seed finding names this loader
        "import torch\nfrom torch.utils.data import DataLoader\nmodel = torch.nn.Linear(2, 2)\n"
        "for batch in DataLoader(range(10), shuffle=True):\n    model(batch)\n",
        # a library helper: the calling script seeds
        "from torch.utils.data import DataLoader\ndef make_loader(ds):\n    return DataLoader(ds, shuffle=True)\n",
        # a machine-dependent worker count whose workers draw nothing: the batches are the same
        "import os, torch\nfrom torch.utils.data import DataLoader, Dataset\ntorch.manual_seed(0)\n"
        "class Plain(Dataset):\n    def __getitem__(self, i):\n        return i\n"
        "loader = DataLoader(Plain(), batch_size=8, num_workers=os.cpu_count())\n",
    )
    INVALID = (
        Invalid(
            "import torch\nfrom torch.utils.data import DataLoader\nloader = DataLoader(range(10), batch_size=2, shuffle=True)\nopt = torch.optim.SGD([], lr=0.1)\n",
            line=3,
            message="generator=",
        ),
        Invalid("import torch\nfrom torch.utils.data import random_split\ntrain, val = random_split(range(10), [8, 2])\nopt = torch.optim.SGD([], lr=0.1)\n", line=3),
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
        # a machine-dependent worker count with random augmentation in the workers
        Invalid(
            "import os, random, torch\nfrom torch.utils.data import DataLoader, Dataset\ntorch.manual_seed(0)\n"
            "class Jittered(Dataset):\n    def __getitem__(self, i):\n        return i + random.random()\n"
            "loader = DataLoader(Jittered(), batch_size=8, num_workers=os.cpu_count())\n",
            line=7,
            message="not across machines",
        ),
        Invalid(
            "import argparse, multiprocessing, torch\nimport torchvision.transforms as T\nfrom torch.utils.data import DataLoader\n"
            "torch.manual_seed(0)\nparser = argparse.ArgumentParser()\n"
            "parser.add_argument('--workers', type=int, default=min(8, multiprocessing.cpu_count()))\nargs = parser.parse_args()\n"
            "augment = T.Compose([T.RandomResizedCrop(224), T.ToTensor()])\nloader = DataLoader(ds, num_workers=args.workers)\n",
            line=9,
            message="multiprocessing.cpu_count()",
        ),
        Invalid(
            "import torch\nfrom torch.utils.data import DataLoader, DistributedSampler\ntorch.manual_seed(0)\n"
            "if __name__ == '__main__':\n    sampler = DistributedSampler(range(10))\n    loader = DataLoader(range(10), sampler=sampler)\n"
            "    for epoch in range(3):\n        for batch in loader:\n            pass\n",
            line=5,
            message="set_epoch",
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
                self._machine_dependent_workers(call)
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

    def _unseeded_shuffle(self, call: CallFact, what: str, shuffles: bool, generator_parameter: tuple) -> None:
        if not shuffles or not self.analyses.script.reaches(call):
            return
        generator = call.value_node(*generator_parameter)
        if generator is not None and not self.facts.evaluate(generator).is_(None):
            return
        seeding = self.analyses.seeding
        if TORCH in seeding.seeded:
            return
        if TORCH in seeding.first_draw:
            return  # the file's one missing-torch-seed (or conditional-seed) finding names this order
        if not seeding.trains:
            return  # a script that never trains: the order it evaluates in changes no result
        self.report(
            call.node,
            f"{what} draws its order from the torch RNG, which this file never seeds, and has no seeded generator=: "
            "the order (and the worker seeds) differ per run.",
            fix=seeded_loader_fix(self, call, generator_parameter, DATALOADER_WORKER_INIT_PARAMETER if generator_parameter == _LOADER_GENERATOR else None),
        )

    def _machine_dependent_workers(self, call: CallFact) -> None:
        """``num_workers=os.cpu_count()`` with random augmentation in the workers:
        reproducible on one machine, not across machines."""
        workers = call.value_node(*_NUM_WORKERS)
        count = self._machine_dependent_count(workers, 0) if workers is not None else None
        if count is None or not self.analyses.script.reaches(call):
            return
        draw = self._worker_draw(call)
        if draw is not None:
            self.report(
                workers,
                f"num_workers comes from {count}(), which differs between machines, and the workers draw random "
                f"augmentation ({draw}): torch seeds worker i with base_seed + i and deals batches to the workers in "
                "turn, so another worker count gives each batch another RNG stream: reproducible on one machine, "
                "not across machines.",
            )

    def _machine_dependent_count(self, node: cst.BaseExpression, depth: int) -> str | None:
        """The machine-dependent count ``node`` is computed from, following names
        assigned once and command-line defaults (``args.workers``)."""
        if depth > _MAX_DEPTH:
            return None
        facts = self.facts
        if isinstance(node, cst.Call):
            qualname = facts.names.resolve(node.func)
            if qualname in MACHINE_DEPENDENT_COUNTS:
                return qualname
            return next(
                (found for arg in node.args if (found := self._machine_dependent_count(arg.value, depth + 1))), None
            ) if qualname in ("min", "max", "int", "len") else None
        if isinstance(node, cst.BinaryOperation):
            return self._machine_dependent_count(node.left, depth + 1) or self._machine_dependent_count(node.right, depth + 1)
        if isinstance(node, cst.Name):
            assigned = facts.simple_assignments.get(node.value)
            return self._machine_dependent_count(assigned[0], depth + 1) if assigned and len(assigned) == 1 else None
        if isinstance(node, cst.Attribute) and node.attr.value in facts.flags:
            default = next((a.value for a in facts.flags[node.attr.value].node.args if a.keyword and a.keyword.value == "default"), None)
            return self._machine_dependent_count(default, depth + 1) if default is not None else None
        return None

    def _worker_draw(self, call: CallFact) -> str | None:
        """What draws random augmentation in the loader's workers: the dataset's
        ``__getitem__`` (a class of this file or of a project module), or a random
        transform this file builds."""
        dataset = call.value_node("dataset", 0)
        if isinstance(dataset, cst.Name):
            assigned = self.facts.simple_assignments.get(dataset.value)
            dataset = assigned[0] if assigned and len(assigned) == 1 else None
        if isinstance(dataset, cst.Call):
            name = dotted_name(dataset.func)
            summary = self.analyses.rng_effects
            if name in self.facts.classes:
                effects = summary.function_effects(f"{name}.__getitem__") if f"{name}.__getitem__" in self.facts.functions else None
            else:
                qualname = self.facts.names.resolve(dataset.func)
                effects = self.context.project.effects(f"{qualname}.__getitem__", self.context.path) if qualname else None
            if effects is not None and effects.draws:
                self.context.dependencies.update(effects.files)
                return effects.draws[0][1]
        for other in self.facts.calls:
            qualname = other.qualname or ""
            module, _, name = qualname.rpartition(".")
            if name.startswith("Random") and f"{module}.".startswith(_RANDOM_TRANSFORM_MODULES):
                return qualname
        return None

    def _starts_workers(self, call: CallFact) -> bool:
        workers = self.facts.evaluate(call.value_node(*_NUM_WORKERS))
        if not (workers.known and isinstance(workers.value, int) and workers.value > 0):
            return False
        init = call.value_node(*DATALOADER_WORKER_INIT_PARAMETER)
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
        shuffle = call.value_node(*_SAMPLER_SHUFFLE)
        shuffles = shuffle is None or self.facts.evaluate(shuffle).truthy
        evaluation = self.analyses.grad_flow.evaluating(call)  # its order changes no update
        if shuffles and evaluation is None and self.analyses.script.reaches(call) and not self._sets_epoch():
            self.report(
                call.node,
                "DistributedSampler shuffles but set_epoch() is never called: every epoch repeats the first epoch's order.",
            )


    def _sets_epoch(self) -> bool:
        """``set_epoch`` is called in this file or in a project helper it calls
        (``train_one_epoch(loader, epoch)`` in another module)."""
        if any(c.method == "set_epoch" for c in self.facts.calls):
            return True
        callees = {call.qualname: call for call in self.facts.calls if call.qualname is not None}
        for call in callees.values():
            helper = helper_calls(self.context, call, ("set_epoch",))
            if helper is not None and any(c.method == "set_epoch" for c in helper[1]):
                return True
        return False


def seeded_loader_fix(
    rule: Rule, call: CallFact, generator_parameter: tuple[str, int], worker_init_parameter: tuple[str, int] | None = None
) -> Replace | None:
    """Give a shuffling ``DataLoader`` / ``random_split`` call the fix style's
    seeded ``generator=`` (``torch.Generator().manual_seed(0)``; and, for a
    DataLoader without one, the style's ``worker_init_fn=``, if it has one).
    Parameters are (keyword, position)."""
    if call.has_star_args:
        return None  # ``**options`` may already pass them
    code = seeded_generator(rule.facts.names.bindings(), rule.context.fix_style)
    if code is None:
        return None
    generator_code, worker_init_fn = code
    generator = cst.parse_expression(generator_code.lines[0])
    added: list[tuple[str, cst.BaseExpression]] = []
    if worker_init_fn is not None and worker_init_parameter is not None and call.argument(*worker_init_parameter) is None:
        added.append((worker_init_parameter[0], cst.parse_expression(worker_init_fn)))
    existing = call.argument(*generator_parameter)  # ``generator=None``
    new_call = call.node
    if existing is None:
        added.append((generator_parameter[0], generator))
    else:
        new_call = new_call.with_changes(args=[arg.with_changes(value=generator) if arg is existing else arg for arg in new_call.args])
    if added:
        new_call = with_keyword_arguments(new_call, added)
    return Replace(call.node, new_call, imports=generator_code.imports)
