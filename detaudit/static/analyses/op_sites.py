"""Op sites: the calls of a file that reach an entry of the ops table.

The matching (which call reaches which entry, with which arguments) is the ops
table's (``detaudit.knowledge.ops``); this analysis decides which call sites the
file shows for certain, once per file, for every rule that needs them:
``nondeterministic-op`` reports them, and the determinism rules name the sites
whose nondeterminism a backend setting decides (cuDNN convolutions) as what
that setting's one finding is about.

Left out: matches that depend on what the call site does not show (a
non-literal mode, a receiver that may not be a tensor, a loss's target shape
unless ``ignore_index=255`` or a transposed input gives it away: the entry's
``certain_when``), calls that cannot bind
to the op's signature (``group.gather(outputs, inputs, opts)``), a class's own
methods (``self.gather(...)``), and code under
``if torch.are_deterministic_algorithms_enabled():`` (the author handles
determinism there).

Third-party layers (``torch_geometric.nn.GCNConv``, ``global_add_pool``) reach
ops-table entries through their own code: the derived layer tables
(``detaudit.knowledge.layers``) say which, so building such a layer (or calling
such a function) is an op site of the entry it reaches, named with the package
version the table was derived from.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import libcst as cst

from detaudit.knowledge.backend_settings import backend_settings
from detaudit.knowledge.layers import DerivedLayer, derived_layers
from detaudit.knowledge.ops import UNKNOWN, CallArguments, OpMatch, OpsTable, load_ops_table
from detaudit.knowledge.ops.matching import bound_argument, condition_holds
from detaudit.knowledge.ops.model import RESHAPING_METHODS, Spelling
from detaudit.knowledge.versions import installed_torch_version
from detaudit.static.engine.facts import CallFact, FileFacts
from detaudit.static.engine.walk import child_nodes

#: ``if torch.are_deterministic_algorithms_enabled():`` guards deterministic-mode code.
_DETERMINISM_QUERIES = frozenset(s.read for s in backend_settings()["deterministic-algorithms"].spellings if s.read)


@dataclass(frozen=True)
class OpSite:
    call: CallFact
    match: OpMatch
    #: the third-party layer that reaches the op through its own code, if any
    layer: DerivedLayer | None = None

    @property
    def via(self) -> str:
        """How the message says where the op comes from, for a third-party layer."""
        if self.layer is None:
            return ""
        return f" (it runs {self.match.entry.summary}: derived from {self.layer.derived_from})"

    @property
    def cause(self) -> tuple[str, str | None]:
        """Sites of one cause: one op called directly, or one third-party layer."""
        return self.match.entry.id, self.layer.name if self.layer else None

    @property
    def backward_only(self) -> bool:
        """The op is nondeterministic only in its backward: it matters only where a gradient passes."""
        return self.match.phases == ("backward",)

    @property
    def decided_by_settings(self) -> tuple[str, ...]:
        """Settings-table ids whose safe values make this op deterministic for the
        whole process (cuDNN convolutions: ``cudnn-benchmark``, ``cudnn-deterministic``)."""
        return self.match.entry.deterministic_settings


@functools.lru_cache(maxsize=1)
def _spelled_names(table: OpsTable) -> frozenset[str]:
    """Every callee and method name the table lists: a cheap pre-filter per call."""
    return frozenset(spelling.name for entry in table for spelling in entry.spellings)


def find(facts: FileFacts) -> tuple[OpSite, ...]:
    """The file's certain op sites, in source order."""
    layers = derived_layers()
    if not facts.imports_module("torch") and not any(facts.imports_module(package) for package in layers.packages):
        return ()
    table = load_ops_table()
    names = _spelled_names(table)
    guarded: dict[int, bool] = {}
    found = []
    for call in facts.calls:
        layer = layers.find(call.qualname)
        if layer is not None:
            site = _layer_site(table, call, layer)
            if site is not None and not _under_determinism_guard(facts, call, guarded):
                found.append(site)
            continue
        qualname = call.qualname or ""
        method = call.method if call.qualname is None else None
        if qualname not in names and qualname.removeprefix("torch.Tensor.") not in names and method not in names:
            continue
        if _under_determinism_guard(facts, call, guarded):
            continue
        if method is not None and not _may_be_tensor(facts, call.node.func.value):
            continue
        arguments = call_arguments(facts, call)
        for match in table.match_call(call.qualname, method, arguments):
            if not match.certain and _shows_evidence(call, match, arguments):
                match = dataclasses.replace(match, certain=True)
            if match.certain and _fits_signature(call, match):
                found.append(OpSite(call, match))
    return tuple(found)


