"""`detaudit run --save-reference DIR` / `--against DIR`: this run against one
saved in another environment, with ATEN_CPU_CAPABILITY as the other machine.

Each case is first checked by plain runs of the fixture (the final state's
bytes under ``default`` and under the machine's best capability), so a drift
reported is one that is there."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from detaudit.cli import main

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "fixtures" / "reference" / "drifting_training.py"
REFERENCE_CAPABILITY = "default"

# a plain run of the fixture: the final parameters' bytes, hashed
_PLAIN_RUN = """
import hashlib, runpy, sys, torch
sys.argv = [sys.argv[1], *sys.argv[2:]]
scope = runpy.run_path(sys.argv[0], run_name="__main__")
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in scope["model"].parameters()))
print(torch.backends.cpu.get_cpu_capability(), digest.hexdigest())
"""


@contextmanager
def _capability(value: str | None):
    """ATEN_CPU_CAPABILITY for the runs started inside (None: the machine's best)."""
    saved = os.environ.get("ATEN_CPU_CAPABILITY")
    if value is None:
        os.environ.pop("ATEN_CPU_CAPABILITY", None)
    else:
        os.environ["ATEN_CPU_CAPABILITY"] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("ATEN_CPU_CAPABILITY", None)
        else:
            os.environ["ATEN_CPU_CAPABILITY"] = saved


def _plain(args: list[str], capability: str | None) -> tuple[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    if capability is not None:
        env["ATEN_CPU_CAPABILITY"] = capability
    out = subprocess.run(
        [sys.executable, "-c", _PLAIN_RUN, str(FIXTURE), "--steps", "2", *args],
        capture_output=True, text=True, env=env, check=True,
    ).stdout.split()
    return out[-2], out[-1]


BEST = _plain(["--init", "numpy"], None)[0]
needs_vector_capability = pytest.mark.skipif(
    BEST == "DEFAULT", reason="this CPU has no vector capability above default: nothing to drift from"
)

# the fixture's bfloat16 linear alone: do its bits follow ATEN_CPU_CAPABILITY on this CPU?  oneDNN
# picks a bf16 kernel by the instruction set; on a CPU with AVX512-BF16 it picks the same one
# under both capabilities (measured on an Intel Xeon with avx512_bf16: equal bytes, and the
# fixture's drift starts at the optimizer's vectorized add_)
_BF16_LINEAR = """
import hashlib, numpy as np, torch
rng = np.random.default_rng(0)  # not torch.randn: its own bits follow the capability
x, w = (torch.from_numpy(rng.standard_normal((512, 64), dtype=np.float32)) for _ in range(2))
print(hashlib.sha256(torch.nn.functional.linear(x.bfloat16(), w.bfloat16()).float().numpy().tobytes()).hexdigest())
"""


def _bf16_linear_digest(capability: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    if capability is not None:
        env["ATEN_CPU_CAPABILITY"] = capability
    return subprocess.run([sys.executable, "-c", _BF16_LINEAR], capture_output=True, text=True, env=env, check=True).stdout.strip()


CASES = {  # fixture arguments -> (the drift root's op, its module, the source text of its line)
    "torch-init": (["--init", "torch"], "aten.randn.default", "", "return torch.randn(*shape)"),
    "layernorm": (["--init", "numpy", "--model", "layernorm"], "aten.native_layer_norm.default", "model.norm", "self.norm("),
    "bf16-matmul": (["--init", "numpy", "--model", "bf16-matmul"], "aten.mm.default", "model", "x.bfloat16()"),
}


def _line_of(text: str) -> int:
    return next(n for n, line in enumerate(FIXTURE.read_text().splitlines(), 1) if text in line)


def _detaudit(capsys, *args) -> tuple[int, str, str]:
    code = main(["run", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """One reference per case, saved under ATEN_CPU_CAPABILITY=default (2 runs: the audit still checks them)."""
    folders = {}
    for name, (args, *_) in CASES.items():
        folder = tmp_path_factory.mktemp("references") / name
        with _capability(REFERENCE_CAPABILITY):
            assert main(["run", str(FIXTURE), "--repeats", "2", "--save-reference", str(folder), "--", *args]) == 0
        folders[name] = folder
    return folders


def _against(capsys, folder, args, *options) -> tuple[int, dict]:
    with _capability(None):
        code, out, _ = _detaudit(capsys, FIXTURE, "--against", folder, "--format", "json", *options, "--", *args)
    return code, json.loads(out)


def test_the_folder_holds_what_a_comparison_needs(references):
    folder = references["torch-init"]
    assert sorted(p.name for p in folder.iterdir()) == [
        "first_steps.pt.gz", "manifest.json", "state.pt.gz", "trace.json.gz"
    ]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["steps"] == 2 and manifest["seed"] == 0 and manifest["script_args"] == ["--init", "torch"]
    assert manifest["environment"]["torch.backends.cpu.get_cpu_capability"] == "DEFAULT"
    assert manifest["environment"]["env.ATEN_CPU_CAPABILITY"] == "default"
    assert manifest["size_bytes"] == sum(p.stat().st_size for p in folder.iterdir() if p.name != "manifest.json")
    assert manifest["size_bytes"] < 4_000_000  # small enough to commit
    assert set(manifest["files"]) == {"trace.json.gz", "first_steps.pt.gz", "state.pt.gz"}


def test_the_same_environment_is_identical(capsys, references):
    args = CASES["layernorm"][0]
    with _capability(REFERENCE_CAPABILITY):
        code, out, err = _detaudit(capsys, FIXTURE, "--against", references["layernorm"], "--", *args)
    assert code == 0, out
    assert out.startswith("identical: 1 run of ") and "matched the reference in" in out
    assert "Root causes" not in out and "note: the environments differ" not in out
    assert "run 2 (against the reference): ok" in err


@needs_vector_capability
@pytest.mark.parametrize("case", list(CASES))
def test_a_drift_names_its_root_and_the_environment_difference(capsys, references, case):
    args, op, module, source = CASES[case]
    # ground truth: plain runs of the fixture end with other parameters under the two capabilities
    assert _plain(args, REFERENCE_CAPABILITY)[1] != _plain(args, None)[1]
    code, report = _against(capsys, references[case], args)
    assert code == 1 and report["verdict"] == "drift" and report["exit_code"] == 1
    first = report["root_causes"][0]
    if case == "bf16-matmul" and _bf16_linear_digest(REFERENCE_CAPABILITY) == _bf16_linear_digest(None):
        # ground truth on this CPU: the matmul gives the same bits under both capabilities, so the
        # drift starts in a later op (the optimizer's vectorized update) and must not be blamed on it
        assert (first["kind"], first["code"]) == ("environment-drift", "DYN030") and first["op"] != op
        return
    assert (first["kind"], first["code"], first["op"], first["module"]) == ("environment-drift", "DYN030", op, module)
    assert first["line"] == _line_of(source) and first["path"].endswith("drifting_training.py")
    assert first["effect"] == "final-state" and first["max_abs_diff"] > 0 and first["max_ulp"] >= 1
    assert report["environment_differences"]["torch.backends.cpu.get_cpu_capability"] == ["DEFAULT", BEST]
    assert report["environment_differences"]["env.ATEN_CPU_CAPABILITY"] == ["default", None]
    assert report["tensors"] and report["reference"]["script_args"] == args
    assert any("the environments differ in torch.backends.cpu.get_cpu_capability: DEFAULT (reference) against" in n for n in report["notes"])


@needs_vector_capability
def test_op_sequences_that_part_are_realigned_and_compared_past(capsys, tmp_path):
    """The path taken depends on the environment (LayerNorm with vector instructions, op by op without):
    the stretches each side ran alone are one control-flow cause where they start, and the comparison goes on
    past them to the drift root after the paths join (the noise's torch.randn)."""
    args = ["--init", "numpy", "--model", "capability-path"]
    with _capability(REFERENCE_CAPABILITY):
        assert main(["run", str(FIXTURE), "--repeats", "2", "--save-reference", str(tmp_path / "ref"), "--", *args]) == 0
    capsys.readouterr()
    code, report = _against(capsys, tmp_path / "ref", args)
    assert code == 1 and report["verdict"] == "drift"
    forward, backward, drift = report["root_causes"]
    assert (forward["kind"], forward["op"], forward["line"], forward["phase"]) == (
        "control-flow", "aten.mean.dim", _line_of("hidden.mean(-1"), "forward"
    )
    assert "only in the other run (aten.native_layer_norm.default at" in forward["other_side"]["note"]
    assert forward["other_side"]["other_only_count"] == 1 and forward["other_side"]["reference_only_count"] > 1
    assert backward["kind"] == "control-flow" and backward["phase"] == "backward"
    assert "aten.native_layer_norm_backward.default" in backward["other_side"]["note"]
    assert (drift["kind"], drift["op"], drift["line"]) == ("environment-drift", "aten.randn.default", _line_of("torch.randn(hidden.shape)"))


def test_a_float64_reference_against_a_float32_run(capsys, tmp_path):
    """Same machine, another precision: the ops align, dtypes aside; a note says where the precisions part,
    the drift root is found by value (a capture rerun of the float32 run against the reference's kept tensors),
    and the final tensors are compared rounded to float32, so a tolerance can pass them."""
    with _capability(None):
        assert main(["run", str(FIXTURE), "--repeats", "2", "--save-reference", str(tmp_path / "ref"), "--",
                     "--init", "numpy", "--dtype", "float64"]) == 0
    capsys.readouterr()
    code, report = _against(capsys, tmp_path / "ref", ["--init", "numpy"])
    assert code == 1 and report["verdict"] == "drift"
    assert report["environment_differences"]["torch.get_default_dtype"] == ["torch.float64", "torch.float32"]
    assert any(note.startswith("the runs compute in other floating-point precisions (float64[") for note in report["notes"])
    assert {diff["dtype"] for diff in report["tensors"]} == {"float64->float32"}
    assert all(0 < diff["max_abs_diff"] < 1e-3 for diff in report["tensors"])  # rounded, not "another dtype: inf"
    # the float64 run casts NumPy's float32 data: an op the float32 run has not; then, by value, the one op
    # whose float32 result rounds differently from the float64 one from inputs that match rounded: the linear layer
    cast, rounding = report["root_causes"]
    assert (cast["kind"], cast["op"], cast["other_side"]["reference_only_count"]) == ("control-flow", "aten._to_copy.default", 1)
    assert (rounding["kind"], rounding["op"], rounding["line"], rounding["phase"]) == (
        "environment-drift", "aten.mm.default", _line_of("self.norm(torch.nn.functional.linear"), "forward"
    )
    assert rounding["max_ulp"] >= 1 and rounding["hint"].startswith("Rounds differently in float32 than the reference's float64")
    assert any("the drift roots are the first ops whose result, from inputs that match rounded" in n for n in report["notes"])
    worst = max(diff["max_rel_diff"] for diff in report["tensors"])
    code, report = _against(capsys, tmp_path / "ref", ["--init", "numpy"], "--tolerance", f"{worst * 2:g}")
    assert (code, report["verdict"]) == (0, "within-tolerance")


@needs_vector_capability
def test_a_tolerance_decides_between_within_and_drift(capsys, references):
    args = CASES["layernorm"][0]
    code, report = _against(capsys, references["layernorm"], args, "--tolerance", "1000000000ulp")
    assert (code, report["verdict"], report["tolerance"]) == (0, "within-tolerance", "1000000000ulp")
    assert report["root_causes"]  # still said where it departed
    worst = max(diff["max_rel_diff"] for diff in report["tensors"])
    code, report = _against(capsys, references["layernorm"], args, "--tolerance", f"{worst / 2:g}")
    assert (code, report["verdict"]) == (1, "drift")
    code, report = _against(capsys, references["layernorm"], args, "--tolerance", f"{worst * 2:g}")
    assert (code, report["verdict"]) == (0, "within-tolerance")


def test_the_text_report_says_drift_with_ulp(capsys, references):
    args = CASES["torch-init"][0]
    with _capability(None):
        code, out, _ = _detaudit(capsys, FIXTURE, "--against", references["torch-init"], "--", *args)
    if BEST == "DEFAULT":
        assert code == 0 and out.startswith("identical:")
        return
    assert code == 1 and out.startswith("drift: 1 run of ") and " drift root" in out
    assert "ULP)" in out and "environment-drift" in out
    # the roots share one fix: said once
    assert out.count("PyTorch promises no bitwise equality") == 1


@pytest.mark.parametrize(
    "options, message",
    [
        (["--tolerance", "4ulp"], "--tolerance goes only with --against"),
        (["--against", "{ref}", "--steps", "5"], "ran with --steps 2 --seed 0"),
        (["--against", "{ref}", "--vary", "threads"], "--vary does not go with --against"),
        (["--against", "{ref}", "--save-reference", "{tmp}/other"], "--save-reference does not go with --against"),
        (["--against", "{tmp}"], "not a reference folder (no manifest.json"),
        (["--against", "{ref}", "--tolerance", "4 parsecs"], "expected ULP (4ulp) or a relative difference"),
    ],
)
def test_bad_reference_options_are_one_line_errors(capsys, references, tmp_path, options, message):
    filled = [o.format(ref=references["torch-init"], tmp=tmp_path) for o in options]
    with pytest.raises(SystemExit) if "parsecs" in options[-1] else _nothing():
        code, out, err = _detaudit(capsys, FIXTURE, *filled)
        assert code == 2 and out == ""
        assert err.count("\n") == 1 and message in err
    if "parsecs" in options[-1]:
        assert message in capsys.readouterr().err


@contextmanager
def _nothing():
    yield


def test_a_reference_never_overwrites_other_files(capsys, tmp_path):
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    code, out, err = _detaudit(capsys, FIXTURE, "--repeats", "2", "--save-reference", folder)
    assert code == 2 and "exists and is not a reference folder" in err
    assert [p.name for p in folder.iterdir()] == ["notes.txt"] and not (tmp_path / "results.partial").exists()


def test_a_broken_reference_is_an_error_not_a_verdict(capsys, references, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for path in references["torch-init"].iterdir():
        broken.joinpath(path.name).write_bytes(path.read_bytes()[: 100 if path.name == "trace.json.gz" else None])
    code, out, err = _detaudit(capsys, FIXTURE, "--against", broken, "--", "--init", "torch")
    assert code == 2 and "trace.json.gz: unreadable" in err and err.count("\n") == 1


# -- in Python: detaudit.audit(step, save_reference=..., reference=...) ---------------------------
_SAVE_IN_A_PROCESS = """
import sys
sys.path.insert(0, sys.argv[1])
import detaudit
from layernorm_step import layernorm_step
report = detaudit.audit(layernorm_step, repeats=2, save_reference=sys.argv[2])
print(report.verdict)
"""


def test_audit_saves_and_compares_in_process(tmp_path):
    import detaudit

    sys.path.insert(0, str(FIXTURE.parent))
    try:
        from layernorm_step import layernorm_step
    finally:
        sys.path.remove(str(FIXTURE.parent))
    here = tmp_path / "here"
    assert detaudit.audit(layernorm_step, repeats=2, save_reference=str(here)).deterministic
    report = detaudit.audit(layernorm_step, reference=str(here))
    assert report.verdict == "identical" and report.passed and report.repeats == 2
    with pytest.raises(ValueError, match="tolerance goes with reference="):
        detaudit.audit(layernorm_step, tolerance="4ulp")
    if BEST == "DEFAULT":
        return
    # the reference from another "machine": a process under ATEN_CPU_CAPABILITY=default
    elsewhere = tmp_path / "elsewhere"
    env = {**os.environ, "ATEN_CPU_CAPABILITY": REFERENCE_CAPABILITY}
    saved = subprocess.run([sys.executable, "-c", _SAVE_IN_A_PROCESS, str(FIXTURE.parent), str(elsewhere)],
                           capture_output=True, text=True, env=env, check=True)
    assert saved.stdout.split()[-1] == "deterministic"
    report = detaudit.audit(layernorm_step, reference=str(elsewhere))
    assert report.verdict == "drift" and not report.passed
    first = report.root_causes[0]
    assert (first.kind.code, first.op, first.module) == ("DYN030", "aten.native_layer_norm.default", "model.1")
    assert first.max_ulp >= 1 and first.path.endswith("layernorm_step.py")
    assert any("torch.backends.cpu.get_cpu_capability: DEFAULT (reference) against" in note for note in report.notes)
    assert detaudit.audit(layernorm_step, reference=str(elsewhere), tolerance="1000000000ulp").verdict == "within-tolerance"


# -- --repro DIR: the root cause's op alone, in a fresh process ------------------------------------
def _repro(script: Path, *options, capability: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    if capability is not None:
        env["ATEN_CPU_CAPABILITY"] = capability
    return subprocess.run([sys.executable, str(script), *options], capture_output=True, text=True, env=env, cwd="/")


def test_a_race_repro_shows_the_outputs_differ(capsys, tmp_path):
    fixture = ROOT / "fixtures" / "dynamic" / "index_put_backward.py"
    code, out, err = _detaudit(capsys, fixture, "--repeats", "2", "--repro", tmp_path / "repro")
    assert code == 1 and f"a repro of aten.index_put.default at fixtures/dynamic/index_put_backward.py:17 is in {tmp_path / 'repro'}" in out
    assert "capture rerun of run 1" in err  # the call is captured by one rerun
    done = _repro(tmp_path / "repro" / "repro.py", "--times", "100")
    # the race (two threads adding duplicates in another order) shows in the op alone
    assert done.returncode == 1, done.stdout + done.stderr
    assert "aten.index_put.default on cpu" in done.stdout and "calls gave other bits than the first" in done.stdout


@needs_vector_capability
def test_a_drift_repro_gives_each_environment_its_own_digest(capsys, references, tmp_path):
    args = CASES["layernorm"][0]
    code, report = _against(capsys, references["layernorm"], args, "--repro", tmp_path / "repro")
    assert code == 1 and any("a repro of aten.native_layer_norm.default" in note for note in report["notes"])
    script = tmp_path / "repro" / "repro.py"
    here, there = _repro(script), _repro(script, capability=REFERENCE_CAPABILITY)
    assert here.returncode == there.returncode == 0

    def digests(output: str) -> dict:
        return {line.split(":")[0].strip(): re.search(r"[0-9a-f]{64}", line).group() for line in output.splitlines()
                if re.search(r"[0-9a-f]{64}", line)}

    mine, reference_side = digests(here.stdout), digests(there.stdout)
    assert mine["output digest here"] != reference_side["output digest here"]
    assert reference_side["output digest here"] == mine["the reference's"] == reference_side["the reference's"]
    assert mine["output digest here"] == mine["the drifted run's"]
    assert "(same as here)" in there.stdout.split("the reference's")[1].splitlines()[0]


def test_no_repro_without_a_kernel_cause(capsys, tmp_path):
    fixture = ROOT / "fixtures" / "dynamic" / "rng_reseed.py"
    code, out, _ = _detaudit(capsys, fixture, "--repeats", "2", "--repro", tmp_path / "repro")
    assert code == 1 and "--repro: no root cause that rerunning one op shows" in out
    assert not (tmp_path / "repro").exists()


@needs_vector_capability
def test_the_html_report_shows_a_drift(capsys, references, tmp_path):
    page = tmp_path / "drift.html"
    code, report = _against(capsys, references["layernorm"], CASES["layernorm"][0], "--html", page)
    html = page.read_text()
    assert code == 1 and 'class="verdict drift"' in html
    assert "environment-drift" in html and "aten.native_layer_norm.default" in html
    assert [step["step"] for step in report["growth"]] == [1, 2] and report["growth"][0]["differing_ops"] > 0
