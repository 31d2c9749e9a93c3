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
            ("list_s", "list s"),
            ("ratio_list", "× list"),
            ("ratio_one_per_repo", "× one/repo"),
        ),
    ),
    (
        "landings",
        (
            ("max_concurrency", "max conc"),
            ("overlaps", "overlaps"),
            ("met_side_by_side", "met"),
            ("lost", "lost"),
            ("broken", "broken"),
        ),
    ),
    (
        "runs again",
        (
            ("conflicts", "confl"),
            ("stopped", "stopped"),
            ("rechecks", "recheck"),
            ("redone", "redone"),
            ("thrown_s", "thrown s"),
            ("saved_s", "saved s"),
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


def _name(row: dict[str, Any]) -> str:
    return f"{row['policy']}/{row['predictor']}"


def row_line(row: dict[str, Any]) -> str:
    """One line for a row the moment it finishes: its makespan and landings, or that it failed and why."""
    if row.get("failed"):
        return f"{_name(row)}: FAILED: {row['failed']}"
    landed = sum(j["state"] == "landed" for j in row.get("per_job", ()))
    return (
        f"{_name(row)}: makespan {_fmt(row['makespan_s'])} s ({_fmt(row['ratio_ideal'])}× ideal, "
        f"{_fmt(row['ratio_list'])}× list), {landed}/{row['jobs']} landed, {row['conflicts']} conflicts "
        f"({row.get('stopped', 0)} stopped while running, {_fmt(row.get('thrown_s', 0.0))} job-s thrown away, "
        f"{_fmt(row.get('saved_s', 0.0))} saved by the stops), {row.get('rechecks', 0)} run again to see an "
        "earlier job's change, "
        f"{row['lost']} lost, {row['broken']} broken"
        + (f" ({row['unreplayable']} no schedule can replay on this range)" if row.get("unreplayable") else "")
    )


def print_table(
    rows: list[dict[str, Any]], info: dict[str, Any], console: Console | None = None, *, per_job: bool = False
) -> None:
    """The rows' tables (a failed row shows `failed` and why, below them); with `per_job`, a table per row of
    its jobs."""
    # Piped (a file, a README), the table keeps its full width instead of wrapping every column to 80.
    if console is None:
        console = Console() if sys.stdout.isatty() else Console(width=200)
    m = info["machine"]
    console.print(
        f"jobs bench: {info['changes']} changes from {info['history']}, "
        f"{m['cores']} cores, {m['ram_mb']} MB RAM, Python {m['python']}, load {m['load_1m']}"
    )
    failed = [r for r in rows if r.get("failed")]
    for title, columns in GROUPS:
        grid = [["failed" if r.get("failed") else _fmt(r.get(k)) for k, _ in columns] for r in rows]
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
    for r in failed:
        console.print(f"{_name(r)} failed: {r['failed']}", highlight=False)
    if per_job:
        for r in rows:
            if r.get("per_job"):
                console.print(_jobs_table(r))


def _jobs_table(row: dict[str, Any]) -> Table:
    """A row's jobs: how each ended, its runs, whom it ran beside (`alone`: nobody), met (really touched a common
    file with, while side by side), conflicts, the work of its runs that did not land, and what it waited for."""
    table = Table(title=f"{_name(row)}: per job", show_edge=False, pad_edge=False)
    for heading in ("job", "state", "runs", "dur s", "wait s", "beside", "met", "confl", "recheck", "thrown s"):
        table.add_column(heading, justify="right" if heading not in ("state", "beside", "met") else "left")
    table.add_column("waited for", overflow="fold")
    for j in row["per_job"]:
        waited = "; ".join(f"{reason} {_ids(on)}".strip() for reason, on in j["waited_for"].items())
        table.add_row(
            str(j["job"]),
            str(j["state"]),
            str(j["runs"]),
            _fmt(j["duration_s"]),
            _fmt(j["wait_s"]),
            _ids(j["beside"]) or "alone",
            _ids(j["met"]) or "-",
            str(j["conflicts"]),
            str(j.get("rechecks", 0)),
            _fmt(j.get("thrown_s")),
            waited or "-",
        )
    return table


def _ids(ids: list[int]) -> str:
    return ",".join(str(i) for i in ids)
