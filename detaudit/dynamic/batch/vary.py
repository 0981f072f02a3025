"""``detaudit run SCRIPT --vary batch``: audit the batch invariance of a script.

A script opts in by defining, at module level::

    def detaudit_batch_samples():        # the samples: a tensor whose dimension 0 indexes them,
        return torch.randn(8, 1024)      # or a tuple/dict of such tensors

    def detaudit_batch_entry(batch):     # the inference / eval function on one batch
        return model(batch)

    detaudit_batch_dim = 0               # optional: the batch dimension (default 0)

In a fresh child process (``launch.run_script``, under the bootstrap's seed
and deterministic switches) the script is loaded with ``__name__`` set to
``"__detaudit_batch__"``, so its ``if __name__ == "__main__":`` block does
not run; then ``detaudit.audit_batch_invariance(detaudit_batch_entry,
detaudit_batch_samples(), ...)`` runs and its report is written as JSON.  The
parent reads it back.  The parent side imports neither torch nor numpy.
"""

from __future__ import annotations

import ast
import json
import runpy
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Sequence

from detaudit.dynamic.batch.report import BatchReport
from detaudit.launch.features import ChildFeature
from detaudit.launch.options import LaunchOptions
from detaudit.launch.process import run_script
from detaudit.report.progress import NoProgress

ENTRY = "detaudit_batch_entry"
SAMPLES = "detaudit_batch_samples"
DIM = "detaudit_batch_dim"
RUN_NAME = "__detaudit_batch__"
REPORT_NAME = "batch_report.json"


def audit_batch_script(
    script: str,
    script_args: Sequence[str] = (),
    *,
    seed: int | None = 0,
    deterministic: bool = False,
    timeout: float | None = None,
    cwd: str | None = None,
    progress=None,  # a detaudit.report.progress.RunProgress, None for silence
    batch_sizes: Sequence[int] | None = None,
    positions: Sequence[int] | str | None = None,
) -> BatchReport:
    """Run the script's batch entry point in a child process; its report.
    Raises ``runner.ScriptFailed`` when the child fails (a crash, no entry
    point, a model that fails on a batch)."""
    from detaudit.dynamic.runner import ScriptFailed
    from detaudit.dynamic.verdict.run_report import RunFailure

    audit = {"target": script, "seed": 0 if seed is None else seed, "positions": positions}
    if batch_sizes is not None:
        audit["batch_sizes"] = list(batch_sizes)
    with tempfile.TemporaryDirectory(prefix="detaudit-batch-") as workdir:
        progress = progress or NoProgress()
        progress.started("batch invariance audit")
        started = time.monotonic()
        options = LaunchOptions(
            seed=seed, output_dir=Path(workdir), settings={"deterministic": True} if deterministic else {},
            features=(BatchAudit(audit),),
        )
        result = run_script(script, script_args, options=options, timeout=timeout, cwd=cwd)
        ok = not result.failed and "batch_report_file" in result.payload
        outcome = f"ok in {time.monotonic() - started:.1f} s" if ok else "failed"
        progress.finished("batch invariance audit", outcome, ok=ok)
        if not ok:
            raise ScriptFailed(RunFailure.of(script, "the batch audit", result, repeats=1, steps=0))
        report = BatchReport.from_dict(json.loads(Path(result.payload["batch_report_file"]).read_text()))
        report.warnings.extend(f"the batch audit {warning}" for warning in result.warnings)
        return report


@dataclass
class BatchAudit(ChildFeature):
    """The launch feature: audit the script's batch entry point instead of running it."""

    key: ClassVar[str] = "batch"
    needs_torch: ClassVar[bool] = False  # the audit imports torch itself, and watches no training
    audit: dict  # target, seed, positions, batch_sizes

    def run_instead(self, session, script: str) -> dict:
        return audit_in_child(script, self.audit, session.output_dir)


def audit_in_child(script: str, audit: dict, output_dir: Path) -> dict:
    """The child's side: load the script, audit its entry point, write the
    report.  Returns the payload entries; a script without the entry points
    or a failing audit ends the child with a one-line message."""
    from detaudit.dynamic.batch.audit import DEFAULT_BATCH_SIZES, BatchInvarianceError, audit_batch_invariance

    # a training script without the entry points is not run at all: it would train first
    _require_entry_points(audit["target"], _top_level_names(script))
    namespace = runpy.run_path(script, run_name=RUN_NAME)
    _require_entry_points(audit["target"], {name for name, value in namespace.items() if callable(value)})
    try:
        report = audit_batch_invariance(
            namespace[ENTRY],
            namespace[SAMPLES](),
            batch_sizes=audit.get("batch_sizes") or DEFAULT_BATCH_SIZES,
            positions=audit.get("positions"),
            dim=int(namespace.get(DIM, 0)),
            seed=audit["seed"],
            target=audit["target"],
        )
    except BatchInvarianceError as error:
        raise SystemExit(f"detaudit: {error}") from None
    report_file = Path(output_dir) / REPORT_NAME
    report_file.write_text(json.dumps(report.to_dict()))
    return {"batch_report_file": str(report_file)}


def _top_level_names(script: str) -> set[str] | None:
    """Names the script may bind at module level (functions, classes,
    assignments, imports, also inside module-level if/try/with blocks);
    None when it does not parse (running it will say why)."""
    try:
        tree = ast.parse(Path(script).read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, OSError):
        return None
    names: set[str] = set()
    statements = list(tree.body)
    while statements:
        node = statements.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
            continue
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):  # compound statements
            statements.extend(getattr(node, field, None) or [])
        for child in ast.iter_child_nodes(node):  # assignment targets, for/with targets, walrus
            if isinstance(child, ast.expr):
                names.update(n.id for n in ast.walk(child) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))
    return names


def _require_entry_points(target: str, names: set[str] | None) -> None:
    missing = [name for name in (ENTRY, SAMPLES) if names is not None and name not in names]
    if missing:
        raise SystemExit(
            f"detaudit: {target} defines no {' and no '.join(f'{name}()' for name in missing)} at module "
            f"level: --vary batch calls {ENTRY}(batch) on batches built from {SAMPLES}()"
        )
