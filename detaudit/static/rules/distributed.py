"""Distributed training: what differs between the ranks of one job, and
collectives read before they finish.

- DET007 per-rank-init-seed: the torch RNG seeded from the rank before a model
  is built, in a file that never makes the ranks' weights agree (no DDP/FSDP
  wrapper, no broadcast, no checkpoint loaded on every run);
- DET023 async-collective-not-waited: ``async_op=True`` (and ``isend``/``irecv``)
  whose handle is dropped, never used, or waited only after the result is read;
- DET033 distributed-sampler-rank-seed: data order that differs between ranks.

The three share what a "rank" looks like in code (``rank_identifiers``).
"""

from __future__ import annotations

from typing import Iterator, Sequence

import libcst as cst

from detaudit.findings import Severity
from detaudit.knowledge.apis import (
    DATA_API_ALIASES,
    DISTRIBUTED_SAMPLER,
    SEED_PARAMETERS,
    TORCH,
)
from detaudit.static.analyses.execution import every_block, is_line
from detaudit.static.analyses.project import Effects, initialises_weights
from detaudit.static.engine.facts import CallFact, FileFacts
from detaudit.static.engine.names import dotted_name
from detaudit.static.engine.walk import child_nodes
from detaudit.static.rule import Invalid, Rule

#: Identifiers (names, attributes, environment variable names, lower-cased) that
#: hold a process's rank: torch.distributed, torchrun's environment, Lightning
#: (``trainer.global_rank``), Accelerate (``accelerator.process_index``), and
#: the launchers' variables (SLURM, Open MPI, PMI).
RANK_IDENTIFIERS = frozenset(
    {"rank", "local_rank", "global_rank", "node_rank", "world_rank", "group_rank", "get_rank",
     "get_node_local_rank", "process_index", "local_process_index", "slurm_procid", "slurm_localid",
     "ompi_comm_world_rank", "ompi_comm_world_local_rank", "pmi_rank"}
)

#: Rank identifiers that other code uses too (a worker index, a LoRA rank): on
#: their own they mean a process rank only in a file that does distributed work.
_AMBIGUOUS_RANKS = frozenset({"rank", "local_rank", "global_rank", "node_rank", "world_rank", "group_rank"})

#: Importing one of these makes a file distributed code.
_DISTRIBUTED_MODULES = ("torch.distributed", "torch.multiprocessing", "accelerate", "deepspeed", "horovod")

#: How far a seed is followed through ``seed = ...`` assignments.
_MAX_ALIAS_DEPTH = 3


def rank_identifiers(facts: FileFacts, node: cst.CSTNode | None, depth: int = 0) -> set[str]:
    """The rank identifiers ``node`` reads, through names assigned once
    (``seed = args.seed + local_rank``): names lower-cased, environment
    variables as spelled (``LOCAL_RANK``)."""
    found: set[str] = set()
    if node is None:
        return found
    for identifier, name in _identifiers_in(node):
        if identifier.lower() in RANK_IDENTIFIERS:
            found.add(identifier)
        if name is not None and depth < _MAX_ALIAS_DEPTH:
            assigned = facts.simple_assignments.get(name)
            if assigned and len(assigned) == 1:
                found |= rank_identifiers(facts, assigned[0], depth + 1)
    return found


def _identifiers_in(node: cst.CSTNode) -> Iterator[tuple[str, str | None]]:
    """(identifier, the name to follow) for every name and attribute (lower-cased)
    and string literal (as spelled: ``os.environ["RANK"]``) in ``node``.  A name is followed to
    its assignment only when its value is used, not an attribute or item of it:
    ``cfg.seed`` does not depend on the rank because ``cfg = load(rank)`` does."""
    stack: list[tuple[cst.CSTNode, bool]] = [(node, True)]
    while stack:
        current, used_whole = stack.pop()
        if isinstance(current, cst.Name):
            yield current.value.lower(), current.value if used_whole else None
        elif isinstance(current, cst.Attribute):
            yield current.attr.value.lower(), None
            stack.append((current.value, False))
        elif isinstance(current, cst.Subscript):
            stack.append((current.value, False))
            stack.extend((element, True) for element in current.slice)
        else:
            if isinstance(current, cst.SimpleString) and isinstance(current.evaluated_value, str):
                yield current.evaluated_value, None
            stack.extend((child, True) for child in child_nodes(current))


