"""What a comparison with a reference should be read with (the report's notes).

A reference that ran with other arguments, and the fingerprint keys whose
values differ between the reference's environment and this run's, which
explain a drift (or, when none differs, that the cause is something the
fingerprint does not record).  Imports neither torch nor numpy.
"""

from __future__ import annotations

from typing import Sequence

from detaudit.dynamic.verdict.run_report import IDENTICAL, RECORDER_KEY


def against_notes(reference, script_args: Sequence[str], report) -> list[str]:
    """What the comparison should be read with: a reference that ran other
    arguments, and the environment differences that explain a drift."""
    notes = []
    if list(script_args) != reference.manifest.get("script_args"):
        notes.append(
            f"the reference ran with the arguments {reference.manifest.get('script_args')}, this run with "
            f"{list(script_args)}: a difference can come from them, not from the environment"
        )
    differences = {key: values for key, values in report.environment_differences.items() if key != RECORDER_KEY}
    if report.verdict != IDENTICAL and differences:
        shown = "; ".join(f"{key}: {shown_values(values)}" for key, values in differences.items())
        notes.append(f"the environments differ in {shown}")
    elif report.verdict != IDENTICAL:
        notes.append(
            "the fingerprints show no difference between the environments: a drift here is a difference they do not "
            "record (a library loaded at run time, the data, the script)"
        )
    return notes


def shown_values(values: list) -> str:
    """"DEFAULT (reference) against AVX2"."""
    shown = list(dict.fromkeys("unset" if value is None else str(value) for value in values))
    return f"{shown[0]} (reference) against " + ", ".join(shown[1:]) if len(shown) > 1 else shown[0]
