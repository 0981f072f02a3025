"""Compiled graphs under the tracer: each Inductor graph runs compiled, and each call of it is one traced record.

Dynamo compiles nothing while a dispatch mode that does not declare
``ignore_compile_internals`` is active; the tracer's mode declares it when
``CompiledGraphs`` is installed, so a script's ``torch.compile`` regions run as
they do without detaudit.  What runs inside a compiled graph (fused C++ or
Triton kernels) never reaches a dispatch mode, so the graph is recorded at its
boundary: one record per call, named ``inductor.graph_<n>.<kind>``, with the
digests of the tensors it reads and writes, at the first source line its FX
nodes come from.  Two hooks, both at Inductor's boundary, make that:

* ``torch._inductor.compile_fx._compile_fx_inner`` (a module global, looked
  up at each call): each forward, backward and inference graph AOTAutograd
  hands Inductor, with its FX nodes (their ``stack_trace`` and module), the
  Inductor options it was compiled under, and the graph itself where a
  bisection may need it;
* ``CompiledFxGraph.__call__``: every call of every compiled graph, freshly
  compiled or from Inductor's FX graph cache.

AOTAutograd's own cache hands back compiled graphs without the first hook, so
it is off in an audited child (Inductor's FX graph cache, which holds the
kernels, stays on: a warm run does not recompile them).  Ops the runtime
wrappers run around a graph (``detach``, input mutations, the gradient seed)
stay ordinary traced ops.  Graph breaks come from dynamo's counters.
"""

from __future__ import annotations

import itertools
import sys

import torch
from torch.utils._python_dispatch import _disable_current_modes

from detaudit.dynamic.compare.trace_format import graph_op_name
from detaudit.knowledge.apis import INDUCTOR_AUTOTUNE_OPTIONS


def unavailable_reason() -> str | None:
    """Why compiled graphs cannot be traced on this torch (None: they can)."""
    try:
        import torch._inductor.compile_fx as compile_fx
        from torch._inductor.output_code import CompiledFxGraph
    except ImportError as error:  # a torch without Inductor
        return f"Inductor is not importable ({error})"
    if not hasattr(compile_fx, "_compile_fx_inner") or "__call__" not in vars(CompiledFxGraph):
        return "this torch's Inductor has no _compile_fx_inner / CompiledFxGraph.__call__ to hook"
    return None


def _user_frame_of(node) -> tuple[str, int]:
    """(file, line) of the last frame of a node's ``stack_trace``: the user's line it was traced from."""
    trace = node.meta.get("stack_trace") or ""
    for text in reversed(trace.splitlines()):
        text = text.strip()
        if text.startswith('File "'):
            path, _, rest = text[len('File "'):].partition('", line ')
            line = rest.partition(",")[0]
            return path, int(line) if line.isdigit() else 0
    return "", 0


def node_module(node) -> str:
    """The module path a node ran in: relative to a compiled module (``L['self'].norm`` -> ``norm``),
    from the global a compiled function reads it through (``G['model'].norm`` -> ``model.norm``)."""
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack") or {}
    if not stack:
        return ""
    path = str(list(stack.values())[-1][0])
    for prefix in ("L['self'].", "L['fn'].", "L['mod'].", "L['model']."):
        if path.startswith(prefix):
            return path[len(prefix):]
    if path.startswith("G['"):
        name, _, rest = path[len("G['"):].partition("']")
        return name + rest
    return "" if path.startswith("L[") else path


