"""Listings as rich tables, or JSON with --json for scripts."""
from __future__ import annotations

import json
from typing import Any, Sequence

from rich.console import Console
from rich.table import Table

console = Console()


def show(rows: Sequence[dict], columns: Sequence[str], as_json: bool, title: str | None = None) -> None:
    if as_json:
        print(json.dumps(list(rows), indent=2, default=str))
        return
    table = Table(title=title)
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*(_cell(row.get(c)) for c in columns))
    console.print(table)


def _cell(value: Any) -> str:
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return "" if value is None else str(value)
