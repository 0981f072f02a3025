"""Derive a layer table: which ops-table entries the public layers of an
installed package reach, and when they draw from the torch RNG.

``detaudit calibrate --modules torch_geometric.nn`` calls :func:`derive`: every
public ``nn.Module`` class and function of the module is built with small
guessed arguments, run forward (and backward through its output) on the CPU
under a ``TorchDispatchMode`` that records the aten ops, and each aten op is
mapped to the ops table the way the dynamic pass does (exact overload, the
entry's argument conditions read from the op's own arguments).  The CUDA
kernels never run here: the ops table says which aten ops are nondeterministic
on CUDA, and the trace says which of them a layer dispatches to.  RNG draws are
seen as a change of the global torch RNG state while building or calling.

What is left out of a layer's entry: entries the call site alone cannot decide
(``static``), except those whose run-time default is the hazard, and entries a
backend setting decides for the whole process (cuDNN convolutions), which the
settings rules name once.  A layer whose arguments cannot be guessed, or whose
run fails, is written with ``traced: false`` (its construction draws, when it
could be built, are still recorded).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import signal
import warnings
from importlib import metadata
from typing import Any, Callable, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from detaudit.knowledge.layers import LAYER_TABLE_SCHEMA_VERSION
from detaudit.knowledge.ops import OpsTable, load_ops_table
from detaudit.knowledge.ops.matching import condition_holds

#: Seconds one layer may take to build and run before it is given up.
LAYER_TIME_LIMIT = 20.0

_NODES, _FEATURES = 6, 4
#: Constructor parameters filled with a small integer, by name.
_SMALL_INTS = {"num_layers": 2, "heads": 2, "num_heads": 2, "k": 2, "K": 2, "num_relations": 2, "num_bases": 2}


class _Unguessable(Exception):
    """A required argument this module does not know how to fill."""


class _AtenRecorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.phase = "forward"
        self.calls: list[tuple[str, Any, tuple, dict]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.calls.append((self.phase, func, args, kwargs))
        return func(*args, **kwargs)


def _graph_inputs() -> dict[str, Callable[[], Any]]:
    edges = torch.tensor([[0, 1, 2, 3, 4, 5, 1, 2], [1, 2, 0, 4, 5, 3, 0, 1]])
    return {
        "x": lambda: torch.randn(_NODES, _FEATURES, requires_grad=True),
        "edge_index": lambda: edges.clone(),
        "batch": lambda: torch.tensor([0, 0, 0, 1, 1, 1]),
        "index": lambda: torch.tensor([0, 0, 0, 1, 1, 1]),
        "pos": lambda: torch.randn(_NODES, 3),
        "edge_weight": lambda: torch.rand(edges.shape[1]),
        "edge_attr": lambda: torch.randn(edges.shape[1], _FEATURES),
    }


#: Tensor parameters by name: a layer's input features under their usual names, and graph structure.
_TENSOR_ALIASES = {"h": "x", "input": "x", "inputs": "x", "feat": "x", "features": "x", "src": "x"}


def _tensor_argument(name: str) -> Any:
    factories = _graph_inputs()
    factory = factories.get(_TENSOR_ALIASES.get(name, name))
    if factory is None:
        raise _Unguessable(name)
    return factory()


def _constructor_argument(param: inspect.Parameter) -> Any:
    name, annotation = param.name, str(param.annotation)
    if name in _SMALL_INTS:
        return _SMALL_INTS[name]
    if name in ("nn", "local_nn", "global_nn", "module") or "Callable" in annotation or "Module" in annotation:
        return torch.nn.Sequential(torch.nn.Linear(_FEATURES, _FEATURES))
    if "float" in annotation or name in ("p", "dropout", "ratio", "alpha", "beta"):
        return 0.5
    if "int" in annotation or "channels" in name or name.endswith(("_dim", "_size", "_features")) or name.startswith("num_"):
        return _FEATURES
    raise _Unguessable(name)


def _required(function: Callable, skip_first: bool) -> list[inspect.Parameter]:
    parameters = list(inspect.signature(function).parameters.values())[int(skip_first):]
    return [
        p for p in parameters
        if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]


def _arguments(parameters: list[inspect.Parameter], value_of: Callable[[inspect.Parameter], Any]) -> tuple[list, dict]:
    """Positional and keyword arguments for ``parameters``, built before the call
    (building an input draws from the RNG too, and must not count as the layer's draw)."""
    positional, keywords = [], {}
    for p in parameters:
        if p.kind is p.KEYWORD_ONLY:
            keywords[p.name] = value_of(p)
        else:
            positional.append(value_of(p))
    return positional, keywords


def _sizes(function: Callable, skip_first: bool) -> dict[str, Any]:
    """Optional size parameters left at ``None`` that a layer may still need one of
    (``MLP(channel_list=None, in_channels=None, ...)``): small sizes for each."""
    sizes = {}
    for p in list(inspect.signature(function).parameters.values())[int(skip_first):]:
        if p.default is None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            if p.name == "channel_list":
                sizes[p.name] = [_FEATURES] * 3
            elif "channels" in p.name or p.name == "num_layers":
                sizes[p.name] = _SMALL_INTS.get(p.name, _FEATURES)
    return sizes


def _construct(layer: type) -> tuple[Any, bool]:
    """Build ``layer`` with guessed required arguments, then, if that fails, with
    its optional sizes too; the module and whether building it drew."""
    positional, keywords = _arguments(_required(layer.__init__, True), _constructor_argument)
    try:
        return _draws(lambda: layer(*positional, **keywords))
    except Exception:
        sizes = _sizes(layer.__init__, True)
        if not sizes:
            raise
        return _draws(lambda: layer(*positional, **{**keywords, **sizes}))


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (tuple, list)) else ()
    return next((found for item in items if (found := _first_tensor(item)) is not None), None)


