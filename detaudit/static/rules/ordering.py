"""Data order that depends on the filesystem or on PYTHONHASHSEED (DET031, DET032).

Both rules follow an *unordered value* (a directory listing, a set of strings)
through one function at a time, in source order, and report it when its order
is kept: indexed, enumerated, returned, stored, appended to a list, passed on.
It is not reported when it is sorted (``sorted(x)``, ``x.sort()``), or only used
in ways that ignore order (``in``, ``len``, ``set``, truthiness, a loop that only
has side effects).  The walk is local and linear: only scopes that contain an
unordered value are walked, once, with a map from each name to what it holds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import libcst as cst

from detaudit.findings import Severity
from detaudit.static.analyses.execution import blocks, header, statements
from detaudit.static.analyses.strings import is_string_expression, is_string_iterable, is_string_set
from detaudit.static.engine.names import dotted_name
from detaudit.static.engine.walk import child_nodes
from detaudit.static.fixes.edits import Replace, wrapped_in_call
from detaudit.static.rule import Invalid, Rule


#: Directory listings in the order the filesystem returns (not sorted).
FILE_LISTING_CALLS = frozenset(
    {"os.listdir", "os.scandir", "os.walk", "os.fwalk", "glob.glob", "glob.iglob",
     "tensorflow.io.gfile.listdir", "tensorflow.io.gfile.glob", "tensorflow.io.gfile.walk"}
)

#: ``pathlib.Path`` methods that list a directory (matched by method name).
FILE_LISTING_METHODS = frozenset({"glob", "rglob", "iterdir"})

#: Consumers whose result does not depend on the order of their argument.
ORDER_INSENSITIVE_CALLS = frozenset(
    {"sorted", "set", "frozenset", "len", "any", "all", "sum", "min", "max", "bool", "print",
     "collections.Counter", "natsort.natsorted", "natsort.os_sorted", "natsort.humansorted",
     "natsort.realsorted", "numpy.sort", "os.path.exists", "os.path.isdir", "os.path.isfile"}
)

#: Wrappers that keep their argument's order (the order-dependent use is further out):
#: a progress bar iterates what it wraps.
ORDER_PRESERVING_CALLS = frozenset(
    {"list", "tuple", "iter", "map", "filter", "reversed", "dict.fromkeys", "itertools.chain",
     "itertools.islice", "tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm", "tqdm.std.tqdm"}
)

#: Consumers that turn an iteration order into data: positions, first match, text.
ORDER_CAPTURING_CALLS = frozenset({"enumerate", "zip", "next", "random.shuffle", "random.choice"})

# -- following an unordered value through a scope ---------------------------------


@dataclass(frozen=True)
class Unordered:
    """An unordered value being followed."""

    what: str  # how the message names it: "os.listdir()", "the set of strings"
    report_at: cst.CSTNode  # where the fix goes
    ordered: bool  # already a sequence (a listing) or still a set
    fix: object = None
    walk: bool = False  # an ``os.walk``-style generator of (dir, dirs, files)


_APPENDING_METHODS = frozenset({"append", "extend", "insert", "appendleft"})
_SET_ADDING_METHODS = frozenset({"add", "update"})


class _ScopeFlow:
    """Follows unordered values through one scope's statements, in execution order
    (nested functions and classes are scopes of their own)."""

    def __init__(self, rule: "_OrderRule", returns_order_free: bool = False) -> None:
        self.rule = rule
        self.returns_order_free = returns_order_free
        self.facts = rule.facts
        self.pending: dict[str, Unordered] = {}  # dotted name -> what it holds
        self.empty_sets: dict[str, cst.CSTNode] = {}  # ``x = set()`` waiting for string elements
        self.string_names: set[str] = set()
        self._rebinds: list[tuple[str, Unordered]] = []

    def run(self, body) -> None:
        for statement in statements(body):
            if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
                continue  # scopes of their own
            if isinstance(statement, cst.For):
                self._for(statement)
                continue
            for node in header(statement):
                self._walk(node, [statement])
        for name, value in self.pending.items():
            if "." in name and value.ordered:  # stored on an object and never sorted in this scope
                self.rule.found(value, f"stored in `{name}` in that order")

    # The walk: a node's parents are passed down so each use can be classified.
    def _walk(self, node: cst.CSTNode, parents: list[cst.CSTNode]) -> None:
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return
        if isinstance(node, (cst.Assign, cst.AnnAssign, cst.AugAssign)):
            self._assignment(node, parents)
            return
        if isinstance(node, cst.Assert):
            single = _asserted_single(node.test)
            if single is not None:
                self.pending.pop(single, None)  # one element has no order
        value = self._value_of(node)
        if value is not None:
            self._classify(value, node, parents)
            if isinstance(node, cst.Name | cst.Attribute):
                return
        parents.append(node)
        for child in child_nodes(node):
            self._walk(child, parents)
        parents.pop()

    def _value_of(self, node: cst.CSTNode) -> Unordered | None:
        if isinstance(node, (cst.Name, cst.Attribute)):
            name = dotted_name(node)
            return self.pending.get(name) if name is not None else None
        return self.rule.source(node, self)

    def _assignment(self, node, parents: list[cst.CSTNode]) -> None:
        parents.append(node)
        if node.value is not None:
            self._walk(node.value, parents)
        parents.pop()
        targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
        for target in targets:
            name = dotted_name(target)
            if name is not None and not isinstance(node, cst.AugAssign):
                self.pending.pop(name, None)
                self.empty_sets.pop(name, None)
                self.string_names.discard(name)
                if isinstance(node.value, cst.Call) and self.facts.names.resolve(node.value.func) == "set" and not node.value.args:
                    self.empty_sets[name] = node.value
                elif node.value is not None and self._holds_strings(node.value):
                    self.string_names.add(name)
        for name, value in self._rebinds:
            self.pending[name] = value
        self._rebinds.clear()

    def _holds_strings(self, value: cst.BaseExpression) -> bool:
        """A string, or strings to iterate (``text.split()``, ``list(set(words))``): a
        name holding either iterates strings, which is what a set built from it holds."""
        names = frozenset(self.string_names)
        if is_string_expression(value, self.facts, names):
            return True
        return isinstance(value, cst.Call) and is_string_iterable(value, self.facts, names)

    def _for(self, node: cst.For) -> None:
        """A loop's iterable, then what its target binds (its body is walked next)."""
        self._walk(node.iter, [node])
        if isinstance(node.target, cst.Name) and is_string_iterable(node.iter, self.facts, frozenset(self.string_names)):
            self.string_names.add(node.target.value)
        self.rule.loop_targets(node, self)

    # -- classification of one use ---------------------------------------------

    def _classify(self, value: Unordered, node: cst.CSTNode, parents: list[cst.CSTNode]) -> None:
        """Follow ``node`` (holding ``value``) outwards to the use that decides."""
        child = node
        for index in range(len(parents) - 1, -1, -1):
            parent = parents[index]
            if isinstance(parent, (cst.Arg, cst.Element, cst.StarredElement, cst.CompFor)):
                # the iterable of a nested ``for`` (``[p for ext in exts for p in d.glob(ext)]``) feeds the outer one
                if isinstance(parent, cst.CompFor) and child is not parent.iter and child is not parent.inner_for_in:
                    return  # used in a comprehension's condition
            elif isinstance(parent, cst.Attribute):
                call = parents[index - 1] if index > 0 else None
                if child is parent.value and isinstance(call, cst.Call) and call.func is parent:
                    self._method(value, parent.attr.value, parent.value, call)
                return  # other attributes (``.name`` of a DirEntry, ...) are single elements
            else:
                value = self._step(value, child, parent)
                if value is None:
                    return
            child = parent

    def _step(self, value: Unordered, child: cst.CSTNode, parent: cst.CSTNode) -> Unordered | None:
        """What using ``child`` inside ``parent`` does: a new value to follow
        outwards, or None when the use is decided (reported, sorted or harmless)."""
        if isinstance(parent, cst.Call):
            return self._call(value, child, parent)
        if isinstance(parent, cst.Subscript):
            if value.ordered and child is parent.value:
                self.rule.found(value, "indexed")
            return None
        if isinstance(parent, (cst.ListComp, cst.GeneratorExp, cst.DictComp)):
            return self.rule.materialised(value, parent)
        if isinstance(parent, cst.BinaryOperation):
            return value if isinstance(parent.operator, (cst.Add, cst.BitOr)) else None
        if isinstance(parent, (cst.Assign, cst.AnnAssign, cst.AugAssign)):
            targets = [t.target for t in parent.targets] if isinstance(parent, cst.Assign) else [parent.target]
            for target in targets:
                name = dotted_name(target)
                if name is not None:
                    self._rebinds.append((name, value))
            return None
        if isinstance(parent, cst.For):
            self._loop(value, parent)
            return None
        if isinstance(parent, (cst.Return, cst.Yield)):
            if value.ordered and not (self.returns_order_free and isinstance(parent, cst.Return)):
                self.rule.found(value, "returned" if isinstance(parent, cst.Return) else "yielded")
            return None
        return None  # comparisons (``in``), tests, f-strings, unpacking: order does not matter

    def _call(self, value: Unordered, child: cst.CSTNode, call: cst.Call) -> Unordered | None:
        """The value is an argument of ``call``."""
        if child is call.func:
            return None
        receiver = call.func.value if isinstance(call.func, cst.Attribute) else None
        method = call.func.attr.value if isinstance(call.func, cst.Attribute) else None
        callee = self.facts.names.resolve(call.func)
        label = callee or dotted_name(call.func) or method or "a call"
        if callee in ORDER_INSENSITIVE_CALLS:
            return None
        if callee in ORDER_PRESERVING_CALLS:
            return self.rule.materialised(value, call)
        if callee == "next" and value.walk:
            return None  # the first step of a walk is the top directory itself
        if callee in ORDER_CAPTURING_CALLS or method == "join":
            self.rule.found(self.rule.materialised(value, call), f"passed to `{label}`")
            return None
        if method in _APPENDING_METHODS and value.ordered:
            self._collect_into(receiver, value)
            return None
        if method in _SET_ADDING_METHODS or not value.ordered:
            return None  # a set handed over as a container keeps no order
        self.rule.found(value, f"passed to `{label}`")
        return None

    def _method(self, value: Unordered, method: str, receiver: cst.BaseExpression, call: cst.Call) -> None:
        """A method of the value itself: ``files.sort()``, ``names.pop()``."""
        if method == "sort":
            name = dotted_name(receiver)
            if name is not None:
                self.pending.pop(name, None)
        elif method == "pop" and not value.ordered:
            self.rule.found(replace(value, report_at=call), "an arbitrary element is taken with `pop()`")

    def _collect_into(self, receiver: cst.BaseExpression, value: Unordered) -> None:
        name = dotted_name(receiver)
        if name is not None:
            self.pending.setdefault(name, value)

    def _loop(self, value: Unordered, loop: cst.For) -> None:
        """A loop over the value keeps its order if it appends or yields."""
        value = self.rule.materialised(value, loop)
        if _sorts_a_loop_target(loop):
            return  # ``for root, dirs, files in os.walk(d): dirs.sort()`` fixes the walk order
        for node in _loop_body_nodes(loop):
            if isinstance(node, cst.Yield):
                self.rule.found(value, "yielded by a loop")
                return
            if (
                isinstance(node, cst.Call)
                and isinstance(node.func, cst.Attribute)
                and node.func.attr.value in _APPENDING_METHODS
            ):
                self._collect_into(node.func.value, value)


