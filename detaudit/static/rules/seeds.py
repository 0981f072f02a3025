"""Seeding: global RNGs drawn from but never seeded, seeded only off by default, or seeded too late.

All five rules read the file's seeding analysis (``self.analyses.seeding``,
``detaudit.static.analyses.seeding``): which RNGs the file seeds (directly, in
its own helpers, in project helpers, through known third-party helpers), where
each RNG is first drawn from when the file runs, and which comes first on the
script's straight-line path.

A file counts as a script only through what runs when it is executed: module
level code (the main guard included) and the local functions and classes it
calls.  A library module (RNG use only inside functions nobody calls at module
level) is never asked for a seed: its caller seeds.
"""

from __future__ import annotations

import libcst as cst

from detaudit.findings import Severity
from detaudit.knowledge.apis import FIX_DEFAULT_SEED, NUMPY, PYTHON, RNG_LABELS, RNGS, SEEDING_FUNCTIONS, TORCH
from detaudit.static.analyses.project import DATA_ORDER_DRAWS
from detaudit.static.analyses.seeding import Draw
from detaudit.static.engine.facts import CallFact
from detaudit.static.engine.names import NameTable
from detaudit.static.fixes.code import FixCode, seeding_code
from detaudit.static.fixes.edits import InsertStatement, Replace, is_import_line, setup_position
from detaudit.static.rule import Invalid, Rule

SEEDING_EXAMPLES = {TORCH: "torch.manual_seed(SEED)", NUMPY: "np.random.seed(SEED)", PYTHON: "random.seed(SEED)"}


# -- fixes -------------------------------------------------------------------------
#
# A seeding call goes at module level, right after the imports and before the
# code that draws: it then runs once per process, never once per call of a
# function that builds a model.


def seeding_fix(
    rule: Rule, before: CallFact, rngs: frozenset[str], *, safe: bool = True
) -> InsertStatement | tuple[InsertStatement, ...] | None:
    """Seed ``rngs`` before ``before`` runs, right after the imports: with a
    seed-everything helper of a library the file imports, else right after the
    file's own seeding helper (defined above that point), else with the
    seeding calls of the fix style (``fixes.code.seeding_code``)."""
    module = rule.context.module
    use_index = before.scope.top_level_index
    anchor, before_anchor = setup_position(module, use_index)
    insertion_index = module.body.index(anchor) + (0 if before_anchor else 1)
    if _library_seeding_call(module, insertion_index) is None:
        helper = _own_seeding_helper(rule, rngs, use_index)
        if helper is not None:
            index, name = helper
            if index >= insertion_index:
                anchor, before_anchor = module.body[index], False
            return InsertStatement(anchor, f"{name}({FIX_DEFAULT_SEED})", before=before_anchor, safe=safe)
    code = seeding_call(rule, rngs, insertion_index)
    if code is None:
        return None
    return tuple(InsertStatement(anchor, line, before=before_anchor, imports=code.imports, safe=safe) for line in code.lines)


def seed_by_default_fix(rule: Rule, condition: cst.If, seeding: CallFact, rngs: frozenset[str]) -> Replace | None:
    """Give ``condition`` (an ``if`` that keeps the call ``seeding`` off by
    default) an ``else`` that seeds ``rngs`` with the default seed.  Unsafe: a
    flag's default decided, and default runs change from unseeded to seeded."""
    code = seeding_call(rule, rngs, seeding.scope.top_level_index)
    if condition.orelse is not None or code is None:
        return None
    seeded_otherwise = cst.Else(body=cst.IndentedBlock(body=[cst.parse_statement(line) for line in code.lines]))
    return Replace(condition, condition.with_changes(orelse=seeded_otherwise), safe=False, imports=code.imports)


