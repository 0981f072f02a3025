"""What calls do to the global RNGs, across the functions of a file and its project.

Seeding often lives in a helper (``utils.fix_random_seeds(0)``, ``from .misc
import set_seed``) and the first draw often happens inside a class of another
module (``from model import GPT; GPT(config)`` builds random layers).  This
module answers "which global RNGs does this call seed, and which does it draw
from?" for any call: a known API (the tables below), a function or
class of the same file, or one of a project-local module.  Project modules are
parsed (never imported or run) with the engine's own fact collector, summarised
once per content hash, and every file an answer depends on is named with its
hash so that a result cache can tell when an edit to ``utils.py`` makes the
cached result of ``train.py`` stale.

An event (a seed or a draw) under an ``if`` whose test is known to be false by
default (``if args.seed is not None:`` with ``default=None``) does not happen in
a default run, so it does not count.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Iterator

import libcst as cst

from detaudit.knowledge.apis import DATA_API_ALIASES, DATALOADER, DATALOADER_WORKER_INIT_PARAMETER, SEEDING_FUNCTIONS, TORCH
from detaudit.static.analyses.rng_apis import NOTHING, TORCH_RANDOM_LAYERS, Effects, api_effects, combine, draw, trains_here
from detaudit.static.analyses.module_paths import ModuleLocator, path_edits
from detaudit.static.engine.facts import CallFact, FactCollector, FileFacts, StaticValue
from detaudit.static.engine.limits import DEFAULT_FILE_TIME_BUDGET, TooComplex, without_complex_expressions
from detaudit.static.engine.names import dotted_name
from detaudit.static.engine.sources import MAX_FILE_BYTES, UnreadableSource, decode_python
from detaudit.static.engine.trees import parse_module
from detaudit.static.engine.walk import name_mentions, walk

# ------------------------------------------------------------------------------------

#: Nested helpers deeper than this are not followed (re-export chains, call chains).
MAX_DEPTH = 12
#: Parsed project modules kept per process (least recently used are dropped).
MAX_CACHED_MODULES = 128


def content_hash(data: bytes) -> str:
    """The digest the result cache validates dependencies with."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


# --- a whole module ---------------------------------------------------------------


@dataclass(frozen=True)
class OffByDefault:
    """An ``if`` whose branch holding a call does not run by default."""

    node: cst.If
    value: StaticValue


