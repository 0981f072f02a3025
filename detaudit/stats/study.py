"""A variance study on disk: what is planned, what has run, and the result files.

Layout of a study folder (``--out DIR``)::

    study.json                 the settings every run and shard must share
    runs.jsonl                 one line per finished run, appended as runs end
    runs-shard-2-of-4.jsonl    the same, written by ``--shard 2/4``
    runs/<run id>/             the run's own folder (logged metrics, predictions)
    runs.csv, runs.json        every run: arm, seed, status, metrics, environment
    summary.json, report.html, variance.png

Appending one line per run makes an interrupted study resumable: a run is
done when its line is there, and a torn last line (killed mid-write) is
ignored.  Shards write separate files, so several machines can share a folder
(or copy theirs back) and ``--merge`` joins them.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

FIXED = "fixed"
VARIED = "varied"
ARMS = (FIXED, VARIED)
STUDY_FILE = "study.json"
RUNS_FOLDER = "runs"


class StudyError(Exception):
    """A study folder that cannot be used as asked (one line for the user)."""


@dataclass(frozen=True)
class StudySettings:
    """What decides a run's result; shards and resumed runs must agree on it."""

    script: str
    script_args: tuple[str, ...] = ()
    runs: int = 5
    seed: int = 0
    deterministic: bool = False
    threads: int | None = None
    max_steps: int = 0
    nproc_per_node: int = 0  # each run under torchrun with this many ranks (0: one process)
    torchrun_options: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["script_args"] = list(self.script_args)
        data["torchrun_options"] = list(self.torchrun_options)
        return data

    def distributed(self):
        """The ``torchrun.Distributed`` each run is launched with (None: one process)."""
        if not self.nproc_per_node:
            return None
        from detaudit.launch.torchrun import Distributed

        return Distributed(self.nproc_per_node, self.torchrun_options)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "StudySettings":
        known = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        known["script_args"] = tuple(known.get("script_args", ()))
        known["torchrun_options"] = tuple(known.get("torchrun_options", ()))
        return cls(**known)


@dataclass(frozen=True)
class PlannedRun:
    arm: str
    index: int
    seed: int

    @property
    def run_id(self) -> str:
        return f"{self.arm}-{self.index:03d}"


def plan(settings: StudySettings) -> list[PlannedRun]:
    """K runs at one seed and K runs at K seeds, interleaved so that a partial
    study (or any shard) has both arms."""
    runs = []
    for index in range(settings.runs):
        runs.append(PlannedRun(FIXED, index, settings.seed))
        runs.append(PlannedRun(VARIED, index, settings.seed + index))
    return runs


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/n"`` (1-based) -> (i, n)."""
    try:
        index_text, count_text = text.split("/")
        index, count = int(index_text), int(count_text)
    except ValueError:
        raise StudyError(f"--shard must look like 2/8 (shard 2 of 8), got {text!r}") from None
    if count < 1 or not 1 <= index <= count:
        raise StudyError(f"--shard {text}: need 1 <= i <= n")
    return index, count


def shard_of(planned: list[PlannedRun], shard: tuple[int, int] | None) -> list[PlannedRun]:
    if shard is None:
        return planned
    index, count = shard
    return [run for position, run in enumerate(planned) if position % count == index - 1]


@dataclass
class RunRecord:
    """One finished run, as saved in ``runs*.jsonl``."""

    arm: str
    index: int
    seed: int
    status: str  # "ok", "failed" (non-zero exit, no metrics) or "timed out"
    metrics: dict[str, float] = field(default_factory=dict)
    predictions: dict[str, str] = field(default_factory=dict)  # name -> path inside the study folder
    environment: dict[str, Any] = field(default_factory=dict)
    returncode: int | None = None
    seconds: float = 0.0
    output_tail: str = ""  # the end of stdout/stderr, kept for failed runs
    problems: list[str] = field(default_factory=list)
    torch_seed: int | None = None  # torch.initial_seed() the script logged with; != seed: it reseeded itself

    @property
    def run_id(self) -> str:
        return PlannedRun(self.arm, self.index, self.seed).run_id

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunRecord":
        return cls(**{name: data[name] for name in cls.__dataclass_fields__ if name in data})


def _records_file(folder: Path, shard: tuple[int, int] | None) -> Path:
    if shard is None:
        return folder / "runs.jsonl"
    return folder / f"runs-shard-{shard[0]}-of-{shard[1]}.jsonl"


def _read_records(path: Path) -> list[RunRecord]:
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(RunRecord.from_dict(json.loads(line)))
        except (json.JSONDecodeError, TypeError):
            continue  # a line torn by an interrupted write: that run simply runs again
    return records


def _latest_per_run(records: Iterable[RunRecord]) -> dict[str, RunRecord]:
    """A successful record beats a failed one; otherwise the later one wins."""
    latest: dict[str, RunRecord] = {}
    for record in records:
        previous = latest.get(record.run_id)
        if previous is None or record.ok or not previous.ok:
            latest[record.run_id] = record
    return latest


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


