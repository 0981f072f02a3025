"""``detaudit variance`` and ``instability`` with ``--nproc-per-node``: each
run a real torchrun run (gloo, 2 ranks), its metric read from rank 0; the
SLURM example script run the way a job array runs it (each shard, then the
merge), with the array's variables set by hand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from detaudit.cli import main

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "fixtures" / "dynamic" / "distributed" / "ddp_metric.py"
SBATCH = ROOT / "fixtures" / "examples" / "slurm_variance.sbatch"


@pytest.mark.slow
def test_slurm_example_runs_distributed_shards_and_merges(tmp_path):
    study = tmp_path / "study"
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",  # this environment's detaudit
        "STUDY": str(study),
        "RUNS": "2",
        "NPROC": "2",
        "SLURM_ARRAY_TASK_COUNT": "2",
    }
    for task in ("1", "2"):  # what `sbatch --array=1-2` runs, one task after the other
        shard = subprocess.run(
            ["bash", str(SBATCH), str(FIXTURE)], env={**env, "SLURM_ARRAY_TASK_ID": task},
            capture_output=True, text=True, timeout=600,
        )
        assert shard.returncode == 0, shard.stderr
        assert f"shard {task}/2: 2 run(s) finished now, 0 still to go" in shard.stdout
    merged = subprocess.run(
        ["bash", str(SBATCH), str(FIXTURE)], env={**env, "MERGE": "1"}, capture_output=True, text=True, timeout=600
    )
    assert merged.returncode == 0, merged.stderr
    summary = json.loads((study / "summary.json").read_text())
    [loss] = summary["metrics"]
    assert loss["name"] == "loss"
    assert loss["fixed"]["std"] == 0.0 and len(loss["fixed"]["values"]) == 2  # DDP on gloo: reproducible
    assert loss["varied"]["std"] > 0  # two seeds, two trainings
    assert json.loads((study / "study.json").read_text())["nproc_per_node"] == 2
    # every rank ran; only rank 0's metrics were read (the others logged into their own folders)
    run_folders = list((study / "runs").iterdir())
    assert len(run_folders) == 4 and all((folder / "launch" / "rank1" / "payload.json").is_file() for folder in run_folders)


@pytest.mark.slow
def test_instability_probe_under_torchrun(tmp_path, capsys):
    out = tmp_path / "probe"
    code = main(["instability", "--nproc-per-node", "2", "--format", "json", "--out", str(out), str(FIXTURE)])
    report = json.loads(capsys.readouterr().out)
    assert code in (0, 1), report
    assert set(report["runs"]) == {"baseline", "one ULP", "reseed"}
    assert all(run["status"] == "ok" and "loss" in run["metrics"] for run in report["runs"].values())
    assert report["runs"]["one ULP"]["perturbed"]["param"].startswith("model.")
