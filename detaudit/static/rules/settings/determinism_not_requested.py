"""A training script that never enables deterministic algorithms (DET015 determinism-not-requested)."""

from __future__ import annotations

import libcst as cst

from detaudit.findings import Severity
from detaudit.static.analyses.op_sites import decided_by_settings_here
from detaudit.static.engine.facts import CallFact
from detaudit.static.fixes.code import determinism_code
from detaudit.static.fixes.edits import InsertStatement, setup_position
from detaudit.static.rule import Invalid, Rule


def determinism_fix(rule: Rule, before: CallFact) -> tuple[InsertStatement, ...] | None:
    """The fix style's request for deterministic algorithms (``fixes.code.determinism_code``)
    right after the file's last seeding call that runs before ``before`` (in
    the same block), else after the imports: at module level it runs once per
    process.

    Unsafe: a nondeterministic op without a deterministic implementation then
    raises, which changes what the program does."""
    code = determinism_code(rule.facts.names.bindings(), rule.context.fix_style)
    if code is None:
        return None

    def insert(anchor: cst.BaseStatement, before_anchor: bool = False) -> tuple[InsertStatement, ...]:
        return tuple(InsertStatement(anchor, line, before=before_anchor, imports=code.imports, safe=False) for line in code.lines)

    last_seeding = None  # after the last one: a block of seeding calls stays together
    for call in rule.facts.calls:
        if call.order >= before.order:
            break
        if call.scope.function not in (None, before.scope.function) or not call.scope.straight_line:
            continue
        statement = _statement_holding(rule, call)
        if statement is not None and rule.analyses.rng_effects.call_effects(call).seeds:
            last_seeding = statement
    if last_seeding is not None:
        return insert(last_seeding)
    return insert(*setup_position(rule.context.module, before.scope.top_level_index))


def _statement_holding(rule: Rule, call: CallFact) -> cst.SimpleStatementLine | None:
    """The statement that is ``call`` (``f(x)`` or ``y = f(x)``) in the block of
    its function, the module or the main guard; None when it is nested deeper."""
    if call.scope.function is not None:
        function = rule.facts.functions.get(call.scope.function)
        blocks = [function.body.body] if function is not None and isinstance(function.body, cst.IndentedBlock) else []
    else:
        module = rule.context.module
        top = module.body[call.scope.top_level_index] if call.scope.top_level_index < len(module.body) else None
        blocks = [[top]] if top is not None else []
        if isinstance(top, cst.If) and isinstance(top.body, cst.IndentedBlock):
            blocks.append(top.body.body)  # the main guard
    for block in blocks:
        for statement in block:
            if isinstance(statement, cst.SimpleStatementLine) and any(
                getattr(small, "value", None) is call.node for small in statement.body
            ):
                return statement
    return None


