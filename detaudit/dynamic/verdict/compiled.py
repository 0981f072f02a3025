"""What a run's torch.compile graphs add to its report (torch-free).

The child traces each Inductor graph's call as one record
(``record/compiled_graphs.py``) and says in its payload how many graphs ran,
how many calls were traced, where dynamo broke the graph and which graphs
Inductor compiled with autotuning.  This module turns that into the report's
``compiled`` section and its warnings, and describes what a bisection found
inside a differing graph (``record/graph_bisect.py``).
"""

from __future__ import annotations

from detaudit.dynamic.compare.causes import NONDETERMINISTIC_OP, RNG
from detaudit.dynamic.compare.trace_format import is_graph_call

#: Why a graph compiled with autotuning is a hazard (DET017 compile-autotune says the same of the code).
AUTOTUNE_HAZARD = (
    "Inductor picked their kernels by timing candidates (DET017 compile-autotune): another process, machine or "
    "cache state can pick another kernel that rounds differently; runs reproduce only with a warm, shared "
    "autotune cache, or with torch._inductor.config.deterministic = True"
)


#: What a graph break changes in the numbers, beyond the eager code between the graphs.
GRAPH_BREAK_HAZARD = (
    "No kernel fuses across a break, so the split code computes otherwise than one graph would (in low precision "
    "a fused kernel rounds once where two round twice); torch.compile(..., fullgraph=True) makes a break an error"
)

#: Why a graph compiled for symbolic sizes is a hazard across runs.
DYNAMIC_SHAPES_HAZARD = (
    "after a call with new sizes (torch.compile's automatic dynamic shapes) or with dynamic=True. Inductor "
    "chose their kernels from the sizes it saw when compiling (how a reduction is split, pytorch#106747), so which "
    "kernel a call runs, and the bits it computes, can depend on the sizes that came before it: a resumed run or "
    "another batch order can compute otherwise. Fixed batch sizes (DataLoader drop_last=True) or "
    "torch.compile(..., dynamic=False) give each size a kernel of its own"
)


#: Why a random op departs from eager once compiled.
COMPILED_RANDOM_DRAWS = (
    "It draws random numbers: compiled, Inductor draws them with its own generator, not eager's, so they differ "
    "from an eager run's under the same seed; torch._inductor.config.fallback_random = True makes compiled random "
    "ops draw as eager does (TORCHINDUCTOR_FALLBACK_RANDOM=1)."
)


def compiled_section(payload: dict) -> dict | None:
    """The report's ``compiled`` section: {"graphs", "calls", "graph_breaks", "graph_table"}; None when nothing compiled."""
    compiled = payload.get("compiled")
    if not compiled or not (compiled["graphs"] or compiled["graph_breaks"]):
        return None
    return compiled