def _asserted_single(test: cst.BaseExpression) -> str | None:
    """The name ``assert len(name) == 1`` says holds exactly one element."""
    if not (isinstance(test, cst.Comparison) and len(test.comparisons) == 1):
        return None
    target = test.comparisons[0]
    if not isinstance(target.operator, cst.Equal) or not (isinstance(target.comparator, cst.Integer) and target.comparator.value == "1"):
        return None
    call = test.left
    if isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and call.func.value == "len" and len(call.args) == 1:
        return dotted_name(call.args[0].value)
    return None


def _sorts_a_loop_target(loop: cst.For) -> bool:
    if not isinstance(loop.target, cst.Tuple):
        return False
    targets = {dotted_name(e.value) for e in loop.target.elements}
    return any(
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value == "sort"
        and dotted_name(node.func.value) in targets
        for node in _loop_body_nodes(loop)
    )


def _loop_body_nodes(loop: cst.For):
    """The nodes of a loop body, not entering nested functions."""
    stack: list[cst.CSTNode] = [loop.body]
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            stack.extend(child_nodes(node))


def sorted_fix(node: cst.BaseExpression, *, safe: bool = True) -> Replace | None:
    """``sorted(node)``; None for a dict (sorting it would keep only its keys)."""
    if isinstance(node, (cst.Dict, cst.DictComp)):
        return None
    return Replace(node, wrapped_in_call(node, "sorted"), safe=safe)