def _shows_evidence(call: CallFact, match: OpMatch, arguments: CallArguments) -> bool:
    """The call site shows what decides an entry the table calls statically
    undecidable (``certain_when``): ``ignore_index=255`` or a transposed input
    give away the N-d targets of a segmentation or detection loss."""
    names = {param.name: param for param in match.spelling.params}
    for condition in match.entry.certain_when:
        param = names.get(condition.arg)
        if param is None:
            continue
        if condition.test == "reshaped":
            node = call.value_node(param.name, param.position)
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in RESHAPING_METHODS:
                return True
        elif condition_holds(condition, bound_argument(match.spelling, param.name, arguments)):
            return True
    return False


def _layer_site(table: OpsTable, call: CallFact, layer: DerivedLayer) -> OpSite | None:
    """Building (or calling) a third-party layer whose traced run reached table
    entries: one site, for the entry that best says why (a forward hazard first:
    it needs no gradient)."""
    torch_version = installed_torch_version()
    matches = []
    for entry_id in layer.ops:
        entry = table.entry(entry_id)
        if entry is None or entry.deterministic_settings:
            continue
        behaviours = entry.behaviours_for(torch_version=torch_version) if torch_version else entry.behaviours
        if behaviours:
            spelling = Spelling("module" if layer.kind == "class" else "function", layer.name, ())
            matches.append(OpMatch(entry, spelling, True, (), behaviours))
    if not matches:
        return None
    best = next((match for match in matches if "forward" in match.phases), matches[0])
    return OpSite(call, best, layer)


def decided_by_settings_here(sites: tuple[OpSite, ...]) -> str:
    """The file's call sites whose nondeterminism a backend setting decides, for a
    message (``"this file's 12 call sites of torch.nn.Conv2d and torch.nn.ConvTranspose2d"``),
    or ``""`` when there are none."""
    decided = [site for site in sites if site.decided_by_settings]
    if not decided:
        return ""
    names = sorted({site.match.spelling.display for site in decided})
    count = len({id(site.call) for site in decided})
    spelled = " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
    return f"this file's {count} call site{'s' if count > 1 else ''} of {spelled}"


def call_arguments(facts: FileFacts, call: CallFact) -> CallArguments:
    """The call's arguments as the ops table reads them: literals, or UNKNOWN."""
    positional, keywords = [], {}
    for arg in call.node.args:
        if arg.star:
            break
        literal = _literal(facts, arg.value)
        if arg.keyword is not None:
            keywords[arg.keyword.value] = literal
        else:
            positional.append(literal)
    return CallArguments(tuple(positional), keywords, call.has_star_args)


def _literal(facts: FileFacts, node: cst.BaseExpression):
    """A literal the table can compare with (a tuple or list of literals is a tuple), or UNKNOWN."""
    if isinstance(node, (cst.Tuple, cst.List)):
        items = tuple(_literal(facts, element.value) if not isinstance(element, cst.StarredElement) else UNKNOWN for element in node.elements)
        return UNKNOWN if UNKNOWN in items else items
    value = facts.evaluate(node)
    return value.value if value.known else UNKNOWN


def operand(site: OpSite) -> cst.BaseExpression | None:
    """The tensor the op works on: a method's receiver, a function's first argument
    (None for a module construction: its input is not at the call site)."""
    call, kind = site.call, site.match.spelling.kind
    if kind == "method":
        return call.node.func.value if isinstance(call.node.func, cst.Attribute) else None
    if kind == "function":
        first = site.match.spelling.params[0].name if site.match.spelling.params else None
        return call.value_node(first, 0)
    return None


def mentions_call(facts: FileFacts, node: cst.CSTNode, qualnames: frozenset[str]) -> bool:
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, cst.Call) and facts.names.resolve(current.func) in qualnames:
            return True
        stack.extend(child_nodes(current))
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


def _may_be_tensor(facts: FileFacts, receiver: cst.BaseExpression) -> bool:
    """``self.gather(...)`` / ``cls.gather(...)`` call the class's own method, and
    ``Config.gather()`` a class defined in this file: not Tensor methods."""
    if isinstance(receiver, cst.Name):
        return receiver.value not in ("self", "cls") and receiver.value not in facts.classes
    return True


def _under_determinism_guard(facts: FileFacts, call: CallFact, guarded: dict[int, bool]) -> bool:
    """Inside ``if torch.are_deterministic_algorithms_enabled():`` (either branch)."""
    for condition in call.scope.conditions:
        if isinstance(condition, cst.If):
            key = id(condition)
            if key not in guarded:
                guarded[key] = mentions_call(facts, condition.test, _DETERMINISM_QUERIES)
            if guarded[key]:
                return True
    return False
