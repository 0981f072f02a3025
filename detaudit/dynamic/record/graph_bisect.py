"""Inside a compiled graph: the first FX node whose compiled result departs.

A graph call whose inputs were equal and whose outputs were not is bisected
on its captured inputs, the way dynamo's accuracy minifier bisects a graph:
a prefix of the graph's nodes is compiled by Inductor alone, its live values
(the nodes of the prefix that later nodes read, and its last node) made its
outputs, and run.  A prefix *departs* when

* ``"replay"``: two runs of the compiled prefix on the same inputs give other
  bits (a run-to-run cause inside the graph: the nondeterministic kernel), or
* ``"eager"``: its outputs differ from the same nodes run one by one, eagerly,
  by ``torch.fx.Interpreter`` (compiled against eager: fusion, decomposition,
  reordered reductions).

Binary search over the prefixes gives the first node that departs, named by
its op, its source line (``node.meta["stack_trace"]``) and its module.  The
nodes are the graph AOTAutograd handed Inductor: after Inductor's
decompositions (a LayerNorm is ``var_mean``, ``rsqrt``, ``mul``, ...), so the
eager side is those ops run eagerly, not the module's own eager kernel.  Each
step compiles one prefix: about log2(nodes) compiles, paid only for a graph
that differs.
"""

from __future__ import annotations

import operator
import os

import torch
from torch.fx import Graph, GraphModule, Interpreter

from detaudit.dynamic.compare.state_diff import tensor_diff
from detaudit.dynamic.record.compiled_graphs import draws_random, node_site

REPLAYS = 3  # runs of a prefix compared in "replay": a race need not show in every pair


def bisector(against: str):
    """The tracer's ``on_graph_capture`` for a bisection ``against`` "replay" or "eager"."""

    departed = []  # the first call found departing: later calls are not bisected

    def bisect(graph, inputs: list) -> dict:
        if departed:
            return {}
        if graph.gm is None:
            return {"error": "the graph was not kept"}
        try:
            found = first_departing_node(graph.gm, inputs, against)
        except Exception as error:  # a prefix Inductor cannot compile: say so, the audit goes on
            return {"error": f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"}
        if found.get("reproduced"):
            departed.append(found)
        return found

    return bisect


def _is_tensor_node(node) -> bool:
    return isinstance(node.meta.get("val"), torch.Tensor)


class _Prefixes:
    """Compiling and running prefixes of one graph on one set of inputs.

    Every run starts from the generator states the graph call started from:
    a graph with random ops (a dropout) draws the same numbers in each replay,
    and, where Inductor draws as eager does (``fallback_random``), in both
    the compiled and the eager run; the caller restores them afterwards."""

    def __init__(self, gm: GraphModule, inputs: list):
        self.gm = gm
        self.inputs = inputs
        self.nodes = list(gm.graph.nodes)
        self.position = {node: index for index, node in enumerate(self.nodes)}
        self.compiles = 0
        self._cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        self._states = (torch.get_rng_state(), torch.cuda.get_rng_state_all() if self._cuda else None)

    def _from_the_start(self) -> list:
        """Copies of the inputs, with the generators as the graph call found them."""
        torch.set_rng_state(self._states[0])
        if self._cuda:
            torch.cuda.set_rng_state_all(self._states[1])
        return [_clone(value) for value in self.inputs]

    def live(self, cut) -> list:
        """The tensor nodes up to ``cut`` that a later node reads, and ``cut`` itself."""
        end = self.position[cut]
        return [
            node for node in self.nodes[: end + 1]
            if _is_tensor_node(node)
            and (node is cut or any(self.position[user] > end and user.op != "output" for user in node.users))
        ]

    def run_compiled(self, cut, runs: int) -> tuple[list, list[list]]:
        """(the prefix's outputs as nodes, ``runs`` runs' output tensors)."""
        from torch._inductor.compile_fx import compile_fx_inner

        outputs = self.live(cut)
        graph, env = Graph(), {}
        end = self.position[cut]
        for node in self.nodes[: end + 1]:
            env[node] = graph.node_copy(node, lambda n: env[n])
        graph.output(tuple(env[node] for node in outputs))
        prefix = GraphModule(self.gm, graph)
        self.compiles += 1
        compiled = compile_fx_inner(prefix, [_clone(value) for value in self.inputs])
        results = []
        for _ in range(runs):
            values = compiled(self._from_the_start())
            results.append([value.detach().cpu() for value in values])
        return outputs, results

    def eager_values(self) -> dict:
        """Every tensor node's value, the graph's ops run one by one."""
        values = {}

        class Recording(Interpreter):
            def run_node(self, node):
                result = super().run_node(node)
                if isinstance(result, torch.Tensor):
                    values[node] = result.detach().cpu()
                return result

        with torch.no_grad():
            Recording(self.gm).run(*self._from_the_start())
        return values


def _located_site(node) -> tuple[str, int, str]:
    """``node_site`` of ``node``, or of the first node computed from it that has a source line: the
    nodes Inductor adds itself (the seeds it draws for a dropout, ``prims.inductor_seeds``) have none."""
    seen, queue = {node}, [node]
    while queue:
        site = node_site(queue[0])
        if site[1]:
            return site
        for user in queue.pop(0).users:
            if user not in seen:
                seen.add(user)
                queue.append(user)
    return node_site(node)


def _clone(value):
    return value.clone() if isinstance(value, torch.Tensor) else value


def first_departing_node(gm: GraphModule, inputs: list, against: str) -> dict:
    """The first node of ``gm`` whose compiled result departs (see the module docstring), as a dict for the report.
    The run it is called from finds its generators as they were (the bisection's draws are not the run's)."""
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        return _bisect(_Prefixes(gm, inputs), against)


def _bisect(prefixes: _Prefixes, against: str) -> dict:
    candidates = [node for node in prefixes.nodes if node.op == "call_function" and _is_tensor_node(node)]
    eager = prefixes.eager_values() if against == "eager" else None

    def departure(cut) -> tuple[bool, float | None]:
        nodes, runs = prefixes.run_compiled(cut, REPLAYS if against == "replay" else 1)
        baseline = runs[0] if against == "replay" else [eager[node] for node in nodes]
        others = runs[1:] if against == "replay" else runs[:1]
        worst, departs = None, False
        for run in others:
            for node, a, b in zip(nodes, baseline, run):
                diff = tensor_diff(node.name, a, b)  # bit for bit, as the traces compare
                if diff is not None:
                    departs = True
                    if node is cut:
                        worst = diff.max_abs_diff
        return departs, worst

    if not candidates:
        return {"error": "the graph computes nothing"}
    low, high = 0, len(candidates) - 1
    departs, worst = departure(candidates[high])
    if not departs:
        return {"against": against, "reproduced": False, "compiles": prefixes.compiles, "nodes": len(candidates)}
    while low < high:  # the smallest prefix that departs
        middle = (low + high) // 2
        middle_departs, middle_worst = departure(candidates[middle])
        if middle_departs:
            high, worst = middle, middle_worst
        else:
            low = middle + 1
    node = candidates[high]
    if node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node):  # one result of a tuple-valued op
        node = node.args[0]
    path, line, module = _located_site(node)
    return {
        "against": against,
        "reproduced": True,
        "op": str(node.target),
        # a random op: compiled, Inductor draws with its own generator unless fallback_random
        "seeded": draws_random(node),
        "node": node.name,
        "path": path.removeprefix(os.getcwd() + os.sep),
        "line": line,
        "module": module,
        "max_abs_diff": worst,
        "compiles": prefixes.compiles,
        "nodes": len(candidates),
    }