def _callee_names(call: CallFact) -> set[str]:
    """The last component of every way ``call`` names its callee (resolved,
    written, or the method), so a project's ``DDP`` alias counts too."""
    names = {call.method} if call.method else set()
    for spelled in (call.qualname, dotted_name(call.node.func)):
        if spelled:
            names.add(spelled.rpartition(".")[2])
    return names


# --- DET007 per-rank-init-seed ---------------------------------------------------

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
            and any(part in " ".join(_callee_names(call)).lower() for part in _GRADIENT_AVERAGING_NAME_PARTS)
            for call in self.facts.calls
        )

    def _weights_made_equal(self) -> bool:
        """Whether something in the file makes the ranks' weights agree
        (flow-insensitive: a wrapper or broadcast anywhere, weights loaded outside any ``if``)."""
        for call in self.facts.calls:
            names = _callee_names(call)
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


# --- DET023 async-collective-not-waited --------------------------------------------

#: torch.distributed collectives taking ``async_op``, with where the tensor they
#: write goes (keyword, position); ``barrier`` writes none and is left out.
_ASYNC_COLLECTIVES: dict[str, tuple[str, int]] = {
    "all_reduce": ("tensor", 0), "broadcast": ("tensor", 0), "reduce": ("tensor", 0),
    "all_gather": ("tensor_list", 0), "all_gather_into_tensor": ("output_tensor", 0),
    "_all_gather_base": ("output_tensor", 0), "reduce_scatter": ("output", 0),
    "reduce_scatter_tensor": ("output", 0), "_reduce_scatter_base": ("output", 0),
    "all_to_all": ("output_tensor_list", 0), "all_to_all_single": ("output", 0),
    "gather": ("gather_list", 1), "scatter": ("tensor", 0),
    "all_reduce_coalesced": ("tensors", 0), "all_gather_coalesced": ("output_tensor_lists", 0),
}
#: Point-to-point calls that always return a handle; ``isend``'s tensor is read,
#: not written, so only its handle is followed.
_ALWAYS_ASYNC: dict[str, tuple[str, int] | None] = {"irecv": ("tensor", 0), "isend": None, "batch_isend_irecv": None}
_DISTRIBUTED_NAMESPACES = frozenset({"torch.distributed", "torch.distributed.distributed_c10d"})
#: Calls after which every issued collective has finished on the device (the
#: NCCL stream is synchronised) or every rank met again: the linter stops there.
_SYNCHRONISERS = frozenset({"synchronize", "barrier", "wait_all"})


