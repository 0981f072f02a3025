"""DET000 parse-error: files the linter could not read or parse."""

from __future__ import annotations

from detaudit.findings import Finding, Severity
from detaudit.static.rule import Invalid, Rule


class ParseError(Rule):
    code = "DET000"
    name = "parse-error"
    severity = Severity.ERROR
    summary = "The file could not be read or parsed, so none of its hazards were checked."
    rationale = """
        A file that does not parse (or is not text) cannot be analysed: every
        reproducibility hazard in it goes unreported.  A syntax error in a
        training script also means the run you are trying to reproduce did not
        come from this exact file.
        """
    fix_hint = "Fix the syntax error (or save the file as UTF-8 text), then re-run detaudit."
    VALID = ("import torch\ntorch.manual_seed(0)\n",)
    INVALID = (Invalid("import torch\ndef broken(:\n    pass\n", line=2, message="syntax error"),)

    @classmethod
    def finding(cls, path: str, reason: str, line: int = 0, column: int = 0, cell: int | None = None) -> Finding:
        return Finding(
            code=cls.code,
            name=cls.name,
            severity=cls.severity,
            message=reason,
            path=path,
            line=line,
            column=column,
            fix_hint=cls.fix_hint,
            cell=cell,
        )
