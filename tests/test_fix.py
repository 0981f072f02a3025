"""``detaudit check --fix`` / ``--diff``: every rule's documented fix, every fixture,
and the guarantees (byte-for-byte elsewhere, idempotent, atomic, never a broken file)."""

from __future__ import annotations

import difflib
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import libcst as cst
import pytest

from detaudit.static.engine.check import check_file
from detaudit.static.fixes.apply import apply_edits, apply_fixes, fix_source
from detaudit.static.fixes.edits import InsertStatement, Replace, insert_before_first_use, with_keyword_arguments, wrapped_in_call
from detaudit.static.rule import RuleHit, all_rules, find_rule

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "fixtures"
FIX_FIXTURES = FIXTURES / "static" / "fix"


def write(path: Path, text: str, newline: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline=newline) as stream:
        stream.write(text)
    return path


def fix(path: Path, *, rules=None, unsafe: bool = False, write: bool = True, config=None):
    """Check ``path`` as the CLI does, then fix it."""
    result = check_file(path, path.name, path.parent)
    return apply_fixes([result], paths={path.name: path}, rules=rules, unsafe=unsafe, write=write, config=config)


def findings_of(path: Path, rules=None) -> list:
    codes = {rule.code for rule in (rules or all_rules())}
    return [f for f in check_file(path, path.name, path.parent).findings if f.code in codes]


# -- every rule's documented fix ----------------------------------------------------


def _fixed_examples():
    for rule in all_rules():
        for index, example in enumerate(rule.INVALID):
            if example.fixed is not None:
                yield pytest.param(rule, example, id=f"{rule.name}-invalid-{index}")


@pytest.mark.parametrize(("rule", "example"), list(_fixed_examples()))
def test_rule_fix_gives_the_documented_code(tmp_path, rule, example):
    """``Invalid(fixed=...)`` is the code after ``--fix --unsafe-fixes`` with only that rule selected."""
    path = write(tmp_path / "train.py", textwrap.dedent(example.code))
    outcome = fix(path, rules=[rule], unsafe=True)
    assert outcome.errors == []
    assert path.read_text(encoding="utf-8") == textwrap.dedent(example.fixed)
    assert outcome.fixed >= 1
    assert findings_of(path, [rule]) == []
    again = fix(path, rules=[rule], unsafe=True)
    assert (again.diff, again.fixed) == ("", 0), "a second --fix must change nothing"


def test_every_rule_with_a_fix_documents_one():
    """Rules whose hits carry edits show the fixed code in at least one INVALID example."""
    documented = {rule.name for rule in all_rules() if any(e.fixed for e in rule.INVALID)}
    assert {"cudnn-benchmark", "tf32"} <= documented


# -- fixtures/static/fix: scripts and the code --fix turns them into -----------------------


def _fix_pairs():
    for original in sorted(FIX_FIXTURES.glob("*.py")):
        if original.stem.endswith((".fixed", ".safe_fixed", ".detaudit_fixed")):
            continue
        yield pytest.param(original, id=original.stem)


@pytest.mark.parametrize("original", list(_fix_pairs()))
def test_fix_fixture_becomes_its_fixed_version(tmp_path, original):
    """``X.py`` becomes ``X.fixed.py`` with ``--unsafe-fixes`` and ``X.safe_fixed.py``
    with safe fixes only (unchanged when there is no such file)."""
    for unsafe, suffix in ((True, ".fixed.py"), (False, ".safe_fixed.py")):
        path = tmp_path / original.name
        shutil.copy(original, path)
        expected = original.with_name(original.stem + suffix)
        outcome = fix(path, unsafe=unsafe)
        assert outcome.errors == []
        assert path.read_text() == (expected if expected.exists() else original).read_text(), suffix


def test_the_detaudit_fix_style_calls_detaudits_helpers():
    """``fix-style = "detaudit"``: the same fixes as calls of detaudit's helpers."""
    original = FIX_FIXTURES / "unseeded_script.py"
    fixed = fix_source(original.read_text(), original, unsafe=True, fix_style="detaudit")
    assert fixed.error is None
    assert fixed.text == (FIX_FIXTURES / "unseeded_script.detaudit_fixed.py").read_text()


