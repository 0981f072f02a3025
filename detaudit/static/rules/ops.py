"""Call sites of ops the knowledge base lists as nondeterministic (DET020).

Which ops, with which arguments, on which devices, and what deterministic mode
does to them is data: ``detaudit.knowledge.ops`` (the shipped table, or one
written by ``detaudit calibrate`` and named by ``$DETAUDIT_OPS_TABLE``).  This
rule only decides what a file's call sites show, and words the finding for the
file: in default mode an op is nondeterministic as written; in a file that
enables deterministic algorithms only the ops that would raise (or that the
mode does not cover) are left to report.
"""

from __future__ import annotations

import functools
from collections import defaultdict

import libcst as cst

from detaudit.findings import Severity
from detaudit.knowledge.apis import (
    CPU_DEFAULT_TENSOR_FACTORIES,
    DEFAULT_DEVICE_SETTER,
    NO_GRAD_CONTEXTS,
)
from detaudit.knowledge.backend_settings import backend_settings
from detaudit.knowledge.ops import UNKNOWN, CallArguments, OpMatch, OpsTable, load_ops_table
from detaudit.static.facts import CallFact, FileFacts, Scope
from detaudit.static.rule import Invalid, Rule
from detaudit.static.rules.determinism import determinism_state


_DEVICE_NAMES = {"cpu": "CPU", "cuda": "CUDA"}
#: ``if torch.are_deterministic_algorithms_enabled():`` guards deterministic-mode code.
_DETERMINISM_QUERIES = frozenset(s.read for s in backend_settings()["deterministic-algorithms"].spellings if s.read)


@functools.lru_cache(maxsize=1)
def _spelled_names(table: OpsTable) -> frozenset[str]:
    """Every callee and method name the table lists: a cheap pre-filter per call."""
    return frozenset(spelling.name for entry in table for spelling in entry.spellings)


def call_arguments(facts: FileFacts, call: CallFact) -> CallArguments:
    """The call's arguments as the ops table reads them: literals, or UNKNOWN."""
    positional, keywords = [], {}
    for arg in call.node.args:
        if arg.star:
            break
        value = facts.evaluate(arg.value)
        literal = value.value if value.known else UNKNOWN
        if arg.keyword is not None:
            keywords[arg.keyword.value] = literal
        else:
            positional.append(literal)
    return CallArguments(tuple(positional), keywords, call.has_star_args)


def _mentions_call(facts: FileFacts, node: cst.CSTNode, qualnames: frozenset[str]) -> bool:
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, cst.Call) and facts.names.resolve(current.func) in qualnames:
            return True
        stack.extend(current.children)
    return False


def _fits_signature(call: CallFact, match: OpMatch) -> bool:
    """Whether the call could bind to the op's signature: ``group.gather(outputs,
    inputs, opts)`` passes more positional arguments than ``Tensor.gather(dim,
    index)`` takes, so it is some other object's method."""
    if call.has_star_args:
        return True
    params = match.spelling.params
    explicit_self = match.spelling.kind == "method" and (call.qualname or "").startswith("torch.Tensor.")
    positional = sum(1 for arg in call.node.args if arg.keyword is None)
    if positional - int(explicit_self) > sum(1 for p in params if p.position is not None):
        return False
    names = {p.name for p in params}
    return all(arg.keyword is None or arg.keyword.value in names for arg in call.node.args)