class Study:
    """One study folder."""

    def __init__(self, folder: Path, settings: StudySettings):
        self.folder = folder
        self.settings = settings

    @classmethod
    def open(cls, folder: Path, settings: StudySettings) -> "Study":
        """Creates the folder, or resumes it when its settings match."""
        folder.mkdir(parents=True, exist_ok=True)
        existing = folder / STUDY_FILE
        if existing.is_file():
            saved = cls.load(folder).settings
            if saved != settings:
                differences = ", ".join(
                    f"{name} {getattr(saved, name)!r} -> {getattr(settings, name)!r}"
                    for name in StudySettings.__dataclass_fields__
                    if getattr(saved, name) != getattr(settings, name)
                )
                raise StudyError(
                    f"{folder} holds a study with other settings ({differences}); "
                    "use another --out folder or the same settings"
                )
        else:
            _write_atomically(existing, json.dumps(settings.to_dict(), indent=2) + "\n")
        return cls(folder, settings)

    @classmethod
    def load(cls, folder: Path) -> "Study":
        path = folder / STUDY_FILE
        if not path.is_file():
            raise StudyError(f"{folder} is not a variance study folder (no {STUDY_FILE})")
        try:
            return cls(folder, StudySettings.from_dict(json.loads(path.read_text(encoding="utf-8"))))
        except (json.JSONDecodeError, TypeError) as error:
            raise StudyError(f"{path} is unreadable: {error}") from None

    def run_folder(self, run: PlannedRun) -> Path:
        return self.folder / RUNS_FOLDER / run.run_id

    def records(self) -> dict[str, RunRecord]:
        """Every run recorded in this folder, by run id (all shards)."""
        records: list[RunRecord] = []
        for path in sorted(self.folder.glob("runs*.jsonl")):
            records.extend(_read_records(path))
        return _latest_per_run(records)

    def pending(self, shard: tuple[int, int] | None = None) -> list[PlannedRun]:
        done = {run_id for run_id, record in self.records().items() if record.ok}
        return [run for run in shard_of(plan(self.settings), shard) if run.run_id not in done]

    def append(self, record: RunRecord, shard: tuple[int, int] | None = None) -> None:
        path = _records_file(self.folder, shard)
        line = json.dumps(asdict(record)) + "\n"
        with open(path, "ab+") as stream:
            stream.seek(0, os.SEEK_END)
            if stream.tell():
                stream.seek(-1, os.SEEK_END)
                if stream.read(1) != b"\n":  # a line torn by a kill: do not glue this record to it
                    line = "\n" + line
            stream.write(line.encode("utf-8"))

    def write_tables(self) -> list[Path]:
        """``runs.json`` (everything) and ``runs.csv`` (one row per run,
        metrics and environment flattened into columns)."""
        records = sorted(self.records().values(), key=lambda r: (ARMS.index(r.arm), r.index))
        json_path = self.folder / "runs.json"
        _write_atomically(
            json_path,
            json.dumps(
                {"settings": self.settings.to_dict(), "runs": [asdict(r) for r in records]}, indent=2
            )
            + "\n",
        )
        metric_names = sorted({name for r in records for name in r.metrics})
        environment_names = sorted({name for r in records for name in r.environment})
        csv_path = self.folder / "runs.csv"
        temporary = csv_path.with_name(f".{csv_path.name}.{os.getpid()}.tmp")
        with open(temporary, "w", newline="", encoding="utf-8") as stream:
            writer = csv.writer(stream)
            writer.writerow(
                ["arm", "run", "seed", "status", "seconds", *metric_names]
                + [f"environment.{name}" for name in environment_names]
            )
            for r in records:
                writer.writerow(
                    [r.arm, r.index, r.seed, r.status, f"{r.seconds:.2f}"]
                    + [repr(r.metrics[name]) if name in r.metrics else "" for name in metric_names]
                    + [_cell(r.environment.get(name)) for name in environment_names]
                )
        os.replace(temporary, csv_path)
        return [csv_path, json_path]


def _cell(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value)


def merge(sources: list[Path], destination: Path) -> Study:
    """Joins the runs of several study folders (shards copied back from other
    machines, or one shared folder) into ``destination``."""
    studies = [Study.load(folder) for folder in sources]
    settings = studies[0].settings
    for study in studies[1:]:
        if study.settings != settings:
            raise StudyError(f"{study.folder} and {studies[0].folder} ran different studies (study.json differs)")
    merged = Study.open(destination, settings)
    known = merged.records()
    new_records = []
    for study in studies:
        if study.folder.resolve() == destination.resolve():
            continue
        for run_id, record in study.records().items():
            if run_id in known and (known[run_id].ok or not record.ok):
                continue
            source_run = study.folder / RUNS_FOLDER / run_id
            if source_run.is_dir():
                shutil.copytree(source_run, destination / RUNS_FOLDER / run_id, dirs_exist_ok=True)
            new_records.append(record)
            known[run_id] = record
    for record in new_records:
        merged.append(record)
    return merged
