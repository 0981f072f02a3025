"""``detaudit calibrate``: rebuild the ops table empirically for the installed torch."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        help="measure which ops are nondeterministic with the installed torch and write a table",
        description="Run every entry of the ops table forward and backward, once under "
        "torch.use_deterministic_algorithms(True) to see whether it raises and several times in "
        "default mode to see whether results differ bitwise; write the measured table as JSON "
        "(use it with --table or $DETAUDIT_OPS_TABLE).",
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--repeats", type=int, default=None, metavar="N", help="runs per phase and mode (default 5)")
    parser.add_argument(
        "--output", metavar="PATH", help="where to write the table (default: detaudit-ops-DEVICE-torchVERSION.json)"
    )
    parser.add_argument(
        "--only", action="append", metavar="ID", help="measure only these entries (repeatable or comma-separated)"
    )
    parser.add_argument("--table", metavar="PATH", help="the table to start from (default: the shipped one)")
    parser.add_argument(
        "--modules",
        action="append",
        metavar="MODULE",
        help="instead of the ops: derive the layer table of an installed package's public layers "
        "(e.g. torch_geometric.nn; repeatable or comma-separated, one package): the ops-table entries "
        "each layer's forward and backward reach and its RNG draws (use it with $DETAUDIT_LAYER_TABLES)",
    )
    parser.set_defaults(handler=run)


def _selected_ids(table, only: list[str] | None) -> list[str]:
    from detaudit.cli import UsageError

    if not only:
        return [entry.id for entry in table if entry.recipe]
    wanted = [name.strip() for item in only for name in item.split(",") if name.strip()]
    unknown = [name for name in wanted if table.entry(name) is None]
    if unknown:
        raise UsageError(f"unknown op {unknown[0]!r} (see 'detaudit ops' for the ids)")
    without_recipe = [name for name in wanted if not table.entry(name).recipe]
    if without_recipe:
        raise UsageError(f"op {without_recipe[0]!r} has no recipe to run")
    return wanted


def _phase_text(result) -> str:
    if result is None:
        return "-"
    runs = result.runs - 1
    if result.alert:
        return f"raises ({result.alert})"
    if result.deterministic_runs_differ:
        return f"differs {result.default_runs_differ}/{runs}, still {result.deterministic_runs_differ}/{runs} in det. mode"
    if result.default_runs_differ:
        return f"differs {result.default_runs_differ}/{runs}, fixed by det. mode"
    return "stable"


def run(args: argparse.Namespace) -> int:
    from detaudit.cli import UsageError
    from detaudit.cli.ops import load_table_or_usage_error

    if args.modules:
        return _derive_layers(args)

    if args.repeats is not None and args.repeats < 2:
        raise UsageError("--repeats must be at least 2 (runs are compared with the first)")
    base = load_table_or_usage_error(args.table)
    entry_ids = _selected_ids(base, args.only)

    import torch

    from detaudit.knowledge import calibrate

    problem = calibrate.check_device(args.device)
    if problem:
        raise UsageError(problem)
    version = torch.__version__.split("+", 1)[0]
    output = Path(args.output or f"detaudit-ops-{args.device}-torch{version}.json")
    if output.is_dir():
        raise UsageError(f"--output {output} is a directory")

    def report(measurement) -> None:
        if measurement.error:
            print(f"{measurement.entry_id:32} could not run: {measurement.error}", flush=True)
        else:
            forward, backward = _phase_text(measurement.forward), _phase_text(measurement.backward)
            print(f"{measurement.entry_id:32} forward: {forward:40} backward: {backward}", flush=True)

    print(f"calibrating {len(entry_ids)} ops on {args.device} with torch {torch.__version__}", flush=True)
    measurements, table = calibrate.run_calibration(
        base, args.device, entry_ids, args.repeats or calibrate.DEFAULT_REPEATS, on_measured=report
    )
    try:
        output.write_text(json.dumps(table.to_document(), indent=2) + "\n", encoding="utf-8")
    except OSError as error:
        raise UsageError(f"cannot write {output}: {error.strerror}") from None
    failed = sum(1 for m in measurements if m.error)
    print(f"wrote {output} ({len(measurements) - failed} measured, {failed} could not run)")
    print(f"use it with: detaudit ops --table {output}   or   export DETAUDIT_OPS_TABLE={output}")
    return 0


def _derive_layers(args: argparse.Namespace) -> int:
    from detaudit.cli import UsageError

    modules = [name.strip() for item in args.modules for name in item.split(",") if name.strip()]
    if args.device != "cpu" or args.only or args.repeats is not None:
        raise UsageError("--modules traces on the CPU and takes no --device, --only or --repeats")
    import importlib.util

    for module in modules:
        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            found = None
        if found is None:
            raise UsageError(f"--modules: no installed module {module!r}")

    from detaudit.knowledge import derive_layers

    def report(name: str, record: dict) -> None:
        if not record["traced"]:
            print(f"{name:56} not traced (its arguments could not be guessed, or it failed)", flush=True)
        elif record["ops"] or record["draws"]:
            draws = f"  draws on {', '.join(record['draws'])}" if record["draws"] else ""
            print(f"{name:56} {', '.join(record['ops']) or '-'}{draws}", flush=True)

    try:
        document = derive_layers.derive(modules, on_traced=report)
    except ValueError as error:
        raise UsageError(str(error)) from None
    output = Path(args.output or f"detaudit-layers-{document['package']}-{document['package_version']}.json")
    if output.is_dir():
        raise UsageError(f"--output {output} is a directory")
    try:
        output.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    except OSError as error:
        raise UsageError(f"cannot write {output}: {error.strerror}") from None
    layers = document["layers"].values()
    traced = sum(1 for layer in layers if layer["traced"])
    hazards = sum(1 for layer in layers if layer["ops"])
    print(
        f"wrote {output}: {len(document['layers'])} layers of {document['package']} {document['package_version']}, "
        f"{traced} traced, {hazards} reach nondeterministic ops"
    )
    print(f"use it with: export DETAUDIT_LAYER_TABLES={output}")
    return 0
