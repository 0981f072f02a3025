"""The two arms of a variance study side by side, per metric.

The HTML page is always written (an inline SVG drawn here, no dependency);
the PNG needs matplotlib, which is optional: ``write_png`` returns False when
it is missing.
"""

from __future__ import annotations

import html
import math
from pathlib import Path

from detaudit.stats.variance import ARM_TITLES, ArmSummary, VarianceSummary

PANEL_WIDTH, PANEL_HEIGHT, MARGIN = 360, 260, 50
ARM_COLOURS = ("#1f77b4", "#ff7f0e")


def _spread(index: int, count: int) -> float:
    """Sideways offset of a run's dot in [-1, 1], centred, so that equal values
    stay visible as a row instead of one dot."""
    return 0.0 if count < 2 else 2.0 * index / (count - 1) - 1.0


def _value_range(arms: list[ArmSummary]) -> tuple[float, float]:
    values = [v for arm in arms for v in arm.values if math.isfinite(v)]
    if not values:
        return 0.0, 1.0
    low, high = min(values), max(values)
    padding = (high - low) * 0.08 or max(abs(low) * 0.01, 1e-12)
    return low - padding, high + padding


def _svg_panel(name: str, arms: list[ArmSummary]) -> str:
    low, high = _value_range(arms)
    plot_height = PANEL_HEIGHT - 2 * MARGIN

    def y(value: float) -> float:
        return MARGIN + (high - value) / (high - low) * plot_height

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{PANEL_WIDTH}" height="{PANEL_HEIGHT}" '
        f'role="img" aria-label="{html.escape(name)}">',
        f'<text x="{PANEL_WIDTH / 2}" y="20" text-anchor="middle" font-weight="bold">{html.escape(name)}</text>',
        f'<line x1="{MARGIN}" y1="{MARGIN}" x2="{MARGIN}" y2="{PANEL_HEIGHT - MARGIN}" stroke="#444"/>',
    ]
    for value in (low, (low + high) / 2, high):
        parts.append(
            f'<text x="{MARGIN - 4}" y="{y(value) + 4:.1f}" text-anchor="end" font-size="10">{value:.5g}</text>'
        )
    column_width = (PANEL_WIDTH - MARGIN - 10) / len(arms)
    for position, (arm, colour, title) in enumerate(zip(arms, ARM_COLOURS, ARM_TITLES.values())):
        center = MARGIN + column_width * (position + 0.5)
        for index, value in enumerate(arm.values):
            offset = _spread(index, arm.runs) * column_width * 0.25
            parts.append(
                f'<circle cx="{center + offset:.1f}" cy="{y(value):.1f}" r="4" fill="{colour}" fill-opacity="0.6"/>'
            )
        if arm.runs:
            parts.append(
                f'<line x1="{center - column_width * 0.35:.1f}" x2="{center + column_width * 0.35:.1f}" '
                f'y1="{y(arm.mean):.1f}" y2="{y(arm.mean):.1f}" stroke="#000" stroke-width="2"/>'
            )
        if arm.runs >= 2:
            parts.append(
                f'<line x1="{center:.1f}" x2="{center:.1f}" y1="{y(arm.mean - arm.std):.1f}" '
                f'y2="{y(arm.mean + arm.std):.1f}" stroke="#000"/>'
            )
        parts.append(
            f'<text x="{center:.1f}" y="{PANEL_HEIGHT - MARGIN + 18}" text-anchor="middle" font-size="12">'
            f"{title} (n={arm.runs})</text>"
        )
    parts.append("</svg>")
    return "\n".join(parts)


def _number(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.6g}"


def write_html(summary: VarianceSummary, path: Path, title: str) -> Path:
    rows = "\n".join(
        f"<tr><td>{html.escape(m.name)}</td><td>{_number(m.fixed.mean)}</td><td>{_number(m.fixed.std)}</td>"
        f"<td>{_number(m.varied.mean)}</td><td>{_number(m.varied.std)}</td><td>{_number(m.ratio)}</td>"
        f"<td>{_number(m.ratio_interval.low)} – {_number(m.ratio_interval.high)}</td></tr>"
        for m in summary.metrics
    )
    sentences = "\n".join(f"<li><b>{html.escape(m.name)}</b>: {html.escape(m.plain_words())}</li>" for m in summary.metrics)
    panels = "\n".join(_svg_panel(m.name, [m.fixed, m.varied]) for m in summary.metrics)
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}} td:first-child{{text-align:left}}</style></head>
<body><h1>{html.escape(title)}</h1>
<p>Each dot is one run. Black bar: mean; vertical line: ± one standard deviation.
Fixed seed: only nondeterminism varies. Varied seeds: initialisation, data order and nondeterminism vary.</p>
<div>{panels}</div>
<table><tr><th>metric</th><th>fixed mean</th><th>fixed std</th><th>varied mean</th><th>varied std</th>
<th>std_fixed / std_varied</th><th>95% CI</th></tr>
{rows}</table>
<ul>{sentences}</ul>
</body></html>
"""
    path.write_text(page, encoding="utf-8")
    return path


def write_png(summary: VarianceSummary, path: Path, title: str) -> bool:
    """False (and nothing written) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    count = max(1, len(summary.metrics))
    figure, axes = plt.subplots(1, count, figsize=(4 * count, 4), squeeze=False)
    for axis, metric in zip(axes[0], summary.metrics):
        arms = [metric.fixed, metric.varied]
        for position, (arm, colour) in enumerate(zip(arms, ARM_COLOURS)):
            offsets = [position + _spread(i, arm.runs) * 0.15 for i in range(arm.runs)]
            axis.scatter(offsets, arm.values, color=colour, alpha=0.6)
            if arm.runs >= 2:
                axis.errorbar(position, arm.mean, yerr=arm.std, color="black", capsize=6, marker="_", markersize=20)
        axis.set_xticks([0, 1], [f"{t}\n(n={a.runs})" for t, a in zip(ARM_TITLES.values(), arms)])
        axis.set_xlim(-0.6, 1.6)
        axis.set_title(metric.name)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return True
