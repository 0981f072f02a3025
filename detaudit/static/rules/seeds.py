"""Seeding: global RNGs drawn from but never seeded, seeded only off by default, or seeded too late.

All five rules read one analysis of the file (``SeedAnalysis``), computed once
and shared through ``facts.derived``: which RNGs the file seeds (directly, in
its own helpers, in project helpers, through known third-party helpers), where
each RNG is first drawn from when the file runs, and which comes first on the
script's straight-line path.

A file counts as a script only through what runs when it is executed: module
level code (the main guard included) and the local functions and classes it
calls.  A library module (RNG use only inside functions nobody calls at module
level) is never asked for a seed: its caller seeds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Iterator

import libcst as cst

from detaudit.findings import Severity
from detaudit.knowledge.apis import NUMPY, PYTHON, RNGS, TORCH
from detaudit.static.edits import seed_by_default_fix, seeding_fix
from detaudit.static.facts import CallFact
from detaudit.static.project import Effects, ModuleSummary, OffByDefault
from detaudit.static.rule import Invalid, Rule

RNG_LABELS = {TORCH: "torch RNG", NUMPY: "NumPy global RNG", PYTHON: "Python `random` RNG"}
SEEDING_EXAMPLES = {TORCH: "torch.manual_seed(SEED)", NUMPY: "np.random.seed(SEED)", PYTHON: "random.seed(SEED)"}


@dataclass(frozen=True)
class Draw:
    call: CallFact  # where the finding goes: the call in this file that leads to the draw
    api: str  # what draws (``torch.nn.Linear``)
    direct: bool  # the call itself is the drawing API


@dataclass
class SeedAnalysis:
    seeded: set[str] = field(default_factory=set)  # RNGs seeded on some path that runs by default
    #: seeding calls that do not run by default, with the ``if`` that keeps them off
    off_by_default: list[tuple[CallFact, frozenset[str], OffByDefault]] = field(default_factory=list)
    first_draw: dict[str, Draw] = field(default_factory=dict)  # RNG -> first draw when the file runs
    #: RNG -> (draw, seeding call) when the straight-line path draws before it seeds
    drawn_before_seeded: dict[str, tuple[Draw, CallFact]] = field(default_factory=dict)


def analyse(rule: Rule) -> SeedAnalysis:
    """The file's seed analysis, computed by the first seed rule that asks."""
    derived = rule.facts.derived
    if "seeds" not in derived:
        derived["seeds"] = _analyse(rule)
    return derived["seeds"]


def _analyse(rule: Rule) -> SeedAnalysis:
    """Lazily: resolving a call into the project parses modules, so the seeds of
    every call are looked up only when the file draws or seeds conditionally."""
    context = rule.context
    context.project.refresh()
    summary = ModuleSummary(rule.facts, context.path, None, context.project)
    analysis = SeedAnalysis()
    consulted: dict[str, str] = {}

    def effects_of(call: CallFact) -> Effects:
        effects = summary.call_effects(call)
        consulted.update(effects.files)
        return effects

    walk = _ExecutionWalk(context.module, summary, effects_of)
    if _is_script(context):
        analysis.first_draw = walk.first_draws()
    off_calls = [(call, off) for call in rule.facts.calls if (off := summary.off_by_default(call)) is not None]
    off_seeding = [(call, effects.seeds, off) for call, off in off_calls if (effects := effects_of(call)).seeds]
    if analysis.first_draw or off_seeding:
        analysis.off_by_default = off_seeding
        off_nodes = {id(call.node) for call, _ in off_calls}
        for call in rule.facts.calls:
            if id(call.node) not in off_nodes:
                analysis.seeded |= effects_of(call).seeds
    for rng in analysis.first_draw:
        if rng in analysis.seeded:
            late = walk.drawn_before_seeded(rng)
            if late is not None:
                analysis.drawn_before_seeded[rng] = late
    context.dependencies.update(consulted)
    return analysis


def _is_script(context) -> bool:
    """A file that runs: a main guard, a notebook, or module-level work (a bare call
    such as ``main()`` or ``print(...)``, a loop).  A module that only binds names
    at import (definitions, example inputs, registries) is a library: its importer seeds."""
    return context.facts.has_main_guard or context.path.suffix == ".ipynb" or _does_work(context.module.body)


def _does_work(statements) -> bool:
    for statement in statements:
        if isinstance(statement, (cst.For, cst.While)):
            return True
        if isinstance(statement, cst.SimpleStatementLine):
            if any(isinstance(s, cst.Expr) and isinstance(s.value, (cst.Call, cst.Await)) for s in statement.body):
                return True
        elif isinstance(statement, (cst.If, cst.With, cst.Try)):
            blocks = [statement.body, getattr(statement, "orelse", None)]
            if any(b is not None and _does_work(getattr(b, "body", ())) for b in blocks):
                return True
    return False


