"""Execution order: the statements and the calls of a file in the order a run reaches them.

Straight-line code runs in source order, so both views follow it:

- **statements**: ``statements(body)`` yields a block's statements in order and
  descends into the blocks of every compound statement (``if``/``elif``/``else``
  chains, loops and their ``else``, ``try`` with its handlers, ``else`` and
  ``finally``, ``with``, ``match``), yielding each compound statement before the
  statements of its blocks.  ``blocks(statement)`` says which blocks a
  statement holds and how each runs, so a reader can choose which to enter;
  ``header(statement)`` gives what the statement itself evaluates (an ``if``'s
  test, a ``with``'s context managers).  An ``elif`` is an ``If`` in its parent's
  ``orelse``: it is walked as the one statement of its parent's else branch.
- **calls**: ``run_order(summary)`` lists the calls a run of the file reaches:
  module level in source order (the main guard included), with each call of one
  of the file's own functions replaced by that function's calls.
"""

from __future__ import annotations

import enum
from typing import Callable, Iterator, NamedTuple, Sequence

import libcst as cst

from detaudit.static.analyses.project import ModuleSummary
from detaudit.static.engine.facts import CallFact
from detaudit.static.engine.walk import child_nodes

# Node types are compared with ``type(node) is ...``: libcst's classes are ABCs,
# and isinstance through abc would dominate the cost of a walk over every statement.

#: Statements that are one line of small statements: ``x = f()``, and the
#: one-line body of a compound statement (``if ready: start()``).
LINES = frozenset({cst.SimpleStatementLine, cst.SimpleStatementSuite})


def is_line(statement: cst.CSTNode) -> bool:
    return type(statement) in LINES


class Runs(enum.Enum):
    """How a block runs when the statement holding it runs."""

    ALWAYS = "always"  # a ``with`` or ``try`` body, ``try``'s ``else`` and ``finally``
    BRANCH = "branch"  # one branch of an ``if`` chain or a ``match``
    LOOP = "loop"  # a loop body (zero or more times) and the loop's ``else``
    ON_ERROR = "on error"  # an ``except`` handler
    OWN_SCOPE = "own scope"  # a function's body (when called) or a class body (its namespace)


class Block(NamedTuple):
    """The statements of one block of a compound statement, in order.  A one-line
    body (``if ready: start()``) is one statement: its SimpleStatementSuite."""

    runs: Runs
    statements: Sequence[cst.CSTNode]


def _statements_of(suite: cst.BaseSuite) -> Sequence[cst.CSTNode]:
    return suite.body if type(suite) is cst.IndentedBlock else (suite,)


def _if_blocks(statement: cst.If) -> tuple[Block, ...]:
    body = Block(Runs.BRANCH, _statements_of(statement.body))
    orelse = statement.orelse
    if type(orelse) is cst.If:  # elif: the one statement of the else branch
        return body, Block(Runs.BRANCH, (orelse,))
    if orelse is not None:
        return body, Block(Runs.BRANCH, _statements_of(orelse.body))
    return (body,)


def _loop_blocks(statement: cst.For | cst.While) -> tuple[Block, ...]:
    body = Block(Runs.LOOP, _statements_of(statement.body))
    if statement.orelse is None:
        return (body,)
    return body, Block(Runs.LOOP, _statements_of(statement.orelse.body))


def _try_blocks(statement: cst.Try | cst.TryStar) -> tuple[Block, ...]:
    parts = [Block(Runs.ALWAYS, _statements_of(statement.body))]
    parts += [Block(Runs.ON_ERROR, _statements_of(handler.body)) for handler in statement.handlers]
    for tail in (statement.orelse, statement.finalbody):
        if tail is not None:
            parts.append(Block(Runs.ALWAYS, _statements_of(tail.body)))
    return tuple(parts)


def _with_blocks(statement: cst.With) -> tuple[Block, ...]:
    return (Block(Runs.ALWAYS, _statements_of(statement.body)),)


def _match_blocks(statement: cst.Match) -> tuple[Block, ...]:
    return tuple(Block(Runs.BRANCH, _statements_of(case.body)) for case in statement.cases)


def _scope_blocks(statement: cst.FunctionDef | cst.ClassDef) -> tuple[Block, ...]:
    return (Block(Runs.OWN_SCOPE, _statements_of(statement.body)),)


_BLOCKS_OF: dict[type, Callable[..., tuple[Block, ...]]] = {
    cst.If: _if_blocks,
    cst.For: _loop_blocks,
    cst.While: _loop_blocks,
    cst.Try: _try_blocks,
    cst.TryStar: _try_blocks,
    cst.With: _with_blocks,
    cst.Match: _match_blocks,
    cst.FunctionDef: _scope_blocks,
    cst.ClassDef: _scope_blocks,
}


def blocks(statement: cst.CSTNode) -> tuple[Block, ...]:
    """The blocks ``statement`` holds, in source order (none for a line)."""
    build = _BLOCKS_OF.get(type(statement))
    return build(statement) if build is not None else ()


def _in_the_same_scope(block: Block) -> bool:
    return block.runs is not Runs.OWN_SCOPE


