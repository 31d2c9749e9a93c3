"""`status` (the job list) and `wait` (until jobs end)."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import click

from orchestrator import paths
from orchestrator.commands import fit, term
from orchestrator.commands.common import (
    FAILED,
    FAILED_STATES,
    TIMED_OUT,
    UNCHANGED,
    api_call,
    client,
    emit,
    emit_lines,
    err,
    json_option,
    tell,
)
from orchestrator.core import models

OPEN_STATES = tuple(sorted(models.OPEN))


def job_line(j: dict[str, Any], lay: fit.Layout, *, now: float | None = None, held: list[int] | None = None) -> Any:
    """One job as a rich `Text` line of `lay.width` columns (see `fit.row`)."""
    from rich.text import Text

    line = Text()
    for n, (text, style) in enumerate(fit.row(j, lay, now=now, held=held)):
        if n and not text.startswith("\n"):
            line.append(" ")
        line.append(text, style=style)
    return line


def print_jobs(jobs: list[dict[str, Any]], wide: bool, holds: dict[int, list[int]]) -> None:
    from rich.console import Console

    console = Console(highlight=False, soft_wrap=wide)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(highlight=False, soft_wrap=wide, width=100)  # piped: a line a job, 100 columns
    lay = fit.layout(jobs, console.width - 1, wide=wide, under=console.is_terminal)
    # --wide: whole lines; a terminal breaks them between words, a pipe gets a job a line whatever its length.
    piped = not console.is_terminal
    for j in jobs:
        line = job_line(j, lay, held=holds.get(j["id"]))
        if wide and piped:
            console.print(line, soft_wrap=True)
        else:
            console.print(line, no_wrap=not wide, overflow="ellipsis" if not wide else "fold", crop=not wide)


@click.command()
@click.option("--state", help="Only these states (comma-separated; `waiting` = queued, planning, planned).")
@click.option("--repo", type=click.Path(path_type=Path), help="Only this repository's jobs.")
@click.option("--since", help="Only jobs queued since: a duration (30m, 2h, 1d) or a time (2026-11-30T09:00).")
@click.option("--wide", is_flag=True, help="Full text and reasons (lines may wrap).")
@json_option
@api_call
def status(state: str | None, repo: Path | None, since: str | None, wide: bool, as_json: bool) -> None:
    """List jobs, one line each, with a summary; the reason is cut from the middle to fit (--wide: whole).

    --json: every job's full record (as `show --json`, without its events), one job a line.
    """
    states = None
    if state:
        names = [s.strip() for s in state.split(",") if s.strip()]
        states = ",".join(dict.fromkeys(x for n in names for x in (fit.WAITING if n == "waiting" else (n,))))
    try:
        cutoff = fit.since_cutoff(since) if since else None
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--since") from None
    where = str(repo.expanduser().resolve()) if repo is not None else None
    jobs = [
        j
        for j in client().jobs(states)
        if (where is None or j["repo"] == where) and (cutoff is None or (fit.ts(j["created_at"]) or 0) >= cutoff)
    ]
    if as_json:
        emit_lines(jobs)
        return
    holds = fit.review_holds(jobs)
    listed = {j["id"] for j in jobs}
    blocking = {b for j in jobs if j["state"] in fit.WAITING for b in (j.get("decision") or {}).get("blocking", ())}
    if blocking - listed:
        # What holds a listed job back may not be listed (`--state waiting`, `--repo`, a slot of another repo).
        others = [j for j in client().jobs(",".join(OPEN_STATES)) if j["id"] not in listed]
        holds = {i: r for i, r in fit.review_holds(jobs + others).items() if i in listed}
    if jobs:
        print_jobs(jobs, wide, holds)
    said = [fit.summary(jobs)]
    if ready := [j["id"] for j in jobs if j["state"] == "ready"]:
        said.append(fit.review_hint(ready, holds))
    paused = sorted(scope for scope, c in client().controls().items() if c["paused"])
    if paused:
        where = "every repo" if "*" in paused else ", ".join(paused)
        said.append(f"paused: {where} (nothing new starts there; `orchestrator resume` lifts it)")
    from orchestrator.commands.settings import restart_notice

    if notice := restart_notice(paths.resolve()):
        said.append(notice)
    tell(*said)


def progress_line(jobs: list[dict[str, Any]], width: int) -> str:
    """Which jobs are still open, and why: `2 open: 4 running · 5 Overlap: waits for job 4 to land`."""
    open_ = [j for j in jobs if j["state"] not in ENDED]
    parts = []
    for j in open_:
        if j["state"] in fit.WAITING:
            nxt = (j.get("decision") or {}).get("next", "")
            parts.append(f"{j['id']} {j.get('code') or j['state']}" + (f": {nxt}" if nxt else ""))
        elif j["state"] == "ready":
            parts.append(f"{j['id']} ready for your review (`orchestrator diff {j['id']}`, then land or reject)")
        elif j["state"] == "landing" and j.get("code") not in ("", None, "Finished"):
            parts.append(f"{j['id']} landing, {j['code']}")
        else:
            parts.append(f"{j['id']} {j['state']}")
    return fit.cut_end(term.visible(f"waiting for {len(open_)} of {len(jobs)} jobs: " + " · ".join(parts)), width)


ENDED = models.ENDED


@click.command()
@click.argument("job_ids", type=int, nargs=-1)
@click.option("--timeout", type=float, default=None, help=f"Give up after this many seconds (exit {TIMED_OUT}).")
@click.option("--quiet", "-q", is_flag=True, help="No progress line on a terminal.")
@json_option
@api_call
def wait(job_ids: tuple[int, ...], timeout: float | None, quiet: bool, as_json: bool) -> None:
    """Wait until the jobs (default: all open ones) end.

    Exit 0 if all landed, 1 if any failed (or was cancelled, conflicted, interrupted), 5 if the rest landed but
    one changed nothing (nothing of it landed), 4 if the timeout passed first. On a terminal a
    progress line says which jobs are still open and why.
    """
    c = client()
    deadline = None if timeout is None else time.monotonic() + timeout
    ids = list(job_ids) or [j["id"] for j in c.jobs() if j["state"] not in ENDED]
    live = sys.stderr.isatty() and not quiet and not as_json
    step_max = 1.0 if live else 60.0
    shown = ""
    while True:
        step = step_max if deadline is None else max(0.0, min(step_max, deadline - time.monotonic()))
        data = c.wait(ids, step)
        if live:
            line = progress_line(data["jobs"], shutil.get_terminal_size().columns - 1)
            if line != shown:
                sys.stderr.write("\r\x1b[2K" + line)
                sys.stderr.flush()
                shown = line
        if data["done"] or (deadline is not None and time.monotonic() >= deadline):
            break
    if live and shown:
        sys.stderr.write("\r\x1b[2K")
        sys.stderr.flush()
    jobs = data["jobs"]
    if as_json:
        emit(jobs)
    else:
        for j in jobs:
            code = f" ({j['code']})" if j.get("code") else ""
            term.echo(f"job {j['id']}: {j['state']}{code} — {j['reason']}", err=True)
    if not data["done"]:
        err(f"orchestrator: timed out after {timeout:g}s; {sum(j['state'] not in ENDED for j in jobs)} still open")
        sys.exit(TIMED_OUT)
    if any(j["state"] in FAILED_STATES for j in jobs):
        sys.exit(FAILED)
    if any(j["state"] == "unchanged" for j in jobs):
        sys.exit(UNCHANGED)