class NondeterministicOp(Rule):
    code = "DET020"
    name = "nondeterministic-op"
    severity = Severity.WARNING
    summary = "A call reaches an op with a nondeterministic kernel."
    rationale = """
        Some kernels accumulate with atomics or race on duplicate indices, so the
        same inputs give different bits from run to run: `index_add_` and
        `scatter_add_` forward on CUDA, the backward of `gather`, `index_select`,
        adaptive pooling, `interpolate(mode="bilinear")` and `grid_sample`, and
        cuDNN convolution algorithms.  The list, with the devices, the phase
        (forward or backward) and what `torch.use_deterministic_algorithms(True)`
        does, is detaudit's knowledge base (`detaudit ops`).  In a file that
        enables deterministic algorithms, ops with a deterministic kernel are
        fine; ops without one are reported because they will raise.

        Not reported: call sites whose hazard the code does not show (the
        2-D-target NLL kernel behind `nll_loss`/`cross_entropy`, since 1-D class
        targets use a deterministic kernel; a tensor's dtype; duplicate
        indices), look-alike arguments (`interpolate(mode="nearest")`,
        `bincount` without weights), `.put()`-style names on objects that may
        not be tensors, backward-only ops under `torch.no_grad()`, and code
        under `if torch.are_deterministic_algorithms_enabled():`.
        """
    fix_hint = (
        "Call `torch.use_deterministic_algorithms(True)` (ops with a deterministic kernel switch to it), "
        "or replace the op (e.g. `index_add_` by a sort-based reduction); `detaudit ops` lists each op's options."
    )
    VALID = (
        "import torch\nimport torch.nn.functional as F\ny = F.interpolate(x, scale_factor=2, mode='nearest')\n",
        "import torch\ncounts = torch.bincount(labels)\n",
        # 1-D class targets use a deterministic kernel; the target shape is not visible
        "import torch.nn.functional as F\nloss = F.nll_loss(log_probs, target)\nloss = F.cross_entropy(logits, target)\n",
        # the file enables deterministic algorithms, and index_add_ has a deterministic kernel
        "import torch\ntorch.use_deterministic_algorithms(True)\nout.index_add_(0, index, src)\n",
        "import torch\nimport torch.nn.functional as F\nif torch.are_deterministic_algorithms_enabled():\n"
        "    y = F.interpolate(x, scale_factor=2, mode='bilinear')\n",
        # backward-only hazard in code that builds no graph
        "import torch\nimport torch.nn.functional as F\nwith torch.no_grad():\n    y = F.grid_sample(x, grid)\n",
        # numpy's put is not torch's
        "import numpy as np\nimport torch\nnp.put(a, [0, 0], [1, 2])\n",
        # a tensor built on the CPU right there: the CUDA-only kernel never runs
        "import torch\nmedians = torch.median(torch.tensor(estimates), dim=0).values\n",
        # a collective and a module's own method, not Tensor.gather
        "import torch\nwork = group.gather(output_tensors, input_tensors, opts)\n",
        "import torch\n\nclass Parallel(torch.nn.Module):\n    def forward(self, outputs):\n        return self.gather(outputs, 0)\n",
    )
    INVALID = (
        Invalid("import torch\nout.index_add_(0, index, src)\n", line=2, message="atomicAdd on CUDA (forward)"),
        Invalid(
            "import torch.nn.functional as F\ny = F.interpolate(x, scale_factor=2, mode='bilinear')\n",
            line=2,
            message="(backward)",
        ),
        Invalid("import torch\nhist = torch.bincount(labels, weights=w)\n", line=2),
        Invalid("import torch\nmedians = torch.median(torch.tensor(xs, device='cuda'), dim=0)\n", line=2),
        Invalid("import torch\npool = torch.nn.AdaptiveAvgPool2d(1)\n", line=2, message="CUDA"),
        Invalid("import torch\nbag = torch.nn.EmbeddingBag(100, 8, mode='max')\n", line=2),
        Invalid(
            "import torch\ntorch.use_deterministic_algorithms(True)\nbag = torch.nn.EmbeddingBag(100, 8, mode='max')\n",
            line=3,
            message="will raise under deterministic mode",
        ),
        Invalid(
            "import torch\ntorch.use_deterministic_algorithms(True, warn_only=True)\nh = torch.histc(x, bins=10)\n",
            line=3,
            message="only a warning",
        ),
        Invalid("import torch\nx.put_(index, values)\nx.put_(index2, values)\n", line=2, message="1 more call site"),
    )

    def finish(self) -> None:
        facts = self.facts
        if not facts.imports_module("torch"):
            return
        table = load_ops_table()
        names = _spelled_names(table)
        state = determinism_state(facts)
        guarded: dict[int, bool] = {}
        pending: dict[str, list[tuple[CallFact, OpMatch]]] = defaultdict(list)
        for call in facts.calls:
            qualname = call.qualname or ""
            method = call.method if call.qualname is None else None
            if qualname not in names and qualname.removeprefix("torch.Tensor.") not in names and method not in names:
                continue
            if self._under_determinism_guard(call.scope, guarded):
                continue
            if method is not None and not self._may_be_tensor(call.node.func.value):
                continue
            for match in table.match_call(call.qualname, method, call_arguments(facts, call)):
                if not match.certain or not _fits_signature(call, match):
                    continue
                if match.phases == ("backward",) and self._without_grad(call.scope):
                    continue
                if match.cuda_only and self._operand_on_cpu(call, match):
                    continue
                if not state.enabled:
                    pending[match.entry.id].append((call, match))
                elif match.raises_under_deterministic_mode:
                    self.report(call.node, self._raise_message(match, state.warn_only))
                elif "nothing" in match.deterministic_modes:
                    self.report(call.node, f"{match.spelling.display}: {match.hint()}.")
        # In default mode one switch fixes every site, so each op is reported once per file.
        for sites in pending.values():
            call, match = sites[0]
            others = len({id(c) for c, _ in sites}) - 1
            more = f" ({others} more call site{'s' if others > 1 else ''} in this file)" if others else ""
            self.report(call.node, f"{match.spelling.display} is nondeterministic: {match.hint()}{more}.")

    @staticmethod
    def _raise_message(match: OpMatch, warn_only: bool) -> str:
        raising = [b for b in match.behaviours if b.deterministic_mode == "raises"]
        devices = " and ".join(_DEVICE_NAMES[d] for d in match.raising_devices)
        versions = {b.torch for b in raising}
        when = f" with torch {next(iter(versions))}" if len(versions) == 1 and None not in versions else ""
        phases = "/".join(sorted({p for b in raising for p in b.phases}))
        if warn_only:
            return (
                f"{match.spelling.display} has no deterministic kernel on {devices}{when} ({phases}): "
                "with warn_only it runs nondeterministically with only a warning."
            )
        return (
            f"{match.spelling.display} will raise under deterministic mode on {devices}{when} ({phases}): "
            "it has no deterministic implementation."
        )

    def _may_be_tensor(self, receiver: cst.BaseExpression) -> bool:
        """``self.gather(...)`` / ``cls.gather(...)`` call the class's own method, and
        ``Config.gather()`` a class defined in this file: not Tensor methods."""
        if isinstance(receiver, cst.Name):
            return receiver.value not in ("self", "cls") and receiver.value not in self.facts.classes
        return True

    def _operand_on_cpu(self, call: CallFact, match: OpMatch) -> bool:
        """The tensor operand is built right there on the CPU (``torch.tensor(xs)``
        without ``device=``), so a CUDA-only kernel never runs."""
        if match.spelling.kind == "method":
            operand = call.node.func.value if isinstance(call.node.func, cst.Attribute) else None
        else:
            operand = call.value_node(position=0)
        if not isinstance(operand, cst.Call) or self.facts.names.resolve(operand.func) not in CPU_DEFAULT_TENSOR_FACTORIES:
            return False
        if any(arg.keyword is not None and arg.keyword.value == "device" for arg in operand.args):
            return False
        return not any(self.facts.calls_to(DEFAULT_DEVICE_SETTER))

    def _under_determinism_guard(self, scope: Scope, guarded: dict[int, bool]) -> bool:
        """Inside ``if torch.are_deterministic_algorithms_enabled():`` (either branch:
        the author handles determinism there)."""
        for condition in scope.conditions:
            if isinstance(condition, cst.If):
                key = id(condition)
                if key not in guarded:
                    guarded[key] = _mentions_call(self.facts, condition.test, _DETERMINISM_QUERIES)
                if guarded[key]:
                    return True
        return False

    def _without_grad(self, scope: Scope) -> bool:
        return any(
            isinstance(c, cst.With) and any(_mentions_call(self.facts, item.item, NO_GRAD_CONTEXTS) for item in c.items)
            for c in scope.conditions
        )
