"""What a calibrated ops table says differently from the shipped one, for one device.

For every entry the calibration measured on DEVICE, prints the shipped facts
for this torch version (phase -> what deterministic mode does) beside the
measured ones, and whether the hazard showed ("observed": an alert, or
outputs that differed between identical runs).  Exit 0 always: this is a
report for a person, not a gate.

Usage: python bench/ops_table_diff.py CALIBRATED.json [--device cuda] [--table SHIPPED.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from detaudit.knowledge.ops import load_ops_table  # noqa: E402


def _facts(behaviours) -> dict[str, str]:
    return {phase: b.deterministic_mode for b in behaviours for phase in b.phases}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("calibrated")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--table", help="the table to compare with (default: the shipped one)")
    args = parser.parse_args()
    shipped = load_ops_table(args.table)
    document = json.loads(Path(args.calibrated).read_text())
    version = document["provenance"]["torch"].split("+", 1)[0]
    print(f"calibrated on {document['provenance'].get('device_name')} with torch {document['provenance']['torch']}")
    same = differs = 0
    for raw in document["ops"]:
        records = [m for m in raw.get("measurements", []) if m["device"] == args.device and m["torch"] == version]
        if not records:
            continue
        entry = shipped.entry(raw["id"])
        before = _facts(entry.behaviours_for(args.device, version)) if entry else {}
        after = {
            phase: b["deterministic_mode"]
            for b in raw["behaviours"]
            if args.device in b["devices"] and b.get("torch") == f"=={version}"
            for phase in b["phases"]
        }
        observed = {
            phase: "alert" if result["alert"] else f"differs {result['default_runs_differ']}/{result['runs'] - 1}"
            for phase, result in records[-1].items()
            if isinstance(result, dict) and (result["alert"] or result["default_runs_differ"])
        }
        if before == after:
            same += 1
            continue
        differs += 1
        print(f"{raw['id']:32} shipped {before or 'nothing'}  measured {after or 'nothing'}  observed {observed or 'nothing'}")
    failed = document["provenance"].get("failed", {})
    print(f"{same} entries as shipped, {differs} differ, {len(failed)} could not run: {sorted(failed) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