def seeding_call(rule: Rule, rngs: frozenset[str], available_before: int) -> FixCode | None:
    """Code seeding ``rngs`` that can run before the module-level statement
    ``available_before``: a library's seed-everything helper the file imports,
    the file's own seeding helper, else the fix style's seeding calls, which
    also seed the other global RNGs the file imports and never seeds (as a
    seed-everything helper would)."""
    library = _library_seeding_call(rule.context.module, available_before)
    if library is not None:
        return FixCode((f"{library}({FIX_DEFAULT_SEED})",))
    helper = _own_seeding_helper(rule, rngs, available_before)
    if helper is not None:
        return FixCode((f"{helper[1]}({FIX_DEFAULT_SEED})",))
    unseeded = set(RNGS) - set(rule.analyses.seeding.seeded)
    return seeding_code(rngs, rule.facts.names.bindings(), rule.context.fix_style, also=unseeded)


def _library_seeding_call(module: cst.Module, available_before: int) -> str | None:
    """How the file spells a library's seed-everything helper (``L.seed_everything``)
    with the names its module-level imports above ``available_before`` bind."""
    imported = NameTable()
    for statement in module.body[:available_before]:
        if is_import_line(statement):
            for small in statement.body:
                imported.add_import(small)
    for function, seeded in SEEDING_FUNCTIONS.items():
        if seeded != frozenset(RNGS):
            continue  # seed-everything helpers only, not torch.manual_seed and the like
        for local, qualified in imported.bindings().items():
            if function == qualified or function.startswith(qualified + "."):
                return f"{local}{function[len(qualified):]}"
    return None


def _own_seeding_helper(rule: Rule, rngs: frozenset[str], defined_before: int) -> tuple[int, str] | None:
    """(index, name) of a module-level function defined above ``defined_before``
    that seeds ``rngs`` from its one required argument."""
    for index, statement in enumerate(rule.context.module.body[:defined_before]):
        if isinstance(statement, cst.FunctionDef) and _takes_one_seed(statement):
            if rngs <= rule.analyses.rng_effects.function_effects(statement.name.value).seeds:
                return index, statement.name.value
    return None


def _takes_one_seed(function: cst.FunctionDef) -> bool:
    parameters = function.params
    required = [p for p in parameters.params if p.default is None]
    return len(parameters.posonly_params) == 0 and len(required) == 1 and parameters.params[0].default is None


def _what_draws(rule: Rule, draw: Draw) -> str:
    if draw.direct:
        return f"by `{draw.api}`"
    return f"by `{_code(rule, draw.call)}`, through `{draw.api}`"


