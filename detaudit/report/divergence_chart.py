"""The divergence chart of ``detaudit run --html``, drawn with matplotlib.

One figure, two panels sharing the x axis (the ops of the reference run's
trace, in order, over the steps where the runs part ways):

* the top panel puts each differing op at its max |diff| on a log scale: root
  causes as red diamonds, propagated ops as orange dots (hollow when measured
  over a sample of a large output: a lower bound), ops whose outputs were
  equal in the capture rerun on the panel's floor; phases are shaded and
  steps separated, so the spread through backward, optimizer and the next
  forward shows at a glance;
* the strip below marks every op equal (grey), root cause (red) or
  propagated (orange); where a control-flow divergence stopped the
  comparison, the rest is hatched.

matplotlib is optional (the ``plot`` extra): ``divergence_png`` returns None
without it.  It draws on a ``Figure`` of its own with the Agg canvas, so the
pyplot state and backend of a notebook that calls it stay untouched.
"""

from __future__ import annotations

import io
import math

from detaudit.dynamic.compare.divergence import PROPAGATED, ROOT, Divergence
from detaudit.dynamic.compare.trace_format import BACKWARD, FORWARD, OPTIMIZER, SETUP

INSTALL_HINT = 'pip install "detaudit[plot]"'
ROOT_COLOUR, PROPAGATED_COLOUR, EQUAL_COLOUR = "#d62728", "#ff7f0e", "#d0d0d0"
PHASE_COLOURS = {SETUP: "#f3eefa", FORWARD: "#eaf1fb", BACKWARD: "#fdf1e6", OPTIMIZER: "#ebf6eb"}
_WIDTH_INCHES, _HEIGHT_INCHES, _DPI = 10.0, 4.4, 110
_MARKERS = {  # matplotlib scatter styles, in legend order
    "root": {"marker": "D", "color": ROOT_COLOUR, "s": 60, "edgecolors": "black", "linewidths": 0.6},
    "propagated": {"marker": "o", "color": PROPAGATED_COLOUR, "s": 22},
    "sampled": {"marker": "o", "facecolors": "none", "edgecolors": PROPAGATED_COLOUR, "s": 22, "linewidths": 1.2},
    "unchanged": {"marker": "_", "color": "#777777", "s": 60},
}
_LABELS = {
    "root": "root cause",
    "propagated": "propagated",
    "sampled": "propagated, sampled (lower bound)",
    "unchanged": "equal in the capture rerun",
}
_LABEL_BOX = {"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 2}


def matplotlib_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def divergence_png(divergence: Divergence) -> bytes | None:
    """The chart as PNG bytes; None when matplotlib is not installed."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None

    figure = Figure(figsize=(_WIDTH_INCHES, _HEIGHT_INCHES), dpi=_DPI)
    FigureCanvasAgg(figure)
    grid = figure.add_gridspec(2, 1, height_ratios=(5, 1), hspace=0.08)
    chart = figure.add_subplot(grid[0])
    strip = figure.add_subplot(grid[1], sharex=chart)
    _draw_phases_and_steps(divergence, chart, strip)
    shown = _draw_deviations(divergence, chart)
    _draw_status_strip(divergence, strip)
    if divergence.control_flow_at is not None:
        _draw_control_flow(divergence, chart, strip)
    _legend(divergence, chart, shown)
    runs, differing = divergence.runs, len(divergence.points)
    title = f"Runs {runs[0]} and {runs[1]}: {differing} of {divergence.compared_ops} ops differ"
    if divergence.control_flow_at is not None:
        title += ", then the runs take different paths"
    chart.set_title(title, loc="left", fontsize=11, pad=16)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", bbox_inches="tight")
    return buffer.getvalue()


def _draw_phases_and_steps(divergence: Divergence, chart, strip) -> None:
    """Phase shading behind both panels, a dashed line and a label where each step starts."""
    spans = divergence.spans
    for span in spans:
        for axis in (chart, strip):
            axis.axvspan(span.start - 0.5, span.end - 0.5, color=PHASE_COLOURS.get(span.phase, "#f4f4f4"), zorder=0)
    step_starts = [span for index, span in enumerate(spans) if index == 0 or span.step != spans[index - 1].step]
    for span in step_starts[1:]:
        for axis in (chart, strip):
            axis.axvline(span.start - 0.5, color="#555555", linewidth=1.0, linestyle="--", zorder=1)
    for span in step_starts:
        label = f" step {span.step}"
        chart.text(span.start - 0.5, 1.01, label, transform=chart.get_xaxis_transform(), fontsize=9, va="bottom")


def _draw_deviations(divergence: Divergence, chart) -> set[str]:
    """Each measured op at its max |diff| on a log scale; returns the marker kinds drawn."""
    measured = [p for p in divergence.points if p.max_abs_diff and math.isfinite(p.max_abs_diff)]
    values = [p.max_abs_diff for p in measured] or [1e-8, 1.0]
    floor = 10.0 ** math.floor(math.log10(min(values)) - 1)
    chart.set_yscale("log")
    chart.set_ylim(floor * 0.6, 10.0 ** math.ceil(math.log10(max(values)) + 0.3))
    chart.set_ylabel("max |diff| (log scale)")
    chart.grid(axis="y", which="major", color="white", linewidth=1.0, zorder=1)
    chart.tick_params(axis="x", labelbottom=False)
    groups = {
        "root": ([p for p in measured if p.status == ROOT], _MARKERS["root"]),
        "propagated": ([p for p in measured if p.status == PROPAGATED and not p.sampled], _MARKERS["propagated"]),
        "sampled": ([p for p in measured if p.status == PROPAGATED and p.sampled], _MARKERS["sampled"]),
        "unchanged": ([p for p in divergence.points if p.max_abs_diff == 0], _MARKERS["unchanged"]),
    }
    for points, style in groups.values():
        if points:
            heights = [p.max_abs_diff or floor for p in points]  # unchanged ones sit on the floor
            chart.scatter([p.record for p in points], heights, zorder=4, **style)
    named = set()
    for point in groups["root"][0]:  # each root cause's line once, where it first shows
        site = (point.op, point.path, point.line)
        if site in named or len(named) == 3:
            continue
        named.add(site)
        to_the_left = point.record > divergence.start + 0.6 * (divergence.end - divergence.start)
        chart.annotate(
            _short_op(point.op) + (f" ({point.path.rsplit('/', 1)[-1]}:{point.line})" if point.line else ""),
            (point.record, point.max_abs_diff),
            xytext=(-8 if to_the_left else 8, 8),
            textcoords="offset points",
            ha="right" if to_the_left else "left",
            fontsize=8.5,
            color=ROOT_COLOUR,
            zorder=5,
        )
    if not measured:
        message = "no op differed before that" if divergence.control_flow_at is not None else "no deviation measured"
        chart.text(
            0.02, 0.5, message, transform=chart.transAxes, va="center", color="#555555", zorder=6, bbox=_LABEL_BOX
        )
    return {kind for kind, (points, _) in groups.items() if points}


def _draw_status_strip(divergence: Divergence, strip) -> None:
    """Every op of the range as one cell: equal, root cause or propagated."""
    from matplotlib.colors import to_rgb

    colours = [to_rgb(EQUAL_COLOUR)] * (divergence.end - divergence.start)
    for point in divergence.points:
        colours[point.record - divergence.start] = to_rgb(ROOT_COLOUR if point.status == ROOT else PROPAGATED_COLOUR)
    left, right = divergence.start - 0.5, divergence.end - 0.5
    strip.imshow([colours], aspect="auto", interpolation="nearest", extent=(left, right, 0, 1), zorder=2)
    strip.set_yticks([])
    strip.set_ylabel("ops", rotation=0, ha="right", va="center")
    strip.set_xlabel(f"op index in run {divergence.runs[0]}'s trace")
    strip.set_xlim(left, right)
    strip.set_ylim(0, 1)


def _draw_control_flow(divergence: Divergence, chart, strip) -> None:
    """Hatch what was not compared, from the op where the runs took different paths."""
    cut = divergence.control_flow_at - 0.5
    right = max(divergence.end - 0.5, cut + 0.5)
    for axis in (chart, strip):
        axis.axvspan(cut, right, facecolor="white", edgecolor="#999999", hatch="//", zorder=3)
        axis.axvline(cut, color=ROOT_COLOUR, linewidth=2, zorder=4)
    chart.text(
        cut,
        0.5,
        " control flow: the runs\n take different paths",
        transform=chart.get_xaxis_transform(),
        color=ROOT_COLOUR,
        fontsize=9,
        va="center",
        zorder=6,
        bbox=_LABEL_BOX,
    )


def _legend(divergence: Divergence, chart, shown: set[str]) -> None:
    """The markers drawn and the phases shown, to the right of the chart."""
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], linestyle="", label=_LABELS[kind], **_legend_style(style))
        for kind, style in _MARKERS.items()
        if kind in shown
    ]
    phases = {span.phase for span in divergence.spans}
    handles += [
        Line2D([], [], marker="s", color=colour, linestyle="", markersize=10, label=phase)
        for phase, colour in PHASE_COLOURS.items()
        if phase in phases
    ]
    chart.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8.5, frameon=False)


def _legend_style(style: dict) -> dict:
    """A scatter style as the equivalent line-marker style."""
    return {
        "marker": style["marker"],
        "color": style.get("color", style.get("edgecolors")),
        "markerfacecolor": style.get("facecolors", style.get("color")),
        "markeredgecolor": style.get("edgecolors", style.get("color")),
        "markersize": 9 if style["marker"] == "_" else 6,
    }


def _short_op(op: str) -> str:
    """aten.index_put.default -> index_put"""
    parts = op.split(".")
    return parts[1] if len(parts) >= 2 and parts[0] == "aten" else op