def draws_random(node) -> bool:
    """Whether a graph node is a random op (``torch.Tag.nondeterministic_seeded``)."""
    return isinstance(node.target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in node.target.tags


def node_site(node) -> tuple[str, int, str]:
    """(file, line, module) a graph node comes from."""
    return (*_user_frame_of(node), node_module(node))


_GRAPH_ATTRIBUTE = "_detaudit_graph"  # the CompiledGraph an OutputCode was compiled as, set on it


class CompiledGraph:
    """One graph Inductor compiled, as the tracer and the report see it.  ``gm`` None: a graph
    compiled before the hooks were installed (``detaudit.audit`` of a step already run compiled),
    of kind "call", whose nodes are not known."""

    def __init__(self, index: int, kind: str, gm, example_inputs=(), kept=None):
        self.index = index
        self.kind = kind
        self.name = graph_op_name(index, kind)
        nodes = [node for node in gm.graph.nodes if node.op == "call_function"] if gm is not None else []
        self.nodes = len(nodes)
        sites = [node_site(node) for node in nodes]
        located = [site for site in sites if site[1]]
        self.site = located[0] if located else ("", 0, "")
        self.lines = sorted({(path, line) for path, line, _ in located})
        self.modules = sorted({module for _, _, module in sites if module})
        self.seeded = any(map(draws_random, nodes))
        import torch._inductor.config as inductor_config

        self.autotune = sorted(option for option in INDUCTOR_AUTOTUNE_OPTIONS if getattr(inductor_config, option, False))
        self.deterministic = bool(getattr(inductor_config, "deterministic", False))
        # compiled for symbolic sizes (dynamic shapes): a size among its inputs, or a tensor's
        self.dynamic = any(_is_symbolic(value) for value in example_inputs)
        self.gm = kept  # a copy of the graph for a bisection (graph_bisect.py), None when not kept

    def to_dict(self, cwd: str) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "nodes": self.nodes,
            "path": self.site[0].removeprefix(cwd),
            "line": self.site[1],
            "module": self.site[2],
            "lines": [f"{path.removeprefix(cwd)}:{line}" for path, line in self.lines],
            "modules": self.modules,
            "autotune": self.autotune,
            "inductor_deterministic": self.deterministic,
            "dynamic": self.dynamic,
        }


def _is_symbolic(value) -> bool:
    if isinstance(value, torch.SymInt):
        return True
    return isinstance(value, torch.Tensor) and any(isinstance(size, torch.SymInt) for size in value.shape)


class _GraphCallInfo:
    """What ``OpTracer.record`` reads of an op (``op_info.OpInfo``), for a compiled graph's call."""

    untraced = communicates = reads_storage = python_only = False
    is_view = is_allocation = returns_python = single_result = False
    flat_args = boxed = returns_inputs = True
    unread_args = ()

    def __init__(self, graph: CompiledGraph, compiled, mutated_inputs):
        self.name = graph.name
        self.graph = graph
        self.is_seeded = graph.seeded
        self.written_args = [(index, "") for index in sorted(mutated_inputs)]
        self._compiled = compiled

    def call(self, inputs: list):
        return self._compiled(inputs)  # empties the list, as the graph frees each input after its last use


