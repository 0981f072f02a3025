"""``detaudit run --html FILE`` and ``detaudit resume --html FILE``: the
report as one self-contained HTML page.

Everything is inline (styles, the chart as a PNG data URI, the source
excerpts): the file opens offline, from a CI artifact or an e-mail, and
loads nothing from the network.  It is written from the same ``RunReport``
the JSON, text and JUnit writers read, and shows its numbers with the text
report's formatting (exact values ride along in ``data-value`` attributes),
so the formats cannot disagree.

The page: the verdict; where the runs part ways (the divergence chart from
``divergence_chart.py``, or a line saying how to get it without matplotlib,
and the first differing ops); each root cause with the source lines around
it, read from the user's file now (a missing or changed file is said so);
the differing tensors; notes; the environment's essentials and the whole
fingerprint.

The resume page (``resume_html``, from a ``ResumeReport``) shares the
skeleton, the styles, the facts line, the source excerpts and the
environment: the verdict; the components that differ, each with its step,
what a difference means and its fix (those that may only follow from an
earlier difference marked); the lines that save and load the checkpoint,
with their source; warnings; what failed, with the run's output.
"""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path
from typing import Iterable, Sequence

from detaudit import __version__
from detaudit.dynamic.compare.divergence import ROOT, Divergence
from detaudit.dynamic.verdict.run_report import RootCause, RunReport
from detaudit.resume.components import COMPONENTS
from detaudit.resume.report import DOWNSTREAM, ERROR, ResumeReport, describe_reader

SOURCE_CONTEXT = 3  # lines shown above and below a root cause's line
POINTS_LISTED = 25  # differing ops listed under the chart
NAMES_LISTED = 8  # names listed per differing component of a resume

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
       margin: 2em auto; max-width: 1180px; padding: 0 1.5em; color: #1d1d1f; line-height: 1.45; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
h2 { font-size: 1.2em; margin-top: 1.8em; border-bottom: 1px solid #ddd; }
code, pre, td.mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono", monospace;
                     font-size: 0.9em; }
