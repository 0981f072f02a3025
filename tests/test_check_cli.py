"""`detaudit check` end to end: spellings at exact lines, outputs, exit codes,
config, suppressions, bad input, caching, and the no-torch guarantee."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "fixtures" / "static" / "backends"
#: the fixtures of this file exercise these two rules; other rules have their own tests
BACKEND_RULES = ("--select", "cudnn-benchmark,tf32")


def detaudit(*args: str, cwd: Path = REPO, check: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("FORCE_COLOR", None)
    return subprocess.run(
        [sys.executable, "-m", "detaudit", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def json_findings(*args: str, cwd: Path = REPO) -> list[dict]:
    result = detaudit("check", "--format", "json", "--no-cache", *args, cwd=cwd)
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout)["findings"]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


HAZARD = "import torch\ntorch.backends.cudnn.benchmark = True\n"


def test_every_spelling_is_reported_at_its_line():
    findings = json_findings(*BACKEND_RULES, str(FIXTURES / "spellings.py"))
    got = [(f["line"], f["name"]) for f in findings]
    assert got == [
        (14, "cudnn-benchmark"), (15, "cudnn-benchmark"), (16, "cudnn-benchmark"), (17, "cudnn-benchmark"),
        (18, "cudnn-benchmark"), (20, "cudnn-benchmark"),
        (22, "tf32"), (23, "tf32"), (24, "tf32"), (25, "tf32"), (26, "tf32"), (27, "tf32"),
    ]


def test_lookalikes_are_not_reported():
    assert json_findings(*BACKEND_RULES, str(FIXTURES / "lookalikes.py")) == []


def test_json_shape_and_relative_paths(tmp_path):
    write(tmp_path / "pkg" / "train.py", HAZARD)
    result = detaudit("check", "--format", "json", "--no-cache", "pkg", cwd=tmp_path)
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert set(report) == {"version", "files_checked", "project_roots", "findings", "summary"}
    assert report["files_checked"] == 1
    assert report["project_roots"] == [{"path": str((tmp_path / "pkg").resolve()), "found_by": "the file's folder"}]
    (finding,) = report["findings"]
    assert {"code", "name", "severity", "path", "line", "column", "end_line", "end_column", "message", "fix_hint"} <= set(finding)
    assert finding["path"] == os.path.join("pkg", "train.py")
    assert (finding["line"], finding["column"], finding["code"]) == (2, 1, "DET010")
    assert report["summary"]["by_rule"] == {"cudnn-benchmark": 1}


def test_sarif_validates_against_the_official_schema():
    schema = json.loads((REPO / "tests" / "sarif-schema-2.1.0.json").read_text())
    result = detaudit("check", "--format", "sarif", "--no-cache", *BACKEND_RULES, str(FIXTURES))
    sarif = json.loads(result.stdout)
    jsonschema.validate(sarif, schema)
    run = sarif["runs"][0]
    rule_ids = [r["id"] for r in run["tool"]["driver"]["rules"]]
    assert rule_ids == sorted(set(rule_ids)) == ["DET010", "DET011"]  # each rule described once
    assert len(run["results"]) == 12


FIXABLE = {
    "train.py": (
        "import os\n"
        "import torch\n"
        "\n"
        'name = "données"; torch.backends.cudnn.benchmark = True  # faster convolutions\n'
        "torch.backends.cuda.matmul.allow_tf32 = True  # allow tf32 on matmul\n"
        "torch.set_float32_matmul_precision('high')\n"
        "torch.manual_seed(0)\n"
        "files = os.listdir('data')\n"
        "x = torch.load(files[0])\n"
    ),
    "model.py": "import torch\r\nfrom torch import nn\r\nmodel = nn.Linear(4, 2)\r\nmodel.weight.sum().backward()\r\n",
}


def apply_sarif_fixes(text: str, results: list[dict]) -> str:
    """The text with the replacements of every fix in ``results`` applied, as an
    editor would: regions are lines and code-point columns of the original text."""
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    replacements = [r for result in results for fix in result.get("fixes", ()) for change in fix["artifactChanges"] for r in change["replacements"]]
    offset = lambda line, column: starts[line - 1] + column - 1  # noqa: E731
    for replacement in sorted(replacements, key=lambda r: offset(r["deletedRegion"]["startLine"], r["deletedRegion"]["startColumn"]), reverse=True):
        region = replacement["deletedRegion"]
        start, end = offset(region["startLine"], region["startColumn"]), offset(region["endLine"], region["endColumn"])
        assert start <= end
        text = text[:start] + replacement["insertedContent"]["text"] + text[end:]
    return text


def test_sarif_fixes_are_what_fix_writes(tmp_path):
    """Each finding with a safe fix carries it in SARIF; applied as an editor
    would, the fixes give the file ``--fix`` writes (one fix per file here, or
    fixes that do not overlap).  The output still validates against the schema."""
    schema = json.loads((REPO / "tests" / "sarif-schema-2.1.0.json").read_text())
    for name, text in FIXABLE.items():
        with open(tmp_path / name, "w", encoding="utf-8", newline="") as stream:
            stream.write(text)
    result = detaudit("check", "--format", "sarif", "--no-cache", ".", cwd=tmp_path)
    sarif = json.loads(result.stdout)
    jsonschema.validate(sarif, schema)
    results = sarif["runs"][0]["results"]
    fixed_rules = {(r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"], r["ruleId"]) for r in results if r.get("fixes")}
    assert fixed_rules == {
        ("train.py", "DET010"), ("train.py", "DET011"), ("train.py", "DET031"), ("model.py", "DET001"),
    }
    assert all(r["fixes"][0]["artifactChanges"][0]["artifactLocation"]["uri"] == r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
               for r in results if r.get("fixes"))
    by_file = {name: [r for r in results if r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == name] for name in FIXABLE}
    suggested = {name: apply_sarif_fixes(text, by_file[name]) for name, text in FIXABLE.items()}
    fixed = detaudit("check", "--fix", "--no-cache", ".", cwd=tmp_path)
    assert fixed.returncode in (0, 1), fixed.stderr
    for name in FIXABLE:
        with open(tmp_path / name, encoding="utf-8", newline="") as stream:
            assert suggested[name] == stream.read(), name
    assert "torch.backends.cudnn.benchmark = False\n" in suggested["train.py"]  # after the non-ASCII string
    assert "import torch\r\nfrom torch import nn\r\n\r\ntorch.manual_seed(0)\r\n" in suggested["model.py"]


def test_output_file_in_a_missing_directory_is_created(tmp_path):
    """``-o reports/x.sarif`` creates ``reports/`` as ruff's ``--output-file`` does;
    a path that cannot be written is one line and exit 2, not a traceback."""
    write(tmp_path / "train.py", HAZARD)
    result = detaudit("check", "--no-cache", "--format", "sarif", "-o", "reports/ci/x.sarif", "train.py", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert json.loads((tmp_path / "reports" / "ci" / "x.sarif").read_text())["runs"][0]["results"]
    write(tmp_path / "blocker", "a file, not a directory")
    blocked = detaudit("check", "--no-cache", "-o", "blocker/x.sarif", "train.py", cwd=tmp_path)
    assert blocked.returncode == 2
    assert blocked.stderr.startswith("detaudit: error: cannot write the report to blocker/x.sarif")
    assert len(blocked.stderr.splitlines()) == 1 and "Traceback" not in blocked.stderr


def test_github_annotations(tmp_path):
    write(tmp_path / "train.py", HAZARD)
    result = detaudit("check", "--format", "github", "--no-cache", "train.py", cwd=tmp_path)
    assert result.stdout.startswith("::warning file=train.py,line=2,col=1,endLine=2,title=DET010 cudnn-benchmark::")


def test_text_output_shows_source_line_and_caret(tmp_path):
    write(tmp_path / "train.py", "import torch\nx = 1; torch.backends.cudnn.benchmark = True\n")
    result = detaudit("check", "--no-cache", "train.py", cwd=tmp_path)
    lines = result.stdout.splitlines()
    assert lines[0].startswith("train.py:2:8 DET010 cudnn-benchmark ")
    assert lines[1] == "2 | x = 1; torch.backends.cudnn.benchmark = True"
    assert lines[2] == "  |        ^"
    assert "\x1b[" not in result.stdout  # no colours into a pipe
    assert lines[-1].startswith("Checked 1 file in ") and "1 finding (1 cudnn-benchmark)" in lines[-1]


def test_exit_codes(tmp_path):
    write(tmp_path / "clean.py", "import torch\ntorch.manual_seed(0)\n")
    write(tmp_path / "bad.py", HAZARD)
    assert detaudit("check", "--no-cache", "clean.py", cwd=tmp_path).returncode == 0
    assert detaudit("check", "--no-cache", "bad.py", cwd=tmp_path).returncode == 1
    assert detaudit("check", "--no-cache", "--exit-zero", "bad.py", cwd=tmp_path).returncode == 0
    assert detaudit("check", "--no-cache", "--fail-on", "error", "bad.py", cwd=tmp_path).returncode == 0
    missing = detaudit("check", "nope.py", cwd=tmp_path)
    assert missing.returncode == 2
    assert missing.stderr.strip() == "detaudit: error: no such file or directory: nope.py"
    assert detaudit("check", "--fail-on", "loud", "bad.py", cwd=tmp_path).returncode == 2


def test_select_and_ignore_by_code_name_and_prefix():
    spellings = str(FIXTURES / "spellings.py")
    assert {f["name"] for f in json_findings("--select", "tf32", spellings)} == {"tf32"}
    assert {f["name"] for f in json_findings("--select", "DET010", spellings)} == {"cudnn-benchmark"}
    prefixed = {f["name"] for f in json_findings("--select", "DET01", "--ignore", "DET011", spellings)}
    assert "cudnn-benchmark" in prefixed and "tf32" not in prefixed
    assert {f["name"] for f in json_findings("--ignore", "DET01", spellings)} & {"cudnn-benchmark", "tf32"} == set()


def test_pyproject_config(tmp_path):
    write(
        tmp_path / "pyproject.toml",
        '[tool.detaudit]\nignore = ["tf32", "no-such-rule"]\nexclude = ["generated"]\nfail-on = "error"\n'
        'per-file-ignores = { "scripts/*" = ["cudnn-benchmark"] }\nsurprise = 1\n',
    )
    write(tmp_path / "train.py", HAZARD + "torch.backends.cuda.matmul.allow_tf32 = True\n")
    write(tmp_path / "scripts" / "bench.py", HAZARD)
    write(tmp_path / "generated" / "gen.py", HAZARD)
    result = detaudit("check", "--format", "json", "--no-cache", cwd=tmp_path)
    findings = json.loads(result.stdout)["findings"]
    assert [(f["path"], f["name"]) for f in findings] == [("train.py", "cudnn-benchmark")]
    assert result.returncode == 0  # fail-on = error; the finding is a warning
    assert "unknown rule selector 'no-such-rule'" in result.stderr
    assert "unknown [tool.detaudit] key 'surprise'" in result.stderr
    ignoring_config = detaudit("check", "--format", "json", "--no-cache", "--no-config", cwd=tmp_path)
    assert len(json.loads(ignoring_config.stdout)["findings"]) == 4


def test_suppression_comments(tmp_path):
    write(
        tmp_path / "train.py",
        "import torch\n"
        "torch.backends.cudnn.benchmark = True  # detaudit: ignore[cudnn-benchmark] -- throughput run\n"
        "torch.backends.cudnn.benchmark = True  # detaudit: ignore\n"
        "torch.backends.cudnn.benchmark = True  # noqa: DET010\n"
        "torch.backends.cudnn.benchmark = True  # detaudit: ignore[tf32]\n"
        "torch.backends.cudnn.benchmark = True  # detaudit: ignore[made-up-rule]\n",
    )
    result = detaudit("check", "--no-cache", "--show-suppressed", "--format", "text", "train.py", cwd=tmp_path)
    reported = [line for line in result.stdout.splitlines() if line.startswith("train.py:")]
    assert [line.split(":")[1] for line in reported[:2]] == ["5", "6"]
    assert "suppressed: throughput run" in result.stdout
    assert "unknown rule 'made-up-rule'" in result.stderr
    report = json.loads(detaudit("check", "--no-cache", "--format", "json", "train.py", cwd=tmp_path).stdout)
    assert report["summary"]["suppressed"] == 3


def test_add_ignores_writes_a_baseline(tmp_path):
    target = write(tmp_path / "train.py", HAZARD + "torch.backends.cuda.matmul.allow_tf32 = True  # keep\n")
    assert detaudit("check", "--no-cache", "--add-ignores", "train.py", cwd=tmp_path).returncode == 0
    assert target.read_text().splitlines()[1:] == [
        "torch.backends.cudnn.benchmark = True  # detaudit: ignore[DET010]",
        "torch.backends.cuda.matmul.allow_tf32 = True  # keep  # detaudit: ignore[DET011]",
    ]
    assert detaudit("check", "--no-cache", "train.py", cwd=tmp_path).returncode == 0


def test_bad_inputs_are_reported_and_the_rest_is_checked(tmp_path):
    write(tmp_path / "a_syntax.py", "import torch\ndef broken(:\n    pass\n")
    (tmp_path / "b_latin1.py").write_bytes(b"import torch\nname = '\xe9t\xe9'\n")
    (tmp_path / "c_binary.py").write_bytes(b"\x00\x01torch\x02\x00")
    write(tmp_path / "d_empty.py", "")
    (tmp_path / "e_huge.py").write_text("import torch\n" + "x = 1\n" * 400_000)
    (tmp_path / "f_dir.py").mkdir()  # a directory with a .py name is walked, not read
    write(tmp_path / "z_good.py", HAZARD)
    result = detaudit("check", "--format", "json", "--no-cache", ".", cwd=tmp_path)
    assert result.returncode == 1
    report = json.loads(result.stdout)
    by_file = {f["path"]: f for f in report["findings"]}
    assert by_file["a_syntax.py"]["name"] == "parse-error" and by_file["a_syntax.py"]["line"] == 2
    assert "not valid utf-8" in by_file["b_latin1.py"]["message"]
    assert "binary file" in by_file["c_binary.py"]["message"]
    assert "larger than the 2 MiB limit" in by_file["e_huge.py"]["message"]
    assert "d_empty.py" not in by_file
    assert by_file["z_good.py"]["name"] == "cudnn-benchmark"
    assert report["files_checked"] == 6


def test_unreadable_file_is_a_finding(tmp_path):
    from detaudit.static.engine.check import check_file

    directory = tmp_path / "not_a_file.py"
    directory.mkdir()
    result = check_file(directory, "not_a_file.py", tmp_path)
    assert [f.name for f in result.findings] == ["parse-error"]
    assert result.findings[0].message.startswith("cannot read:")


def test_discovery_skips_venvs_build_dirs_and_gitignored_files(tmp_path):
    write(tmp_path / ".gitignore", "ignored_dir/\nsecret_*.py\n")
    write(tmp_path / "train.py", HAZARD)
    write(tmp_path / "secret_train.py", HAZARD)
    write(tmp_path / "ignored_dir" / "x.py", HAZARD)
    write(tmp_path / "build" / "x.py", HAZARD)
    write(tmp_path / "node_modules" / "x.py", HAZARD)
    write(tmp_path / "myenv" / "pyvenv.cfg", "home = /usr\n")
    write(tmp_path / "myenv" / "lib" / "x.py", HAZARD)
    write(tmp_path / "src" / "model.py", HAZARD)
    paths = sorted(f["path"] for f in json_findings(cwd=tmp_path))
    assert paths == [os.path.join("src", "model.py"), "train.py"]
    # a file named on the command line is always checked (pre-commit passes files)
    assert len(json_findings("secret_train.py", cwd=tmp_path)) == 1


def test_cache_reuses_results_and_notices_edits(tmp_path):
    write(tmp_path / "pyproject.toml", "[project]\nname = 'x'\n")
    target = write(tmp_path / "train.py", HAZARD)
    first = detaudit("check", "--format", "json", ".", cwd=tmp_path)
    assert (tmp_path / ".detaudit_cache").is_dir()
    second = detaudit("check", "--format", "json", ".", cwd=tmp_path)
    assert json.loads(first.stdout)["findings"] == json.loads(second.stdout)["findings"]
    target.write_text("import torch\ntorch.backends.cudnn.benchmark = False\n")
    third = detaudit("check", "--format", "json", ".", cwd=tmp_path)
    assert json.loads(third.stdout)["findings"] == []


def test_check_never_imports_torch_or_numpy(tmp_path):
    write(tmp_path / "train.py", HAZARD + "import numpy as np\nnp.random.rand(3)\n")
    probe = (
        "import sys\n"
        "from detaudit.cli import main\n"
        "code = main(['check', '--no-cache', '--format', 'json', 'train.py'])\n"
        "heavy = sorted(m for m in ('torch', 'numpy') if m in sys.modules)\n"
        "print('HEAVY', heavy, code)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120,
    )
    assert "HEAVY [] 1" in result.stdout, result.stderr


def test_a_file_that_cannot_matter_is_never_parsed(tmp_path):
    """The pre-filter's promise: no libcst import (about 0.1 s) for files without torch & co."""
    write(tmp_path / "util.py", "def add(a, b):\n    return a + b\n")
    probe = (
        "import sys\n"
        "from detaudit.cli import main\n"
        "code = main(['check', '--no-cache', 'util.py'])\n"
        "print('LIBCST', 'libcst' in sys.modules, code)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120,
    )
    assert "LIBCST False 0" in result.stdout, result.stdout + result.stderr


