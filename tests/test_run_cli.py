"""`detaudit run` end to end: verdicts, exit codes, JSON shape, failures."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

from detaudit.cli import main

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures" / "dynamic"


_HELP_THEN_REPORT_TORCH = """
import contextlib, io, sys
from detaudit.cli import main
with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):
    main(["run", "--help"])
print("torch" in sys.modules)
"""

# a deterministic audit's parent compares the children's traces and state digests: no torch, no numpy
_AUDIT_THEN_REPORT_HEAVY = """
import contextlib, io, sys
from detaudit.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    code = main(["run", sys.argv[1], "--repeats", "2"])
print(code, "deterministic" in out.getvalue(), sorted({"torch", "numpy"} & set(sys.modules)))
"""


def _run(capsys, *args) -> tuple[int, str, str]:
    code = main(["run", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_deterministic_script_over_three_repeats(capsys, tmp_path):
    junit = tmp_path / "junit.xml"
    code, out, err = _run(capsys, FIXTURES / "deterministic_mlp.py", "--format", "json", "--junit-xml", junit)
    report = json.loads(out)  # stdout is the JSON report alone
    assert code == 0
    # progress goes to stderr, one plain line per run off a terminal
    lines = err.splitlines()
    assert len(lines) == 3 and all(f"deterministic_mlp.py [{n}/3] run {n}: ok in " in lines[n - 1] for n in (1, 2, 3))
    assert lines[0].endswith(" left") and re.search(r", \d+ steps? · \d+:\d\d elapsed$", lines[2])
    assert report["verdict"] == "deterministic" and report["repeats"] == 3
    assert report["root_causes"] == [] and report["tensors"] == []
    assert set(report) >= {"verdict", "repeats", "root_causes", "tensors", "environment"}
    assert "torch.version" in json.dumps(report["environment"])
    assert ElementTree.parse(junit).getroot().get("failures") == "0"


def test_index_put_race_is_localized_to_its_line(capsys, tmp_path):
    junit = tmp_path / "junit.xml"
    code, out, err = _run(
        capsys, FIXTURES / "index_put_backward.py", "--repeats", "2", "--format", "json", "--junit-xml", junit
    )
    report = json.loads(out)
    assert code == 1 and report["verdict"] == "nondeterministic"
    # run 1 kept its first steps, run 2 the ops that differed from run 1's as it ran: no capture rerun
    runs = [re.search(r"\] (.*?): ", line).group(1) for line in err.splitlines()]
    assert runs == ["run 1", "run 2"], err
    [cause] = report["root_causes"]
    assert set(cause) >= {"kind", "op", "path", "line", "module", "phase", "seen", "max_abs_diff"}
    assert cause["kind"] == "nondeterministic-op"
    assert cause["op"].startswith("aten.index_put")
    assert cause["phase"] == "backward"
    assert (cause["path"], cause["line"]) == ("fixtures/dynamic/index_put_backward.py", 17) or cause["path"].endswith(
        "index_put_backward.py"
    ) and cause["line"] == 17  # the forward line W[idx], not loss.backward()
    assert cause["seen"] == 1 and cause["max_abs_diff"] > 0
    names = {tensor["name"] for tensor in report["tensors"]}
    assert {"table", "table.grad"} <= names
    assert ElementTree.parse(junit).getroot().get("failures") == "1"


def test_a_deterministic_audit_never_imports_torch_in_the_parent():
    check = subprocess.run(
        [sys.executable, "-c", _AUDIT_THEN_REPORT_HEAVY, str(FIXTURES / "deterministic_mlp.py")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert check.stdout.strip() == "0 True []", check.stderr


def test_sarif_and_github_formats_reuse_the_shared_writers(capsys):
    # a control-flow cause needs no capture reruns: two script runs in all
    code, out, _ = _run(capsys, FIXTURES / "control_flow_pid.py", "--repeats", "2", "--format", "sarif")
    sarif = json.loads(out)
    assert code == 1
    [result] = sarif["runs"][0]["results"]
    assert result["ruleId"] == "DYN005"
    assert result["locations"][0]["physicalLocation"]["region"]["startLine"] == 14


def test_crashing_script_exits_2_with_its_traceback(capsys, tmp_path):
    junit = tmp_path / "junit.xml"
    code, out, err = _run(capsys, FIXTURES / "crash_after_step.py", "--junit-xml", junit)
    assert code == 2
    assert "run 1 of the script exited with code 1" in err
    assert "ValueError: the data loader ran dry" in err
    assert ElementTree.parse(junit).getroot().get("errors") == "1"


def test_hanging_script_is_killed_and_reported(capsys):
    code, _, err = _run(capsys, FIXTURES / "hang.py", "--timeout", "3", "--no-seed")
    assert code == 2 and "timed out" in err


def test_bad_input_is_a_one_line_usage_error(capsys):
    code, _, err = _run(capsys, "no_such_script.py")
    assert code == 2 and err.strip() == "detaudit: error: no such script: no_such_script.py"
    code, _, err = _run(capsys, FIXTURES / "exit_code.py", "--repeats", "1")
    assert code == 2 and "--repeats" in err


def test_script_args_after_double_dash_and_static_path_stays_light(tmp_path):
    script = tmp_path / "echo_args.py"
    script.write_text("import sys\nassert sys.argv[1:] == ['--lr', '0.5'], sys.argv\n")
    process = subprocess.run(
        [sys.executable, "-m", "detaudit", "run", str(script), "--repeats", "2", "--", "--lr", "0.5"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert process.returncode == 0, process.stderr
    # registering `run` must not make the CLI import torch
    check = subprocess.run(
        [sys.executable, "-c", _HELP_THEN_REPORT_TORCH],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.stdout.strip() == "False"


UNSEEDED_ADAM = """
import torch
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
for _ in range(2):
    optimizer.zero_grad()
    model(torch.randn(8, 4)).square().mean().backward()
    optimizer.step()