class _ExecutionWalk:
    """Calls in the order a run of the file reaches them: module level (main guard
    included), descending into the local functions those calls run."""

    def __init__(self, module: cst.Module, summary: ModuleSummary, effects_of: Callable[[CallFact], Effects]) -> None:
        self.module = module
        self.summary = summary
        self.effects_of = effects_of

    def _calls(self, function: str | None, visiting: set[str]) -> Iterator[tuple[CallFact, Effects]]:
        for call in self.summary.calls_of(function):
            if self.summary.off_by_default(call) is not None:
                continue
            target = self.summary.local_target(call)
            if target is not None and target[0] == "function":
                if target[1] not in visiting and not call.scope.in_lambda:
                    visiting.add(target[1])
                    yield from self._calls(target[1], visiting)
                continue
            yield call, self.summary.as_run(call, self.effects_of(call))

    def _draw(self, call: CallFact, api: str) -> Draw:
        return Draw(call, api, direct=self.summary.is_known_api(call))

    def first_draws(self) -> dict[str, Draw]:
        """RNG -> the first call that draws from it when the file runs."""
        found: dict[str, Draw] = {}
        for call, effects in self._calls(None, set()):
            for rng, api in effects.draws:
                if rng not in found:
                    found[rng] = self._draw(call, api)
        return found

    def drawn_before_seeded(self, rng: str) -> tuple[Draw, CallFact] | None:
        """The straight-line path's first draw and the later first seed, when the draw comes first.

        A draw that picks the seed itself (``seed = random.randint(1, 10000)``
        then ``random.seed(seed)``, the DCGAN example's fallback) is not a use."""
        draws: list[Draw] = []
        for call, effects in self._calls(None, set()):
            if rng in effects.seeds:
                used = next((d for d in draws if not _feeds(self.module, d.call, call)), None)
                return (used, call) if used is not None else None
            api = effects.draw_of(rng)
            if api is not None:
                draws.append(self._draw(call, api))
        return None


def _feeds(module: cst.Module, draw: CallFact, seed: CallFact) -> bool:
    """Whether ``draw``'s result is assigned to a name that ``seed``'s arguments read."""
    finder = _AssignmentOf(draw.node)
    module.body[draw.scope.top_level_index].visit(finder)
    if not finder.targets:
        return False
    arguments = " ".join(module.code_for_node(arg.value) for arg in seed.node.args)
    return any(re.search(rf"(?<![\w.]){re.escape(target)}(?!\w)", arguments) for target in finder.targets)


class _AssignmentOf(cst.CSTVisitor):
    """Finds the targets (as code) of the assignment whose value is ``value``."""

    def __init__(self, value: cst.CSTNode) -> None:
        super().__init__()
        self.value = value
        self.targets: list[str] = []

    def visit_Assign(self, node: cst.Assign) -> None:
        if node.value is self.value:
            self.targets = [cst.Module([]).code_for_node(t.target) for t in node.targets]


def _what_draws(rule: Rule, draw: Draw) -> str:
    if draw.direct:
        return f"by `{draw.api}`"
    return f"by `{_code(rule, draw.call)}`, through `{draw.api}`"


