"""What distributed code looks like, for the rules of several families: which
identifiers hold a process's rank (per-rank-init-seed, distributed-sampler-rank-seed)
and the names a callee goes by (per-rank-init-seed, async-collective-not-waited).
"""

from __future__ import annotations

from typing import Iterator

import libcst as cst

from detaudit.static.engine.facts import CallFact, FileFacts
from detaudit.static.engine.names import dotted_name
from detaudit.static.engine.walk import child_nodes

#: Identifiers (names, attributes, environment variable names, lower-cased) that
#: hold a process's rank: torch.distributed, torchrun's environment, Lightning
#: (``trainer.global_rank``), Accelerate (``accelerator.process_index``), and
#: the launchers' variables (SLURM, Open MPI, PMI).
RANK_IDENTIFIERS = frozenset(
    {"rank", "local_rank", "global_rank", "node_rank", "world_rank", "group_rank", "get_rank",
     "get_node_local_rank", "process_index", "local_process_index", "slurm_procid", "slurm_localid",
     "ompi_comm_world_rank", "ompi_comm_world_local_rank", "pmi_rank"}
)


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


def callee_names(call: CallFact) -> set[str]:
    """The last component of every way ``call`` names its callee (resolved,
    written, or the method), so a project's ``DDP`` alias counts too."""
    names = {call.method} if call.method else set()
    for spelled in (call.qualname, dotted_name(call.node.func)):
        if spelled:
            names.add(spelled.rpartition(".")[2])
    return names
