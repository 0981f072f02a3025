"""``detaudit check``: the static pass.  Never imports torch or numpy."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from detaudit.findings import Finding, Severity
from detaudit.static.fixes.code import FIX_STYLES

FORMATS = ("text", "json", "sarif", "github")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "check",
        help="statically check training code for reproducibility hazards",
        description="Read training code (never run it) and report what makes results irreproducible.",
    )
    parser.add_argument("paths", nargs="*", type=Path, help="files or directories (default: the current directory)")
    parser.add_argument("--format", choices=FORMATS, default="text", help="output format (default: text)")
    parser.add_argument("-o", "--output", type=Path, help="write the report to this file instead of stdout")
    parser.add_argument("--select", action="append", default=[], metavar="RULES",
                        help="only these rules (codes, names or code prefixes, comma-separated)")
    parser.add_argument("--ignore", action="append", default=[], metavar="RULES", help="skip these rules")
    parser.add_argument("--fail-on", type=str, metavar="SEVERITY",
                        help="exit 1 only for findings at or above: info, warning (default), error")
    parser.add_argument("--exit-zero", action="store_true", help="exit 0 even when there are findings")
    parser.add_argument("-q", "--quiet", action="store_true", help="print findings only, no summary")
    parser.add_argument("--no-config", action="store_true", help="ignore [tool.detaudit] in pyproject.toml")
    parser.add_argument("--no-cache", action="store_true", help="neither read nor write the result cache")
    parser.add_argument("--jobs", type=int, help="worker processes (default: all cores)")
    parser.add_argument("--file-time-budget", type=str, metavar="SECONDS",
                        help="stop analysing a file after this long, and leave out expressions predicted to take "
                             "longer to parse; both reported as parse errors (default: 10, or file-time-budget in "
                             "[tool.detaudit])")
    parser.add_argument("--show-suppressed", action="store_true", help="also list suppressed findings with their reasons")
    parser.add_argument("--add-ignores", action="store_true",
                        help="add '# detaudit: ignore[CODE]' comments for every current finding (a baseline)")
    parser.add_argument("--fix", action="store_true", help="apply safe fixes in place")
    parser.add_argument("--diff", action="store_true", help="print the fixes as a unified diff; change nothing")
    parser.add_argument("--unsafe-fixes", action="store_true", help="also apply fixes that may change behaviour")
    parser.add_argument("--fix-style", choices=FIX_STYLES,
                        help="what fixes write: plain torch/numpy/random code (default), or calls of detaudit's "
                             "helpers, which need detaudit installed (default: fix-style in [tool.detaudit])")
    parser.set_defaults(handler=run)


def _split_selectors(values: list[str]) -> list[str]:
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


def run(args: argparse.Namespace) -> int:
    from detaudit.cli import UsageError
    from detaudit.static.run.checker import run_check
    from detaudit.static.run.config import Config, ConfigError, RuleSelection, find_pyproject, load_config, parse_budget

    paths = args.paths or [Path(".")]
    # a path that does not exist is an error reported with the others' results (exit 2), as ruff does
    config_start = next((p for p in paths if p.exists()), Path("."))
    try:
        config = Config() if args.no_config else load_config(find_pyproject(config_start.resolve()))
        fail_on = Severity.parse(args.fail_on) if args.fail_on else config.fail_on
    except (ConfigError, ValueError) as error:
        raise UsageError(str(error)) from None
    if args.file_time_budget is not None:
        try:
            config.file_time_budget = parse_budget(args.file_time_budget)
        except ValueError as error:
            raise UsageError(f"--file-time-budget: {error}") from None
    if args.fix_style is not None:
        config.fix_style = args.fix_style

    _load_ops_table_or_fail()
    _load_layer_tables_or_fail()
    select = _split_selectors(args.select) or config.select
    ignore = [*config.ignore, *_split_selectors(args.ignore)]
    selection = RuleSelection(select, ignore)
    for warning in [*config.warnings, *([] if selection.is_default else selection.warnings())]:
        print(f"detaudit: warning: {warning}", file=sys.stderr)

    check = run_check(paths, config, selection, use_cache=not args.no_cache, jobs=args.jobs)
    for message in check.messages:
        print(f"detaudit: {message}", file=sys.stderr)
    for warning in check.warnings:
        print(f"detaudit: warning: {warning}", file=sys.stderr)
    for error in check.errors:
        print(f"detaudit: error: {error}", file=sys.stderr)
    # a missing path or an internal error means the check is incomplete: never a clean pass
    incomplete = bool(check.errors)

    if args.diff:
        code = _print_fix_diff(args, check, config, selection)
        return 2 if incomplete else code
    if args.fix:
        check = _apply_fixes(args, check, paths, config, selection)
    if args.add_ignores:
        from detaudit.static.fixes.baseline import add_ignores

        added, problems = add_ignores(check.findings, check.paths)
        for problem in problems:
            print(f"detaudit: {problem}", file=sys.stderr)
        print(f"Added {added} suppression comment{'s' if added != 1 else ''}.", file=sys.stderr)
        return 2 if incomplete else 0

    _write_report(args, check, config, selection)
    if incomplete or check.errors:  # check.errors: also the fresh check after --fix
        return 2
    if args.exit_zero:
        return 0
    return 1 if any(f.severity >= fail_on for f in check.findings) else 0


def _load_ops_table_or_fail() -> None:
    """A bad ``$DETAUDIT_OPS_TABLE`` is the user's input error: say so once, up
    front, instead of letting the nondeterministic-op rule fail in every file."""
    import os

    if not os.environ.get("DETAUDIT_OPS_TABLE"):  # knowledge.ops.TABLE_ENV_VAR, without importing it
        return  # the shipped table is validated by the test suite
    from detaudit.cli import UsageError
    from detaudit.knowledge.ops import OpsTableError, load_ops_table

    try:
        load_ops_table()
    except OpsTableError as error:
        raise UsageError(str(error)) from None


def _load_layer_tables_or_fail() -> None:
    """A bad ``$DETAUDIT_LAYER_TABLES`` file, likewise."""
    from detaudit.cli import UsageError
    from detaudit.knowledge.layers import LayerTableError, derived_layers

    try:
        derived_layers()
    except LayerTableError as error:
        raise UsageError(str(error)) from None


def _print_fix_diff(args, check, config, selection) -> int:
    """``--diff``: only the diff on stdout (so it pipes into ``git apply``); exit 1
    when there is something to fix, like ruff."""
    from detaudit.static.fixes.apply import apply_fixes

    outcome = apply_fixes(
        check.results, paths=check.paths, rules=selection.rules, config=config, unsafe=args.unsafe_fixes, write=False
    )
    for error in outcome.errors:
        print(f"detaudit: {error}", file=sys.stderr)
    sys.stdout.write(outcome.diff)
    print(f"{outcome.fixed} fixable finding{'s' if outcome.fixed != 1 else ''} (diff only, nothing written).", file=sys.stderr)
    return 1 if outcome.fixed and not args.exit_zero else 0


def _apply_fixes(args, check, paths, config, selection):
    """``--fix``: write the fixes, then report what remains from a fresh check."""
    from detaudit.static.fixes.apply import apply_fixes
    from detaudit.static.run.checker import run_check

    outcome = apply_fixes(
        check.results, paths=check.paths, rules=selection.rules, config=config, unsafe=args.unsafe_fixes, write=True
    )
    for error in outcome.errors:
        print(f"detaudit: {error}", file=sys.stderr)
    rechecked = run_check(paths, config, selection, use_cache=not args.no_cache, jobs=args.jobs)
    for error in rechecked.errors:
        if error not in check.errors:  # a fixed file the fresh check failed on
            print(f"detaudit: error: {error}", file=sys.stderr)
    print(
        f"Fixed {outcome.fixed} finding{'s' if outcome.fixed != 1 else ''}; {len(rechecked.findings)} remaining.",
        file=sys.stderr,
    )
    return rechecked


def _write_report(args: argparse.Namespace, check, config, selection) -> None:
    from detaudit.report.github import github_annotations
    from detaudit.report.jsonout import check_report
    from detaudit.report.sarif import invocation, to_sarif

    stream = _open_output(args.output) if args.output else sys.stdout
    try:
        if args.format == "json":
            report = check_report(
                check.findings,
                files_checked=check.files_checked,
                suppressed=check.suppressed,
                messages=[*check.messages, *(f"warning: {w}" for w in check.warnings)],
                errors=check.errors,
                elapsed=check.elapsed,
                project_roots=[{"path": str(root.path), "found_by": root.found_by} for root in check.roots],
            )
            json.dump(report, stream, indent=2)
            stream.write("\n")
        elif args.format == "sarif":
            from detaudit.static.rule import all_rules

            # a check some file's errors left incomplete is not a successful run
            from detaudit.static.fixes.apply import with_suggested_fixes

            run_invocation = invocation(not check.errors, [("error", error) for error in check.errors])
            findings = with_suggested_fixes(check.findings, check.results, rules=selection.rules, paths=check.paths, config=config)
            sarif = to_sarif(findings, all_rules() if findings else [], run_invocation=run_invocation)
            json.dump(sarif, stream, indent=2)
            stream.write("\n")
        elif args.format == "github":
            stream.write(github_annotations(check.findings, errors=check.errors))
        else:
            _write_text(args, check, stream)
    finally:
        if args.output:
            stream.close()


def _open_output(path: Path):
    """The report file, its missing parent directories created (as ruff's
    ``--output-file`` does); a path that cannot be written is a usage error."""
    from detaudit.cli import UsageError

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.open("w", encoding="utf-8")
    except OSError as error:
        raise UsageError(f"cannot write the report to {path}: {error.strerror or error}") from None


def _write_text(args: argparse.Namespace, check, stream) -> None:
    from rich.markup import escape

    from detaudit.report.text import make_console, render_findings, summary_line
    from detaudit.static.engine.sources import split_lines
    from detaudit.static.run.discovery import display_path

    console = make_console(stream)
    lines_cache: dict[str, list[str]] = {}

    def source_line(finding: Finding) -> str | None:
        if finding.cell is not None or finding.path not in check.paths:
            return None
        if finding.path not in lines_cache:
            try:
                text = check.paths[finding.path].read_bytes().decode("utf-8", errors="replace")
            except OSError:
                text = ""
            lines_cache[finding.path] = split_lines(text)
        lines = lines_cache[finding.path]
        return lines[finding.line - 1] if 0 < finding.line <= len(lines) else None

    render_findings(console, check.findings, source_line)
    if args.show_suppressed and check.suppressed:
        console.print()
        console.print("[bold]Suppressed:[/bold]")
        render_findings(console, check.suppressed, source_line, show_reason=True)
    if not args.quiet:
        if check.findings:
            console.print()
        console.print(
            summary_line(check.files_checked, check.findings, len(check.suppressed), check.elapsed, len(check.errors))
        )
        # project modules are resolved from the root: say which, where it is not the obvious one
        for root in check.roots:
            if root.path != Path.cwd().resolve():
                console.print(f"[dim]Project root: {escape(display_path(root.path))} (found by {escape(root.found_by)})[/dim]")