def test_version_and_rules_commands():
    from detaudit import __version__

    assert detaudit("--version").stdout.strip() == f"detaudit {__version__}"
    listing = detaudit("rules", "--format", "json")
    names = {r["name"] for r in json.loads(listing.stdout)}
    assert {"parse-error", "cudnn-benchmark", "tf32"} <= names
    doc = detaudit("rules", "cudnn-benchmark").stdout
    assert doc.startswith("# DET010 cudnn-benchmark") and "## Why is this bad?" in doc and "## Use instead" in doc
    unknown = detaudit("rules", "nope")
    assert unknown.returncode == 2 and "unknown rule 'nope'" in unknown.stderr


@pytest.mark.parametrize("fmt", ["text", "json", "sarif", "github"])
def test_no_files_is_not_an_error(tmp_path, fmt):
    result = detaudit("check", "--no-cache", "--format", fmt, ".", cwd=tmp_path)
    assert result.returncode == 0, result.stderr


def test_bad_ops_table_is_a_usage_error(tmp_path):
    write(tmp_path / "train.py", HAZARD)
    write(tmp_path / "bad.json", "{}")
    env = {**os.environ, "PYTHONPATH": str(REPO), "DETAUDIT_OPS_TABLE": str(tmp_path / "bad.json")}
    result = subprocess.run([sys.executable, "-m", "detaudit", "check", "--no-cache", "train.py"], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.startswith("detaudit: error: bad ops table") and len(result.stderr.splitlines()) == 1


def test_framework_only_file_is_checked(tmp_path):
    write(tmp_path / "train.py", "import lightning as L\ntrainer = L.Trainer(deterministic=False)\n")
    assert [f["name"] for f in json_findings("train.py", cwd=tmp_path)] == ["framework-determinism-off"]


def test_repeated_code_is_located_at_each_occurrence():
    """Nodes are located by their text; repeated text falls back to the top-level
    statement, then to libcst's positions: every path must give the exact line."""
    from detaudit.static.engine.check import check_source

    text = (
        "import torch\n"
        "torch.backends.cudnn.benchmark = True\n"  # same text at top level twice
        "x = 1\n"
        "torch.backends.cudnn.benchmark = True\n"
        "def configure():\n"
        "    torch.backends.cuda.matmul.allow_tf32 = True\n"  # same text twice in one statement
        "    torch.backends.cuda.matmul.allow_tf32 = True\n"
        "torch.set_float32_matmul_precision('high')\n"  # unique text
    )
    findings = check_source(text, "train.py").findings
    assert [(f.line, f.column, f.name) for f in findings if f.name in ("cudnn-benchmark", "tf32")] == [
        (2, 1, "cudnn-benchmark"), (4, 1, "cudnn-benchmark"), (6, 5, "tf32"), (7, 5, "tf32"), (8, 1, "tf32"),
    ]


def test_multi_line_node_in_an_indented_block_is_located():
    from detaudit.static.engine.check import check_source

    text = (
        "import torch\n"
        "def configure():\n"
        "    setattr(\n"
        "        torch.backends.cudnn,\n"
        "        'benchmark',\n"
        "        True,\n"
        "    )\n"
    )
    (finding,) = [f for f in check_source(text, "train.py").findings if f.name == "cudnn-benchmark"]
    assert (finding.line, finding.column, finding.end_line, finding.end_column) == (3, 5, 7, 6)


def test_code_repeated_within_one_statement_is_located_by_its_rank_in_pythons_ast():
    """Identical multi-line calls in one class are ambiguous by text; the k-th call
    of the tree is where Python's ast puts its k-th call (non-ASCII text before
    one of them, a parenthesised one that must fall back), as libcst's
    PositionProvider says."""
    import libcst as cst
    from libcst.metadata import MetadataWrapper, PositionProvider

    from detaudit.static.engine.locate import Locator

    text = (
        "import torch.nn.functional as F\n\n"
        "class Net:\n"
        "    def a(self, x):\n"
        "        return F.interpolate(\n            x, scale_factor=2, mode='bilinear'\n        )\n\n"
        "    def b(self, x):\n"
        "        é = 1; y = F.interpolate(\n            x, scale_factor=2, mode='bilinear'\n        )\n"
        "        return (F.interpolate(\n            x, scale_factor=2, mode='bilinear'\n        ))\n\n"
        "    def c(self, x):\n"
        "        return (F.interpolate(\n            x, scale_factor=2, mode='bilinear'\n        ))\n"
    )
    module = cst.parse_module(text)
    calls = [n for n in _all_nodes(module) if isinstance(n, cst.Call) and module.code_for_node(n.func) == "F.interpolate"]
    locator = Locator(module, text)
    snippets = [module.code_for_node(call).strip() for call in calls]
    assert len(calls) == 4 and all(locator._by_text(snippet) is None for snippet in snippets)
    assert [locator._by_rank(call, snippet) is not None for call, snippet in zip(calls, snippets)] == [True, True, False, False]
    spans = locator.spans(calls)
    exact = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    for call in calls:
        p, span = exact[call], spans[id(call)]
        assert (span.start_line, span.start_column, span.end_line, span.end_column) == (
            p.start.line, p.start.column, p.end.line, p.end.column,
        )



def test_a_multi_line_call_ends_at_its_own_parenthesis_when_code_follows_on_its_last_line():
    """Inside an indented block libcst prints a node's continuation lines
    without the block's indentation; the node ends where its last line's text
    first ends in the file, not at a later parenthesis on that line."""
    import libcst as cst
    from libcst.metadata import MetadataWrapper, PositionProvider

    from detaudit.static.engine.locate import Locator

    text = (
        "import torch.nn.functional as F\n\n"
        "def attend(q, k, v):\n"
        "    if q is not None:\n"
        "        x = F.scaled_dot_product_attention(\n            q, k, v,\n        ).transpose(1, 2).reshape(-1)\n"
        "    return x\n"
    )
    module = cst.parse_module(text)
    [call] = [n for n in _all_nodes(module) if isinstance(n, cst.Call) and module.code_for_node(n.func).endswith("attention")]
    span = Locator(module, text).spans([call])[id(call)]
    p = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)[call]
    assert (span.start_line, span.start_column, span.end_line, span.end_column) == (5, 12, 7, 9)
    assert (p.start.line, p.start.column, p.end.line, p.end.column) == (5, 12, 7, 9)

def _all_nodes(module):
    from detaudit.static.engine.walk import iter_nodes

    return list(iter_nodes(module))


def test_fast_node_location_agrees_with_libcst_positions():
    """The engine locates reported nodes by their text; over every fixture, each
    location must equal libcst's PositionProvider's (the slow, exact answer)."""
    from libcst.metadata import MetadataWrapper, PositionProvider

    from detaudit.static.engine.check import analyse_source
    from detaudit.static.engine.locate import hit_spans

    compared = 0
    for path in sorted((REPO / "fixtures").rglob("*.py")):
        _, context = analyse_source(path.read_text(encoding="utf-8"), path, project_root=path.parent)
        if context is None or not context.hits:
            continue
        fast = hit_spans(context)
        exact = MetadataWrapper(context.module, unsafe_skip_copy=True).resolve(PositionProvider)
        for hit in context.hits:
            p = exact[hit.node]
            span = fast[id(hit.node)]
            assert (span.start_line, span.start_column, span.end_line, span.end_column) == (
                p.start.line, p.start.column, p.end.line, p.end.column,
            ), f"{path}: {type(hit.node).__name__} at line {p.start.line}"
            compared += 1
    assert compared > 50
