"""The composite GitHub Action (``action.yml``): its metadata, and its shell
steps run the way a runner runs them, on a copy of a fixture project.

GitHub cannot run here, so this test does what a runner does with a
composite action: it evaluates each step's ``if:``, substitutes the
``${{ ... }}`` expressions (inputs, earlier steps' outputs), runs ``run:``
scripts with ``bash --noprofile --norc -eo pipefail`` (the ``shell: bash``
command line) with ``GITHUB_ACTION_PATH``, ``GITHUB_OUTPUT`` and
``RUNNER_TEMP`` set, and reads the outputs back from ``GITHUB_OUTPUT``.
``uses:`` steps (setup-python, upload-sarif) are recorded with their
resolved ``with:`` instead of being called.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
ACTION = REPO / "action.yml"
EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
TOKEN = re.compile(
    r"\s*(?:(?P<string>'(?:[^']|'')*')|(?P<call>(?:always|success|failure)\(\))|"
    r"(?P<name>[A-Za-z_][\w.-]*)|(?P<op>==|!=|&&|\|\||!|\(|\)))"
)
PYTHON_OPERATORS = {"==": "==", "!=": "!=", "&&": " and ", "||": " or ", "!": " not ", "(": "(", ")": ")"}


def load_action() -> dict:
    return yaml.safe_load(ACTION.read_text())


def referenced_names(action: dict) -> list[str]:
    """Every context name used in a ``${{ }}`` or an ``if:`` of the action."""
    texts = EXPRESSION.findall(ACTION.read_text())
    texts += [step["if"] for step in action["runs"]["steps"] if "if" in step]
    return [match.group("name") for text in texts for match in TOKEN.finditer(text) if match.group("name")]


@dataclass
class ActionRun:
    failed: bool = False
    outputs: dict[str, dict[str, str]] = field(default_factory=dict)  # step id -> outputs
    logs: dict[str, str] = field(default_factory=dict)  # step name -> stdout + stderr
    exit_codes: dict[str, int] = field(default_factory=dict)
    calls: dict[str, dict] = field(default_factory=dict)  # uses -> resolved with
    skipped: list[str] = field(default_factory=list)


class Runner:
    """Runs action.yml's steps for one job on a project folder."""

    def __init__(self, action_path: Path, runner_temp: Path):
        self.action_path = action_path
        self.runner_temp = runner_temp

    def run(self, project: Path, inputs: dict[str, str] | None = None, *, reuse: dict | None = None) -> ActionRun:
        """``reuse``: outputs of steps (by id) taken from an earlier job instead of running them."""
        action = yaml.safe_load((self.action_path / "action.yml").read_text())
        declared = action["inputs"]
        unknown = set(inputs or {}) - set(declared)
        assert not unknown, f"not inputs of the action: {unknown}"
        values = {name: str(spec.get("default", "")) for name, spec in declared.items()} | (inputs or {})
        job = ActionRun()

        def lookup(name: str) -> str:
            parts = name.split(".")
            if parts[0] == "inputs" and len(parts) == 2:
                return values[parts[1]]
            if parts[0] == "steps" and len(parts) == 4 and parts[2] == "outputs":
                return job.outputs.get(parts[1], {}).get(parts[3], "")  # GitHub: a missing output is ''
            raise AssertionError(f"this harness does not know the context {name!r}")

        def evaluate(expression: str):
            python, position = [], 0
            for match in TOKEN.finditer(expression):
                assert match.start() == position, f"cannot read {expression!r} at {position}"
                position = match.end()
                if match.group("string"):
                    python.append(repr(match.group("string")[1:-1].replace("''", "'")))
                elif match.group("call"):
                    python.append({"always()": "True", "success()": "not failed", "failure()": "failed"}[match.group("call")])
                elif match.group("name"):
                    python.append(repr(lookup(match.group("name"))))
                else:
                    python.append(PYTHON_OPERATORS[match.group("op")])
            assert position == len(expression.rstrip()), f"cannot read {expression!r}"
            return eval("".join(python), {"failed": job.failed})  # noqa: S307 - a test's own tokens

        def substitute(text) -> str:
            return EXPRESSION.sub(lambda match: str(evaluate(match.group(1))), str(text))

        for number, step in enumerate(action["runs"]["steps"]):
            name = step.get("name", step.get("id", str(number)))
            if not evaluate(step.get("if", "success()")):
                job.skipped.append(name)
                continue
            if "uses" in step:
                job.calls[step["uses"]] = {key: substitute(value) for key, value in step.get("with", {}).items()}
                continue
            if reuse and step.get("id") in reuse:
                job.outputs[step["id"]] = reuse[step["id"]]
                continue
            assert step.get("shell") == "bash", f"step {name!r}: composite run steps need shell: bash"
            script = self.runner_temp / f"step-{number}.sh"
            script.write_text(substitute(step["run"]))
            output_file = self.runner_temp / f"output-{number}"
            output_file.write_text("")
            env = {
                **os.environ,
                "GITHUB_ACTION_PATH": str(self.action_path),
                "GITHUB_OUTPUT": str(output_file),
                "GITHUB_WORKSPACE": str(project),
                "RUNNER_TEMP": str(self.runner_temp),
                **{key: substitute(value) for key, value in step.get("env", {}).items()},
            }
            result = subprocess.run(
                ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
                cwd=project, env=env, capture_output=True, text=True, timeout=600,
            )
            job.logs[name] = result.stdout + result.stderr
            job.exit_codes[name] = result.returncode
            if step.get("id"):
                job.outputs[step["id"]] = dict(
                    line.split("=", 1) for line in output_file.read_text().splitlines() if "=" in line
                )
            if result.returncode != 0:
                job.failed = True
        return job


