"""Every rule's VALID and INVALID examples, run through the real engine (Fixit's pattern)."""

from __future__ import annotations

import textwrap

import pytest

from detaudit.static.engine.check import check_source
from detaudit.static.rule import all_rules

RULES = all_rules()


def _cases(kind: str):
    for rule in RULES:
        for index, example in enumerate(getattr(rule, kind)):
            yield pytest.param(rule, example, id=f"{rule.name}-{kind.lower()}-{index}")


def _findings_of(rule, code: str):
    result = check_source(textwrap.dedent(code), "train.py")
    return [f for f in result.findings if f.code == rule.code]


@pytest.mark.parametrize(("rule", "example"), list(_cases("VALID")))
def test_valid_example_is_not_reported(rule, example):
    assert _findings_of(rule, example) == []


@pytest.mark.parametrize(("rule", "example"), list(_cases("INVALID")))
def test_invalid_example_is_reported(rule, example):
    findings = _findings_of(rule, example.code)
    assert findings, f"{rule.name} did not report:\n{example.code}"
    if example.line is not None:
        assert findings[0].line == example.line
    if example.message is not None:
        assert example.message in findings[0].message


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_rule_is_documented(rule):
    assert rule.code.startswith("DET") and len(rule.code) == 6
    assert rule.name == rule.name.lower() and " " not in rule.name
    assert rule.summary and rule.rationale.strip() and rule.fix_hint
    assert rule.INVALID, "every rule needs at least one INVALID example"
    assert rule.VALID or rule.name == "parse-error"
    doc = rule.documentation()
    for heading in ("## What it does", "## Why is this bad?", "## Example"):
        assert heading in doc