class ModuleSummary:
    """The RNG effects of the functions and classes of one parsed module."""

    def __init__(
        self, facts: FileFacts, path: Path, digest: str | None, index: "ProjectIndex | None", tree: cst.Module | None = None
    ) -> None:
        self.facts = facts
        #: the parsed tree of a project module, which a check of the same file reuses
        self.tree = tree
        self._name_mentions: Counter[str] | None = None
        self.path = path
        #: (path, hash) of this file when it is a project module (None: the checked file)
        self.own_file = frozenset({(str(path), digest)}) if digest is not None else frozenset()
        self.index = index
        self.imports_torch = facts.imports_module("torch")
        self.calls_by_function: dict[str | None, list[CallFact]] = {}
        for call in facts.calls:
            self.calls_by_function.setdefault(call.scope.function, []).append(call)
        self._memo: dict[str, Effects] = {}
        self._in_progress: set[str] = set()
        self._orelse_calls: dict[int, frozenset[int]] = {}
        self._attributes_of: dict[str, dict[str, list[cst.BaseExpression]]] = {}
        self._worker_init_calls: frozenset[int] | None = None
        self._uses_torch: bool | None = None

    @property
    def uses_torch(self) -> bool:
        """The module imports torch, or a project module it imports does: a trainer
        module that only calls ``loss.backward()`` and ``self.optimizer.step()`` on
        what ``from models.pix2pix_model import Pix2PixModel`` built is torch code."""
        if self.imports_torch:
            return True
        if self._uses_torch is None:
            self._uses_torch = False
            if self.index is not None:
                for qualname in set(self.facts.names.bindings().values()):
                    found = self.index.module_of(qualname, self.path)
                    summary = self.index.summary(found[0]) if found is not None else None
                    if summary is not None and summary.imports_torch:
                        self._uses_torch = True
                        break
        return self._uses_torch

    # -- conditions ---------------------------------------------------------------

    def off_by_default(self, call: CallFact) -> OffByDefault | None:
        """The ``if`` that keeps ``call`` from running by default, if any."""
        for condition in call.scope.conditions:
            if not isinstance(condition, cst.If):
                continue
            value = self.facts.evaluate(condition.test)
            if not value.known:
                continue
            in_else = id(call.node) in self._calls_in_else(condition)
            if bool(value.value) == in_else:
                return OffByDefault(condition, value)
        return None

    def _calls_in_else(self, node: cst.If) -> frozenset[int]:
        found = self._orelse_calls.get(id(node))
        if found is None:
            collector = _CallIds()
            if node.orelse is not None:
                walk(node.orelse, [collector])
            found = self._orelse_calls[id(node)] = frozenset(collector.ids)
        return found

    # -- calls --------------------------------------------------------------------

    def call_effects(self, call: CallFact, depth: int = 0) -> Effects:
        """What ``call`` does to the RNGs: a known API, a local function or class, a project helper."""
        known = api_effects(call, self.facts, self.imports_torch)
        if known is not None:
            return known
        local = self.local_target(call)
        if local is not None:
            kind, name = local
            effects_of = {"function": self.function_effects, "class": self.class_effects, "bases": self.bases_effects}
            return effects_of[kind](name, depth + 1)
        if call.qualname is not None and self.index is not None:
            return self.index.effects(call.qualname, self.path, depth + 1) or NOTHING
        return self._instance_method_effects(call, depth)

    def _instance_method_effects(self, call: CallFact, depth: int) -> Effects:
        """``buffer.push_and_pop(x)`` where ``buffer = ReplayBuffer()`` (assigned
        once), or ``self.sampler.sample(t)`` where the class sets ``self.sampler =
        sampler or UniformSampler(diffusion)`` (the default a caller that passes
        none gets): the method of that class, in this file or a project module.
        Calling such an object (``noise()`` with ``noise = OUNoise(...)``,
        ``self.transform(img)``) runs its ``__call__``."""
        func = call.node.func
        if call.qualname is not None:
            return NOTHING
        built = self._instance_built_by(func, call.scope.function)
        if built is not None:
            attribute = "__call__"  # ``noise()`` or ``self.transform(img)``: calling the object runs its __call__
        elif type(func) is cst.Attribute:
            built, attribute = self._instance_built_by(func.value, call.scope.function), func.attr.value
        if built is None:
            return NOTHING
        class_name = dotted_name(built.func)
        method = f"{class_name}.{attribute}"
        if class_name in self.facts.classes and not self.facts.names.is_bound(class_name.partition(".")[0]):
            return self.function_effects(method, depth + 1) if method in self.facts.functions else NOTHING
        if self.index is None:
            return NOTHING
        qualname = self.facts.names.resolve(built.func)
        if qualname is None and class_name is not None:
            qualname = self.index.star_imported(class_name, self.facts.names.star_modules, self.path)
        if qualname is None:
            return NOTHING
        return self.index.effects(f"{qualname}.{attribute}", self.path, depth + 1) or NOTHING

    def _instance_built_by(self, node: cst.BaseExpression, caller: str | None) -> cst.Call | None:
        """The constructor call of the object ``node`` names: a name assigned once,
        or an attribute of ``self`` its class assigns once (``x or Default(...)``
        counts as its default)."""
        if type(node) is cst.Name:
            values = self.facts.simple_assignments.get(node.value)
        elif type(node) is cst.Attribute and type(node.value) is cst.Name and node.value.value == "self" and caller and "." in caller:
            values = self._self_attributes(caller.rpartition(".")[0]).get(node.attr.value)
        else:
            return None
        if not values or len(values) != 1:
            return None
        value = values[0]
        if type(value) is cst.BooleanOperation and type(value.operator) is cst.Or:
            value = value.right
        return value if type(value) is cst.Call else None

    def _self_attributes(self, owner: str) -> dict[str, list[cst.BaseExpression]]:
        """``self.<attribute>`` -> the values the methods of class ``owner`` assign it."""
        found = self._attributes_of.get(owner)
        if found is None:
            collector = _SelfAttributes()
            for name, function in self.facts.functions.items():
                if name.rpartition(".")[0] == owner:
                    walk(function, [collector])
            found = self._attributes_of[owner] = collector.values
        return found

    def is_known_api(self, call: CallFact) -> bool:
        return api_effects(call, self.facts, self.imports_torch) is not None

    def local_target(self, call: CallFact) -> tuple[str, str] | None:
        """("function" | "class" | "bases", qualified name) for calls to this module's own code."""
        func = call.node.func
        caller = call.scope.function
        if isinstance(func, cst.Attribute) and caller is not None:
            owner = caller.rpartition(".")[0]
            if isinstance(func.value, cst.Name) and func.value.value == "self" and f"{owner}.{func.attr.value}" in self.facts.functions:
                return "function", f"{owner}.{func.attr.value}"
            if _is_super_call(func.value) and func.attr.value == "__init__" and owner in self.facts.classes:
                return "bases", owner
        name = dotted_name(func)
        if name is None or self.facts.names.is_bound(name.partition(".")[0]):
            return None
        if caller is not None and f"{caller}.{name}" in self.calls_by_function:
            return "function", f"{caller}.{name}"  # a nested helper
        if name in self.facts.functions:
            return "function", name
        if name in self.facts.classes:
            return "class", name
        return None

    @property
    def worker_init_calls(self) -> frozenset[int]:
        """Calls that run only in DataLoader workers: a ``worker_init_fn=`` lambda's,
        or those of this file's function passed there.  What they seed is the
        workers' RNGs (``worker_init_fn=lambda i: np.random.seed(i + int(time.time()))``
        leaves the main process's NumPy unseeded)."""
        if self._worker_init_calls is None:
            found: set[int] = set()
            functions: set[str] = set()
            for call in self.facts.calls:
                if DATA_API_ALIASES.get(call.qualname, call.qualname) != DATALOADER:
                    continue
                init = call.value_node(*DATALOADER_WORKER_INIT_PARAMETER)
                if isinstance(init, cst.Lambda):
                    collector = _CallIds()
                    walk(init, [collector])
                    found |= collector.ids
                elif isinstance(init, cst.Name) and init.value in self.facts.functions:
                    functions.add(init.value)
            found |= {id(call.node) for call in self.facts.calls if call.scope.function in functions}
            self._worker_init_calls = frozenset(found)
        return self._worker_init_calls

    @property
    def name_mentions(self) -> Counter[str]:
        """How often the module's code names each name (``engine.walk.name_mentions``), counted once."""
        if self._name_mentions is None:
            self._name_mentions = name_mentions(self.tree) if self.tree is not None else Counter()
        return self._name_mentions

    def calls_of(self, function: str | None) -> list[CallFact]:
        return self.calls_by_function.get(function, [])

    # -- functions and classes -------------------------------------------------------

    def function_effects(self, name: str, depth: int = 0) -> Effects:
        return self._memoized(f"def {name}", depth, lambda: self._body_effects(name, depth))

    def class_effects(self, name: str, depth: int = 0) -> Effects:
        """Instantiating class ``name`` runs its ``__init__`` (or its bases')."""
        init = f"{name}.__init__"
        if init in self.facts.functions:
            return self.function_effects(init, depth)
        return self.bases_effects(name, depth)

    def bases_effects(self, name: str, depth: int = 0) -> Effects:
        return self._memoized(f"bases {name}", depth, lambda: self._construct_bases(name, depth))

    def _memoized(self, key: str, depth: int, compute) -> Effects:
        known = self._memo.get(key)
        if known is not None:
            return known
        if key in self._in_progress or depth > MAX_DEPTH:
            return self.own_file_effects  # recursion: the outer computation has the rest
        self._in_progress.add(key)
        try:
            result = self._memo[key] = compute() | self.own_file_effects
        finally:
            self._in_progress.discard(key)
        return result

    def forget(self) -> None:
        """Drop memoised effects (another module they were read from changed)."""
        self._memo.clear()
        self._uses_torch = None

    @property
    def own_file_effects(self) -> Effects:
        return Effects(files=self.own_file)

    def _body_effects(self, function: str, depth: int) -> Effects:
        return combine(
            self.as_run(call, self.call_effects(call, depth))
            for call in self.calls_of(function)
            if self.off_by_default(call) is None
        )

    def as_run(self, call: CallFact, effects: Effects) -> Effects:
        """A call inside a ``lambda`` may never run: its seeds still count (precision:
        never demand a seed that may be there), its draws do not.  A call that runs
        only in DataLoader workers does nothing to the main process's RNGs."""
        if id(call.node) in self.worker_init_calls:
            return Effects(files=effects.files)
        if call.scope.in_lambda and effects.draws:
            return Effects(seeds=effects.seeds, files=effects.files)
        return effects

    def _construct_bases(self, name: str, depth: int) -> Effects:
        effects = NOTHING
        for base in self.facts.classes[name].bases:
            base_name = dotted_name(base.value)
            if base_name is None:
                continue
            if base_name in self.facts.classes and not self.facts.names.is_bound(base_name.partition(".")[0]):
                effects |= self.class_effects(base_name, depth + 1)
                continue
            qualname = self.facts.names.resolve(base.value)
            if qualname in TORCH_RANDOM_LAYERS:
                effects |= draw(TORCH, qualname)
            elif qualname is not None and self.index is not None:
                effects |= self.index.effects(qualname, self.path, depth + 1) or NOTHING
        return effects

    def code_trains(self, function: str) -> bool:
        """The body of ``function`` (``"Trainer.run"``) builds an optimiser or calls backward()."""
        return any(trains_here(call, call.method == "backward" and self.uses_torch) for call in self.calls_of(function))

    def export_trains(self, attribute: str, depth: int) -> tuple[bool, frozenset[tuple[str, str]]]:
        """Whether ``module.<attribute>`` trains, and the project files that says so."""
        if attribute in self.facts.classes:  # building it runs its __init__
            return self.code_trains(f"{attribute}.__init__"), self.own_file
        if attribute in self.facts.functions:
            return self.code_trains(attribute), self.own_file
        first, _, rest = attribute.partition(".")
        bound = self.facts.names.bindings().get(first)
        if bound is not None and self.index is not None:
            trains, files = self.index.trains(f"{bound}.{rest}" if rest else bound, self.path, depth + 1)
            return trains, files | self.own_file
        return False, self.own_file

    def import_time_seeds(self) -> Effects:
        """The seeds importing this file makes: its module-level code outside the
        ``__main__`` guard (a ``utils/seeding.py`` that seeds on import).  Its
        draws are left out: an importer is never asked to seed for them
        (precision).  The modules it imports in turn are not followed: a
        package's import graph can be most of a library."""
        return self._memoized("import", 0, self._import_time_seeds)

    def _import_time_seeds(self) -> Effects:
        own = combine(
            self.call_effects(call)
            for call in self.calls_of(None)
            if not call.scope.in_main_guard and self.off_by_default(call) is None
        )
        return Effects(seeds=own.seeds, files=own.files)

    def imports_seeds(self) -> Effects:
        """The seeds the project modules this file imports make when imported."""
        if self.index is None:
            return NOTHING
        return combine(self.index.import_time_seeds(module, self.path) for module in self.facts.names.imported_modules)

    def export_effects(self, attribute: str, depth: int) -> Effects | None:
        """Effects of calling ``module.<attribute>`` from another module."""
        if attribute in self.facts.functions:
            return self.function_effects(attribute, depth)
        if attribute in self.facts.classes:
            return self.class_effects(attribute, depth)
        first, _, rest = attribute.partition(".")
        bound = self.facts.names.bindings().get(first)
        if bound is not None and self.index is not None:  # re-exported: ``from .seeding import set_seed``
            target = f"{bound}.{rest}" if rest else bound
            known = SEEDING_FUNCTIONS.get(target)
            if known is not None:
                return Effects(seeds=known, files=self.own_file)
            found = self.index.effects(target, self.path, depth + 1)
            return (found or NOTHING) | self.own_file_effects
        return self.own_file_effects


