"""`status` (the job list) and `wait` (until jobs end)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click

from orchestrator.commands.common import FAILED, FAILED_STATES, api_call, client, emit, err, json_option


def _table(jobs: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    for col in ("id", "state", "repo", "branch", "claim", "text", "reason"):
        table.add_column(col, overflow="fold")
    for j in jobs:
        table.add_row(
            str(j["id"]),
            j["state"],
            Path(j["repo"]).name,
            j["branch"],
            ", ".join(j["claim"]["paths"]) or "-",
            j["text"][:40],
            j["reason"][:80],
        )
    Console(width=200 if not sys.stdout.isatty() else None).print(table)


@click.command()
@click.option("--state", help="Only these states (comma-separated).")
@json_option
@api_call
def status(state: str | None, as_json: bool) -> None:
    """List jobs."""
    jobs = client().jobs(state)
    if as_json:
        emit(jobs)
    elif not jobs:
        err("no jobs")
    else:
        _table(jobs)


@click.command()
@click.argument("job_ids", type=int, nargs=-1)
@click.option("--timeout", type=float, default=None, help="Give up after this many seconds (exit 1).")
@json_option
@api_call
def wait(job_ids: tuple[int, ...], timeout: float | None, as_json: bool) -> None:
    """Wait until the jobs (default: all open ones) end; exit 1 if any did not land."""
    c = client()
    deadline = None if timeout is None else time.monotonic() + timeout
    ids = list(job_ids) or [j["id"] for j in c.jobs() if j["state"] not in FAILED_STATES | {"landed"}]
    while True:
        step = 60.0 if deadline is None else max(0.0, min(60.0, deadline - time.monotonic()))
        data = c.wait(ids, step)
        if data["done"] or (deadline is not None and time.monotonic() >= deadline):
            break
    jobs = data["jobs"]
    if as_json:
        emit(jobs)
    else:
        for j in jobs:
            err(f"job {j['id']}: {j['state']} — {j['reason']}")
    if not data["done"] or any(j["state"] in FAILED_STATES for j in jobs):
        sys.exit(FAILED)
