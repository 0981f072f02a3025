"""An eager reference for a compiled run: the first graph whose compiled result departs from eager.

A reference saved with compilation off (``TORCH_COMPILE_DISABLE=1``) traced
each op eagerly; a compiled run traced each graph's call as one record.  The
two traces line up only outside the graphs, so the comparison's roots there
are the graphs and the eager ops set against each other.  Instead, one
capture rerun of this run checks its first graph calls, in order, against
their own nodes run eagerly on the same inputs and bisects the first that
departs (``record/graph_bisect.py``, ``"eager"``): that graph call, with the
node inside it, is the root.
"""

from __future__ import annotations

from detaudit.dynamic.compare.causes import COMPILED_VS_EAGER
from detaudit.dynamic.compare.trace_format import Trace, is_graph_call
from detaudit.dynamic.verdict.run_report import RootCause

#: graph calls checked against eager, first to last (each a capture; one bisection at most)
EAGER_CHECKED_CALLS = 8


def ran_eagerly(reference: Trace, run: Trace) -> bool:
    """Whether ``run`` called compiled graphs and ``reference`` none: an eager reference for a compiled run."""
    return not any(is_graph_call(op.op) for op in reference.ops) and any(is_graph_call(op.op) for op in run.ops)


def eager_checked_calls(run: Trace) -> list[int]:
    """The graph calls of ``run`` the child compares with their ops run eagerly, first to last."""
    return [index for index, op in enumerate(run.ops) if is_graph_call(op.op)][:EAGER_CHECKED_CALLS]


def explain_compiled_against_eager(report, run: Trace, found: dict[int, dict]) -> None:
    """Against an eager reference: the root causes of a compiled run become the first graph call whose
    compiled result departs from its ops run eagerly, with the node inside it (``found``: record ->
    the child's bisection).  The comparison's own roots there are the graphs and the eager ops lined up
    against each other (the two sides ran different ops): they are kept only when no graph departs."""
    departing = [record for record in sorted(found) if found[record].get("reproduced")]
    if not departing:
        return
    record = departing[0]
    op = run.ops[record]
    report.notes.append(
        "the reference ran eagerly and this run compiled: the root is the first graph whose compiled result departs "
        "from its own ops run eagerly on the same inputs"
    )
    report.root_causes = [
        RootCause(
            kind=COMPILED_VS_EAGER, op=op.op, path=op.path, line=op.line, module=op.module, phase=run.phase_of(record),
            seen=1, pairs=1, first_step=op.step, max_abs_diff=found[record].get("max_abs_diff"),
            inside_graph=found[record], record=record,
        )
    ]