@pytest.mark.parametrize("relative", [p for p in FIX_FIXTURES.glob("*.py") if p.stem.count(".") == 0], ids=lambda p: p.stem)
def test_plain_fixes_never_make_code_depend_on_detaudit(relative):
    fixed = fix_source(relative.read_text(), relative, unsafe=True)
    assert fixed.error is None and fixed.fixed > 0
    added = [line for line in difflib.ndiff(relative.read_text().splitlines(), fixed.text.splitlines()) if line.startswith("+ ")]
    assert added and not [line for line in added if "detaudit" in line]


@pytest.mark.parametrize(
    ("source", "seeding"),
    [
        # the file's own names; RNGs the file imports are seeded too, as seed_everything would
        ("import numpy as np\nimport torch as T\nx = T.randn(3)\nprint(x.sum())\n", "np.random.seed(0)\nT.manual_seed(0)\n"),
        # only what the file lacks is imported
        (
            "from torch import nn\nimport random\nmodel = nn.Linear(4, 2)\nmodel.weight.sum().backward()\n"
            "print(model, random.random())\n",
            None,
        ),
    ],
)
def test_plain_seeding_uses_the_files_names(source, seeding):
    fixed = fix_source(source, "train.py", rules=[find_rule("missing-torch-seed"), find_rule("missing-python-seed")])
    assert fixed.error is None
    if seeding is not None:
        assert seeding in fixed.text and "import numpy\n" not in fixed.text and "import torch\n" not in fixed.text
    else:
        assert fixed.text.count("import random") == 1
        assert "import torch\n\nrandom.seed(0)\ntorch.manual_seed(0)\n" in fixed.text