@contextlib.contextmanager
def _time_limit(seconds: float):
    def give_up(signum, frame):
        raise TimeoutError(f"took more than {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, give_up)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _draws(action: Callable[[], Any]) -> tuple[Any, bool]:
    """Run ``action``; whether it moved the global torch RNG."""
    before = torch.random.get_rng_state()
    result = action()
    return result, not torch.equal(before, torch.random.get_rng_state())


def _entries_for(table: OpsTable, phase: str, func: Any, args: tuple, kwargs: dict) -> list[str]:
    """The ops-table entries one dispatched aten op reaches, its conditions read
    from its own arguments.  An op the backward pass dispatches runs only its own
    kernel there (its backward would need a second derivative), and one that
    accumulates integer values (the counts max-aggregation's backward divides
    by) gives the same sum in any order."""
    name = str(func)  # "aten.scatter_add_.default"
    overload = name.removeprefix("aten.")
    found = []
    schema_args = [argument.name for argument in func._schema.arguments]
    bound = dict(zip(schema_args, args)) | kwargs
    if phase == "backward" and _accumulates_exactly(bound):
        return found
    for entry in table.entries_for_aten(name):
        if phase == "backward" and "forward" not in entry.phases:
            continue
        if overload not in {aten.removeprefix("aten.") for aten in entry.aten}:
            continue
        if entry.deterministic_settings or (entry.static and not entry.hazard_by_default):
            continue
        if any(
            condition.arg in bound and condition_holds(condition, _literal(bound[condition.arg])) is False
            for condition in entry.when
        ):
            continue
        found.append(entry.id)
    return found


#: Integer-valued float32 sums below this are exact, whatever the order of the additions.
_EXACT_FLOAT_SUM = 2**24


def _accumulates_exactly(bound: dict[str, Any]) -> bool:
    """Every floating-point tensor argument holds small integers (0/1 masks, counts)."""
    tensors = [value for value in bound.values() if isinstance(value, torch.Tensor) and value.is_floating_point()]
    return bool(tensors) and all(
        bool(torch.equal(t, t.round())) and float(t.abs().sum()) < _EXACT_FLOAT_SUM for t in tensors
    )


def _literal(value: Any) -> Any:
    # a tensor argument counts as passed; the conditions compare literals only
    return object() if isinstance(value, torch.Tensor) else value


def trace_layer(layer: Any, table: OpsTable) -> dict[str, Any]:
    """Build (a class) and run one layer; its table entry."""
    is_class = inspect.isclass(layer)
    record: dict[str, Any] = {
        "kind": "class" if is_class else "function",
        "defined_in": layer.__module__,
        "ops": [],
        "draws": [],
        "traced": False,
    }
    recorder = _AtenRecorder()
    with contextlib.ExitStack() as stack:
        stack.enter_context(_time_limit(LAYER_TIME_LIMIT))
        stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore")
        stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
        try:
            if is_class:
                module, drew = _construct(layer)
                if drew:
                    record["draws"].append("construction")
                module.train()
                target, parameters = module, _required(module.forward, False)
            else:
                target, parameters = layer, _required(layer, False)
            positional, keywords = _arguments(parameters, lambda p: _tensor_argument(p.name))
            with recorder:
                output, drew = _draws(lambda: target(*positional, **keywords))
                tensor = _first_tensor(output)
                if tensor is not None and tensor.requires_grad:
                    recorder.phase = "backward"
                    tensor.float().sum().backward()
        except Exception:  # a layer that cannot be built or run here is written untraced
            return record
    if drew:
        record["draws"].append("call")
    record["traced"] = True
    ops = []
    for phase, func, args, kwargs in recorder.calls:
        for entry_id in _entries_for(table, phase, func, args, kwargs):
            if entry_id not in ops:
                ops.append(entry_id)
    record["ops"] = ops
    return record


def public_layers(module_name: str) -> Iterable[tuple[str, Any]]:
    """The public ``nn.Module`` classes and functions of a module, by public name."""
    module = importlib.import_module(module_name)
    # ``__all__`` often lists only a module's own names, not what it re-exports (``from .conv import *``)
    exported = set(getattr(module, "__all__", ())) | {name for name in dir(module) if not name.startswith("_")}
    for name in sorted(exported):
        value = getattr(module, name, None)
        if inspect.isclass(value) and issubclass(value, torch.nn.Module):
            yield f"{module_name}.{name}", value
        elif inspect.isfunction(value):
            yield f"{module_name}.{name}", value


def derive(module_names: list[str], on_traced: Callable[[str, dict], None] = lambda name, record: None) -> dict[str, Any]:
    """The layer table document for ``module_names`` (all of one installed package)."""
    packages = {name.partition(".")[0] for name in module_names}
    if len(packages) != 1:
        raise ValueError("--modules must all belong to one package (one table per package)")
    package = packages.pop()
    table = load_ops_table()
    layers: dict[str, Any] = {}
    torch.manual_seed(0)
    with _AtenRecorder():  # the first dispatch mode imports torch._dynamo: not the first layer's time
        torch.ones(1).add(1)
    for module_name in module_names:
        for name, layer in public_layers(module_name):
            if name in layers:
                continue
            layers[name] = trace_layer(layer, table)
            on_traced(name, layers[name])
    return {
        "schema_version": LAYER_TABLE_SCHEMA_VERSION,
        "package": package,
        "package_version": _installed_version(package),
        "torch_version": torch.__version__.split("+", 1)[0],
        "modules": list(module_names),
        "layers": layers,
    }


def _installed_version(package: str) -> str:
    for distribution in (package, package.replace("_", "-")):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    module = importlib.import_module(package)
    return str(getattr(module, "__version__", "unknown"))

