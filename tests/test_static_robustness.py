"""`detaudit check` on bad input and its own faults (issue 9): nothing crashes,
nothing hangs, nothing is lost, and an internal error is never a clean pass.

Each test names the issue item it pins down; each failed before its fix.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from detaudit.cli import main
from detaudit.static.engine.check import check_file

REPO = Path(__file__).resolve().parent.parent
HAZARD = "import torch\ntorch.backends.cudnn.benchmark = True\n"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def detaudit(*args: str, cwd: Path, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("FORCE_COLOR", None)
    return subprocess.run(
        [*prefix, sys.executable, "-m", "detaudit", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def report_of(result: subprocess.CompletedProcess) -> dict:
    assert result.stdout, result.stderr
    return json.loads(result.stdout)


def paths_with_findings(report: dict) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for finding in report["findings"]:
        found.setdefault(finding["path"], []).append(finding["name"])
    return found


def without_file_permissions() -> tuple[str, ...]:
    """A command prefix under which file permissions apply: root reads a mode-000
    directory anyway, so as root the command runs without the capabilities that
    bypass permission checks."""
    if os.name != "posix":
        pytest.skip("POSIX permissions")
    if os.geteuid() != 0:
        return ()
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: permissions cannot be enforced")
    capabilities = "-dac_override,-dac_read_search"
    return ("setpriv", f"--bounding-set={capabilities}", f"--inh-caps={capabilities}")


# -- item 1: an internal error in a rule ---------------------------------------------


@pytest.fixture
def crashing_rules():
    """Two rules registered for one test: one raises in a visitor hook, one in finish()."""
    from detaudit.static.rule import RULES, Rule

    class CrashesInVisit(Rule):
        code = "DET998"
        name = "test-crashes-in-visit"
        summary = rationale = fix_hint = "a rule that raises (test only)"

        def visit_Call(self, node) -> None:
            raise ZeroDivisionError("boom in visit")

    class CrashesInFinish(Rule):
        code = "DET999"
        name = "test-crashes-in-finish"
        summary = rationale = fix_hint = "a rule that raises (test only)"

        def finish(self) -> None:
            raise KeyError("boom in finish")

    yield CrashesInVisit, CrashesInFinish
    for rule in (CrashesInVisit, CrashesInFinish):
        del RULES[rule.code], RULES[rule.name]


def test_rule_crash_is_exit_2_with_one_line_naming_file_and_rule(tmp_path, crashing_rules, capsys, monkeypatch):
    write(tmp_path / "a_train.py", HAZARD + "print(1)\n")
    write(tmp_path / "b_other.py", HAZARD + "print(2)\n")
    monkeypatch.chdir(tmp_path)
    code = main(["check", "--no-cache", "--jobs", "1", "--format", "json", "."])
    captured = capsys.readouterr()
    assert code == 2
    report = json.loads(captured.out)
    # every other rule still reports, in both files
    assert paths_with_findings(report) == {"a_train.py": ["cudnn-benchmark"], "b_other.py": ["cudnn-benchmark"]}
    errors = [line for line in captured.err.splitlines() if "internal error" in line]
    assert len(errors) == 4, captured.err  # two rules, two files
    assert any(line.startswith("detaudit: error: a_train.py: internal error in rule test-crashes-in-visit (DET998): ZeroDivisionError: boom in visit")
               for line in errors), errors
    assert any(line.startswith("detaudit: error: a_train.py: internal error in rule test-crashes-in-finish (DET999): KeyError:")
               for line in errors), errors
    assert report["summary"]["errors"] == [line.removeprefix("detaudit: error: ") for line in errors]


def test_rule_crash_result_is_not_cached(tmp_path, crashing_rules, capsys, monkeypatch):
    write(tmp_path / "pyproject.toml", "[project]\nname = 'x'\n")
    write(tmp_path / "train.py", HAZARD)
    monkeypatch.chdir(tmp_path)
    assert main(["check", "--jobs", "1", "-q", "."]) == 2
    assert main(["check", "--jobs", "1", "-q", "."]) == 2, "a cached result hid the internal error"
    assert "internal error in rule test-crashes-in-finish" in capsys.readouterr().err.splitlines()[-1]


def test_seed_rules_on_module_level_elif_never_give_a_clean_pass(tmp_path):
    """Item 1's reproduction.  The seed rules crashed on it (an IndentedBlock
    iterated as statements); the walker rewrite fixes the crash, and from then
    on this must report the missing seed.  Either way: never "no findings", exit 0."""
    write(tmp_path / "a_elif.py", "import torch\nif a:\n    pass\nelif b:\n    pass\nx = torch.randn(3)\nfor i in range(3):\n    torch.randn(2)\n")
    write(tmp_path / "b_other.py", HAZARD)
    result = detaudit("check", "--no-cache", "--format", "json", ".", cwd=tmp_path)
    report = report_of(result)
    found = paths_with_findings(report)
    assert found["b_other.py"] == ["cudnn-benchmark"]
    errors = [line for line in result.stderr.splitlines() if "internal error" in line]
    if errors:
        assert result.returncode == 2
        assert all(line.startswith("detaudit: error: a_elif.py: internal error in rule ") for line in errors), errors
    else:
        assert result.returncode == 1 and "missing-torch-seed" in found.get("a_elif.py", [])


# -- item 2: expressions libcst parses in quadratic time, and the per-file time budget ---


def chain(terms: int, term: str = "torch.randn(1)") -> str:
    return " + ".join([term] * terms)


def test_an_expression_too_deep_for_libcst_is_left_out_and_the_rest_checked(tmp_path):
    """2,000 terms: libcst took about 20 s to parse them; now Python's parser
    measures the expression (nested 2,003 levels) and it is not parsed."""
    text = f"import torch\nx = {chain(2000)}\ntorch.backends.cudnn.benchmark = True\n"
    path = write(tmp_path / "train.py", text)
    findings = check_file(path, "train.py", tmp_path).findings
    assert [(f.name, f.line, f.column) for f in findings] == [("parse-error", 2, 5), ("cudnn-benchmark", 3, 1)]
    assert findings[0].message.startswith("expression not analysed: nested 2003 levels deep (the limit is 200)")
    result = detaudit("check", "--no-cache", "--fix", "train.py", cwd=tmp_path)
    assert path.read_text() == text, "a file with a left-out expression is never rewritten"
    assert "train.py: not fixed: part of it was not analysed" in result.stderr


@pytest.mark.parametrize(
    "template",
    [
        "def step():\n    x = {chain}\n    return x\n",  # indented in a block
        "def step(\n    x={chain},\n):\n    return x\n",  # a compound statement's header
        "if ({chain}) > 0:\n    pass\n",
        "@decorate({chain})\ndef step():\n    pass\n",
        '"""Docs (with an open bracket\nthat joins lines."""\nx = {chain}\n',  # its bracket joins lines
        "for i in range(3):\n    x = [\n        {chain},\n    ]\n",
    ],
)
def test_an_expression_over_the_limits_is_found_wherever_its_logical_line_stands(tmp_path, template):
    """Long logical lines are first parsed on their own; the whole file is
    parsed when one does not parse alone or is over a limit, so that the
    expression is left out exactly as before."""
    body = template.format(chain=chain(300))
    path = write(tmp_path / "train.py", "import torch\n" + body + "torch.backends.cudnn.benchmark = True\n")
    findings = check_file(path, "train.py", tmp_path).findings
    assert [f.name for f in findings] == ["parse-error", "cudnn-benchmark"]
    assert findings[0].message.startswith("expression not analysed: nested") and findings[1].line == body.count("\n") + 2


def test_left_out_expression_keeps_lines_and_columns_around_it(tmp_path):
    """The placeholder has the expression's shape: what follows it on its last
    line, and every later line, is located exactly (multi-byte text included)."""
    text = (
        "import torch\n"
        f"x = ('é' +  # the chain starts\n    {chain(600)}\n    + torch.randn(1)); torch.backends.cudnn.benchmark = True\n"
        "torch.backends.cuda.matmul.allow_tf32 = True\n"
    )
    path = write(tmp_path / "train.py", text)
    found = [(f.name, f.line, f.column) for f in check_file(path, "train.py", tmp_path).findings]
    assert found == [("parse-error", 2, 6), ("cudnn-benchmark", 4, 24), ("tf32", 5, 1)]


def test_left_out_expression_finding_can_be_suppressed(tmp_path):
    path = write(tmp_path / "train.py", f"import torch\nx = {chain(300)}  # detaudit: ignore[parse-error] -- generated\n")
    result = check_file(path, "train.py", tmp_path)
    assert result.findings == [] and [f.name for f in result.suppressed] == ["parse-error"]


def test_an_expression_predicted_over_the_budget_is_left_out(tmp_path):
    """190 levels (under the depth limit) of 20-element lists: about 0.5 M units
    of parse cost, predicted at about 2 s, over a 1 s budget."""
    term = "[" + ", ".join(str(i) for i in range(20)) + "]"
    write(tmp_path / "pyproject.toml", "[tool.detaudit]\nfile-time-budget = 1\n")
    write(tmp_path / "train.py", f"import torch\nx = {chain(190, term)}\ntorch.backends.cudnn.benchmark = True\n")
    result = detaudit("check", "--no-cache", "--format", "json", "train.py", cwd=tmp_path)
    findings = report_of(result)["findings"]
    assert [(f["name"], f["line"]) for f in findings] == [("parse-error", 2), ("cudnn-benchmark", 3)]
    assert "(the per-file time budget is 1 s)" in findings[0]["message"]


def test_analysis_over_the_time_budget_is_a_parse_error_and_not_cached(tmp_path):
    write(tmp_path / "pyproject.toml", "[project]\nname = 'x'\n")
    write(tmp_path / "a.py", HAZARD)
    write(tmp_path / "b.py", "def add(a, b):\n    return a + b\n")
    over = detaudit("check", "--format", "json", "--file-time-budget", "1e-9", ".", cwd=tmp_path)
    assert over.returncode == 1, over.stderr
    report = report_of(over)
    assert report["files_checked"] == 2
    (finding,) = report["findings"]
    assert (finding["path"], finding["name"]) == ("a.py", "parse-error")
    assert finding["message"] == "analysis stopped: it took longer than the per-file time budget (1e-09 s)"
    again = detaudit("check", "--format", "json", ".", cwd=tmp_path)
    assert [f["name"] for f in report_of(again)["findings"]] == ["cudnn-benchmark"]


@pytest.mark.parametrize("budget", ["0", "-1", "soon", "inf"])
def test_bad_budget_is_a_usage_error(tmp_path, budget):
    write(tmp_path / "train.py", HAZARD)
    result = detaudit("check", "--no-cache", "--file-time-budget", budget, "train.py", cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.startswith("detaudit: error: --file-time-budget: ")


# -- item 3: a notebook whose cell source holds a non-string ---------------------------


def test_notebook_cell_source_with_a_non_string_is_a_parse_error(tmp_path):
    write(tmp_path / "a.ipynb", '{"cells":[{"cell_type":"code","source":["import torch\\n", 5]}],"nbformat":4}')
    write(tmp_path / "b.py", HAZARD)
    result = detaudit("check", "--no-cache", "--format", "json", ".", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    found = {f["path"]: f for f in report_of(result)["findings"]}
    assert found["a.ipynb"]["name"] == "parse-error" and "cell 1" in found["a.ipynb"]["message"]
    assert found["b.py"]["name"] == "cudnn-benchmark"


# -- item 4: a directory that cannot be read --------------------------------------------


def test_unreadable_directory_is_skipped_with_a_warning(tmp_path):
    prefix = without_file_permissions()
    write(tmp_path / "a.py", HAZARD)
    write(tmp_path / "locked" / "b.py", HAZARD)
    write(tmp_path / "venvlike" / "lib" / "c.py", HAZARD)
    (tmp_path / "locked").chmod(0)
    (tmp_path / "venvlike").chmod(0)  # discovery looks for venvlike/pyvenv.cfg
    try:
        result = detaudit("check", "--no-cache", "--format", "json", ".", cwd=tmp_path, prefix=prefix)
    finally:
        (tmp_path / "locked").chmod(0o755)
        (tmp_path / "venvlike").chmod(0o755)
    assert result.returncode == 1, result.stderr
    assert list(paths_with_findings(report_of(result))) == ["a.py"]
    warnings = [line for line in result.stderr.splitlines() if "cannot read directory" in line]
    assert warnings == [
        "detaudit: warning: cannot read directory locked: Permission denied; skipped",
        "detaudit: warning: cannot read directory venvlike: Permission denied; skipped",
    ], result.stderr


# -- item 5: pyproject.toml that is not a usable config ---------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("[tool]\ndetaudit = 5\n", ":2: [tool.detaudit] must be a table"),
        ("tool = 5\n", ":1: [tool] must be a table"),
        ('tool = "detaudit"\n', ":1: [tool] must be a table"),
        ("[project]\nname = 'x'\n\n[tool.detaudit]\nselect = [\n", ":6: invalid TOML: "),
        ("[tool.detaudit]\nselect = 5\n", ":2: select must be a list of strings"),
        ("[tool.detaudit]\nfail-on = 'loud'\n", ":2: fail-on: unknown severity 'loud'"),
    ],
    ids=["detaudit-not-a-table", "tool-an-integer", "tool-a-string", "invalid-toml", "select-an-integer", "bad-severity"],
)
def test_bad_pyproject_is_a_one_line_usage_error(tmp_path, content, expected):
    write(tmp_path / "pyproject.toml", content)
    write(tmp_path / "train.py", HAZARD)
    result = detaudit("check", "--no-cache", "train.py", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(f"detaudit: error: {tmp_path / 'pyproject.toml'}{expected}"), result.stderr


def test_invalid_pyproject_is_not_skipped_for_a_parent_config(tmp_path):
    write(tmp_path / "pyproject.toml", "[tool.detaudit]\nignore = ['cudnn-benchmark']\n")
    write(tmp_path / "pkg" / "pyproject.toml", "[project\n")
    write(tmp_path / "pkg" / "train.py", HAZARD)
    result = detaudit("check", "--no-cache", "train.py", cwd=tmp_path / "pkg")
    assert result.returncode == 2
    assert result.stderr.startswith(f"detaudit: error: {tmp_path / 'pkg' / 'pyproject.toml'}:1: invalid TOML: ")


# -- item 6: a cache file with the wrong structure ---------------------------------------


def _corruptions(entries: dict) -> list:
    (path,) = entries
    entry = entries[path]
    missing_field = json.loads(json.dumps(entries))
    del missing_field[path]["result"]["parsed"]
    bad_severity = json.loads(json.dumps(entries))
    bad_severity[path]["result"]["findings"][0]["severity"] = "catastrophic"
    wrong_types = json.loads(json.dumps(entries))
    wrong_types[path]["result"]["findings"][0]["line"] = "two"
    unknown_field = json.loads(json.dumps(entries))
    unknown_field[path]["result"]["findings"][0]["colour"] = "red"
    return [
        [], 5, "text", None, {path: []}, {path: {}}, {path: {**entry, "dependencies": 3}},
        {path: {**entry, "result": []}}, missing_field, bad_severity, wrong_types, unknown_field,
    ]


def test_structurally_wrong_cache_entries_are_recomputed(tmp_path):
    write(tmp_path / "pyproject.toml", "[project]\nname = 'x'\n")
    write(tmp_path / "train.py", HAZARD)
    clean = detaudit("check", "--format", "json", ".", cwd=tmp_path)
    expected = report_of(clean)["findings"]
    (cache_file,) = (tmp_path / ".detaudit_cache").glob("results-*.json")
    entries = json.loads(cache_file.read_text())
    for corruption in _corruptions(entries):
        cache_file.write_text(json.dumps(corruption))
        result = detaudit("check", "--format", "json", ".", cwd=tmp_path)
        assert (result.returncode, report_of(result)["findings"]) == (1, expected), (corruption, result.stderr)
        assert json.loads(cache_file.read_text()) == entries, "the recomputed result replaces the bad entry"


# -- item 7: --fix and the file's identity -----------------------------------------------


FIXED = "import torch\ntorch.backends.cudnn.benchmark = False\n"


def test_fix_leaves_a_read_only_file_alone_with_a_message(tmp_path):
    path = write(tmp_path / "train.py", HAZARD)
    path.chmod(0o444)
    result = detaudit("check", "--no-cache", "--fix", "train.py", cwd=tmp_path)
    assert path.read_text() == HAZARD and path.stat().st_mode & 0o777 == 0o444
    assert "detaudit: train.py: read-only; not fixed" in result.stderr
    assert "Fixed 0 findings; 1 remaining." in result.stderr
    assert result.returncode == 1


@pytest.mark.skipif(os.name != "posix" or os.geteuid() != 0, reason="only root can hand a file to another user")
def test_fix_keeps_owner_and_group(tmp_path):
    path = write(tmp_path / "train.py", HAZARD)
    os.chown(path, 65534, 65534)
    detaudit("check", "--no-cache", "--fix", "train.py", cwd=tmp_path)
    assert path.read_text() == FIXED
    assert (path.stat().st_uid, path.stat().st_gid) == (65534, 65534)


def test_fix_keeps_hard_links(tmp_path):
    path = write(tmp_path / "train.py", HAZARD)
    other = tmp_path / "elsewhere" / "same.py"
    other.parent.mkdir()
    os.link(path, other)
    detaudit("check", "--no-cache", "--fix", "train.py", cwd=tmp_path)
    assert path.read_text() == FIXED and other.read_text() == FIXED
    assert path.stat().st_ino == other.stat().st_ino and path.stat().st_nlink == 2


def test_fix_keeps_the_final_carriage_return_of_a_cr_only_file(tmp_path):
    path = tmp_path / "train.py"
    path.write_bytes(HAZARD.replace("\n", "\r").encode())
    detaudit("check", "--no-cache", "--fix", "train.py", cwd=tmp_path)
    assert path.read_bytes() == FIXED.replace("\n", "\r").encode()


def test_cr_only_file_is_located_by_its_lines(tmp_path):
    """libcst takes a lone CR as a newline; so do the findings' lines and columns."""
    path = tmp_path / "train.py"
    path.write_bytes(b"import torch\r\rx = 1; torch.backends.cudnn.benchmark = True\r")
    (finding,) = check_file(path, "train.py", tmp_path).findings
    assert (finding.line, finding.column, finding.end_line) == (3, 8, 3)


def test_text_libcst_drops_shifts_no_position_and_is_never_fixed_away(tmp_path):
    """libcst drops a line holding only a backslash before a statement (found by
    the fuzzer): repeated findings after it are located in the file's lines,
    not libcst's, and --fix, which writes libcst's code, leaves the file alone."""
    text = "import torch\n\\\nimport lightning as L\nx = L.Trainer(deterministic=False)\ny = L.Trainer(deterministic=False)\n"
    path = write(tmp_path / "train.py", text)
    found = [(f.name, f.line, f.column) for f in check_file(path, "train.py", tmp_path).findings]
    assert found == [("framework-determinism-off", 4, 29), ("framework-determinism-off", 5, 29)]
    result = detaudit("check", "--no-cache", "--fix", "--unsafe-fixes", "train.py", cwd=tmp_path)
    assert path.read_text() == text
    assert "libcst does not reproduce this file exactly" in result.stderr


# -- item 8: a path that does not exist --------------------------------------------------


def test_missing_path_is_reported_and_the_rest_checked(tmp_path):
    write(tmp_path / "train.py", HAZARD)
    result = detaudit("check", "--no-cache", "--format", "json", "nope.py", "train.py", "gone/", cwd=tmp_path)
    assert result.returncode == 2
    assert paths_with_findings(report_of(result)) == {"train.py": ["cudnn-benchmark"]}
    assert result.stderr.splitlines() == [
        "detaudit: error: no such file or directory: nope.py",
        "detaudit: error: no such file or directory: gone",
    ]
    assert report_of(result)["summary"]["errors"] == ["no such file or directory: nope.py", "no such file or directory: gone"]


# -- item 9: concurrent --fix runs ---------------------------------------------------------


def test_concurrent_fix_runs_report_only_what_each_fixed(tmp_path):
    files = [write(tmp_path / f"train_{i:02d}.py", HAZARD) for i in range(40)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "detaudit", "check", "--no-cache", "--jobs", "1", "--fix", "-q", "."]
    runs = [subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(3)]
    outputs = [run.communicate(timeout=300) for run in runs]
    fixed = []
    for _, err in outputs:
        (summary,) = [line for line in err.splitlines() if line.startswith("Fixed ")]
        fixed.append(int(summary.split()[1]))
    assert all(path.read_text() == FIXED for path in files)
    assert sum(fixed) == len(files), (fixed, [err for _, err in outputs])