def sorted_iteration_fix(node: cst.BaseExpression) -> Replace | None:
    """Sort what ``node`` iterates over: ``enumerate(s)`` -> ``enumerate(sorted(s))``,
    ``[f(x) for x in s]`` -> ``[f(x) for x in sorted(s)]``.  None when that is not
    one plain argument or one ``for``."""
    if isinstance(node, cst.Call) and len(node.args) == 1 and not node.args[0].star and node.args[0].keyword is None:
        iterated = node.args[0].value
    elif isinstance(node, (cst.ListComp, cst.GeneratorExp, cst.DictComp, cst.SetComp)) and node.for_in.inner_for_in is None:
        iterated = node.for_in.iter
    else:
        return None
    return Replace(iterated, wrapped_in_call(iterated, "sorted"))


class _OrderRule(Rule):
    """Marks the scopes that hold an unordered value during the shared walk and
    follows the value through those scopes (only) in ``finish``."""

    def __init__(self, context) -> None:
        super().__init__(context)
        self._scopes: list[cst.CSTNode] = [context.module]
        self._marked: dict[int, cst.CSTNode] = {}
        self._reported: set[int] = set()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._scopes.append(node)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._scopes.pop()

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._scopes.append(node)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self._scopes.pop()

    def _mark(self) -> None:
        scope = self._scopes[-1]
        self._marked[id(scope)] = scope

    def finish(self) -> None:
        for scope in self._marked.values():
            # ``dir()`` sorts what ``__dir__`` returns
            returns_order_free = isinstance(scope, cst.FunctionDef) and scope.name.value == "__dir__"
            _ScopeFlow(self, returns_order_free).run(scope.body if isinstance(scope, cst.Module) else blocks(scope)[0].statements)

    def found(self, value: Unordered, use: str) -> None:
        if id(value.report_at) in self._reported:
            return
        self._reported.add(id(value.report_at))
        self.report(value.report_at, self.message(value, use), fix=value.fix)

    # -- what subclasses define ---------------------------------------------------
    def source(self, node: cst.CSTNode, flow: _ScopeFlow) -> Unordered | None:
        raise NotImplementedError

    def materialised(self, value: Unordered, node: cst.CSTNode) -> Unordered:
        """The value once its order is fixed into a sequence at ``node``: a call or
        comprehension that iterates it, or the ``for`` loop that does."""
        return value

    def loop_targets(self, loop: cst.For, flow: _ScopeFlow) -> None:
        """Names a loop over a source binds to further unordered values."""

    def message(self, value: Unordered, use: str) -> str:
        raise NotImplementedError