class DeterminismNotRequested(Rule):
    code = "DET015"
    name = "determinism-not-requested"
    severity = Severity.INFO
    summary = "A training script never enables deterministic algorithms."
    rationale = """
        By default PyTorch runs CUDA kernels that are nondeterministic (atomicAdd
        scatter/index ops, pooling and upsampling backward, cuDNN algorithm
        choice) and never says so.  `torch.use_deterministic_algorithms(True)`
        swaps in deterministic kernels where they exist and raises where they do
        not, so every nondeterministic op becomes visible.  Leaving it off is a
        legitimate choice (it costs speed), so this is informational: it tells
        you that two runs with the same seed may still differ.  cuDNN's choice
        of convolution algorithm is named here (with the file's convolutions),
        once, not at every `Conv2d`: one setting decides it for the process.
        """
    fix_hint = (
        "Call `torch.use_deterministic_algorithms(True)` at start-up (or Lightning `Trainer(deterministic=True)`, "
        "transformers `enable_full_determinism(seed)`, `detaudit.enable_determinism()`)."
    )
    VALID = (
        "import torch\ntorch.use_deterministic_algorithms(True)\nmodel = torch.nn.Linear(2, 2)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n",
        # cuDNN's switch is a request too
        "import torch\ntorch.backends.cudnn.deterministic = True\nopt = torch.optim.Adam([])\n",
        # a framework helper asks for it
        "import lightning as L\nimport torch\n\nclass M(L.LightningModule):\n    def configure_optimizers(self):\n"
        "        return torch.optim.Adam(self.parameters())\n\nif __name__ == '__main__':\n"
        "    L.Trainer(deterministic=True).fit(M())\n",
        "from transformers import enable_full_determinism\nimport torch\nenable_full_determinism(0)\nloss = torch.ones(1, requires_grad=True).sum()\nloss.backward()\n",
        # a project helper named for it: its body is another file's business
        "import torch\nfrom utils import setup\nsetup(seed=0, deterministic=True)\nopt = torch.optim.SGD([], lr=0.1)\n",
        # a library module: no main guard, training code only inside functions
        "import torch\n\ndef train(model):\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    model(1).sum().backward()\n",
        # set_seed asked for deterministic kernels
        "from transformers import set_seed\nimport torch\nset_seed(0, deterministic=True)\nopt = torch.optim.AdamW([], lr=0.1)\n",
        # turned off on purpose is deterministic-off's business, not this rule's
        "import torch\ntorch.use_deterministic_algorithms(False)\nopt = torch.optim.SGD([], lr=0.1)\n",
    )
    INVALID = (
        Invalid(
            "import torch\nmodel = torch.nn.Linear(2, 2)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n",
            line=3,
            message="never enables deterministic algorithms",
        ),
        # cuDNN's switch only under an option that is off by default
        Invalid(
            "import argparse, torch\np = argparse.ArgumentParser()\np.add_argument('--seed', type=int, default=None)\n"
            "args = p.parse_args()\nif args.seed is not None:\n    torch.manual_seed(args.seed)\n"
            "    torch.backends.cudnn.deterministic = True\nopt = torch.optim.SGD([], lr=0.1)\n",
            line=8,
            message="only when `args.seed is not None` is True",
        ),
        # transformers' set_seed seeds, but leaves deterministic=False
        Invalid(
            "from transformers import set_seed\nimport torch\nset_seed(0)\nopt = torch.optim.AdamW([], lr=0.1)\n",
            line=4,
            message="never enables deterministic algorithms",
        ),
        Invalid(
            "import torch\n\ndef main():\n    x = torch.ones(2, requires_grad=True)\n    (x * 2).sum().backward()\n\n"
            "if __name__ == '__main__':\n    main()\n",
            line=5,
        ),
        Invalid("import pytorch_lightning as pl\n\nif __name__ == '__main__':\n    pl.Trainer(max_epochs=1).fit(model)\n", line=4),
        Invalid(
            "import torch\nnet = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ConvTranspose2d(8, 3, 3))\n"
            "opt = torch.optim.SGD(net.parameters(), lr=0.1)\n",
            line=3,
            message="2 call sites of torch.nn.Conv2d and torch.nn.ConvTranspose2d",
        ),
    )

    def finish(self) -> None:
        evidence = self.analyses.training
        if evidence is None or self.analyses.determinism.addressed:
            return
        convolutions = decided_by_settings_here(self.analyses.op_sites)
        optional = self.analyses.determinism.off_by_default
        only_when = ""
        if optional:
            condition, value = optional[0]
            test = " ".join(self.context.module.code_for_node(condition.test).split())
            default = f" (with the default of --{value.flag.replace('_', '-')} it is {bool(value.value)})" if value.flag else ""
            only_when = f" by default: only when `{test}` is {not value.value}{default} does it ask for them, and"
        self.report(
            evidence.node,
            f"training script never enables deterministic algorithms{only_when or ':'} nondeterministic kernels "
            "(atomicAdd scatter/index ops, pooling/upsampling backward, cuDNN algorithm choice for every convolution"
            f"{': ' + convolutions if convolutions else ''}) run silently.",
            fix=determinism_fix(self, evidence),
        )
