"""`detaudit resume`'s page (``resume_html``): the run page's style and
skeleton, with the components that differ, their fix, the checkpoint's save
and load lines with their source, and what failed.  Two real audits of the
resume fixture (one diverging, one equivalent); the error and escaping cases
are reports built directly."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from detaudit.report.html import NAMES_LISTED, resume_html, write_resume_html
from detaudit.resume.audit import audit_resume
from detaudit.resume.compare import Difference
from detaudit.resume.components import COMPONENTS
from detaudit.resume.report import DOWNSTREAM, ResumeReport, describe_reader
from html_page import parse, rows

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "resume" / "checkpointed_training.py"
SOURCE = FIXTURE.read_text().splitlines()


def _audit(tmp_path_factory, forget: str) -> tuple[ResumeReport, str]:
    folder = tmp_path_factory.mktemp(f"resume-{forget}")
    report = audit_resume(FIXTURE, 4, "--resume", steps=8, script_args=["--forget", forget], cwd=folder, timeout=300)
    page = write_resume_html(report, folder / "resume.html")
    return report, page.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def diverging(tmp_path_factory):
    """The checkpoint leaves out the torch RNG state: torch-rng, then the batch, differ as step 5 starts."""
    return _audit(tmp_path_factory, "torch-rng")


@pytest.fixture(scope="module")
def equivalent(tmp_path_factory):
    return _audit(tmp_path_factory, "none")


def _line_of(text: str) -> int:
    return next(number for number, line in enumerate(SOURCE, 1) if text in line)


def _hit(number: int) -> str:
    return f"{number} | {SOURCE[number - 1]}"


def test_a_diverging_resume_names_each_component_its_step_and_fix(diverging):
    report, page = diverging
    assert report.verdict == "diverges" and page.startswith("<!DOCTYPE html>")
    parser = parse(page)
    assert not re.search(r"https?://|<script|<link|<iframe|@import|url\(", page, re.I), "the page loads something"
    assert parser.links == []
    [verdict] = parser.classes["verdict"]
    assert verdict == report.verdict_line() and 'class="verdict diverges"' in page
    assert (
        f"interrupted after step 4 · 8 steps straight · steps 5-8 compared · resumed from {report.checkpoint}"
        in parser.classes["muted"]
    )

    table = rows(parser, "differences")
    assert [row[0][0] for row in table] == [f"{COMPONENTS[d.component].code} {d.component}" for d in report.differences]
    assert table[0][0][0] == "RES001 torch-rng"
    for row, difference in zip(table, report.differences):
        texts = [text for text, _ in row]
        assert texts[1:3] == [str(difference.step), difference.at]
        assert texts[3].splitlines() == difference.names[:NAMES_LISTED]
        measured = difference.max_abs_diff
        assert (row[4][1] or None) == (None if measured is None else repr(measured))
        assert texts[5] == (describe_reader(difference.read_by) if difference.read_by else "-")
        if difference.downstream:
            assert texts[6:] == [DOWNSTREAM, "-"]
        else:
            assert texts[6:] == [difference.meaning, difference.fix]
    assert table[0][7][0] == COMPONENTS["torch-rng"].fix
    assert table[0][5][0].startswith("aten::") and "(model.2)" in table[0][5][0]  # the dropout draws first
    batch = next(d for d in report.differences if d.component == "batch")
    assert batch.max_abs_diff is not None and f"{batch.max_abs_diff:.3g}" in [row[4][0] for row in table]
    downstream = [d for d in report.differences if d.downstream]
    assert downstream and len(parser.classes["downstream"]) == len(downstream)
    assert len(parser.classes["first"]) == len(report.differences) - len(downstream)


def test_the_checkpoint_lines_are_shown_with_their_source(diverging):
    report, page = diverging
    parser = parse(page)
    save, loads = _line_of("torch.save("), [call["line"] for call in report.loaded_at]
    assert [call["line"] for call in report.saved_at] == [save] and _line_of("torch.load(") in loads
    [saved] = parser.classes["saved"]
    assert f"{FIXTURE}:{save} (torch.save)" in saved and "what differs above must also be in it" in saved
    # the three nearby load calls in one excerpt, each highlighted
    [loaded] = parser.classes["loaded"]
    assert all(f"{FIXTURE}:{line}" in loaded for line in loads)
    assert len(parser.classes["source"]) == 2
    assert parser.classes["hit"] == [_hit(save), *(_hit(line) for line in sorted(loads))]
    assert _hit(save - 1) in parser.classes["source"][0]  # the lines around it too


def test_an_equivalent_resume(equivalent):
    report, page = equivalent
    assert (report.verdict, report.differences) == ("equivalent", [])
    parser = parse(page)
    [verdict] = parser.classes["verdict"]
    assert verdict.startswith("equivalent: checkpointed_training.py interrupted after step 4") and "5-8" in verdict
    assert "differences" not in parser.tables and "What failed" not in page
    assert "what differs above" not in parser.classes["saved"][0]  # nothing to add to the checkpoint
    assert parser.classes["hit"][0] == _hit(_line_of("torch.save("))
    assert rows(parser, "environment") and "<th>value in the straight run</th>" in page


def test_an_error_shows_what_failed_and_the_runs_output_escaped():
    error = (
        "the resumed run of the script exited with code 1\n"
        "Traceback (most recent call last):\n"
        "  File \"train.py\", line 3, in <module>\n"
        "FileNotFoundError: <script>alert('missing-2.pt')</script> & more"
    )
    report = ResumeReport("train<1>.py", 2, 4, "error", error=error, warnings=["a <b>warning</b> & more"])
    # the text report keeps the whole output
    assert report.text() == f"error: {error}\nwarning: a <b>warning</b> & more"
    page = resume_html(report)
    parser = parse(page)
    assert parser.classes["verdict"] == ["error: the resumed run of the script exited with code 1"]
    assert 'class="verdict error"' in page
    [output] = parser.classes["output"]
    assert output == error.partition("\n")[2]
    assert "<script>" not in page and "&lt;script&gt;alert(&#x27;missing-2.pt&#x27;)&lt;/script&gt; &amp; more" in page
    assert "<h1>detaudit resume: train&lt;1&gt;.py</h1>" in page
    assert "a &lt;b&gt;warning&lt;/b&gt; &amp; more" in page
    assert "differences" not in parser.tables and "The checkpoint" not in page and "Environment" not in page
    # an error without output (the resume arguments loaded nothing): the headline only
    quiet = ResumeReport("train.py", 2, 4, "error", error="the resumed run loaded no checkpoint")
    assert "What failed" not in resume_html(quiet)


def test_relative_paths_are_read_from_the_source_root_and_names_are_escaped(tmp_path):
    (tmp_path / "train.py").write_text("import torch\n\nif a < b:  # \"quoted\" & more\n    torch.save(state, path)\n")
    names = [f"model.layer<{i}>.weight" for i in range(NAMES_LISTED + 3)]
    report = ResumeReport(
        "train.py", 2, 4, "diverges",
        [Difference("parameters", 3, "end", names)],
        [{"call": "torch.save", "path": "train.py", "line": 4, "run": "interrupted"},
         {"call": "torch.load", "path": "gone.py", "line": 7, "run": "resumed"}],
        compared_steps=[3, 4],
    )
    parser = parse(resume_html(report, source_root=tmp_path))
    [row] = rows(parser, "differences")
    assert row[3][0].splitlines() == [*names[:NAMES_LISTED], "… and 3 more"]
    assert parser.classes["hit"] == ["4 |     torch.save(state, path)"]
    assert '3 | if a < b:  # "quoted" & more' in parser.classes["source"][0]
    [missing] = parser.classes["missing"]
    assert f"{tmp_path / 'gone.py'}: not found" in missing


def test_the_cli_writes_the_page_beside_its_usual_output(tmp_path, monkeypatch, capsys):
    from detaudit.cli import main

    monkeypatch.chdir(tmp_path)
    code = main(["resume", str(FIXTURE), "--interrupt-at", "4", "--resume-args=--resume", "--html", "resume.html",
                 "--", "--forget", "scheduler"])
    captured = capsys.readouterr()
    assert code == 1 and captured.out.startswith("diverges:")
    assert "detaudit: wrote resume.html" in captured.err
    page = parse((tmp_path / "resume.html").read_text(encoding="utf-8"))
    assert rows(page, "differences")[0][0][0] == "RES005 scheduler"