"""


def test_the_text_report_prints_names_with_brackets_as_they_are(capsys, tmp_path):
    script = tmp_path / "adam.py"
    script.write_text(UNSEEDED_ADAM)
    code, out, _ = _run(capsys, script, "--no-seed", "--repeats", "2")
    assert code == 1
    # rich would read "[model.bias]" as markup and print optimizer.state.exp_avg
    for name in ("optimizer.state[model.bias].exp_avg", "optimizer.state[model.weight].exp_avg_sq"):
        assert name in out


def test_a_script_that_uses_inference_mode_is_audited_not_broken(capsys, tmp_path):
    # Lightning's validate()/test()/predict() run under inference mode; its tensors have no version counter
    script = tmp_path / "inference.py"
    script.write_text(
        "import torch\n"
        "torch.manual_seed(0)\n"
        "m = torch.nn.Linear(2, 1)\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "with torch.inference_mode():\n"
        "    n = torch.tensor(3)\n"
        "for _ in range(2):\n"
        "    opt.zero_grad()\n"
        "    (m(torch.ones(4, 2)).sum() * n.item()).backward()\n"
        "    opt.step()\n"
    )
    code, out, err = _run(capsys, script, "--repeats", "2")
    assert code == 0, err
    assert out.startswith("deterministic: 2 runs")


def test_a_script_that_compiles_with_another_backend_than_inductor_is_told_its_graphs_were_traced_op_by_op(
    capsys, tmp_path
):
    script = tmp_path / "compiles.py"
    script.write_text(
        "import torch\n"
        "torch.manual_seed(0)\n"
        "model = torch.nn.Linear(4, 2)\n"
        "step = torch.compile(lambda x: model(x).sum(), backend='eager')\n"
        "model.compile(backend='eager')\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for _ in range(2):\n"
        "    optimizer.zero_grad()\n"
        "    step(torch.ones(3, 4)).backward()\n"
        "    optimizer.step()\n"
    )
    code, out, err = _run(capsys, script, "--repeats", "2", "--format", "json")
    assert code == 0, err
    [warning] = [w for w in json.loads(out)["warnings"] if "compiles" in w]
    assert f"torch.compile at {script}:4, Module.compile at {script}:5" in warning
    assert "no graph ran through Inductor" in warning and "traced op by op" in warning
