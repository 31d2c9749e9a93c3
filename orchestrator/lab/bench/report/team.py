"""The team benchmark's report for a person: two tables that fit an 80-column terminal (`--json` prints the report
itself). A figure the run took no sample of reads `-`."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.table import Table

SETUPS = (("team_3x2", "3 nodes × 2 slots"), ("single_1x6", "1 node × 6 slots"))
QUEUE = (
    ("landed", "landed"),
    ("landed_once", "each landed once"),
    ("fsck_clean", "git fsck clean"),
    ("overlapping_at_once", "overlapping jobs at once"),
    ("requeued", "re-queued"),
    ("makespan_s", "makespan s"),
    ("admission_p50_s", "admission wait p50 s"),
    ("admission_p99_s", "admission wait p99 s"),
    ("landing_p50_s", "landing p50 s"),
    ("landing_p99_s", "landing p99 s"),
)
"""The shared queue's figures, one a row, a column per setup."""
BY_NODES = (
    ("runs", "runs"),
    ("landed_once", "once"),
    ("admission_p50_s", "admit p50"),
    ("admission_p99_s", "admit p99"),
    ("landing_p50_s", "land p50"),
    ("landing_p99_s", "land p99"),
    ("p50_over_1_node", "÷ 1 node"),
)
"""Per count of nodes: its runs, whether each landed every job once, latencies (s), admission p50 over 1 node's."""


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def print_report(report: dict[str, Any], console: Console | None = None) -> None:
    """The shared queue through each setup, then admission latency by the number of nodes."""
    if console is None:
        console = Console(highlight=False) if sys.stdout.isatty() else Console(highlight=False, width=100)
    m = report.get("machine") or {}
    setups = [(k, name) for k, name in SETUPS if k in report]
    jobs = next((report[k].get("jobs") for k, _ in setups), None)
    queued = f"{cell(jobs)} jobs on one shared queue; " if setups else ""
    console.print(
        f"bench team: {queued}{m.get('cores', '?')} cores, "
        f"{m.get('ram_mb', '?')} MB RAM, Python {m.get('python', '?')}, load {cell(report.get('load_1m_after'))} after"
    )
    if setups:
        queue = Table(title="one queue, each setup", show_edge=False, pad_edge=False)
        queue.add_column("figure", no_wrap=True)
        for _, name in setups:
            queue.add_column(name, justify="right", no_wrap=True)
        for key, label in QUEUE:
            queue.add_row(label, *(cell(report[k].get(key)) for k, _ in setups))
        console.print(queue)
        console.print(f"makespan, team ÷ single: {cell(report.get('makespan_ratio_team_over_single'))}")
    by = report.get("admission_by_nodes") or {}
    if by:
        nodes = Table(title="admission latency by nodes (s, medians of the runs)", show_edge=False, pad_edge=False)
        nodes.add_column("nodes", justify="right", no_wrap=True)
        for _, heading in BY_NODES:
            nodes.add_column(heading, justify="right", no_wrap=True)
        for n, row in sorted(by.items()):
            nodes.add_row(n, *(cell(row.get(key)) for key, _ in BY_NODES))
        console.print(nodes)
    print_many_files(report, console)


MANY_FILES = (
    ("files", "files the big job wrote"),
    ("big_job_s", "big job s"),
    ("big_job_state", "big job ended"),
    ("api_calls", "API calls on its node"),
    ("api_p50_s", "API p50 s"),
    ("api_p99_s", "API p99 s"),
    ("api_max_s", "API max s"),
    ("api_unanswered", "API calls unanswered (60 s)"),
    ("small_jobs", "small jobs beside it"),
    ("small_landed_once", "each landed once"),
    ("small_job_mean_s", "small job mean s"),
    ("lease_s", "lease s"),
    ("taken_over", "jobs taken over"),
)
"""The many-files run's figures, one a row."""


def print_many_files(report: dict[str, Any], console: Console) -> None:
    """A node's job writing many files beside the team's other work: the API on that node, the leases."""
    many = report.get("many_files")
    if not many:
        return
    table = Table(title="one job writing many files, beside the team's work", show_edge=False, pad_edge=False)
    table.add_column("figure", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    for key, label in MANY_FILES:
        table.add_row(label, cell(many.get(key)))
    for name, margin in sorted((many.get("lease_margin_min_s") or {}).items()):
        table.add_row(f"least lease margin s, {name}", cell(margin))
    console.print(table)