class AsyncCollectiveNotWaited(Rule):
    code = "DET023"
    name = "async-collective-not-waited"
    severity = Severity.WARNING
    summary = "An asynchronous collective's handle is dropped, never used, or waited only after its result is read."
    rationale = """
        With `async_op=True` a collective (`all_reduce`, `all_gather`,
        `broadcast`, `reduce_scatter`, ...) returns at once with a work handle,
        and so do `isend`/`irecv`; the tensor it writes holds its result only
        after `handle.wait()` (or `torch.futures.wait_all`, or the handle's
        future) returns.  Reading the tensor before that reads whatever has
        arrived so far: the old values, a partial sum, or the result, depending
        on how fast the other ranks and the network were this time.  The
        outcome changes from run to run and from rank to rank.  Under NCCL the
        collective runs on a stream of its own, and `wait()` is what makes the
        current stream wait for it: without it nothing orders the read after
        the result.  A dropped handle (the call used as a statement, assigned
        to `_` or to a name never used again) can never be waited on.
        """
    fix_hint = (
        "Keep the handle and call `handle.wait()` before reading or writing the tensor "
        "(`handles.append(...)` then `for h in handles: h.wait()` to overlap several), or drop `async_op=True`."
    )
    VALID = (
        "import torch, torch.distributed as dist\n\ndef sync(t):\n    work = dist.all_reduce(t, async_op=True)\n"
        "    work.wait()\n    return t / dist.get_world_size()\n",
        # handles kept in a list and waited later
        "import torch.distributed as dist\n\ndef sync(grads):\n    handles = []\n    for g in grads:\n"
        "        handles.append(dist.all_reduce(g, async_op=True))\n    for h in handles:\n        h.wait()\n",
        "from torch.distributed import all_reduce\n\ndef sync(t):\n    all_reduce(t, async_op=True).wait()\n    return t.sum()\n",
        # other work overlaps the collective; the result is read after the wait
        "import torch, torch.distributed as dist\n\ndef step(t, x):\n    work = dist.all_reduce(t, async_op=True)\n"
        "    y = x * 2\n    work.wait()\n    return t + y\n",
        "import torch.distributed as dist\n\ndef sync(t, overlap):\n    dist.all_reduce(t, async_op=overlap)\n",
    )
    INVALID = (
        Invalid(
            "import torch, torch.distributed as dist\n\ndef sync(t):\n    dist.all_reduce(t, async_op=True)\n"
            "    return t / dist.get_world_size()\n",
            line=4,
            message="discarded",
        ),
        Invalid(
            "import torch, torch.distributed as dist\n\ndef sync(t):\n    work = dist.all_reduce(t, async_op=True)\n"
            "    print(t.sum())\n    work.wait()\n",
            line=4,
            message="`t` is used by `print(t.sum())` before `work.wait()`",
        ),
        Invalid(
            "import torch\nfrom torch.distributed import irecv\nbuf = torch.zeros(4)\nreq = irecv(buf, src=0)\nprint(buf)\n",
            line=4,
            message="never used",
        ),
        Invalid(
            "import torch.distributed as dist\n\ndef gather(out, t):\n    _ = dist.all_gather_into_tensor(out, t, async_op=True)\n"
            "    return out\n",
            line=4,
        ),
    )

    def finish(self) -> None:
        pending = {id(call.node): (call, written) for call in self.facts.calls if (written := self._async_output(call)) is not False}
        if not pending:
            return
        for block in every_block(self.context.module):
            for index, statement in enumerate(block.statements):
                if not is_line(statement):
                    continue
                for small in statement.body:
                    target, node = _issued(small)
                    if node is not None and id(node) in pending:
                        self._check(*pending[id(node)], target, block.statements[index + 1:])

    def _async_output(self, call: CallFact) -> cst.BaseExpression | None | bool:
        """The tensor an asynchronous collective writes (None: none to follow);
        False when ``call`` is not an asynchronous collective."""
        namespace, _, function = (call.qualname or "").rpartition(".")
        if namespace not in _DISTRIBUTED_NAMESPACES or _expected_to_raise(call):
            return False
        if function in _ALWAYS_ASYNC:
            output = _ALWAYS_ASYNC[function]
        elif function in _ASYNC_COLLECTIVES and self.facts.evaluate(call.value_node("async_op")).truthy:
            output = _ASYNC_COLLECTIVES[function]
        else:
            return False
        return call.value_node(*output) if output is not None else None

    def _check(
        self, fact: CallFact, written: cst.BaseExpression | None, target: cst.Name | None, after: Sequence[cst.CSTNode]
    ) -> None:
        """Report the collective ``fact`` whose handle is assigned to ``target``
        (None: dropped) when nothing waits for it before ``written`` is used in
        ``after``, the statements that follow it in its block."""
        call = fact.node
        described = f"`{dotted_name(call.func)}`"
        handle = target.value if target is not None else "_"
        if handle == "_":
            synchronised = any(
                c.scope.function == fact.scope.function and c.order > fact.order and _callee_names(c) & _SYNCHRONISERS
                for c in self.facts.calls
            )
            if not synchronised:
                self.report(
                    call,
                    f"The handle of the asynchronous {described} is discarded, so nothing waits for it: what reads the "
                    "result may see it before it arrives, differently on every run; keep the handle and call `.wait()`.",
                )
            return
        scope = self.facts.functions.get(fact.scope.function or "", self.context.module)
        if not any(name.value == handle for name in _names_in(scope) if name is not target):
            self.report(
                call,
                f"The handle `{handle}` of the asynchronous {described} is never used, so nothing waits for it: "
                f"call `{handle}.wait()` before reading the result.",
            )
            return
        written_name = dotted_name(written) if written is not None else None
        if written_name is None:
            return
        for statement in after:
            if _calls_synchroniser(statement) or any(name.value == handle for name in _names_in(statement)):
                return  # the handle (or everything) is waited here, or handed on
            if _mentions(statement, written_name):
                code = self.context.module.code_for_node(statement).strip().splitlines()[0]
                self.report(
                    call,
                    f"`{written_name}` is used by `{code[:60]}` before `{handle}.wait()`: the asynchronous "
                    f"{described} may not have written it yet, so what is read differs from run to run; "
                    f"call `{handle}.wait()` first.",
                )
                return