_WALKS = frozenset({"os.walk", "os.fwalk", "tensorflow.io.gfile.walk"})
#: Listings whose entries do not compare (``DirEntry``) or that are not flat (walks).
_UNSORTABLE_LISTINGS = _WALKS | {"os.scandir"}


class UnorderedFileListing(_OrderRule):
    code = "DET031"
    name = "unordered-file-listing"
    severity = Severity.WARNING
    summary = "A directory listing is used in the order the filesystem returns it."
    rationale = """
        `os.listdir`, `os.scandir`, `os.walk`, `glob.glob`/`iglob` and
        `Path.glob`/`rglob`/`iterdir` return entries in the order the filesystem
        stores them, which differs between machines, filesystems and even copies
        of the same dataset.  When that order becomes data order (a file list a
        Dataset indexes, class indices from `enumerate`, the "first" checkpoint
        matching a pattern, a list that is then shuffled with a seeded RNG), the
        same seed gives different batches on another machine.
        """
    fix_hint = "Sort the listing: `sorted(os.listdir(d))`, `sorted(root.glob('*.png'))`; in `os.walk` sort `dirs[:]` and `files`."
    VALID = (
        "import os, torch\nfiles = sorted(os.listdir('data'))\ndataset = [torch.load(f) for f in files]\n",
        "import glob, torch\nfiles = glob.glob('data/*.pt')\nfiles.sort()\nsamples = [torch.load(f) for f in files]\n",
        "import glob, torch\nfiles = glob.glob('data/*.pt')\nfiles = sorted(files)\nprint(files[0])\n",
        # membership, counting and existence checks do not depend on order
        "import os, torch\nif 'model.pt' in os.listdir('ckpt'):\n    n = len(os.listdir('ckpt'))\nif not os.listdir('out'):\n    torch.save({}, 'out/x.pt')\n",
        # a loop that only has side effects
        "import os, torch\nfor name in os.listdir('tmp'):\n    os.remove(os.path.join('tmp', name))\n",
        "import os, torch\npaths = []\nfor root, dirs, files in os.walk('data'):\n    for f in files:\n        paths.append(os.path.join(root, f))\npaths.sort()\nloader = torch.utils.data.DataLoader(paths)\n",
        "from pathlib import Path\nimport torch\nimages = sorted(p for p in Path('data').rglob('*.png') if p.is_file())\n",
        # exactly one match asserted: a single element has no order
        "import torch\ndef mask_of(folder, name):\n    found = list(folder.glob(name + '.*'))\n"
        "    assert len(found) == 1, found\n    return torch.load(found[0])\n",
        # a progress bar over the listing, each file handled on its own
        "import glob, torch\nfrom tqdm import tqdm\nfiles = []\nfiles.extend(glob.glob('in/*.png'))\n"
        "for path in tqdm(files):\n    torch.save(torch.load(path), path + '.out')\n",
        # the first step of a walk is the top directory; its names are only tested for membership
        "import os, torch\nknown = next(os.walk('hub'))[1]\ntrusted = 'owner_repo' in known\n",
    )
    INVALID = (
        Invalid(
            "import os, torch\nfiles = os.listdir('data')\nx = torch.load(files[0])\n",
            line=2,
            message="indexed",
            fixed="import os, torch\nfiles = sorted(os.listdir('data'))\nx = torch.load(files[0])\n",
        ),
        Invalid("import glob, torch\nclass_to_idx = {c: i for i, c in enumerate(glob.glob('train/*'))}\n", line=2, message="enumerate"),
        Invalid(
            "import os, torch\nclass Images(torch.utils.data.Dataset):\n    def __init__(self, root):\n        self.files = [os.path.join(root, f) for f in os.listdir(root)]\n",
            line=4,
            message="self.files",
        ),
        Invalid("from pathlib import Path\nimport random\nfiles = list(Path('data').glob('*.jpg'))\nrandom.shuffle(files)\n", line=3, message="random.shuffle"),
        Invalid(
            "import os, torch\ndef list_images(root):\n    out = []\n    for root, dirs, files in os.walk(root):\n        for f in files:\n            out.append(f)\n    return out\n",
            line=4,
            message="returned",
        ),
        Invalid("import glob, torch\ndef latest():\n    return glob.glob('ckpt/*.pt')[-1]\n", line=3),
        # a listing per extension, flattened by a nested comprehension into a Dataset's index order
        Invalid(
            "from pathlib import Path\nimport torch\nclass Images(torch.utils.data.Dataset):\n    def __init__(self, folder, exts):\n"
            "        self.paths = [p for ext in exts for p in Path(folder).glob(f'**/*.{ext}')]\n",
            line=5,
            message="self.paths",
        ),
        Invalid("import os, torch\nloader = torch.utils.data.DataLoader(os.listdir('data'))\n", line=2, message="DataLoader"),
    )

    def visit_Call(self, node: cst.Call) -> None:
        call = self.facts.calls[-1]  # the fact collector (first in the walk) just recorded this call
        if call.node is node and self._is_listing(call.qualname, call.method):
            self._mark()

    @staticmethod
    def _is_listing(qualname: str | None, method: str | None) -> bool:
        if qualname is not None:
            return qualname in FILE_LISTING_CALLS
        return method in FILE_LISTING_METHODS

    def source(self, node: cst.CSTNode, flow: _ScopeFlow) -> Unordered | None:
        if not isinstance(node, cst.Call):
            return None
        qualname = self.facts.names.resolve(node.func)
        method = node.func.attr.value if isinstance(node.func, cst.Attribute) else None
        if not self._is_listing(qualname, method):
            return None
        label = f"{qualname or method}()"
        fix = None  # DirEntry objects and walk tuples need a key or per-level sorting
        if qualname not in _UNSORTABLE_LISTINGS:
            fix = Replace(node, cst.Call(cst.Name("sorted"), [cst.Arg(node)]))
        return Unordered(label, node, ordered=True, fix=fix, walk=qualname in _WALKS)

    def loop_targets(self, loop: cst.For, flow: _ScopeFlow) -> None:
        # ``for root, dirs, files in os.walk(...)``: dirs and files are listings too
        walk = self.source(loop.iter, flow)
        if walk is None or not isinstance(loop.target, cst.Tuple) or len(loop.target.elements) != 3:
            return
        for element in loop.target.elements[1:]:
            name = dotted_name(element.value)
            if name is not None:
                flow.pending[name] = Unordered(f"{walk.what} ({name})", walk.report_at, ordered=True)

    def message(self, value: Unordered, use: str) -> str:
        return f"{value.what} returns entries in filesystem order, and that order is used ({use}); sort it."