def compiled_warnings(payload: dict, *, eager: bool) -> list[str]:
    """What the report warns about compiled code: regions that ran eagerly, graph breaks, symbolic sizes, autotuning."""
    calls = payload.get("compile_calls") or []
    where = ", ".join(f"{call['call']} at {call['path']}:{call['line']}" for call in calls)
    if calls and (eager or payload.get("compiled_unavailable")):
        why = "--eager" if eager else f"this torch cannot be traced compiled ({payload['compiled_unavailable']})"
        return [
            f"the script compiles ({where}), but its compiled regions ran eagerly ({why}): this verdict is the "
            "eager code's; Inductor's kernels round differently and can vary from run to run"
        ]
    compiled = payload.get("compiled") or {}
    if calls and compiled.get("disabled"):
        return [f"the script compiles ({where}), but compilation is disabled (TORCH_COMPILE_DISABLE=1 or "
                "torch._dynamo.config.disable): it ran eagerly, traced op by op"]
    warnings = []
    if calls and not compiled.get("graphs"):
        warnings.append(
            f"the script compiles ({where}), but no graph ran through Inductor (another backend, or nothing compiled "
            "was called): what ran was traced op by op"
        )
    breaks = compiled.get("graph_breaks") or []
    if breaks:
        count = sum(entry["count"] for entry in breaks)
        reasons = "; ".join(f"{_first_line(entry['reason'])} ({entry['count']}x)" for entry in breaks[:5])
        warnings.append(
            f"{count} graph break{'s' if count != 1 else ''}: dynamo split the compiled code, and what lies between "
            f"the graphs ran eagerly (traced op by op): {reasons}. " + GRAPH_BREAK_HAZARD
        )
    dynamic = [graph["name"] for graph in compiled.get("graph_table", []) if graph.get("dynamic")]
    if dynamic:
        warnings.append(f"{len(dynamic)} graph{'s' if len(dynamic) != 1 else ''} compiled for symbolic sizes "
                        f"({', '.join(dynamic[:4])}{', ...' if len(dynamic) > 4 else ''}), " + DYNAMIC_SHAPES_HAZARD)
    tuned = [graph["name"] for graph in compiled.get("graph_table", []) if graph["autotune"]
             and not graph["inductor_deterministic"]]
    if tuned:
        options = sorted({option for graph in compiled["graph_table"] for option in graph["autotune"]})
        warnings.append(f"{len(tuned)} graph{'s' if len(tuned) != 1 else ''} compiled with {', '.join(options)}: "
                        + AUTOTUNE_HAZARD)
    return warnings


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def compiled_line(section: dict) -> str:
    """The text report's line: "compiled: 2 graphs ran compiled, 12 calls traced, 1 graph break"."""
    breaks = sum(entry["count"] for entry in section["graph_breaks"])
    text = f"compiled: {section['graphs']} graph{'s' if section['graphs'] != 1 else ''} ran compiled (Inductor), " \
           f"{section['calls']} call{'s' if section['calls'] != 1 else ''} traced"
    return text + (f", {breaks} graph break{'s' if breaks != 1 else ''}" if breaks else "")


def describe_inside_graph(found: dict) -> str:
    """A bisection's result as a sentence of the root cause's details."""
    if found.get("error"):
        return f"The bisection inside the graph could not finish: {found['error']}."
    against = "two compiled replays of its call differ" if found["against"] == "replay" else \
        "its compiled result departs from its ops run eagerly"
    if not found.get("reproduced"):
        return (
            "Replayed on its captured inputs, two compiled runs of the graph agreed: the difference came from outside "
            "its kernels (its inputs, a generator state)." if found["against"] == "replay"
            else "Replayed on its captured inputs, its compiled result matched its ops run eagerly."
        )
    where = f"{found['path']}:{found['line']}" if found.get("line") else "no source line"
    module = f" in {found['module']}" if found.get("module") else ""
    diff = f", max |diff| {found['max_abs_diff']:.3g}" if found.get("max_abs_diff") is not None else ""
    text = (f"Inside the graph, the first node where {against}: {found['op']} ({found['node']}) at {where}{module}"
            f"{diff}; bisected over {found['nodes']} nodes in {found['compiles']} compiles.")
    if found.get("seeded") and found["against"] == "eager":
        text += " " + COMPILED_RANDOM_DRAWS
    return text


def settle_graph_cause(cause) -> None:
    """A graph call's root cause, once the bisection looked inside it (``cause.inside_graph``): a graph
    that draws random numbers (a dropout) was classified a generator's draw, but two replays from the
    same generator state that part at a node drawing none name a nondeterministic kernel."""
    found = cause.inside_graph or {}
    if cause.kind is RNG and found.get("reproduced") and found["against"] == "replay" and not found.get("seeded"):
        cause.kind, cause.other_side = NONDETERMINISTIC_OP, None


def graph_cause(report):
    """The first root cause that is a compiled graph's call (what a bisection looks inside), or None."""
    return next((cause for cause in report.root_causes if is_graph_call(cause.op) and cause.record >= 0), None)