def statements(body: Sequence[cst.CSTNode], enter: Callable[[Block], bool] = _in_the_same_scope) -> Iterator[cst.CSTNode]:
    """The statements of ``body`` and of the blocks ``enter`` accepts (by default
    every block but function and class bodies), in source order; a compound
    statement comes before the statements of its blocks."""
    pending: list[Iterator[cst.CSTNode]] = [iter(body)]
    while pending:
        statement = next(pending[-1], None)
        if statement is None:
            pending.pop()
            continue
        yield statement
        build = _BLOCKS_OF.get(type(statement))
        if build is not None:
            inner = [block.statements for block in build(statement) if enter(block)]
            if inner:
                pending.append(s for block in inner for s in block)


def every_block(module: cst.Module) -> Iterator[Block]:
    """The module's body and every block in it, function and class bodies included."""
    yield Block(Runs.ALWAYS, module.body)
    for statement in statements(module.body, enter=lambda block: True):
        yield from blocks(statement)


_SUITES = frozenset({cst.IndentedBlock, cst.SimpleStatementSuite})
#: Children of a compound statement that hold blocks but also expressions the
#: statement evaluates (an ``except``'s exception type, a ``case``'s pattern).
_BLOCK_HOLDERS = frozenset({cst.Else, cst.Finally, cst.ExceptHandler, cst.ExceptStarHandler, cst.MatchCase})


def header(statement: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """What ``statement`` evaluates itself, outside its blocks, in source order: a
    line's small statements, an ``if``'s or ``while``'s test, a ``for``'s target
    and iterable, a ``with``'s items, handler types, ``case`` patterns and guards,
    a ``def``'s decorators and defaults.  An ``elif`` is left to the walk (it is a
    statement of its parent's else branch)."""
    orelse = getattr(statement, "orelse", None)
    elif_ = orelse if type(orelse) is cst.If else None
    pending = list(reversed(child_nodes(statement)))
    while pending:
        child = pending.pop()
        kind = type(child)
        if kind in _SUITES or child is elif_:
            continue
        if kind in _BLOCK_HOLDERS:
            pending.extend(reversed(child_nodes(child)))
            continue
        yield child


#: Calls that run a function of the file as an entry point, by the parameter that
#: names it (keyword, position).  ``spawn`` starts fresh interpreters: the parent's
#: seeds never reach them.  ``Process``/``Thread`` run the target with the parent's
#: RNG state (a thread shares it; a process forks it, the Linux default).
ENTRY_POINT_CALLS: dict[str, tuple[str, int | None, bool]] = {
    "torch.multiprocessing.spawn": ("fn", 0, True),
    "torch.multiprocessing.start_processes": ("fn", 0, True),
    "torch.multiprocessing.spawn.spawn": ("fn", 0, True),
    "multiprocessing.Process": ("target", 1, False),
    "torch.multiprocessing.Process": ("target", 1, False),
    "threading.Thread": ("target", 1, False),
}


class RunOrder(NamedTuple):
    """The calls a run of the file reaches, in order, and which of them run in a
    process started fresh (their ``id(call.node)``)."""

    calls: tuple[CallFact, ...]
    spawned: frozenset[int]
    #: the calls that start a fresh process, by the id of each call they lead to
    spawned_by: dict[int, CallFact]


def _entry_point(summary: ModuleSummary, call: CallFact) -> tuple[str, bool] | None:
    """(the file's function a call runs as an entry point, whether in a fresh process)."""
    known = ENTRY_POINT_CALLS.get(call.qualname or "")
    if known is None:
        return None
    keyword, position, fresh = known
    target = call.value_node(keyword, position)
    if target is None or type(target) is not cst.Name:
        return None
    name = target.value
    if summary.facts.names.is_bound(name) or name not in summary.facts.functions:
        return None
    return name, fresh


def run_order(summary: ModuleSummary) -> RunOrder:
    """The calls a run of the file reaches, in order: module level (the main guard
    included), descending into the file's own functions where they are called
    (each function the first time) or started as entry points (``mp.spawn(main,
    ...)``, ``Process(target=train)``), without calls an ``if`` keeps off by
    default (except a fresh process started under an option: its code runs
    unseeded whenever the option is given).  A call inside a ``lambda`` is
    listed but not descended into: it runs only if and when the lambda is called."""
    order: list[CallFact] = []
    spawned: set[int] = set()
    spawned_by: dict[int, CallFact] = {}
    visiting: set[str] = set()
    # (the calls to walk, the call that started their fresh process, if any)
    pending: list[tuple[Iterator[CallFact], CallFact | None]] = [(iter(summary.calls_of(None)), None)]
    while pending:
        calls, starter = pending[-1]
        call = next(calls, None)
        if call is None:
            pending.pop()
            continue
        if summary.off_by_default(call) is not None:
            # a process spawned only under an option still runs unseeded when the option is given
            entry = _entry_point(summary, call)
            if entry is None or not entry[1] or entry[0] in visiting or call.scope.in_lambda:
                continue
        target = summary.local_target(call)
        if target is not None and target[0] == "function":
            if target[1] not in visiting and not call.scope.in_lambda:
                visiting.add(target[1])
                pending.append((iter(summary.calls_of(target[1])), starter))
            continue
        if starter is not None:
            spawned.add(id(call.node))
            spawned_by[id(call.node)] = starter
        order.append(call)
        entry = _entry_point(summary, call)
        if entry is not None and entry[0] not in visiting and not call.scope.in_lambda:
            visiting.add(entry[0])
            pending.append((iter(summary.calls_of(entry[0])), call if entry[1] else starter))
    return RunOrder(tuple(order), frozenset(spawned), spawned_by)
