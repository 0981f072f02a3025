"""`detaudit run --html`: one self-contained page whose numbers are the JSON
report's, with the source around each cause and a divergence chart that a
browser draws."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

import detaudit
from detaudit.report.html import run_html
from html_page import parse as _parse, rows as _rows

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = "fixtures/dynamic/index_put_backward.py"
# Debian's chromium package (what .ci/run installs); Chrome or Ubuntu's name for it where that is what there is
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
# colours only the chart draws: its forward and backward phase bands, the strip's propagated ops
FORWARD_BAND, BACKWARD_BAND, PROPAGATED_ORANGE = (0xEA, 0xF1, 0xFB), (0xFD, 0xF1, 0xE6), (0xFF, 0x7F, 0x0E)


@pytest.fixture(scope="module")
def index_put_run(tmp_path_factory):
    """One `detaudit run --format json --html` of the index_put race: (JSON report, page, stderr, page path)."""
    page = tmp_path_factory.mktemp("html") / "report.html"
    process = subprocess.run(
        [sys.executable, "-m", "detaudit", "run", FIXTURE, "--repeats", "2", "--format", "json", "--html", str(page)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert process.returncode == 1, process.stderr
    return json.loads(process.stdout), page.read_text(encoding="utf-8"), process.stderr, page


def test_the_page_is_well_formed_and_loads_nothing(index_put_run):
    _, page, stderr, path = index_put_run
    assert page.startswith("<!DOCTYPE html>") and f"detaudit: wrote {path}" in stderr
    parser = _parse(page)
    assert not re.search(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/", page, re.I), "a network address in the page"
    assert not re.search(r"<script|<link|<iframe|<object|<embed|@import|url\(", page, re.I)
    assert parser.links and all(value.startswith("data:image/png;base64,") for _, _, value in parser.links)


def test_its_numbers_are_the_json_reports(index_put_run):
    report, page, _, _ = index_put_run
    parser = _parse(page)
    [verdict] = parser.classes["verdict"]
    assert report["verdict"] == "nondeterministic" and verdict.startswith("nondeterministic: 2 runs of")
    counts = f"{report['propagated_ops']} ops differ downstream, {len(report['tensors'])} final tensors differ"
    assert counts in verdict

    [cause] = report["root_causes"]
    [row] = _rows(parser, "root-causes")
    texts = [text for text, _ in row]
    assert texts[:3] == [f"{cause['code']} {cause['kind']}", cause["op"], f"{cause['path']}:{cause['line']}"]
    assert texts[5] == f"{cause['seen']}/{cause['pairs']} pairs"
    assert float(row[6][1]) == cause["max_abs_diff"] and texts[6] == f"{cause['max_abs_diff']:.3g}"

    tensors = _rows(parser, "tensors")
    assert [row[0][0] for row in tensors] == [tensor["name"] for tensor in report["tensors"]]
    for row, tensor in zip(tensors, report["tensors"]):
        assert float(row[3][1]) == tensor["max_abs_diff"] and float(row[4][1]) == tensor["max_rel_diff"]
        assert row[5][0] == str(tensor["max_ulp"]) and float(row[6][1]) == tensor["fraction_differing"]

    points = report["divergence"]["points"]
    listed = _rows(parser, "divergence-ops")
    assert [int(row[0][0]) for row in listed] == [point["record"] for point in points][: len(listed)]
    for row, point in zip(listed, points):
        measured = point["max_abs_diff"]
        assert (row[6][1] or None) == (None if measured is None else repr(measured))
    # the chart's root point and the root-cause table show the same measurement
    assert points[0]["status"] == "root" and points[0]["max_abs_diff"] == cause["max_abs_diff"]
    assert f"{report['divergence']['equal_ops']} ops were bitwise equal" in page


def test_each_cause_shows_its_source_lines(index_put_run):
    _, page, _, _ = index_put_run
    parser = _parse(page)
    [excerpt] = parser.classes["source"]
    [hit] = parser.classes["hit"]
    source = (ROOT / FIXTURE).read_text().splitlines()
    assert hit == f"17 |     {source[16].strip()}" and "rows = table[token_ids]" in hit
    assert f"14 | {source[13]}".rstrip() in excerpt and f"20 |     {source[19].strip()}" in excerpt


def _reseeding_step():
    torch.seed()  # entropy: every repeat draws another dropout mask
    layer = torch.nn.Linear(8, 8)
    torch.nn.functional.dropout(layer(torch.ones(4, 8)), 0.5).sum().backward()
    return layer


@pytest.fixture(scope="module")
def rng_report():
    return detaudit.audit(_reseeding_step, repeats=2)


def test_a_missing_or_changed_source_file_is_said_so(rng_report, tmp_path):
    cause = rng_report.root_causes[0]
    moved = dataclasses.replace(rng_report, root_causes=[dataclasses.replace(cause, path="gone/train.py")])
    parser = _parse(run_html(moved, source_root=tmp_path))
    [missing] = [text for text in parser.classes["missing"] if "Source not shown" in text]
    assert str(tmp_path / "gone" / "train.py") in missing and "not found" in missing
    short = tmp_path / "train.py"
    short.write_text("import torch\n")
    changed = dataclasses.replace(rng_report, root_causes=[dataclasses.replace(cause, path="train.py")])
    assert "has 1 lines now, fewer than" in run_html(changed, source_root=tmp_path)


def test_without_matplotlib_everything_but_the_chart(rng_report, monkeypatch):
    with_chart = _parse(run_html(rng_report))
    for name in [name for name in sys.modules if name == "matplotlib" or name.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)  # import matplotlib now raises ImportError
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    page = run_html(rng_report)
    parser = _parse(page)
    missing = " ".join(parser.classes["missing"])
    assert parser.links == [] and "<img" not in page
    assert 'The divergence chart needs matplotlib: pip install "detaudit[plot]"' in missing
    assert with_chart.links and "needs matplotlib" not in " ".join(with_chart.classes.get("missing", []))
    assert parser.tables.keys() == with_chart.tables.keys()  # the tables all stay


@pytest.fixture(scope="module")
def chromium() -> str:
    for name in BROWSERS:
        found = shutil.which(name)
        # Ubuntu's chromium-browser can be a wrapper for a snap that is not there
        if found and subprocess.run([found, "--version"], capture_output=True, timeout=60).returncode == 0:
            return found
    pytest.skip("needs headless Chromium (Debian: apt-get install chromium)")


def test_a_browser_draws_the_chart(index_put_run, chromium, tmp_path):
    from PIL import Image

    _, _, _, page = index_put_run
    screenshot = tmp_path / "page.png"
    with tempfile.TemporaryDirectory(prefix="detaudit-chromium-") as profile:
        subprocess.run(
            [
                chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                f"--user-data-dir={profile}", f"--screenshot={screenshot}", "--window-size=1280,1400",
                "--hide-scrollbars", page.as_uri(),
            ],
            capture_output=True,
            timeout=120,
            check=True,
        )
    image = Image.open(screenshot).convert("RGB")
    pixels = image.load()
    band = [
        (x, y)
        for y in range(0, image.height, 2)
        for x in range(0, image.width, 2)
        if pixels[x, y] in (FORWARD_BAND, BACKWARD_BAND)
    ]
    assert band, "no phase band of the chart on the screen"
    left, top = min(x for x, _ in band), min(y for _, y in band)
    right, bottom = max(x for x, _ in band), max(y for _, y in band)
    assert right - left > 400 and bottom - top > 150, (left, top, right, bottom)  # the chart's plot area
    chart = image.crop((left, top, right + 1, bottom + 1))
    colours = chart.getcolors(maxcolors=1 << 16)
    assert colours is not None and len(colours) > 20  # markers, grid, strip and labels, not a flat box
    assert any(colour == PROPAGATED_ORANGE for _, colour in colours), "the propagated ops are not drawn"
