"""``detaudit ops``: print the knowledge base of nondeterministic ops."""

from __future__ import annotations

import argparse
import json


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "ops",
        help="list the ops known to be nondeterministic and what deterministic mode does to them",
        description="Print the table of nondeterministic PyTorch ops (the shipped one, "
        "$DETAUDIT_OPS_TABLE, or --table) that the static rules and the dynamic report use.",
    )
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--table", metavar="PATH", help="a table written by 'detaudit calibrate'")
    parser.set_defaults(handler=run)


def load_table_or_usage_error(path: str | None):
    """The table at ``path`` (or the default one); a bad file is a usage error."""
    from detaudit.cli import UsageError
    from detaudit.knowledge.ops import OpsTableError, load_ops_table

    try:
        return load_ops_table(path)
    except OpsTableError as error:
        raise UsageError(str(error)) from None


def run(args: argparse.Namespace) -> int:
    table = load_table_or_usage_error(args.table)
    if args.format == "json":
        print(json.dumps(table.to_document(), indent=2))
        return 0
    from rich.table import Table

    from detaudit.knowledge.ops import DETERMINISTIC_MODES
    from detaudit.report.text import make_console

    provenance = table.provenance
    title = f"{len(table)} nondeterministic ops · torch {table.torch_versions} · {provenance['kind']}"
    if provenance.get("device"):
        title += f" on {provenance['device']} ({provenance.get('device_name', '')})"
    if provenance.get("date"):
        title += f" · {provenance['date']}"
    caption = "under torch.use_deterministic_algorithms(True): " + "; ".join(
        f"{mode} = {text.format(where='').split(': ')[-1]}" for mode, text in DETERMINISTIC_MODES.items()
    )
    grid = Table(title=title, caption=caption, show_lines=True)
    grid.add_column("op", no_wrap=True)
    grid.add_column("reached through", min_width=24, ratio=1)
    grid.add_column("where")
    grid.add_column("det. mode")
    for entry in table:
        spellings = ", ".join(dict.fromkeys(s.display for s in entry.spellings))
        conditions = " and ".join(c.describe() for c in entry.when)
        if conditions:
            spellings += f" [dim]when {conditions}[/dim]"
        if entry.static:
            spellings += f" [dim](only {entry.static.removeprefix('only ')})[/dim]"
        where, modes = [], []
        for behaviour in entry.behaviours:
            devices = "+".join(behaviour.devices)
            version = f" torch{behaviour.torch}" if behaviour.torch else ""
            where.append(f"{devices} {'+'.join(behaviour.phases)}{version}")
            modes.append(behaviour.deterministic_mode)
        grid.add_row(entry.id, spellings, "\n".join(where), "\n".join(modes))
    make_console().print(grid)
    return 0
