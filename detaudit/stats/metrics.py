"""How a user's script reports results to the statistics commands, and how
detaudit reads them back.

In the script::

    detaudit.log_metric("test_acc", acc)              # a final value
    detaudit.log_metric("loss", loss, step=step)      # a value per step
    detaudit.log_predictions("test", logits)          # per-example outputs

or, without importing detaudit, print one line per metric::

    detaudit-metric: {"name": "test_acc", "value": 0.91}
    detaudit-metric: {"test_acc": 0.91, "test_loss": 0.30}

Both helpers do nothing unless the script runs under a detaudit statistics
command, which sets ``DETAUDIT_STATS_DIR`` to a folder of the run.  This module
is imported by user scripts: it must stay cheap, so numpy/torch are imported
only inside ``log_predictions``.

Each logged value also records ``torch.initial_seed()`` when the script has
imported torch: a run started at detaudit's seed that logs another one was
reseeded by the script itself (``torch.manual_seed(args.seed)``), which is
how ``variance`` tells that its varied-seed runs did not vary.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from detaudit.launch.features import ChildFeature

STATS_DIR_ENV = "DETAUDIT_STATS_DIR"
METRICS_FILE = "metrics.jsonl"
PREDICTIONS_FOLDER = "predictions"
STDOUT_PREFIX = "detaudit-metric:"


@dataclass
class RankMetrics(ChildFeature):
    """The launch feature of a statistics run: under torchrun, the ranks but
    rank 0 log into their own folders (the statistics read rank 0's metrics)."""

    key: ClassVar[str] = "rank-metrics"
    needs_torch: ClassVar[bool] = False

    def prepare(self, session) -> None:
        if os.environ.get("RANK", "0") != "0":
            os.environ[STATS_DIR_ENV] = str(session.output_dir / "stats")


def _stats_dir() -> Path | None:
    location = os.environ.get(STATS_DIR_ENV)
    return Path(location) if location else None


def _checked_name(name: Any) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"metric name must be a non-empty string, got {name!r}")
    return name.strip()


def _step(step: Any) -> int | None:
    return None if step is None else int(step)


def log_metric(name: str, value: Any, step: int | None = None) -> None:
    """Record one value of metric ``name`` (a number, or a 1-element tensor/array).

    The last value logged for a name is the run's result; values logged with
    ``step`` also form the per-step history that ``instability`` reports.
    """
    name = _checked_name(name)
    if hasattr(value, "detach"):  # a tensor, maybe still attached to the graph (a loss)
        value = value.detach()
    number = float(value)  # Python numbers, 1-element tensors, numpy scalars
    folder = _stats_dir()
    if folder is None:
        return
    record = {"name": name, "value": number, "step": _step(step), "torch_seed": _torch_seed()}
    with open(folder / METRICS_FILE, "a", encoding="utf-8") as stream:
        stream.write(json.dumps(record) + "\n")


def _torch_seed() -> int | None:
    """The torch seed now, when the script uses torch (never imports it)."""
    torch = sys.modules.get("torch")
    return torch.initial_seed() if torch is not None and hasattr(torch, "initial_seed") else None


def predictions_file(folder: Path, name: str, step: int | None) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    suffix = "" if step is None else f"@{step}"
    return folder / PREDICTIONS_FOLDER / f"{safe}{suffix}.npy"


def log_predictions(name: str, predictions: Any, step: int | None = None) -> None:
    """Record per-example outputs on a fixed evaluation set: logits (examples x
    classes; the predicted class is the argmax) or predicted labels (examples,).
    Every run must log the same examples in the same order."""
    name = _checked_name(name)
    folder = _stats_dir()
    if folder is None:
        return
    import numpy as np

    if hasattr(predictions, "detach"):  # a torch tensor, possibly on a GPU
        predictions = predictions.detach().float().cpu().numpy()
    path = predictions_file(folder, name, _step(step))
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, np.asarray(predictions))


@dataclass
class RunOutputs:
    """What one run reported."""

    final: dict[str, float] = field(default_factory=dict)  # last value per metric
    history: dict[str, dict[int, float]] = field(default_factory=dict)  # metric -> step -> value
    predictions: dict[str, Path] = field(default_factory=dict)  # "name" or "name@step" -> file
    problems: list[str] = field(default_factory=list)  # unreadable metric lines, children killed at exit
    torch_seed: int | None = None  # torch.initial_seed() when the last value was logged (log_metric only)

    def add(self, name: str, value: float, step: int | None) -> None:
        self.final[name] = value
        if step is not None:
            self.history.setdefault(name, {})[step] = value


def _stdout_records(line: str) -> list[tuple[str, float, int | None]]:
    data = json.loads(line)
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object")
    if "name" in data and "value" in data:
        return [(_checked_name(data["name"]), float(data["value"]), _step(data.get("step")))]
    step = _step(data.get("step"))
    return [(_checked_name(key), float(value), step) for key, value in data.items() if key != "step"]


def read_run_outputs(folder: Path | None, stdout: str) -> RunOutputs:
    """Collects what a run logged through the helpers (in ``folder``) and
    through ``detaudit-metric:`` lines of its stdout, in that order."""
    outputs = RunOutputs()
    if folder is not None and (folder / METRICS_FILE).is_file():
        for line in (folder / METRICS_FILE).read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            outputs.add(record["name"], record["value"], record["step"])
            if record.get("torch_seed") is not None:
                outputs.torch_seed = record["torch_seed"]
    for line in stdout.splitlines():
        text = line.strip()
        if not text.startswith(STDOUT_PREFIX):
            continue
        try:
            for name, value, step in _stdout_records(text[len(STDOUT_PREFIX):]):
                outputs.add(name, value, step)
        except (ValueError, TypeError) as error:
            outputs.problems.append(f"ignored metric line {text!r}: {error}")
    if folder is not None and (folder / PREDICTIONS_FOLDER).is_dir():
        for path in sorted((folder / PREDICTIONS_FOLDER).glob("*.npy")):
            outputs.predictions[path.stem] = path
    return outputs