class SetIterationOrder(_OrderRule):
    code = "DET032"
    name = "set-iteration-order"
    severity = Severity.WARNING
    summary = "The iteration order of a set of strings is turned into data order."
    rationale = """
        Python salts the hash of `str` and `bytes` per process (unless
        PYTHONHASHSEED is fixed before the interpreter starts), so a set of
        strings iterates in a different order in every run.  Turning that order
        into data (`list(labels)`, `enumerate(vocab)`, a class index
        `{c: i for i, c in enumerate(set(names))}`, `" ".join(tags)`, a list
        built by a loop) gives different token ids or class indices per run.
        Sets of ints iterate in a fixed order, so only sets whose elements are
        visibly strings (literals, `str` methods, `split()` words) are reported.
        """
    fix_hint = "Sort before the order matters: `sorted(labels)`, `enumerate(sorted(vocab))`."
    VALID = (
        "import torch\nvocab = set('the cat sat'.split())\nword_to_id = {w: i for i, w in enumerate(sorted(vocab))}\n",
        # membership and size only
        "import torch\nSTOP = {'a', 'the', 'of'}\nwords = [w for w in 'the cat'.split() if w not in STOP]\nn = len(STOP)\n",
        # sets of ints iterate in a fixed order
        "import torch\nids = set([3, 1, 2])\nindex = {c: i for i, c in enumerate(ids)}\n",
        # a loop with side effects only
        "import torch\nfor name in {'a.pt', 'b.pt'}:\n    torch.save({}, name)\n",
        # a vocabulary from split words, sorted before ids are given; its size only
        "import torch\nwords = open('c.txt').read().split()\nvocab = sorted(set(words))\nn = len(set(words))\n"
        "stoi = {w: i for i, w in enumerate(vocab)}\n",
        # dir() sorts what __dir__ returns
        "import torch\ndef __dir__():\n    return list({'load', 'save'} | set(globals()))\n",
        # passed as a membership container
        "import torch\nKEEP = {'weight', 'bias'}\ndef keep(state):\n    return {k: v for k, v in state.items() if k in KEEP}\n",
    )
    INVALID = (
        Invalid("import torch\nlabels = {'cat', 'dog', 'bird'}\nclass_to_idx = {c: i for i, c in enumerate(labels)}\n", line=3, message="enumerate"),
        Invalid(
            "import torch\ntext = open('corpus.txt').read()\nvocab = list(set(text.split()))\nstoi = {w: i for i, w in enumerate(vocab)}\n",
            line=3,
            message="enumerate",
        ),
        Invalid(
            "import torch\nvocab = set()\nfor line in open('corpus.txt'):\n    for word in line.split():\n        vocab.add(word)\nitos = list(vocab)\ntoken = itos[0]\n",
            line=6,
        ),
        Invalid("import torch\ntags = {t.lower() for t in ['A', 'B']}\nheader = ','.join(tags)\n", line=3, message="join"),
        # words split into a list first, then deduplicated through a set
        Invalid(
            "import torch\nsentences = ['i like dog', 'i hate milk']\nword_list = ' '.join(sentences).split()\n"
            "word_list = list(set(word_list))\nword_dict = {w: i for i, w in enumerate(word_list)}\n",
            line=4,
            message="enumerate",
        ),
        Invalid(
            "import torch\ndef vocab(text):\n    words = text.split()\n    return {w: i for i, w in enumerate(set(words))}\n",
            line=4,
            message="enumerate",
        ),
        Invalid("import torch\nnames = frozenset(['x', 'y'])\nfirst = names.pop()\n", line=3, message="pop"),
        Invalid(
            "import torch\ndef build(words):\n    out = []\n    for w in {w.lower() for w in words}:\n        out.append(w)\n    return out\n",
            line=4,
        ),
    )

    # Only scopes that build a set of strings (or an empty set to fill) are walked in finish().
    def visit_Set(self, node: cst.Set) -> None:
        if is_string_set(node, self.facts):
            self._mark()

    def visit_SetComp(self, node: cst.SetComp) -> None:
        if is_string_set(node, self.facts):
            self._mark()

    def visit_Call(self, node: cst.Call) -> None:
        call = self.facts.calls[-1]
        # ``set(words)``: whether ``words`` holds strings only the walk of the scope can tell
        if call.node is node and call.qualname in ("set", "frozenset") and (
            not node.args or isinstance(node.args[0].value, (cst.Name, cst.Attribute)) or is_string_set(node, self.facts)
        ):
            self._mark()

    def source(self, node: cst.CSTNode, flow: _ScopeFlow) -> Unordered | None:
        if isinstance(node, (cst.Set, cst.SetComp, cst.Call)) and is_string_set(node, self.facts, frozenset(flow.string_names)):
            # unsafe: a set kept in a name becomes a list (``.add`` no longer works)
            return Unordered("a set of strings", node, ordered=False, fix=sorted_fix(node, safe=False))
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in _SET_ADDING_METHODS:
            self._fill_empty_set(node, flow)
        return None

    def _fill_empty_set(self, call: cst.Call, flow: _ScopeFlow) -> None:
        """``s = set(); s.add(word)``: the set holds strings once one is added."""
        name = dotted_name(call.func.value)
        if name not in flow.empty_sets or not call.args:
            return
        argument = call.args[0].value
        strings = frozenset(flow.string_names)
        adds_text = (
            is_string_expression(argument, self.facts, strings)
            if call.func.attr.value == "add"
            else is_string_iterable(argument, self.facts, strings)
        )
        if adds_text:
            flow.pending[name] = Unordered("a set of strings", flow.empty_sets.pop(name), ordered=False)

    def materialised(self, value: Unordered, node: cst.CSTNode) -> Unordered:
        if value.ordered:
            return value
        if isinstance(node, cst.For):  # the loop iterates the set itself: sort that, not what built it
            return Unordered(value.what, node.iter, ordered=True, fix=sorted_fix(node.iter))
        return Unordered(value.what, node, ordered=True, fix=sorted_iteration_fix(node))

    def message(self, value: Unordered, use: str) -> str:
        return f"{value.what} iterates in a per-process order (PYTHONHASHSEED), and that order is used ({use}); sort it first."