.verdict { padding: 0.7em 1em; border-radius: 6px; font-weight: 600; margin: 1em 0; }
.verdict.nondeterministic { background: #fdecea; border-left: 6px solid #d62728; }
.verdict.deterministic { background: #e9f6ec; border-left: 6px solid #2ca02c; }
.verdict.drift { background: #fdecea; border-left: 6px solid #d62728; }
.verdict.identical { background: #e9f6ec; border-left: 6px solid #2ca02c; }
.verdict.latent, .verdict.within-tolerance { background: #fcf8e3; border-left: 6px solid #c09853; }
.verdict.diverges { background: #fdecea; border-left: 6px solid #d62728; }
.verdict.equivalent { background: #e9f6ec; border-left: 6px solid #2ca02c; }
.verdict.error { background: #fcf8e3; border-left: 6px solid #c09853; }
table { border-collapse: collapse; margin: 0.6em 0; }
th, td { border: 1px solid #d8d8d8; padding: 4px 9px; text-align: left; vertical-align: top; }
th { background: #f5f5f7; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.root td, tr.first td { background: #fdecea; } tr.downstream td { color: #666; }
pre.output { background: #f7f7f9; border: 1px solid #e2e2e2; padding: 0.5em 0.8em; overflow-x: auto; }
.cause { border: 1px solid #e2e2e2; border-radius: 6px; padding: 0.2em 1em 0.8em; margin: 1em 0; }
.cause h3 { font-size: 1em; margin: 0.7em 0 0.3em; } .code { color: #d62728; }
pre.source { background: #f7f7f9; border: 1px solid #e2e2e2; padding: 0.5em 0; overflow-x: auto; }
pre.source span { display: block; padding: 0 0.8em; white-space: pre; }
pre.source span.hit { background: #fde2e0; font-weight: 600; }
.muted { color: #666; } .missing { color: #8a6d3b; background: #fcf8e3; padding: 0.5em 0.8em; border-radius: 4px; }
figure { margin: 0.5em 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.92em; max-width: 60em; }
details summary { cursor: pointer; color: #444; }
"""


def write_run_html(report: RunReport, path: str | Path, *, source_root: str | Path | None = None) -> Path:
    """Write ``report`` as a self-contained page to ``path``; source files
    named by relative paths are read from ``source_root`` (default: the
    working directory, where ``detaudit run`` ran the script)."""
    path = Path(path)
    path.write_text(run_html(report, source_root=source_root), encoding="utf-8")
    return path


def run_html(report: RunReport, *, source_root: str | Path | None = None) -> str:
    root = Path(source_root) if source_root is not None else Path.cwd()
    title = f"detaudit run: {report.target}"
    body = [
        f"<h1>{_text(title)}</h1>",
        f'<p class="muted">{_facts(report)}</p>',
        f'<div class="verdict {report.verdict}" id="verdict">{_text(report.verdict_line())}</div>',
    ]
    if report.divergence is not None:
        body.append(_divergence_section(report.divergence))
    if report.root_causes:
        body.append(_root_causes_section(report.root_causes, root))
    if report.tensors:
        body.append(_tensors_section(report.tensors))
    if report.notes:
        body.append(_list_section("Notes", report.notes))
    if report.environment:
        body.append(_environment_section(report.environment, report.environment_differences))
    return _page(title, body)


def _list_section(title: str, items: list[str]) -> str:
    return f"<h2>{title}</h2><ul>" + "".join(f"<li>{_text(item)}</li>" for item in items) + "</ul>"


def write_resume_html(report: ResumeReport, path: str | Path, *, source_root: str | Path | None = None) -> Path:
    """Write the ``detaudit resume`` report as a self-contained page to
    ``path``; the checkpoint's source lines named by relative paths are read
    from ``source_root`` (default: the working directory, where the script ran)."""
    path = Path(path)
    path.write_text(resume_html(report, source_root=source_root), encoding="utf-8")
    return path


def resume_html(report: ResumeReport, *, source_root: str | Path | None = None) -> str:
    root = Path(source_root) if source_root is not None else Path.cwd()
    title = f"detaudit resume: {report.script}"
    body = [
        f"<h1>{_text(title)}</h1>",
        f'<p class="muted">{_resume_facts(report)}</p>',
        f'<div class="verdict {report.verdict}" id="verdict">{_text(report.verdict_line())}</div>',
    ]
    if report.verdict == ERROR:
        output = report.error.partition("\n")[2].strip("\n")
        if output:
            body.append(f'<h2>What failed</h2>\n<pre class="output" id="error-output">{_text(output)}</pre>')
    if report.differences:
        body.append(_differences_section(report))
    if report.saved_at or report.loaded_at:
        body.append(_checkpoint_section(report, root))
    if report.warnings:
        body.append(_list_section("Warnings", report.warnings))
    if report.environment:
        body.append(_environment_section(report.environment, {}, column="value in the straight run"))
    return _page(title, body)


def _page(title: str, body: list[str]) -> str:
    """The page around ``body``'s sections: one file, styles inline."""
    body = [*body, f'<p class="muted">Written by detaudit {_text(__version__)}.</p>']
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{_text(title)}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )


# -- sections -------------------------------------------------------------
def _facts(report: RunReport) -> str:
    facts = [f"{report.repeats} runs", f"{report.traced_ops} ops traced per run"]
    if report.steps:
        facts.insert(1, f"{report.steps} steps each")
    if report.variation:
        facts.append(f"varied: {report.variation.get('vary')} {report.variation.get('settings')}")
    return _text(" · ".join(facts))


def _divergence_section(divergence: Divergence) -> str:
    from detaudit.report.divergence_chart import INSTALL_HINT, divergence_png

    parts = ["<h2>Where the runs part ways</h2>"]
    png = divergence_png(divergence)
    caption = _divergence_caption(divergence)
    if png is not None:
        data = base64.b64encode(png).decode("ascii")
        parts.append(
            f'<figure id="divergence-chart"><img alt="divergence chart" src="data:image/png;base64,{data}">'
            f"<figcaption>{_text(caption)}</figcaption></figure>"
        )
    else:
        parts.append(
            f'<p class="missing" id="divergence-chart-missing">The divergence chart needs matplotlib: '
            f"<code>{_text(INSTALL_HINT)}</code>, then run again.</p><p>{_text(caption)}</p>"
        )
    if not divergence.points:
        return "\n".join(parts)
    shown = divergence.points[:POINTS_LISTED]
    rows = [
        (
            [
                _cell(str(p.record), "num"),
                _cell("root cause" + (f" ({p.kind})" if p.kind else "") if p.status == ROOT else "propagated"),
                _cell(p.op, "mono"),
                _cell(p.phase),
                _cell(str(p.step), "num"),
                _cell(_location(p.path, p.line), "mono"),
                _number_cell(p.max_abs_diff, suffix=" (sampled)" if p.sampled else ""),
            ],
            "root" if p.status == ROOT else "",
        )
        for p in shown
    ]
    parts.append(
        _table(("#", "status", "op", "phase", "step", "location", "max |diff|"), rows, table_id="divergence-ops")
    )
    if len(divergence.points) > len(shown):
        parts.append(f'<p class="muted">… and {len(divergence.points) - len(shown)} more differing ops.</p>')
    return "\n".join(parts)


def _divergence_caption(divergence: Divergence) -> str:
    runs, steps = divergence.runs, divergence.steps
    sentences = [
        f"Runs {runs[0]} and {runs[1]}, step{'s' if len(steps) > 1 else ''} {' and '.join(map(str, steps))}: "
        "the ops in trace order."
    ]
    roots = [p for p in divergence.points if p.status == ROOT]
    if divergence.points:
        lines = len({(p.path, p.line) for p in roots})
        sentences.append(
            f"{divergence.equal_ops} ops were bitwise equal, {len(roots)} were root causes "
            f"(at {lines} source line{'s' if lines != 1 else ''}) and {len(divergence.points) - len(roots)} "
            "differed downstream of them. Each differing op's max |diff| was measured in a rerun of the pair that "
            "captured its outputs: exactly for root causes and small outputs, over evenly spaced elements of large "
            "ones (hollow: a lower bound)."
        )
    else:
        sentences.append(f"The first {divergence.equal_ops} ops were bitwise equal.")
    if divergence.control_flow_at is not None:
        sentences.append(
            f"From op {divergence.control_flow_at} on, the runs executed different ops and were not compared."
        )
    return " ".join(sentences)


def _root_causes_section(causes: Sequence[RootCause], root: Path) -> str:
    rows = [
        (
            [
                _cell(f"{cause.code} {cause.kind}"),
                _cell(cause.op, "mono"),
                _cell(_location(cause.path, cause.line), "mono"),
                _cell(cause.module or "-", "mono"),
                _cell(cause.phase),
                _cell(f"{cause.seen}/{cause.pairs} pairs", "num"),
                _number_cell(cause.max_abs_diff),
                _cell(str(cause.first_step), "num"),
            ],
            "",
        )
        for cause in causes
    ]
    header = ("kind", "op", "location", "module", "phase", "seen", "max |diff|", "step")
    parts = ["<h2>Root causes</h2>", _table(header, rows, table_id="root-causes")]
    for cause in causes:
        details = [*cause.details(), _sentence(cause.fix)]
        parts.append(
            '<div class="cause">'
            f'<h3><span class="code">{_text(cause.code)}</span> {_text(cause.kind)}: <code>{_text(cause.op)}</code> '
            f"at <code>{_text(_location(cause.path, cause.line))}</code></h3>"
            f"<p>{_text(cause.kind.summary)} {_text(' '.join(details))}</p>"
            f"{_source_excerpt(cause.path, cause.line, root)}</div>"
        )
    return "\n".join(parts)


def _tensors_section(tensors: Sequence[dict]) -> str:
    rows = [
        (
            [
                _cell(diff["name"], "mono"),
                _cell(str(diff["shape"]), "mono"),
                _cell(diff["dtype"]),
                _number_cell(diff["max_abs_diff"]),
                _number_cell(diff["max_rel_diff"]),
                _cell(str(diff["max_ulp"]), "num"),
                f'<td class="num" data-value="{diff["fraction_differing"]!r}">{diff["fraction_differing"]:.1%}</td>',
            ],
            "",
        )
        for diff in tensors
    ]
    header = ("tensor", "shape", "dtype", "max |diff|", "max rel", "max ULP", "elements differing")
    return "<h2>Differing tensors after the last step</h2>\n" + _table(header, rows, table_id="tensors")


def _resume_facts(report: ResumeReport) -> str:
    facts = [f"interrupted after step {report.interrupt_at}", f"{report.steps} steps straight"]
    if report.compared_steps:
        facts.append(f"steps {report.compared_range} compared")
    if report.checkpoint:
        facts.append(f"resumed from {report.checkpoint}")
    return _text(" · ".join(facts))


def _differences_section(report: ResumeReport) -> str:
    rows = []
    for difference in report.differences:
        names = difference.names[:NAMES_LISTED]
        more = len(difference.names) - len(names)
        listed = "<br>\n".join(_text(name) for name in names) + (f"<br>\n… and {more} more" if more else "")
        rows.append(
            (
                [
                    _cell(f"{COMPONENTS[difference.component].code} {difference.component}"),
                    _cell(str(difference.step), "num"),
                    _cell(difference.at),
                    f'<td class="mono">{listed}</td>',
                    _number_cell(difference.max_abs_diff),
                    _cell(describe_reader(difference.read_by) if difference.read_by else "-", "mono"),
                    _cell(DOWNSTREAM if difference.downstream else difference.meaning),
                    _cell("-" if difference.downstream else difference.fix),
                ],
                "downstream" if difference.downstream else "first",
            )
        )
    header = ("component", "step", "at", "what differs", "max |diff|", "first read by", "meaning", "fix")
    return (
        "<h2>What differs from the uninterrupted run</h2>\n"
        '<p class="muted">Each component at the first step boundary where it differs: <em>start</em> is the state '
        "as the step's update starts (its forward and backward done, its batch), <em>end</em> the state after its "
        "optimizer step. First read by: the first op after the resume that read it. Greyed: first "
        "differs after the first differences, and may follow from them.</p>\n"
        + _table(header, rows, table_id="differences")
    )


def _checkpoint_section(report: ResumeReport, root: Path) -> str:
    parts = ["<h2>The checkpoint</h2>"]
    for label, calls, purpose in (
        ("Saved at", report.saved_at, "where the interrupted run wrote it"),
        ("Loaded at", report.loaded_at, "where the resumed run read it"),
    ):
        if report.differences and label == "Saved at":
            purpose += ": what differs above must also be in it"
        for path, group in _nearby(calls):
            sites = ", ".join(
                f"<code>{_text(_location(call['path'], call['line']))}</code> ({_text(call['call'])})" for call in group
            )
            parts.append(
                f'<div class="cause {label.split()[0].lower()}"><h3>{label} {sites}</h3>'
                f"<p>{_text(_sentence(purpose))}</p>"
                f"{_source_excerpt(path, [call['line'] for call in group], root)}</div>"
            )
    return "\n".join(parts)


def _nearby(calls: Sequence[dict]) -> list[tuple[str, list[dict]]]:
    """The calls by file, those whose excerpts would overlap together."""
    groups: list[tuple[str, list[dict]]] = []
    for call in sorted(calls, key=lambda call: (call["path"], call["line"])):
        last = groups[-1] if groups else None
        if last and last[0] == call["path"] and call["line"] - last[1][-1]["line"] <= 2 * SOURCE_CONTEXT + 1:
            last[1].append(call)
        else:
            groups.append((call["path"], [call]))
    return groups


def _environment_section(environment: dict, differences: dict[str, list], *, column: str = "value in run 1") -> str:
    from detaudit.runtime.environment import summary

    # what the text report shows too: what decides reproducibility, and what differed between the runs
    essentials = summary(environment, also=differences).items()
    rows = [([_cell(key, "mono"), _cell(_setting(value), "mono")], "") for key, value in essentials]
    everything = [([_cell(key, "mono"), _cell(_setting(value), "mono")], "") for key, value in environment.items()]
    return (
        "<h2>Environment</h2>\n"
        + _table(("setting", column), rows, table_id="environment")
        + f"\n<details><summary>The whole fingerprint ({len(environment)} settings)</summary>\n"
        + _table(("setting", column), everything)
        + "</details>"
    )


def _source_excerpt(path: str, line: int | Sequence[int], root: Path) -> str:
    """The lines around ``path:line`` (or around several lines, each
    highlighted) as they are in the file now."""
    hits = {line} if isinstance(line, int) else set(line)
    line = min(hits) if hits else 0
    if not path or not line:
        return '<p class="muted">No source line: the op ran outside the user\'s code.</p>'
    file = Path(path) if Path(path).is_absolute() else root / path
    try:
        lines = file.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as error:
        reason = "not found" if isinstance(error, FileNotFoundError) else (error.strerror or type(error).__name__)
        return f'<p class="missing">Source not shown: {_text(str(file))}: {_text(reason)}.</p>'
    if max(hits) > len(lines):
        return (
            f'<p class="missing">Source not shown: {_text(path)} has {len(lines)} lines now, '
            f"fewer than {max(hits)} (it changed since the run).</p>"
        )
    first, last = max(1, line - SOURCE_CONTEXT), min(len(lines), max(hits) + SOURCE_CONTEXT)
    width = len(str(last))
    spans = [
        f"<span{_class('hit' if number in hits else '')}>{number:>{width}} | {_text(lines[number - 1])}</span>"
        for number in range(first, last + 1)
    ]
    return '<pre class="source">' + "".join(spans) + "</pre>"


# -- small helpers ----------------------------------------------------------
def _text(value: object) -> str:
    return html.escape(str(value), quote=True)


def _sentence(text: str) -> str:
    """A hint as a sentence of its own ("parallel accumulation ... kernel" -> "Parallel ... kernel.")."""
    text = text.strip()
    if not text:
        return text
    return text[0].upper() + text[1:] + ("" if text.endswith((".", "!", "?")) else ".")


def _location(path: str, line: int) -> str:
    return f"{path}:{line}" if line else (path or "-")


def _class(css_class: str) -> str:
    return f' class="{css_class}"' if css_class else ""


def _cell(text: str, css_class: str = "") -> str:
    return f"<td{_class(css_class)}>{_text(text)}</td>"


def _number_cell(value: float | None, suffix: str = "") -> str:
    """A deviation as the text report writes it, the exact value in ``data-value``."""
    if value is None:
        return '<td class="num" data-value="">-</td>'
    shown = f"{value:.3g}" if math.isfinite(value) else str(value)
    return f'<td class="num" data-value="{value!r}">{_text(shown + suffix)}</td>'


def _setting(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "-"
    return str(value)


def _table(header: Iterable[str], rows: Iterable[tuple[list[str], str]], *, table_id: str = "") -> str:
    attribute = f' id="{table_id}"' if table_id else ""
    head = "".join(f"<th>{_text(name)}</th>" for name in header)
    body = "".join(f"<tr{_class(css)}>{''.join(cells)}</tr>" for cells, css in rows)
    return f"<table{attribute}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