def _is_super_call(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "super"


class _SelfAttributes(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, list[cst.BaseExpression]] = {}

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            attribute = target.target
            if type(attribute) is cst.Attribute and type(attribute.value) is cst.Name and attribute.value.value == "self":
                self.values.setdefault(attribute.attr.value, []).append(node.value)


class _CallIds(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[int] = set()

    def visit_Call(self, node: cst.Call) -> None:
        self.ids.add(id(node))


# --- the project ------------------------------------------------------------------


@dataclass
class _CachedModule:
    digest: str
    summary: ModuleSummary | None  # None: not parseable


@dataclass
class ProjectIndex:
    """Project-local modules under ``root``, parsed on demand and cached per content hash."""

    root: Path
    _modules: OrderedDict[Path, _CachedModule] = field(default_factory=OrderedDict)
    #: path -> ((mtime_ns, size), digest): re-hash a file only when it changed on disk
    _digests: dict[Path, tuple[tuple[int, int], str]] = field(default_factory=dict)
    locator: ModuleLocator = field(init=False)

    def __post_init__(self) -> None:
        self.locator = ModuleLocator(self.root)

    def enter(self, entry: Path, facts: FileFacts) -> None:
        """Resolve imports as a run of ``entry`` would: with the folders its path
        edits, and those of the project modules it imports (``_init_paths``), add
        to ``sys.path``.  Answers learnt under another entry's search path are forgotten."""
        search_path = path_edits(facts, entry, self.root)
        for module in facts.names.imported_modules:
            if not module.startswith("."):
                for path, attribute in self._candidates((*module.split("."), "*"), 0, entry):
                    edits = attribute == "*" and (_mentions(path, b"sys.path") or _mentions(path, b"addsitedir"))
                    summary = self.summary(path) if edits else None
                    if summary is not None:
                        search_path += tuple(d for d in path_edits(summary.facts, path, self.root) if d not in search_path)
        if search_path != self.locator.search_path:
            self.locator.search_path = search_path
            for cached in self._modules.values():
                if cached.summary is not None:
                    cached.summary.forget()

    def effects(self, qualname: str, importer: Path, depth: int = 0) -> Effects | None:
        """Effects of calling ``qualname`` (as resolved in ``importer``), when it names
        a function or class of a project module; None when it is not project code."""
        if depth > MAX_DEPTH:
            return None
        dots = len(qualname) - len(qualname.lstrip("."))
        parts = tuple(qualname[dots:].split("."))
        if not dots and parts[0] in sys.stdlib_module_names:
            return None
        for path, attribute in self._candidates(parts, dots, importer):
            summary = self.summary(path)
            if summary is None:
                digest = self._digest(path)
                return Effects(files=frozenset({(str(path), digest)})) if digest else None
            return summary.export_effects(attribute, depth)
        return None

    def import_time_seeds(self, module: str, importer: Path) -> Effects:
        """The seeds importing ``module`` (as named in ``importer``) makes, when it is a
        project module.  A module whose text never says "seed" is not parsed."""
        dots = len(module) - len(module.lstrip("."))
        parts = tuple(part for part in module[dots:].split(".") if part)
        if not dots and parts and parts[0] in sys.stdlib_module_names:
            return NOTHING
        for path, attribute in self._candidates((*parts, "*"), dots, importer):
            if attribute != "*":
                return NOTHING  # a name in a shorter module: that module is another import's
            digest = self._digest(path)
            if digest is None:
                return NOTHING
            if not _mentions(path, b"seed"):
                return Effects(files=frozenset({(str(path), digest)}))
            summary = self.summary(path)
            return summary.import_time_seeds() if summary is not None else NOTHING
        return NOTHING

    def star_imported(self, name: str, modules: list[str], importer: Path) -> str | None:
        """``module.name`` for the first star-imported project module (``from utils
        import *``) that defines ``name`` as a class or function."""
        for module in modules:
            dots = len(module) - len(module.lstrip("."))
            parts = tuple(part for part in module[dots:].split(".") if part)
            for path, attribute in self._candidates((*parts, name), dots, importer):
                summary = self.summary(path)
                if summary is not None and attribute == name and (name in summary.facts.classes or name in summary.facts.functions):
                    return f"{module}.{name}" if module[dots:] else f"{module}{name}"
        return None

    def trains(self, qualname: str, importer: Path, depth: int = 0) -> tuple[bool, frozenset[tuple[str, str]]]:
        """Whether calling ``qualname`` (a project function, or building a project
        class) runs training, and the project files read to say so."""
        if depth > MAX_DEPTH:
            return False, frozenset()
        dots = len(qualname) - len(qualname.lstrip("."))
        parts = tuple(qualname[dots:].split("."))
        if not dots and parts[0] in sys.stdlib_module_names:
            return False, frozenset()
        for path, attribute in self._candidates(parts, dots, importer):
            summary = self.summary(path)
            if summary is None:
                return False, frozenset()
            return summary.export_trains(attribute, depth)
        return False, frozenset()

    def module_of(self, qualname: str, importer: Path) -> tuple[Path, str] | None:
        """(project module file, attribute path in it) that ``qualname`` (as resolved in
        ``importer``) names, or None when it is not project code.  A module not found
        where the import system would look is looked for in the root's folders,
        when exactly one of them holds it."""
        dots = len(qualname) - len(qualname.lstrip("."))
        parts = tuple(qualname[dots:].split("."))
        if not dots and parts[0] in sys.stdlib_module_names:
            return None
        found = next(self._candidates(parts, dots, importer), None)
        if found is not None or dots:
            return found
        return self.locator.in_source_folders(parts)

    def _candidates(self, parts: tuple[str, ...], dots: int, importer: Path) -> Iterator[tuple[Path, str]]:
        return self.locator.candidates(parts, dots, importer)

    def tree_of(self, path: Path, digest: str) -> "cst.Module | None":
        """The tree of ``path`` already parsed for the index, when its content hash is ``digest``."""
        cached = self._modules.get(Path(os.path.abspath(path)))
        if cached is None or cached.digest != digest or cached.summary is None:
            return None
        return cached.summary.tree

    def adopt(self, path: Path, digest: str, module: "cst.Module", facts: FileFacts) -> None:
        """A checked file's tree and facts (the same text, parser and collector as ``_parse``),
        kept so that a later import of it is not parsed again."""
        path = Path(os.path.abspath(path))
        cached = self._modules.get(path)
        if cached is not None and cached.digest == digest:
            return
        self._modules[path] = _CachedModule(digest, ModuleSummary(facts, path, digest, self, module))
        while len(self._modules) > MAX_CACHED_MODULES:
            self._modules.popitem(last=False)

    def summary(self, path: Path) -> ModuleSummary | None:
        path = Path(os.path.abspath(path))  # one entry per file, however the importer named it
        digest = self._digest(path)
        cached = self._modules.get(path)
        if cached is None or cached.digest != digest:
            cached = self._modules[path] = _CachedModule(digest or "", self._parse(path, digest))
            while len(self._modules) > MAX_CACHED_MODULES:  # parsed trees are large
                self._modules.popitem(last=False)
        self._modules.move_to_end(path)
        return cached.summary

    def refresh(self) -> None:
        """Forget what was learnt from modules that changed on disk since (one stat
        per cached module; called once per checked file)."""
        changed = [path for path, cached in self._modules.items() if self._digest(path) != cached.digest]
        if changed:
            for path in changed:
                del self._modules[path]
            for cached in self._modules.values():
                if cached.summary is not None:
                    cached.summary.forget()

    def _parse(self, path: Path, digest: str | None) -> ModuleSummary | None:
        if digest is None:
            return None
        try:
            data = path.read_bytes()
            if len(data) > MAX_FILE_BYTES:
                return None
            # an expression too costly for libcst is left out here too (its file reports it)
            text, _ = without_complex_expressions(decode_python(data), DEFAULT_FILE_TIME_BUDGET)
            module = parse_module(text)
            facts = FileFacts()
            walk(module, [FactCollector(facts, module)])
        except (OSError, UnreadableSource, cst.ParserSyntaxError, RecursionError, ValueError, TooComplex):
            return None
        return ModuleSummary(facts, path, digest, self, module)

    def digest(self, path: Path) -> str | None:
        """The content hash of a project file (None when unreadable), for a result's dependencies."""
        return self._digest(path)

    def _digest(self, path: Path) -> str | None:
        try:
            stat = path.stat()
            key = (stat.st_mtime_ns, stat.st_size)
            cached = self._digests.get(path)
            if cached is not None and cached[0] == key:
                return cached[1]
            digest = content_hash(path.read_bytes())
        except OSError:
            return None
        self._digests[path] = (key, digest)
        return digest


def _mentions(path: Path, word: bytes) -> bool:
    """Whether a project file's text holds ``word`` (a cheap test before parsing it)."""
    try:
        return word in path.read_bytes()
    except OSError:
        return False


@lru_cache(maxsize=None)
def _index_for(root: Path) -> ProjectIndex:
    return ProjectIndex(root)


def project_index(root: Path) -> ProjectIndex:
    """The project index of ``root``, shared by every check in this process."""
    return _index_for(Path(root).resolve())