def test_plain_determinism_fix_sets_what_enable_determinism_sets(tmp_path):
    """The written-out settings (from the settings table) really switch torch:
    run them and read each setting back as ``enable_determinism`` would."""
    from detaudit.static.fixes.code import determinism_code, determinism_settings

    code = determinism_code({}, "plain")
    assert any("use_deterministic_algorithms(True)" in line for line in code.lines)
    probe = "\n".join(
        [*(f"import {module}" for module in code.imports), "import torch", *code.lines,
         "from detaudit.knowledge.backend_settings import backend_settings",
         "from detaudit.runtime.settings import access",
         "from detaudit.static.fixes.code import determinism_settings",
         "print(all(access(torch, s).read() == access(torch, s).spelling.environment and s.safe or access(torch, s).read() == s.safe"
         " for s, _ in determinism_settings()))",
         "print(torch.are_deterministic_algorithms_enabled())"]
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("CUBLAS_WORKSPACE_CONFIG", None)
    run = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.stdout.split() == ["True", "True"], run.stderr
    assert len(code.lines) == len(determinism_settings())


def test_a_comment_about_the_old_value_goes_with_it():
    source = (
        "import torch\n"
        "torch.backends.cuda.matmul.allow_tf32 = True  # allow tf32 on matmul\n"
        "torch.backends.cudnn.benchmark = True  # faster convolutions\n"
        "torch.set_float32_matmul_precision('high')  # see README\n"
    )
    fixed = fix_source(source, "train.py", rules=[find_rule("tf32"), find_rule("cudnn-benchmark")])
    assert fixed.text == (
        "import torch\n"
        "torch.backends.cuda.matmul.allow_tf32 = False\n"
        "torch.backends.cudnn.benchmark = False\n"
        "torch.set_float32_matmul_precision('highest')  # see README\n"
    )


def test_fixed_script_trains_identically_in_two_processes(tmp_path):
    """The inserted seeding and determinism calls work: two runs print the same loss
    (the unfixed script, unseeded, does not reproduce)."""
    script = FIX_FIXTURES / "unseeded_script.fixed.py"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    runs = [
        subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        for _ in range(2)
    ]
    assert all(run.returncode == 0 for run in runs), runs[0].stderr
    assert runs[0].stdout.startswith("final loss ") and runs[0].stdout == runs[1].stdout


# -- every fixture --------------------------------------------------------------------


def _fixture_files():
    return sorted(p.relative_to(FIXTURES) for p in FIXTURES.rglob("*.py"))


@pytest.fixture(scope="module")
def fixture_copy(tmp_path_factory) -> Path:
    copy = tmp_path_factory.mktemp("fixtures")
    shutil.copytree(FIXTURES, copy, dirs_exist_ok=True)
    return copy


@pytest.mark.parametrize("relative", list(_fixture_files()), ids=str)
def test_fixture_fixes_cleanly_and_only_where_reported(fixture_copy, relative):
    path = fixture_copy / relative
    before_text = path.read_text(encoding="utf-8")
    before = findings_of(path)
    outcome = fix(path, unsafe=True)
    assert outcome.errors == []
    after_text = path.read_text(encoding="utf-8")
    compile(after_text, str(path), "exec")
    # text outside the reported lines is untouched: lines are only inserted, or
    # changed where a finding was reported
    reported_lines = {line for f in before for line in range(f.line, f.end_line + 1)}
    matcher = difflib.SequenceMatcher(None, before_text.splitlines(), after_text.splitlines(), autojunk=False)
    for tag, old_start, old_end, _, _ in matcher.get_opcodes():
        if tag in ("replace", "delete"):
            assert set(range(old_start + 1, old_end + 1)) <= reported_lines, f"changed unreported lines {old_start + 1}-{old_end}"
    assert len(findings_of(path)) == len(before) - outcome.fixed == outcome.remaining
    again = fix(path, unsafe=True)
    assert (again.diff, again.fixed, again.errors) == ("", 0, []), "a second --fix must change nothing"


# -- guarantees -------------------------------------------------------------------------

HAZARD = "import torch\n\ntorch.backends.cudnn.benchmark = True  # keep this comment\n"
HAZARD_FIXED = "import torch\n\ntorch.backends.cudnn.benchmark = False  # keep this comment\n"


def test_diff_changes_nothing_and_applies_with_patch(tmp_path):
    path = write(tmp_path / "train.py", HAZARD)
    stamp = path.stat().st_mtime_ns
    outcome = fix(path, write=False)
    assert path.read_text() == HAZARD and path.stat().st_mtime_ns == stamp
    assert (outcome.fixed, outcome.remaining, outcome.changed) == (1, 0, ["train.py"])
    assert "-torch.backends.cudnn.benchmark = True  # keep this comment\n" in outcome.diff
    assert "+torch.backends.cudnn.benchmark = False  # keep this comment\n" in outcome.diff
    subprocess.run(["patch", "-p1", "--quiet"], input=outcome.diff, text=True, cwd=tmp_path, check=True)
    assert path.read_text() == HAZARD_FIXED


def test_file_that_does_not_parse_is_untouched(tmp_path):
    text = "import torch\ntorch.backends.cudnn.benchmark = True\ndef broken(:\n"
    path = write(tmp_path / "train.py", text)
    outcome = fix(path, unsafe=True)
    assert path.read_text() == text
    assert (outcome.diff, outcome.fixed, outcome.remaining) == ("", 0, 1)  # the parse error remains


def test_file_mode_encoding_and_newlines_are_kept(tmp_path):
    path = tmp_path / "train.py"
    path.write_bytes(b"\xef\xbb\xbf# caf\xc3\xa9\r\n" + HAZARD.replace("\n", "\r\n").encode())
    path.chmod(0o751)
    fix(path)
    assert path.read_bytes() == b"\xef\xbb\xbf# caf\xc3\xa9\r\n" + HAZARD_FIXED.replace("\n", "\r\n").encode()
    assert path.stat().st_mode & 0o7777 == 0o751
    assert [p.name for p in tmp_path.iterdir()] == ["train.py"], "no temporary file left behind"


def test_symlink_stays_a_symlink(tmp_path):
    target = write(tmp_path / "real.py", HAZARD)
    link = tmp_path / "train.py"
    link.symlink_to(target)
    fix(link)
    assert link.is_symlink() and target.read_text() == HAZARD_FIXED


def test_suppressed_and_unselected_findings_are_not_fixed(tmp_path):
    text = (
        "import torch\n"
        "torch.backends.cudnn.benchmark = True  # detaudit: ignore[cudnn-benchmark] -- throughput run\n"
        "torch.backends.cuda.matmul.allow_tf32 = True  # noqa: DET011\n"
        "torch.backends.cudnn.allow_tf32 = True\n"
    )
    path = write(tmp_path / "train.py", text)
    outcome = fix(path, rules=[find_rule("cudnn-benchmark")])
    assert (outcome.diff, outcome.fixed, outcome.remaining) == ("", 0, 0)
    outcome = fix(path)
    assert path.read_text() == text.replace("cudnn.allow_tf32 = True", "cudnn.allow_tf32 = False")
    assert (outcome.fixed, outcome.remaining) == (1, 0)


def test_per_file_ignores_are_honoured(tmp_path):
    from detaudit.static.run.config import Config

    text = HAZARD + "torch.backends.cudnn.allow_tf32 = True\n"
    path = write(tmp_path / "sub" / "train.py", text)
    config = Config(per_file_ignores={"sub/*.py": ["DET010"]})
    result = check_file(path, "sub/train.py", tmp_path)
    outcome = apply_fixes([result], paths={"sub/train.py": path}, config=config)
    assert path.read_text() == text.replace("allow_tf32 = True", "allow_tf32 = False")
    assert (outcome.fixed, outcome.remaining) == (1, 0)


def test_unsafe_fixes_need_the_flag(tmp_path):
    flag_default = (
        "import argparse, torch\np = argparse.ArgumentParser()\np.add_argument('--benchmark', type=int, default=1)\n"
        "args = p.parse_args()\ntorch.backends.cudnn.benchmark = bool(args.benchmark)\n"
    )
    guarded = (
        "import torch\n"
        "try:\n    torch.backends.cudnn.allow_tf32 = True\nexcept AttributeError:\n    pass\n"
        "if hasattr(torch.backends.cuda.matmul, 'fp32_precision'):\n    torch.backends.cuda.matmul.fp32_precision = 'tf32'\n"
    )
    for text in (flag_default, guarded):
        path = write(tmp_path / "train.py", text)
        outcome = fix(path)
        assert path.read_text() == text and outcome.fixed == 0 and outcome.remaining > 0
        outcome = fix(path, unsafe=True)
        assert outcome.fixed == outcome.remaining + outcome.fixed > 0 and findings_of(path) == []


def test_read_error_is_one_line_and_nothing_is_lost(tmp_path):
    path = write(tmp_path / "train.py", HAZARD)
    result = check_file(path, "train.py", tmp_path)
    path.unlink()
    outcome = apply_fixes([result], paths={"train.py": path})
    assert outcome.errors == ["train.py: cannot read: No such file or directory"]
    assert outcome.remaining == 1 and outcome.fixed == 0


def test_notebooks_are_left_alone_with_a_one_line_note(tmp_path):
    import json

    cell = {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": HAZARD.splitlines(True)}
    notebook = {"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = write(tmp_path / "train.ipynb", json.dumps(notebook))
    before = path.read_bytes()
    outcome = fix(path)
    assert path.read_bytes() == before
    assert outcome.errors == ["train.ipynb: notebooks are not fixed automatically; fix the cells by hand"]
    assert outcome.remaining == 1


# -- edits ------------------------------------------------------------------------------


def _hits(module: cst.Module, *fixes) -> list[RuleHit]:
    rule = find_rule("cudnn-benchmark")  # any rule: apply_edits only reads the edits
    return [RuleHit(rule, module, "", fix) for fix in fixes]


def test_seeding_is_spelled_with_the_names_bound_where_it_goes():
    # above the seeding point ``random`` is the function ``from random import *`` binds; the
    # module is imported further down: no fix can call ``random.seed`` there (it used to loop)
    source = "from random import *\nimport torch\nk = randint(0, 9)\nimport random\nprint(k, random.random())\n"
    fixed = fix_source(source, "train.py", rules=[find_rule("missing-python-seed")])
    assert fixed.error is None and fixed.text == source
    # a module imported inside a ``try`` above the seeding point is one the fix can use
    source = "try:\n    import numpy as np\nexcept ImportError:\n    np = None\nx = np.random.rand(3)\nprint(x)\n"
    fixed = fix_source(source, "train.py", rules=[find_rule("missing-numpy-seed")])
    assert fixed.error is None and "np.random.seed(0)\nx = np.random.rand(3)" in fixed.text


def test_insertion_goes_after_the_imports_with_the_import_it_needs():
    module = cst.parse_module(
        '"""Train."""\nfrom __future__ import annotations\nimport torch\n\n# the model\nmodel = torch.nn.Linear(2, 2)\n'
    )
    seed = insert_before_first_use(module, 3, "detaudit.seed_everything(0)", imports=("detaudit",))
    determinism = insert_before_first_use(module, 3, "detaudit.enable_determinism()", imports=("detaudit",))
    # three findings asking for the same seeding call get one
    code = apply_edits(module, _hits(module, seed, seed, (seed, determinism)), {"torch": "torch"})
    assert code == (
        '"""Train."""\nfrom __future__ import annotations\nimport torch\nimport detaudit\n\n'
        "detaudit.seed_everything(0)\ndetaudit.enable_determinism()\n\n# the model\nmodel = torch.nn.Linear(2, 2)\n"
    )
    # an existing ``import detaudit`` is reused
    assert apply_edits(module, _hits(module, seed), {"detaudit": "detaudit"}).count("import detaudit") == 0


def test_insertion_into_a_block_keeps_its_indentation():
    module = cst.parse_module("import torch\nif __name__ == '__main__':\n    x = torch.rand(3)  # data\n")
    use = module.body[1].body.body[0]
    code = apply_edits(module, _hits(module, InsertStatement(use, "torch.manual_seed(0)", before=True)), {"torch": "torch"})
    assert code == "import torch\nif __name__ == '__main__':\n    torch.manual_seed(0)\n    x = torch.rand(3)  # data\n"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("DataLoader(ds)", "DataLoader(ds, worker_init_fn=f, generator=g)"),
        ("DataLoader(ds, batch_size = 4)", "DataLoader(ds, batch_size = 4, worker_init_fn = f, generator = g)"),
        ("DataLoader(\n    ds,\n    batch_size=4,\n)", "DataLoader(\n    ds,\n    batch_size=4,\n    worker_init_fn=f,\n    generator=g,\n)"),
        ("DataLoader(\n    ds,\n)", "DataLoader(\n    ds,\n    worker_init_fn=f,\n    generator=g,\n)"),
        ("DataLoader(ds,\n           shuffle=True)", "DataLoader(ds,\n           shuffle=True,\n           worker_init_fn=f,\n           generator=g)"),
        ("DataLoader()", "DataLoader(worker_init_fn=f, generator=g)"),
    ],
)
def test_keyword_arguments_follow_the_call_layout(source, expected):
    call = cst.parse_expression(source)
    new = with_keyword_arguments(call, [("worker_init_fn", cst.Name("f")), ("generator", cst.Name("g"))])
    assert cst.Module([]).code_for_node(new) == expected


def test_an_edit_inside_a_replaced_node_waits_for_the_next_round():
    module = cst.parse_module("import os\nfiles = list(os.listdir('.'))\n")
    outer = module.body[1].body[0].value
    inner = outer.args[0].value
    hits = _hits(module, Replace(outer, wrapped_in_call(outer, "sorted")), Replace(inner, wrapped_in_call(inner, "sorted")))
    assert apply_edits(module, hits, {"os": "os"}) == "import os\nfiles = sorted(list(os.listdir('.')))\n"


# -- the command line ------------------------------------------------------------------------


def detaudit(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "detaudit", "check", "--no-cache", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_cli_diff_then_fix(tmp_path):
    path = write(tmp_path / "train.py", HAZARD)
    shown = detaudit("--diff", "train.py", cwd=tmp_path)
    assert "+torch.backends.cudnn.benchmark = False  # keep this comment" in shown.stdout
    assert shown.stdout.startswith("--- a/train.py") and "Checked" not in shown.stdout  # only the diff: pipes into git apply
    assert shown.returncode == 1  # something to fix, like ruff --diff
    assert path.read_text() == HAZARD
    fixed = detaudit("--fix", "train.py", cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stderr
    assert "Fixed 1 finding; 0 remaining." in fixed.stderr
    assert path.read_text() == HAZARD_FIXED


def test_cli_fix_never_imports_torch(tmp_path):
    write(tmp_path / "train.py", FIX_FIXTURES.joinpath("unseeded_script.py").read_text())
    probe = (
        "import sys\nfrom detaudit.cli import main\n"
        "main(['check', '--fix', '--unsafe-fixes', '--no-cache', '-q', 'train.py'])\n"
        "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.stdout.strip().splitlines()[-1] == "[]", run.stderr
    assert "torch.manual_seed(0)" in (tmp_path / "train.py").read_text()


def test_fix_style_from_config_and_command_line(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.detaudit]\nfix-style = "detaudit"\n')
    source = FIX_FIXTURES.joinpath("unseeded_script.py").read_text()
    path = write(tmp_path / "train.py", source)
    assert "+import detaudit" in detaudit("--diff", "train.py", cwd=tmp_path).stdout
    plain = detaudit("--diff", "--fix-style", "plain", "train.py", cwd=tmp_path).stdout  # the flag wins
    assert "+torch.manual_seed(0)" in plain and "detaudit" not in plain
    write(tmp_path / "pyproject.toml", '[tool.detaudit]\nfix-style = "helpers"\n')
    bad = detaudit("--fix", "train.py", cwd=tmp_path)
    assert bad.returncode == 2 and "pyproject.toml:2: fix-style: unknown fix style 'helpers'" in bad.stderr
    assert path.read_text() == source