def test_metadata_names_real_inputs_and_uses_every_one():
    action = load_action()
    assert action["runs"]["using"] == "composite"
    assert set(action["inputs"]) == {"paths", "args", "python-version", "upload-sarif", "sarif-file"}
    for name, spec in action["inputs"].items():
        assert spec.get("description"), f"input {name} has no description"
        assert "default" in spec, f"input {name} has no default"
    names = referenced_names(action)
    inputs_used = {name.split(".")[1] for name in names if name.startswith("inputs.")}
    assert inputs_used == set(action["inputs"])  # every input is used, and every use is declared
    step_ids = {step["id"] for step in action["runs"]["steps"] if "id" in step}
    for name in names:
        assert name.split(".")[0] in ("inputs", "steps"), f"unexpected context {name}"
        if name.startswith("steps."):
            assert name.split(".")[1] in step_ids, f"{name} refers to no step"
    for output in action["outputs"].values():
        assert EXPRESSION.fullmatch(output["value"])
    uses = [step["uses"] for step in action["runs"]["steps"] if "uses" in step]
    assert uses == ["actions/setup-python@v5", "github/codeql-action/upload-sarif@v3"]
    for step in action["runs"]["steps"]:
        if "run" in step:  # inputs reach scripts through env, never pasted into the script text
            assert "${{" not in step["run"] and step["shell"] == "bash"


@pytest.fixture(scope="module")
def runner(tmp_path_factory) -> Runner:
    """The action as a workflow checks it out: its own folder, with the package."""
    action_path = tmp_path_factory.mktemp("action")
    for name in ("action.yml", "pyproject.toml", "README.md"):
        shutil.copy(REPO / name, action_path / name)
    shutil.copytree(REPO / "detaudit", action_path / "detaudit", ignore=shutil.ignore_patterns("__pycache__"))
    return Runner(action_path, tmp_path_factory.mktemp("runner-temp"))


def project_with(tmp_path: Path, files: dict[str, str]) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    for name, text in files.items():
        (project / name).write_text(text)
    return project


def sarif_results(path: Path) -> list[dict]:
    sarif = json.loads(path.read_text())
    jsonschema.validate(sarif, json.loads((REPO / "tests" / "sarif-schema-2.1.0.json").read_text()))
    return sarif["runs"][0]["results"]


@pytest.mark.slow
def test_the_steps_gate_a_project_and_write_sarif(runner, tmp_path_factory):
    # a job on a project with hazards: the real install step (a virtual environment, pip)
    hazards = project_with(tmp_path_factory.mktemp("hazards"), {
        "train.py": (REPO / "fixtures" / "examples" / "train.py").read_text(),
    })
    job = runner.run(hazards)
    assert job.exit_codes["Install detaudit"] == 0, job.logs["Install detaudit"]
    assert job.calls["actions/setup-python@v5"] == {"python-version": "3.12"}
    assert job.outputs["check"]["exit-code"] == "1"
    assert job.failed and job.exit_codes["Gate"] == 1
    assert "::error::detaudit found reproducibility hazards" in job.logs["Gate"]
    assert "::warning file=train.py,line=22," in job.logs["Check"]  # annotations on the pull request
    upload = job.calls["github/codeql-action/upload-sarif@v3"]
    assert upload == {"sarif_file": "detaudit.sarif", "category": "detaudit"}
    results = sarif_results(hazards / upload["sarif_file"])
    assert "DET010" in {result["ruleId"] for result in results}
    installed = job.outputs["install"]

    # more jobs on the same runner (the install step's outputs reused)
    clean = project_with(tmp_path_factory.mktemp("clean"), {
        "train.py": "import torch\n\ntorch.manual_seed(0)\nprint(torch.randn(2))\n",
    })
    job = runner.run(clean, {"python-version": "", "sarif-file": "out/report.sarif"}, reuse={"install": installed})
    assert "Set up Python" in job.skipped
    assert (job.failed, job.outputs["check"]["exit-code"], job.exit_codes["Gate"]) == (False, "0", 0)
    assert sarif_results(clean / "out" / "report.sarif") == []

    job = runner.run(hazards, {"args": "--select DET010", "upload-sarif": "false", "paths": "train.py\n"},
                     reuse={"install": installed})
    assert "Upload SARIF to code scanning" in job.skipped
    assert {result["ruleId"] for result in sarif_results(hazards / "detaudit.sarif")} == {"DET010"}
    assert job.exit_codes["Gate"] == 1

    job = runner.run(hazards, {"args": "--fail-on sometimes"}, reuse={"install": installed})
    assert job.outputs["check"]["exit-code"] == "2" and job.exit_codes["Gate"] == 2
    assert "sarif-file" not in job.outputs["check"]  # the earlier job's report was removed, nothing uploaded
    assert "Upload SARIF to code scanning" in job.skipped
    assert "unknown severity 'sometimes'" in job.logs["Check"]