def _code(rule: Rule, call: CallFact, limit: int = 60) -> str:
    text = " ".join(rule.context.module.code_for_node(call.node).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _MissingSeed(Rule):
    """One rule per global RNG: drawn from when the file runs, seeded nowhere."""

    rng: str
    severity = Severity.WARNING

    def finish(self) -> None:
        analysis = analyse(self)
        draw = analysis.first_draw.get(self.rng)
        if draw is None or self.rng in analysis.seeded:
            return
        if any(self.rng in seeds for _, seeds, _ in analysis.off_by_default):
            return  # conditional-seed says it better
        self.report(
            draw.call.node,
            f"the {RNG_LABELS[self.rng]} is drawn from here {_what_draws(self, draw)}, but nothing in this file "
            f"or the project helpers it calls seeds it: call `{SEEDING_EXAMPLES[self.rng]}` before this point.",
            fix=seeding_fix(self, draw.call, frozenset({self.rng})),
        )


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
        """
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
        # resuming restores the RNG state
        "import torch\ntorch.set_rng_state(torch.load('rng.pt'))\nx = torch.rand(2)\n",
    )
    INVALID = (
        Invalid("import torch\nfrom torch import nn\nmodel = nn.Linear(4, 2)\nprint(model)\n", line=3, message="torch.nn.Linear"),
        Invalid("import torch as T\nx = T.randn(3)\nprint(x.sum())\n", line=2),
        Invalid(
            "import torch\nfrom torch import nn\n\nclass Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            "        self.fc = nn.Linear(2, 2)\n\ndef main():\n    model = Net()\n\nif __name__ == '__main__':\n    main()\n",
            line=10,
            message="Net()",
        ),
        Invalid(
            "import torch\nloader = torch.utils.data.DataLoader(range(10), batch_size=2, shuffle=True)\nfor batch in loader:\n    print(batch)\n",
            line=2,
            message="DataLoader(shuffle=True)",
        ),
        Invalid("import torch\nimport random\nrandom.seed(0)\nw = torch.empty(3).normal_()\n", line=4),
        # seeding the CUDA generators only leaves the CPU generator (weight init) unseeded
        Invalid("import torch\ntorch.cuda.manual_seed_all(0)\nlayer = torch.nn.Conv2d(3, 8, 3)\n", line=3),
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
        """
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
        """
    fix_hint = "Call `random.seed(SEED)` at startup, or use a seeded `random.Random(SEED)` instance."
    VALID = (
        "import random\nrandom.seed(0)\nfiles = ['a', 'b']\nrandom.shuffle(files)\n",
        "import random\nrng = random.Random(0)\nrng.shuffle([1, 2])\n",
        "import random\nfrom accelerate.utils import set_seed\nset_seed(3)\nk = random.randint(0, 9)\n",
    )
    INVALID = (
        Invalid("import random\nfiles = ['a', 'b']\nrandom.shuffle(files)\n", line=3, message="random.shuffle"),
        Invalid("from random import choice\nimport torch\npick = choice([1, 2, 3])\nprint(pick)\n", line=3),
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
        analysis = analyse(self)
        for call, seeds, off in analysis.off_by_default:
            unseeded = [rng for rng in RNGS if rng in seeds and rng not in analysis.seeded]
            if not unseeded:
                continue
            test = " ".join(self.context.module.code_for_node(off.node.test).split())
            labels = " and the ".join(RNG_LABELS[rng] for rng in unseeded)
            flag = off.value.flag
            by_default = f"with the default of --{flag.replace('_', '-')}" if flag else "by default"
            holds = bool(off.value.value)
            self.report(
                call.node,
                f"this seeds the {labels} only when `{test}` is {not holds}; {by_default} it is {holds}, "
                "so default runs are unseeded.",
                fix=seed_by_default_fix(self, off.node, call, frozenset(unseeded)),
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
        """
    fix_hint = "Move the seeding call to the start of the script, before the first model, split or shuffle."
    VALID = (
        "import torch\nfrom torch import nn\ntorch.manual_seed(0)\nmodel = nn.Linear(2, 2)\n",
        "import torch\nfrom torch import nn\n\ndef main():\n    torch.manual_seed(0)\n    model = nn.Linear(2, 2)\n\n"
        "if __name__ == '__main__':\n    main()\n",
        # drawing the seed itself (printed, so a run can be repeated) is not a use
        "import random\nseed = random.randint(1, 10000)\nprint('seed', seed)\nrandom.seed(seed)\nrandom.shuffle([1, 2])\n",
        # a numpy draw before the torch seed does not make the torch seed late
        "import numpy as np, torch\nnp.random.seed(0)\nx = np.random.rand(3)\ntorch.manual_seed(0)\ny = torch.rand(3)\n",
    )
    INVALID = (
        Invalid(
            "import torch\nfrom torch import nn\nmodel = nn.Linear(2, 2)\ntorch.manual_seed(0)\n",
            line=3,
            message="torch.manual_seed(0)",
        ),
        Invalid(
            "import torch\nfrom torch import nn\n\nclass Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            "        self.fc = nn.Linear(2, 2)\n\ndef main():\n    model = Net()\n    torch.manual_seed(0)\n\n"
            "if __name__ == '__main__':\n    main()\n",
            line=10,
        ),
        Invalid("import random\nrandom.shuffle([1, 2])\nrandom.seed(0)\n", line=2),
    )

    def finish(self) -> None:
        for rng, (draw, seed) in analyse(self).drawn_before_seeded.items():
            self.report(
                draw.call.node,
                f"the {RNG_LABELS[rng]} is drawn from here {_what_draws(self, draw)}, before "
                f"`{_code(self, seed)}` seeds it: move the seeding above this point.",
                # unsafe: the early draws get the default seed, not the one the late call passes
                fix=seeding_fix(self, draw.call, frozenset({rng}), safe=False),
            )
