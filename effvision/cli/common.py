"""What every command module shares: the console, tables, list parsing and the options that
several commands declare alike."""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.table import Table

from ..errors import EffvisionError

# Piped output (CI logs, `| tee`) would otherwise wrap tables at 80 columns.
out = Console(width=None if sys.stdout.isatty() else 160)

# This invocation's arguments (main fills it): `train --nproc` relaunches them under torchrun and
# `zoo compat` records them in its table.
ARGV: list[str] = []

SET_HELP = "Override a recipe key, e.g. --set stages.1.ratio=0.6 or --set data.root=../data (repeatable)."


def set_option():
    """The repeatable `--set key=value` recipe override."""
    return typer.Option([], "--set", help=SET_HELP)


def table(title: str, head: list[str], rows: list[list[str]]) -> None:
    t = Table(title=title, show_lines=False)
    for h in head:
        t.add_column(h, overflow="fold", no_wrap=h not in ("path", "error"))
    for r in rows:
        t.add_row(*r)
    out.print(t)


def csv(value: str, cast=str) -> list:
    try:
        return [cast(v.strip()) for v in value.split(",") if v.strip()]
    except ValueError:
        raise EffvisionError(f"cannot parse '{value}' as a comma-separated list") from None