def _expected_to_raise(call: CallFact) -> bool:
    """Inside ``with pytest.raises(...)`` or ``with self.assertRaises...(...)``: a
    test that the call fails, so it returns no handle."""
    return any(
        isinstance(condition, cst.With)
        and any(
            isinstance(item.item, cst.Call) and "raises" in (dotted_name(item.item.func) or "").lower()
            for item in condition.items
        )
        for condition in call.scope.conditions
    )


def _issued(small: cst.BaseSmallStatement) -> tuple[cst.Name | None, cst.Call | None]:
    """(the name the handle is assigned to, or None when it is dropped; the call)
    for a statement that issues a call and keeps or drops its result; (None,
    None) when the result goes anywhere else (a list, a return, an argument)."""
    if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
        return None, small.value
    if isinstance(small, cst.Assign) and isinstance(small.value, cst.Call) and len(small.targets) == 1:
        target = small.targets[0].target
        if isinstance(target, cst.Name):
            return target, small.value
    if isinstance(small, cst.AnnAssign) and isinstance(small.value, cst.Call) and isinstance(small.target, cst.Name):
        return small.target, small.value
    return None, None


def _walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """``node`` and what it refers to: an attribute's name (``x.t``) and a keyword
    (``f(t=1)``) are not references to ``t``."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        if isinstance(current, cst.Attribute):
            stack.append(current.value)
        elif isinstance(current, cst.Arg):
            stack.append(current.value)
        else:
            stack.extend(child_nodes(current))


def _names_in(node: cst.CSTNode) -> Iterator[cst.Name]:
    return (n for n in _walk(node) if isinstance(n, cst.Name))


def _mentions(statement: cst.CSTNode, dotted: str) -> bool:
    """Whether ``statement`` names ``dotted`` (``t``, ``p.grad``) or something in it."""
    return any(
        isinstance(n, (cst.Name, cst.Attribute)) and dotted_name(n) == dotted for n in _walk(statement)
    )


def _calls_synchroniser(statement: cst.CSTNode) -> bool:
    return any(
        isinstance(n, cst.Call) and (dotted_name(n.func) or "").rpartition(".")[2] in _SYNCHRONISERS
        for n in _walk(statement)
    )


# --- DET033 distributed-sampler-rank-seed ----------------------------------------------

#: ``DistributedSampler(dataset, num_replicas, rank, shuffle, seed, drop_last)``
_SHUFFLE = ("shuffle", 3)
_SEED = ("seed", 4)


class DistributedSamplerRankSeed(Rule):
    code = "DET033"
    name = "distributed-sampler-rank-seed"
    severity = Severity.WARNING
    summary = "A `DistributedSampler` is seeded from the process's rank."
    rationale = """
        Every rank builds its own `DistributedSampler`, which shuffles the whole
        dataset with `seed + epoch` and keeps every `num_replicas`-th index from
        its `rank` on.  That splits one permutation into disjoint shards only if
        all ranks draw the same permutation, so torch documents that the seed
        "should be identical across all processes in the distributed group".
        Seeded from the rank (`seed=rank`, `seed=args.seed + local_rank`,
        `seed=int(os.environ["RANK"])`), each rank shuffles differently: the
        shards overlap, some samples are seen twice per epoch and others never,
        and the global order is not the single permutation that data-parallel
        training (and its resumption) assumes.  Per-rank seeds belong to the
        RNGs that should differ between ranks (augmentation, dropout), not to
        the sampler.
        """
    fix_hint = "Pass the same seed on every rank (`DistributedSampler(ds, seed=args.seed)`) and call `set_epoch(epoch)` every epoch."
    VALID = (
        "import torch\nfrom torch.utils.data import DistributedSampler\n\ndef loader(ds, args, rank):\n"
        "    return DistributedSampler(ds, rank=rank, seed=args.seed)\n",
        # per-rank seeds for the RNGs that should differ between ranks are fine
        "import torch, torch.distributed as dist\nfrom torch.utils.data import DistributedSampler\n"
        "torch.manual_seed(1234 + dist.get_rank())\nsampler = DistributedSampler(range(10), seed=1234)\n",
        # without shuffling the seed is never used
        "import torch\nfrom torch.utils.data import DistributedSampler\n\ndef evaluation(ds, rank):\n"
        "    return DistributedSampler(ds, shuffle=False, seed=rank)\n",
        # a seed variable that does not depend on the rank
        "import torch\nfrom torch.utils.data import DistributedSampler\nseed = 42\nsampler = DistributedSampler(range(10), seed=seed)\n",
    )
    INVALID = (
        Invalid(
            "import torch\nfrom torch.utils.data import DistributedSampler\n\ndef loader(ds, rank):\n"
            "    return DistributedSampler(ds, seed=rank)\n",
            line=5,
            message="seeded from the rank (rank)",
        ),
        Invalid(
            "import torch, torch.distributed as dist\nfrom torch.utils.data import DistributedSampler\ntorch.manual_seed(0)\n"
            "sampler = DistributedSampler(range(10), seed=42 + dist.get_rank())\nsampler.set_epoch(0)\n",
            line=4,
            message="rank",
        ),
        Invalid(
            "import os, torch\nfrom torch.utils.data.distributed import DistributedSampler\n"
            "seed = 1234 + int(os.environ['LOCAL_RANK'])\nsampler = DistributedSampler(range(10), seed=seed)\n",
            line=4,
            message="LOCAL_RANK",
        ),
        # positional: (dataset, num_replicas, rank, shuffle, seed)
        Invalid(
            "import torch\nimport torch.utils.data as data\n\ndef shard(ds, world, rank):\n"
            "    return data.DistributedSampler(ds, world, rank, True, rank)\n",
            line=5,
        ),
    )

    def finish(self) -> None:
        for call in self.facts.calls:
            if DATA_API_ALIASES.get(call.qualname, call.qualname) != DISTRIBUTED_SAMPLER:
                continue
            seed = call.value_node(*_SEED)
            if seed is None or self.facts.evaluate(call.value_node(*_SHUFFLE)).falsy:
                continue
            ranks = sorted(rank_identifiers(self.facts, seed))
            if ranks:
                self.report(
                    seed,
                    f"DistributedSampler seeded from the rank ({', '.join(ranks)}): each rank shuffles a different "
                    "permutation, so the ranks' shards overlap and some samples are never seen in an epoch; "
                    "pass the same seed on every rank.",
                )
