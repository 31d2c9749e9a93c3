"""The jobs benchmark's tables: one row per (policy, predictor), the machine and the ideal beside it; the
figures split into tables narrow enough for an 80-column terminal."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.table import Table

GROUPS = (
    (
        "schedule",
        (
            ("makespan_s", "makespan s"),
            ("ideal_s", "ideal s"),
            ("ratio_ideal", "× ideal"),
            ("ratio_one_per_repo", "× one/repo"),
            ("max_concurrency", "max conc"),
        ),
    ),
    (
        "landings",
        (
            ("overlaps", "overlaps"),
            ("met_side_by_side", "met"),
            ("conflicts", "confl"),
            ("redone", "redone"),
            ("lost", "lost"),
            ("broken", "broken"),
        ),
    ),
    (
        "claims",
        (
            ("over_serialized_pairs", "over-ser"),
            ("reordered_pairs", "reord"),
            ("confident_claims", "conf"),
            ("missed_claims", "missed"),
        ),
    ),
    ("queue (s)", (("wait_p50_s", "wait p50"), ("wait_p95_s", "wait p95"), ("planning_s", "plan"))),
)
"""The figures of a row, a table per group, each narrow enough for an 80-column terminal."""
OVERHEAD = (
    ("slot_to_start", "slot free → start"),
    ("exit_to_landed", "runner exit → landed"),
    ("landing_hold", "landing hold"),
)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}" if abs(value) >= 0.1 or value == 0 else f"{value:.3f}"
    return str(value)


def print_table(rows: list[dict[str, Any]], info: dict[str, Any], console: Console | None = None) -> None:
    # Piped (a file, a README), the table keeps its full width instead of wrapping every column to 80.
    if console is None:
        console = Console() if sys.stdout.isatty() else Console(width=200)
    m = info["machine"]
    console.print(
        f"jobs bench: {info['changes']} changes from {info['history']}, "
        f"{m['cores']} cores, {m['ram_mb']} MB RAM, Python {m['python']}, load {m['load_1m']}"
    )
    for title, columns in GROUPS:
        grid = [[_fmt(r.get(k)) for k, _ in columns] for r in rows]
        table = Table(title=title, show_edge=False, pad_edge=False)
        table.add_column("policy/predictor", no_wrap=True)
        for i, (_, heading) in enumerate(columns):
            table.add_column(heading, justify="right", min_width=max((len(c[i]) for c in grid), default=1))
        for r, row_cells in zip(rows, grid, strict=True):
            table.add_row(f"{r['policy']}/{r['predictor']}", *row_cells)
        console.print(table)
    over = Table(title="overhead per job (s)", show_edge=False, pad_edge=False)
    over.add_column("policy/predictor", no_wrap=True)
    for _, title in OVERHEAD:
        over.add_column(f"{title} p50", justify="right")
        over.add_column("p95", justify="right")
    for r in rows:
        cells = [f"{r['policy']}/{r['predictor']}"]
        for key, _ in OVERHEAD:
            cells += [_fmt(r.get(f"{key}_p50_s")), _fmt(r.get(f"{key}_p95_s"))]
        over.add_row(*cells)
    console.print(over)
