"""Review before landing: `diff` shows a job's change, `land` lands ready jobs, `reject` drops them, `revise`
sends one back to its agent with feedback.

A job enqueued with `--land review` (or in a repo with `land = "review"`) stops in `ready` when it
finishes; its paths stay taken until a person lands or rejects it.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from orchestrator.client import ApiError, Client
from orchestrator.commands import term
from orchestrator.commands.common import api_call, client, emit, err, json_option
from orchestrator.commands.queue import each


@click.command()
@click.argument("job_id", type=int)
@click.option("--head", "against_head", is_flag=True, help="What landing it now would change on the branch head.")
@click.option("--transcript", is_flag=True, help="Beside it, the agent CLI's conversation that made it.")
@json_option
@api_call
def diff(job_id: int, against_head: bool, transcript: bool, as_json: bool) -> None:
    """Show a finished job's change: against its base, or (--head) against the current branch head.

    With --transcript, the agent's conversation beside it (side by side on a terminal 120 columns wide or more,
    else after it), for runners that keep one (`output = "claude-json"`).
    """
    c = client()
    data = c.diff(job_id, "head" if against_head else "base")
    said = conversation(c, job_id) if transcript else None
    if as_json:
        emit({**data, **({"transcript": said} if transcript else {})})
        return
    if data.get("conflicts"):
        term.echo(f"job {job_id} conflicts with the branch head in: {', '.join(data['conflicts'])}", err=True)
        sys.exit(1)
    if transcript:
        side_by_side(data["diff"], said or [], job_id)
    else:
        # The job wrote what the diff shows: on a terminal, nothing in it may drive the terminal (`term.output`).
        sys.stdout.write(term.output(data["diff"], colours=False) if sys.stdout.isatty() else data["diff"])
    if not data["diff"]:
        err(f"job {job_id}: no difference against {data['against']}")


def conversation(c: Client, job_id: int) -> list[dict[str, Any]] | None:
    """The job's agent transcript entries, or None (said on stderr) when its runner keeps none."""
    try:
        raw = b"".join(c.stream(f"/jobs/{job_id}/log?transcript=1")).decode(errors="replace")
    except ApiError as e:
        if e.status != 404:
            raise
        err(f"orchestrator: {e.message}")
        return None
    return [json.loads(line) for line in raw.splitlines() if line.strip().startswith("{")]


SIDE_BY_SIDE = 120
"""Columns a terminal needs for the diff and the transcript side by side (else one after the other)."""


def side_by_side(patch: str, entries: list[dict[str, Any]], job_id: int, console: Any = None) -> None:
    """The diff and the agent's turns in two columns (one after the other on a narrow terminal), everything from
    the job made visible."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from orchestrator.commands.jobs import transcript_lines

    if console is None:
        console = Console(highlight=False) if sys.stdout.isatty() else Console(highlight=False, width=200)
    left = Text(term.output(patch, colours=False) or f"(no difference: job {job_id} changed nothing)")
    turns = [term.visible(line) for entry in entries for line in transcript_lines(entry, width=400)]
    right = Text("\n".join(turns) or "(no transcript)")
    if console.width < SIDE_BY_SIDE:
        console.print(Text(f"diff of job {job_id}", style="bold"))
        console.print(left, overflow="fold")
        console.print(Text("\nwhat its agent said and did", style="bold"))
        console.print(right, overflow="fold")
        return
    table = Table(box=None, expand=True, pad_edge=False, show_edge=False)
    table.add_column(f"diff of job {job_id}", ratio=1, overflow="fold")
    table.add_column("what its agent said and did", ratio=1, overflow="fold")
    table.add_row(left, right)
    console.print(table)


@click.command()
@click.argument("job_ids", type=int, nargs=-1, required=True)
@json_option
@api_call
def land(job_ids: tuple[int, ...], as_json: bool) -> None:
    """Land ready jobs (review mode): each goes to its branch's landing queue."""
    c = client()
    each(list(job_ids), c.land, lambda j: f"job {j['id']}: {j['state']} ({j['reason']})", as_json)


@click.command()
@click.argument("job_ids", type=int, nargs=-1, required=True)
@json_option
@api_call
def reject(job_ids: tuple[int, ...], as_json: bool) -> None:
    """Drop ready jobs (review mode): not landed, their paths freed, their branches kept for inspection."""
    c = client()
    each(list(job_ids), c.reject, lambda j: f"job {j['id']}: {j['reason']}", as_json)


@click.command()
@click.argument("job_id", type=int)
@click.argument("feedback")
@json_option
@api_call
def revise(job_id: int, feedback: str, as_json: bool) -> None:
    """Send a ready, failed or interrupted job back to its agent with FEEDBACK (`-` reads it from stdin): the agent
    goes on in the job's kept worktree from where it stopped (Claude Code resumes its session), and the job is ready
    again (or lands). A failed or interrupted job first waits for admission, as a new job would."""
    text = sys.stdin.read() if feedback == "-" else feedback
    job = client().revise(job_id, text)
    if as_json:
        emit(job)
        return
    then = (
        f"`orchestrator why {job['id']}` says what it waits for"
        if job["state"] == "planned"
        else "`orchestrator watch` shows it ready again once its runner is done"
    )
    term.echo(f"job {job['id']}: {job['reason']}; {then}", err=True)