def _code(rule: Rule, call: CallFact, limit: int = 60) -> str:
    text = " ".join(rule.context.module.code_for_node(call.node).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


#: What every draw-based seed rule says about scripts that never train (one policy, documented once).
NON_TRAINING_SCRIPTS = """

        Scripts that never train (no optimiser, `backward()` or trainer that a run
        reaches) are judged by what can change their output: building layers
        and models is setup there (the weights come from a checkpoint), so only
        their other draws count (sampling noise, a shuffle that writes a
        split).  A library module that defines model or dataset classes and
        never trains is not asked for seeds for its `__main__` smoke test."""


class _MissingSeed(Rule):
    """One rule per global RNG: drawn from when the file runs, seeded nowhere."""

    rng: str
    severity = Severity.WARNING

    def finish(self) -> None:
        seeding = self.analyses.seeding
        spawned = seeding.unseeded_in_spawned_process(self.rng)
        if spawned is not None:
            draw, starter = spawned
            self.report(
                draw.call.node,
                f"the {RNG_LABELS[self.rng]} is drawn from here {_what_draws(self, draw)} in a process started by "
                f"`{_code(self, starter, 40)}`: a fresh interpreter that the parent's seeds never reach, and nothing "
                f"it runs seeds it: call `{SEEDING_EXAMPLES[self.rng]}` in the function it starts.",
            )
            return
        draw = seeding.first_draw.get(self.rng)
        if draw is None or self.rng in seeding.seeded:
            return
        if any(self.rng in off.rngs for off in seeding.off_by_default):
            return  # conditional-seed says it better
        self.report(
            draw.call.node,
            f"the {RNG_LABELS[self.rng]} is drawn from here {_what_draws(self, draw)}, but nothing in this file "
            f"or the project helpers it calls seeds it: call `{SEEDING_EXAMPLES[self.rng]}` before this point."
            f"{self._data_order(seeding.draws(self.rng))}",
            fix=seeding_fix(self, draw.call, frozenset({self.rng})),
        )

    def _data_order(self, draws: tuple[Draw, ...]) -> str:
        """The data order that follows from the unseeded RNG (shuffling loaders,
        ``random_split``): named here, so the one seed that fixes it is one finding."""
        shuffles = [d for d in draws if d.direct and d.api in DATA_ORDER_DRAWS]
        if not shuffles:
            return ""
        named = ", ".join(f"`{_code(self, d.call, 40)}`" for d in shuffles[:3])
        more = f" and {len(shuffles) - 3} more" if len(shuffles) > 3 else ""
        return f" It also decides the data order of {named}{more}, which differs per run without it."


class MissingTorchSeed(_MissingSeed):
    code = "DET001"
    name = "missing-torch-seed"
    rng = TORCH
    summary = "The script draws from the torch RNG but never seeds it."
    rationale = """
        Initial weights of `torch.nn` layers, dropout masks, `torch.rand*`,
        `torch.randperm`, `DataLoader(shuffle=True)` and random transforms all
        draw from torch's global generator.  Unseeded, it starts from a
        different state in every process, so two runs of the same script train
        different models and nothing downstream (determinism flags included)
        can make them agree.
        """ + NON_TRAINING_SCRIPTS
    fix_hint = "Call `torch.manual_seed(SEED)` (or `detaudit.seed_everything(SEED)`, which seeds every RNG) at the start of the script."
    VALID = (
        "import torch\nfrom torch import nn\ntorch.manual_seed(0)\nmodel = nn.Linear(4, 2)\n",
        # seeding through a known third-party helper
        "import lightning as L\nimport torch\nL.seed_everything(42)\nx = torch.randn(3)\n",
        "from transformers import set_seed\nimport torch\nset_seed(0)\nnoise = torch.rand(3)\n",
        # seeding in the file's own helper, called from the main guard
        "import torch\nfrom torch import nn\n\ndef set_seed(seed):\n    torch.manual_seed(seed)\n\n"
        "def main():\n    set_seed(1)\n    model = nn.Linear(2, 2)\n\nif __name__ == '__main__':\n    main()\n",
        # a library module: nothing runs at import, the caller seeds
        "import torch\nfrom torch import nn\n\ndef build():\n    return nn.Linear(2, 2)\n",
        # a module that only binds names (example inputs of a registry), and a deferred lambda
        "import torch\nexample_args = (torch.randn(3, 4),)\n",
        "import torch\nmake_input = lambda: torch.rand(3)\nprint(make_input)\n",
        # draws from an explicit generator, loads pretrained weights, no shuffling
        "import torch\ng = torch.Generator().manual_seed(0)\nx = torch.randn(3, generator=g)\n",
        "import torchvision\nmodel = torchvision.models.resnet18(weights='DEFAULT')\n",
        "import torch\nloader = torch.utils.data.DataLoader(range(10), batch_size=2, shuffle=False)\n",
        # a script that never trains: the init a checkpoint replaces and a dummy input are setup
        "import torch\nmodel = torch.nn.Linear(4, 2)\nmodel.load_state_dict(torch.load('w.pt'))\n"
        "print(model(torch.ones(1, 4)))\n",
        "import torch\n\nclass Net(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.fc = torch.nn.Linear(4, 2)\n\nif __name__ == '__main__':\n    print(Net()(torch.randn(1, 4)).shape)\n",
        # resuming restores the RNG state
        "import torch\ntorch.set_rng_state(torch.load('rng.pt'))\nx = torch.rand(2)\n",
        # the spawned function seeds its own process
        "import torch\nimport torch.multiprocessing as mp\n\ndef main(rank):\n    torch.manual_seed(rank)\n"
        "    model = torch.nn.Linear(2, 2)\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n\nif __name__ == '__main__':\n"
        "    mp.spawn(main, nprocs=2)\n",
        # a forked process inherits the parent's seeded RNG state
        "import torch\nimport multiprocessing\n\ndef train():\n    model = torch.nn.Linear(2, 2)\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n\nif __name__ == '__main__':\n    torch.manual_seed(0)\n"
        "    multiprocessing.Process(target=train).start()\n",
    )
    INVALID = (
        Invalid("import torch\nfrom torch import nn\nmodel = nn.Linear(4, 2)\nmodel(torch.ones(4)).sum().backward()\n", line=3, message="torch.nn.Linear"),
        Invalid("import torch as T\nx = T.randn(3)\nprint(x.sum())\n", line=2),
        Invalid(
            "import torch\nfrom torch import nn\n\nclass Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            "        self.fc = nn.Linear(2, 2)\n\ndef main():\n    model = Net()\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n\n"
            "if __name__ == '__main__':\n    main()\n",
            line=10,
            message="Net()",
        ),
        Invalid(
            "import torch\nloader = torch.utils.data.DataLoader(range(10), batch_size=2, shuffle=True)\nfor batch in loader:\n    print(batch)\n",
            line=2,
            message="DataLoader(shuffle=True)",
        ),
        # the shuffling loader is named in the one finding (not a second finding at the loader)
        Invalid(
            "import torch\nmodel = torch.nn.Linear(2, 2)\nloader = torch.utils.data.DataLoader(range(10), shuffle=True)\n"
            "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor batch in loader:\n    model(batch)\n",
            line=2,
            message="It also decides the data order of `torch.utils.data.DataLoader(range(10)...`",
        ),
        Invalid("import torch\nimport random\nrandom.seed(0)\nw = torch.empty(3).normal_()\n", line=4),
        # a sampling script: it never trains, but draws noise for every sample it writes
        Invalid(
            "import torch\nmodel = torch.load('model.pt')\nfor i in range(10):\n    torch.save(model(torch.randn(1, 4)), f'{i}.pt')\n",
            line=4,
            message="torch.randn",
        ),
        # training in a function the module calls at top level (no main guard) is the script's code
        Invalid(
            "import torch\n\ndef main():\n    model = torch.nn.Linear(2, 2)\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n\nmain()\n",
            line=4,
        ),
        # a spawned process starts a fresh interpreter: the parent's seed never reaches it
        Invalid(
            "import torch\nimport torch.multiprocessing as mp\n\ndef main(rank):\n    model = torch.nn.Linear(2, 2)\n"
            "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n\nif __name__ == '__main__':\n    torch.manual_seed(0)\n"
            "    mp.spawn(main, nprocs=2)\n",
            line=5,
            message="in a process started by `mp.spawn(main, nprocs=2)`",
        ),
        # seeding the CUDA generators only leaves the CPU generator (weight init) unseeded
        Invalid("import torch\ntorch.cuda.manual_seed_all(0)\nlayer = torch.nn.Conv2d(3, 8, 3)\nopt = torch.optim.SGD(layer.parameters(), lr=0.1)\n", line=3),
    )


class MissingNumpySeed(_MissingSeed):
    code = "DET002"
    name = "missing-numpy-seed"
    rng = NUMPY
    summary = "The script draws from NumPy's global RNG but never seeds it."
    rationale = """
        The legacy global functions (`np.random.rand`, `np.random.shuffle`,
        `np.random.choice`, ...) share one generator that NumPy seeds from the
        operating system at import.  Augmentation parameters, sampled indices
        and splits drawn from it differ in every run.
        """ + NON_TRAINING_SCRIPTS
    fix_hint = "Seed it once at startup (`np.random.seed(SEED)`), or better draw from a seeded `rng = np.random.default_rng(SEED)`."
    VALID = (
        "import numpy as np\nnp.random.seed(0)\nidx = np.random.permutation(10)\n",
        "import numpy as np\nrng = np.random.default_rng(0)\nidx = rng.permutation(10)\n",
        "import numpy as np\nimport pytorch_lightning as pl\npl.seed_everything(1)\nnp.random.shuffle([1, 2])\n",
        "import numpy as np\n\ndef augment(x):\n    return x + np.random.rand()\n",
    )
    INVALID = (
        Invalid("import numpy as np\nidx = np.random.permutation(10)\nprint(idx)\n", line=2, message="numpy.random.permutation"),
        Invalid("from numpy import random as npr\nimport torch\ntorch.manual_seed(0)\nnpr.shuffle([1, 2, 3])\n", line=4),
        # random.seed() without a value reseeds from the OS
        Invalid("import numpy\nnumpy.random.seed()\nx = numpy.random.rand(3)\n", line=3),
    )


class MissingPythonSeed(_MissingSeed):
    code = "DET003"
    name = "missing-python-seed"
    rng = PYTHON
    summary = "The script draws from Python's `random` module but never seeds it."
    rationale = """
        `random.shuffle`, `random.choice`, `random.random` and friends use one
        module-level generator seeded from the operating system at import, so
        file orders, sampled subsets and augmentation choices made with it
        change from run to run.
        """ + NON_TRAINING_SCRIPTS
    fix_hint = "Call `random.seed(SEED)` at startup, or use a seeded `random.Random(SEED)` instance."
    VALID = (
        "import random\nrandom.seed(0)\nfiles = ['a', 'b']\nrandom.shuffle(files)\n",
        "import random\nrng = random.Random(0)\nrng.shuffle([1, 2])\n",
        "import random\nfrom accelerate.utils import set_seed\nset_seed(3)\nk = random.randint(0, 9)\n",
        "from random import *\nimport torch\nseed(0)\nk = randint(0, 9)\nprint(k)\n",
    )
    INVALID = (
        Invalid("import random\nfiles = ['a', 'b']\nrandom.shuffle(files)\n", line=3, message="random.shuffle"),
        Invalid("from random import choice\nimport torch\npick = choice([1, 2, 3])\nprint(pick)\n", line=3),
        # a method of an instance of the file's (or a project module's) class draws
        Invalid(
            "import random\nimport torch\n\nclass Buffer:\n    def sample(self):\n        return random.random()\n\n"
            "buffer = Buffer()\nx = buffer.sample()\nprint(x)\n",
            line=9,
            message="through `random.random`",
        ),
        # a star import binds the module's functions
        Invalid("from random import *\nimport torch\nk = randint(0, 9)\nprint(k)\n", line=3, message="random.randint"),
    )


class ConditionalSeed(Rule):
    code = "DET004"
    name = "conditional-seed"
    severity = Severity.WARNING
    summary = "Seeding runs only under a condition that is off by default."
    rationale = """
        A script that seeds only `if args.seed is not None:` (with the flag's
        default `None`), or only when some switch is on, is unseeded in every
        run that does not pass the flag: which is most runs, and every run of
        someone who did not read the code.  Results then differ from run to run
        although the code looks seeded.
        """
    fix_hint = "Give the seed a default (`add_argument('--seed', type=int, default=0)`) or seed unconditionally."
    VALID = (
        "import argparse, torch\np = argparse.ArgumentParser()\np.add_argument('--seed', type=int, default=0)\n"
        "args = p.parse_args()\nif args.seed is not None:\n    torch.manual_seed(args.seed)\n",
        "import argparse, torch\np = argparse.ArgumentParser()\np.add_argument('--seed', type=int)\nargs = p.parse_args()\n"
        "if args.seed is not None:\n    torch.manual_seed(args.seed)\nelse:\n    torch.manual_seed(0)\n",
        # an unknown condition is not assumed to be off
        "import os, random\nif os.environ.get('SEED'):\n    random.seed(int(os.environ['SEED']))\n",
    )
    INVALID = (
        Invalid(
            "import argparse, random, torch\np = argparse.ArgumentParser()\np.add_argument('--seed', default=None, type=int)\n"
            "args = p.parse_args()\nif args.seed is not None:\n    random.seed(args.seed)\n    torch.manual_seed(args.seed)\n",
            line=6,
            message="default of --seed",
        ),
        Invalid(
            "import argparse, torch\np = argparse.ArgumentParser()\np.add_argument('--deterministic', action='store_true')\n"
            "args = p.parse_args()\nif args.deterministic:\n    torch.manual_seed(0)\n",
            line=6,
        ),
    )

    def finish(self) -> None:
        seeding = self.analyses.seeding
        for off in seeding.off_by_default:
            unseeded = [rng for rng in RNGS if rng in off.rngs and rng not in seeding.seeded]
            if not unseeded:
                continue
            condition = off.condition
            test = " ".join(self.context.module.code_for_node(condition.node.test).split())
            labels = " and the ".join(RNG_LABELS[rng] for rng in unseeded)
            flag = condition.value.flag
            by_default = f"with the default of --{flag.replace('_', '-')}" if flag else "by default"
            holds = bool(condition.value.value)
            self.report(
                off.call.node,
                f"this seeds the {labels} only when `{test}` is {not holds}; {by_default} it is {holds}, "
                "so default runs are unseeded.",
                fix=seed_by_default_fix(self, condition.node, off.call, frozenset(unseeded)),
            )


class SeedAfterUse(Rule):
    code = "DET005"
    name = "seed-after-use"
    severity = Severity.WARNING
    summary = "The RNG is drawn from before it is seeded."
    rationale = """
        Seeding fixes only the draws that come after it.  A model built (its
        weights initialised), a dataset split or a shuffle made before
        `torch.manual_seed` uses the unseeded generator: those draws differ in
        every run while the code looks seeded.
        """ + NON_TRAINING_SCRIPTS
    fix_hint = "Move the seeding call to the start of the script, before the first model, split or shuffle."
    VALID = (
        "import torch\nfrom torch import nn\ntorch.manual_seed(0)\nmodel = nn.Linear(2, 2)\n",
        "import torch\nfrom torch import nn\n\ndef main():\n    torch.manual_seed(0)\n    model = nn.Linear(2, 2)\n\n"
        "if __name__ == '__main__':\n    main()\n",
        # drawing the seed itself (printed, so a run can be repeated) is not a use
        "import random\nseed = random.randint(1, 10000)\nprint('seed', seed)\nrandom.seed(seed)\nrandom.shuffle([1, 2])\n",
        # building a shuffling loader draws nothing: its sampler draws when the loader is iterated
        "import torch\nloader = torch.utils.data.DataLoader(range(10), shuffle=True)\ntorch.manual_seed(0)\n"
        "model = torch.nn.Linear(1, 1)\nfor batch in loader:\n    model(batch)\n",
        # a numpy draw before the torch seed does not make the torch seed late
        "import numpy as np, torch\nnp.random.seed(0)\nx = np.random.rand(3)\ntorch.manual_seed(0)\ny = torch.rand(3)\n",
    )
    INVALID = (
        Invalid(
            "import torch\nfrom torch import nn\nmodel = nn.Linear(2, 2)\ntorch.manual_seed(0)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n",
            line=3,
            message="torch.manual_seed(0)",
        ),
        Invalid(
            "import torch\nfrom torch import nn\n\nclass Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            "        self.fc = nn.Linear(2, 2)\n\ndef main():\n    model = Net()\n    torch.manual_seed(0)\n    model(1).sum().backward()\n\n"
            "if __name__ == '__main__':\n    main()\n",
            line=10,
        ),
        Invalid("import random\nrandom.shuffle([1, 2])\nrandom.seed(0)\n", line=2),
    )

    def finish(self) -> None:
        for rng, (draw, seed) in self.analyses.seeding.drawn_before_seeded.items():
            self.report(
                draw.call.node,
                f"the {RNG_LABELS[rng]} is drawn from here {_what_draws(self, draw)}, before "
                f"`{_code(self, seed)}` seeds it: move the seeding above this point.",
                # unsafe: the early draws get the default seed, not the one the late call passes
                fix=seeding_fix(self, draw.call, frozenset({rng}), safe=False),
            )
