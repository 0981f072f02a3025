"""``detaudit rules [NAME]``: list the rules, or print one rule's documentation."""

from __future__ import annotations

import argparse
import json


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("rules", help="list the static rules, or document one")
    parser.add_argument("rule", nargs="?", help="a rule code or name (e.g. DET010 or cudnn-benchmark)")
    parser.add_argument("--format", choices=("text", "json", "markdown"), default="text")
    parser.set_defaults(handler=run)


def rules_table_markdown() -> str:
    """The rules table in Markdown, as `detaudit rules --format markdown` prints it."""
    from detaudit.static.rule import all_rules

    rows = ["| Code | Name | Severity | What it flags |", "|---|---|---|---|"]
    for rule in all_rules():
        rows.append(f"| {rule.code} | `{rule.name}` | {rule.severity.label} | {rule.summary} |")
    return "\n".join(rows) + "\n"


def run(args: argparse.Namespace) -> int:
    from rich.table import Table

    from detaudit.cli import UsageError
    from detaudit.report.text import make_console
    from detaudit.static.rule import all_rules, find_rule

    if args.rule:
        rule = find_rule(args.rule)
        if rule is None:
            raise UsageError(f"unknown rule {args.rule!r} (see 'detaudit rules')")
        print(rule.documentation(), end="")
        return 0
    rules = all_rules()
    if args.format == "json":
        data = [
            {"code": r.code, "name": r.name, "severity": r.severity.label, "summary": r.summary, "fix_hint": r.fix_hint}
            for r in rules
        ]
        print(json.dumps(data, indent=2))
    elif args.format == "markdown":
        print(rules_table_markdown(), end="")
    else:
        table = Table("Code", "Name", "Severity", "What it flags")
        for rule in rules:
            table.add_row(rule.code, rule.name, rule.severity.label, rule.summary)
        make_console().print(table)
    return 0
