"""``detaudit compare``: is B better than A, or is it seed noise?"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from detaudit.cli import UsageError, add_format_argument

DESCRIPTION = """\
Compares per-seed results of two models.  Each of RESULTS_A / RESULTS_B is a
CSV with a 'seed' column and one column per metric (and optionally a 'task'
column, one row per task and seed), or a 'detaudit variance --out' folder
(its varied-seed runs).  Reports mean ± std of each, the difference B - A on
common seeds with a bootstrap 95% CI and a paired t-test (unpaired, Welch,
when the seeds differ), a verdict in words, the interquartile mean and the
probability that B beats A on a random pair of seeds with stratified
bootstrap CIs (Agarwal et al. 2021), and how many seeds would make the
observed difference distinguishable at the measured spread."""


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "compare",
        help="does B beat A beyond seed noise? (per-seed results of two models)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("results_a", type=Path, metavar="RESULTS_A")
    parser.add_argument("results_b", type=Path, metavar="RESULTS_B")
    parser.add_argument("--metric", action="append", metavar="NAME", help="compare only this metric (repeatable)")
    parser.add_argument("--lower-is-better", action="store_true", help="for losses and error rates")
    add_format_argument(parser, "the comparison")
    parser.set_defaults(handler=run_compare)


def run_compare(args) -> int:
    from detaudit.stats.numerics import scipy_missing

    missing = scipy_missing("compare")
    if missing:
        raise UsageError(missing)

    from detaudit.stats.compare import compare_metric, load_per_seed
    from detaudit.stats.display import report_console
    from detaudit.stats.numerics import json_safe
    from detaudit.stats.study import StudyError

    try:
        a, b = load_per_seed(args.results_a), load_per_seed(args.results_b)
    except StudyError as error:
        raise UsageError(str(error)) from None
    common = sorted(set(a) & set(b))
    if args.metric:
        absent = [name for name in args.metric if name not in common]
        if absent:
            raise UsageError(
                f"metric {', '.join(absent)} is not in both results (common metrics: {', '.join(common) or 'none'})"
            )
        common = [name for name in common if name in args.metric]
    if not common:
        raise UsageError(f"A and B share no metric column (A: {', '.join(sorted(a))}; B: {', '.join(sorted(b))})")
    try:
        comparisons = [compare_metric(name, a[name], b[name], lower_is_better=args.lower_is_better) for name in common]
    except ValueError as error:
        raise UsageError(str(error)) from None

    if args.format == "json":
        print(json.dumps(json_safe([c.to_dict() for c in comparisons]), indent=2))
        return 0
    console = report_console()
    _render(comparisons, args, console)
    for c in comparisons:
        ignored = len(a[c.metric]) + len(b[c.metric]) - 2 * len(c.paired_keys) if c.paired else 0
        note = f" ({ignored} result(s) without a matching seed ignored)" if ignored else ""
        console.print(f"[bold]{c.metric}[/]: {c.verdict()}{note}", highlight=False, soft_wrap=True)
        console.print(f"  {c.improvement_words()}", highlight=False, soft_wrap=True)
        console.print(f"  seeds: {c.seeds_needed.in_words()}", highlight=False, soft_wrap=True)
    return 0


def _render(comparisons, args, console) -> None:
    from rich.table import Table

    table = Table(title=f"A = {args.results_a}   B = {args.results_b}", title_justify="left")
    for column in ("metric", "A mean ± std", "B mean ± std", "B - A", "95% CI", "test", "p"):
        table.add_column(column, justify="left" if column in ("metric", "test") else "right")
    for c in comparisons:
        table.add_row(
            c.metric,
            f"{c.a.mean:.4g} ± {c.a.std:.2g} (n={len(c.a.values)})",
            f"{c.b.mean:.4g} ± {c.b.std:.2g} (n={len(c.b.values)})",
            f"{c.difference:+.4g}",
            f"{c.interval.low:+.4g} to {c.interval.high:+.4g}",
            f"paired t, {len(c.paired_keys)} seeds" if c.paired else "Welch t, seeds differ",
            f"{c.test.p_value:.3g}",
        )
    console.print(table)
    robust = Table(title="robust measures, stratified bootstrap 95% CIs", title_justify="left")
    for column in ("metric", "IQM A", "IQM B", "P(B better than A)"):
        robust.add_column(column, justify="left" if column == "metric" else "right")
    for c in comparisons:
        robust.add_row(
            c.metric,
            f"{c.iqm_a:.4g} [{c.iqm_a_interval.low:.4g}, {c.iqm_a_interval.high:.4g}]",
            f"{c.iqm_b:.4g} [{c.iqm_b_interval.low:.4g}, {c.iqm_b_interval.high:.4g}]",
            f"{c.improvement:.2f} [{c.improvement_interval.low:.2f}, {c.improvement_interval.high:.2f}]",
        )
    console.print(robust)
