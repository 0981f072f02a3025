"""Suppression comments: ``# detaudit: ignore[CODE] -- reason`` and ``# noqa: CODE`` on a finding's line."""

from __future__ import annotations

import re

from detaudit.findings import Finding

_SUPPRESSION = re.compile(
    r"#\s*detaudit:\s*ignore(?:\[(?P<rules>[^\]]*)\])?(?:\s*--\s*(?P<reason>.*))?", re.IGNORECASE
)
_NOQA = re.compile(r"#\s*noqa:\s*(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*)", re.IGNORECASE)


def suppression_for(finding: Finding, source_line: str, messages: list[str]) -> str | None:
    """The suppression reason ("" when none given) if ``source_line`` suppresses
    ``finding``, else None.  Unknown rule names become a message, not an error."""
    from detaudit.static.rule import find_rule

    if "#" not in source_line:
        return None
    match = _SUPPRESSION.search(source_line)
    if match is not None:
        reason = (match.group("reason") or "").strip()
        if match.group("rules") is None:
            return reason
        for selector in filter(None, (s.strip() for s in match.group("rules").split(","))):
            rule = find_rule(selector)
            if rule is None:
                messages.append(f"{finding.location}: unknown rule {selector!r} in a detaudit: ignore comment")
            elif rule.code == finding.code:
                return reason
    match = _NOQA.search(source_line)
    if match is not None:
        codes = {c.upper() for c in re.split(r"[\s,]+", match.group("codes"))}
        if finding.code in codes:
            return ""
    return None