class CompiledGraphs:
    """The two hooks (see the module docstring), installed for the life of a traced run.

    ``keep_graphs``: hold each graph for a bisection (``graph_bisect.py``);
    ``on_capture(graph, inputs) -> dict``: called when a graph call the tracer
    captures has run, on copies of its inputs as they were before the call
    (the bisection); its result is kept with the capture as ``inside_graph``."""

    def __init__(self, tracer, keep_graphs: bool = False, on_capture=None):
        self.tracer = tracer
        self.keep_graphs = keep_graphs
        self.on_capture = on_capture
        # the graphs compiled or called while installed, by name (a graph compiled under an
        # earlier tracer of the process keeps its CompiledGraph on its OutputCode: _GRAPH_ATTRIBUTE)
        self.graphs: dict[str, CompiledGraph] = {}
        self._infos: dict[int, _GraphCallInfo] = {}
        self.calls = 0
        # graphs are numbered in the order this run compiles them, from 0: each repeat of an
        # in-process audit (detaudit.audit) that compiles afresh names its graphs as the first did
        self._numbers = itertools.count()
        self._patched: list[tuple] = []
        self._breaks_before: dict[str, int] = {}

    def install(self) -> None:
        import torch._functorch.config as functorch_config
        import torch._inductor.compile_fx as compile_fx
        from torch._dynamo.utils import counters
        from torch._inductor.output_code import CompiledFxGraph

        self._breaks_before = dict(counters["graph_break"])
        original_inner, original_call = compile_fx._compile_fx_inner, CompiledFxGraph.__call__
        self._patched = [
            (compile_fx, "_compile_fx_inner", original_inner),
            (CompiledFxGraph, "__call__", original_call),
            (functorch_config, "enable_autograd_cache", functorch_config.enable_autograd_cache),
        ]
        functorch_config.enable_autograd_cache = False
        graphs = self

        def compiling(gm, example_inputs, **kwargs):
            if graphs.tracer.paused:  # detaudit's own compile (a bisection's prefix)
                return original_inner(gm, example_inputs, **kwargs)
            kind = "backward" if kwargs.get("is_backward") else "inference" if kwargs.get("is_inference") else "forward"
            # kept as a copy: Inductor's passes rewrite gm in place
            graph = CompiledGraph(
                next(graphs._numbers), kind, gm, example_inputs, _copy_graph(gm) if graphs.keep_graphs else None
            )
            output = original_inner(gm, example_inputs, **kwargs)
            setattr(output, _GRAPH_ATTRIBUTE, graph)
            graphs.graphs[graph.name] = graph
            return output

        def calling(output, inputs):
            if graphs.tracer.paused:  # detaudit's own
                return original_call(output, inputs)
            graph = getattr(output, _GRAPH_ATTRIBUTE, None)
            if graph is None:  # compiled before the hooks: traced at its boundary all the same
                graph = CompiledGraph(next(graphs._numbers), "call", None)
                setattr(output, _GRAPH_ATTRIBUTE, graph)
            return graphs._record_call(graph, output, inputs, original_call)

        compile_fx._compile_fx_inner = compiling
        CompiledFxGraph.__call__ = calling

    def remove(self) -> None:
        for owner, attribute, original in reversed(self._patched):
            setattr(owner, attribute, original)
        self._patched = []

    def _record_call(self, graph: CompiledGraph, output, inputs, original_call):
        info = self._infos.get(id(output))
        if info is None:
            info = self._infos[id(output)] = _GraphCallInfo(
                graph, lambda boxed: original_call(output, boxed), getattr(output, "mutated_input_idxs", ())
            )
            self.tracer.register_op_info(info)
        self.calls += 1
        self.graphs.setdefault(graph.name, graph)
        tracer = self.tracer
        if tracer.watcher is not None and (graph.modules or graph.kind == "backward"):
            # a module ran forward (inside the graph, where the watcher's hooks stand aside), or backward did
            tracer.watcher.training_started = True
        arguments = list(inputs)  # the graph empties it (OpTracer.record's boxed call)
        if isinstance(inputs, list):
            inputs.clear()  # the boxed convention: the callee empties the caller's list, letting go of the inputs
        caller = sys._getframe(2)
        with _disable_current_modes():  # the graph's own kernels (and extern ops) are inside this one record
            site = tracer.site_of(caller)  # the user line that called it: where its nodes name no line
            if graph.site[1]:  # (a model of torch's own modules, nn.Sequential, has none)
                site = (site[0], *graph.site)
            return tracer.record(info, arguments, {}, caller, site=site)

    def captured(self, info, inputs: list) -> dict:
        """What the tracer keeps with a graph call's capture beyond its tensors:
        ``on_capture``'s result (a bisection) on the inputs as they were before the call."""
        if self.on_capture is None or not isinstance(info, _GraphCallInfo):
            return {}
        with self.tracer.untraced():
            return {"inside_graph": self.on_capture(info.graph, inputs)}

    def payload(self, cwd: str) -> dict:
        from torch._dynamo.utils import counters

        breaks = {
            reason: count - self._breaks_before.get(reason, 0)
            for reason, count in counters["graph_break"].items()
            if count > self._breaks_before.get(reason, 0)
        }
        import torch._dynamo.config as dynamo_config

        return {
            "disabled": bool(dynamo_config.disable),
            "graphs": len(self.graphs),
            "calls": self.calls,
            "graph_breaks": [{"reason": reason, "count": count} for reason, count in breaks.items()],
            "graph_table": [graph.to_dict(cwd) for graph in sorted(self.graphs.values(), key=lambda g: g.index)],
        }


def _copy_graph(gm):
    """A copy of a graph module that Inductor's in-place passes leave alone."""
    import copy

    return copy.deepcopy(gm)
