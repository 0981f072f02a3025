"""The pre-commit hook works through pre-commit itself (`pre-commit try-repo`)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("pre-commit") is None, reason="pre-commit is not installed")


def git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", "-c", "user.email=ci@example.com", "-c", "user.name=ci", *args], cwd=cwd, check=True,
                   capture_output=True)


def test_hook_blocks_a_bad_file_and_passes_a_good_one(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    git("init", "-q", cwd=project)
    (project / "train.py").write_text("import torch\ntorch.backends.cudnn.benchmark = True\n")
    (project / "notes.txt").write_text("not python\n")
    git("add", ".", cwd=project)
    git("commit", "-qm", "init", cwd=project)
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home")}

    def try_repo(*files: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["pre-commit", "try-repo", str(REPO), "detaudit", "--files", *files],
            cwd=project, env=env, capture_output=True, text=True, timeout=600,
        )

    bad = try_repo("train.py", "notes.txt")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "train.py:2:1 DET010 cudnn-benchmark" in bad.stdout

    (project / "train.py").write_text("import torch\ntorch.backends.cudnn.benchmark = False\n")
    good = try_repo("train.py")
    assert good.returncode == 0, good.stdout + good.stderr
    # no Python file at all: the hook is skipped, not crashed (TorchFix #63)
    assert try_repo("notes.txt").returncode == 0
