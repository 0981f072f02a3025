"""Seeding that runs only under a condition that is off by default (DET004 conditional-seed)."""

from __future__ import annotations

import libcst as cst

from detaudit.findings import Severity
from detaudit.knowledge.apis import RNG_LABELS, RNGS
from detaudit.static.engine.facts import CallFact
from detaudit.static.fixes.edits import Replace
from detaudit.static.rule import Invalid, Rule
from detaudit.static.rules.seeding._common import NON_TRAINING_SCRIPTS, seeding_call


def seed_by_default_fix(rule: Rule, condition: cst.If, seeding: CallFact, rngs: frozenset[str]) -> Replace | None:
    """Give ``condition`` (an ``if`` that keeps the call ``seeding`` off by
    default) an ``else`` that seeds ``rngs`` with the default seed.  Unsafe: a
    flag's default decided, and default runs change from unseeded to seeded."""
    code = seeding_call(rule, rngs, seeding.scope.top_level_index)
    if condition.orelse is not None or code is None:
        return None
    seeded_otherwise = cst.Else(body=cst.IndentedBlock(body=[cst.parse_statement(line) for line in code.lines]))
    return Replace(condition, condition.with_changes(orelse=seeded_otherwise), safe=False, imports=code.imports)


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
        """ + NON_TRAINING_SCRIPTS
    fix_hint = "Give the seed a default (`add_argument('--seed', type=int, default=0)`) or seed unconditionally."
    VALID = (
        "import argparse, torch\np = argparse.ArgumentParser()\np.add_argument('--seed', type=int, default=0)\n"
        "args = p.parse_args()\nif args.seed is not None:\n    torch.manual_seed(args.seed)\n",
        "import argparse, torch\np = argparse.ArgumentParser()\np.add_argument('--seed', type=int)\nargs = p.parse_args()\n"
        "if args.seed is not None:\n    torch.manual_seed(args.seed)\nelse:\n    torch.manual_seed(0)\n",
        # an unknown condition is not assumed to be off
        "import os, random\nif os.environ.get('SEED'):\n    random.seed(int(os.environ['SEED']))\n",
        # an evaluation script: its only draws build the model whose weights the checkpoint replaces
        "import argparse, torch\np = argparse.ArgumentParser()\np.add_argument('--seed', type=int)\nargs = p.parse_args()\n"
        "if args.seed is not None:\n    torch.manual_seed(args.seed)\nmodel = torch.nn.Linear(4, 2)\n"
        "model.load_state_dict(torch.load('best.pt'))\nwith torch.no_grad():\n    print(model(torch.ones(1, 4)))\n",
        "import os, random\nif os.environ.get('SEED'):\n    random.seed(int(os.environ['SEED']))\n",
    )
    INVALID = (
        Invalid(
            "import argparse, random, torch\np = argparse.ArgumentParser()\np.add_argument('--seed', default=None, type=int)\n"
            "args = p.parse_args()\nif args.seed is not None:\n    random.seed(args.seed)\n    torch.manual_seed(args.seed)\n"
            "model = torch.nn.Linear(4, 2)\nmodel(torch.ones(1, 4)).sum().backward()\n",
            line=6,
            message="default of --seed",
        ),
        Invalid(
            "import argparse, torch\np = argparse.ArgumentParser()\np.add_argument('--deterministic', action='store_true')\n"
            "args = p.parse_args()\nif args.deterministic:\n    torch.manual_seed(0)\n"
            "model = torch.nn.Linear(4, 2)\nmodel(torch.ones(1, 4)).sum().backward()\n",
            line=6,
        ),
    )

    def finish(self) -> None:
        seeding = self.analyses.seeding
        for off in seeding.off_by_default:
            unseeded = [
                rng
                for rng in RNGS
                if rng in off.rngs and rng not in seeding.seeded and (seeding.trains or rng in seeding.first_draw)
            ]
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
