"""Review before landing: `diff` shows a job's change, `land` lands ready jobs, `reject` drops them, `revise`
sends one back to its agent with feedback.

A job enqueued with `--land review` (or in a repo with `land = "review"`) stops in `ready` when it
finishes; its paths stay taken until a person lands or rejects it.
"""

from __future__ import annotations

import sys

import click

from orchestrator.commands import term
from orchestrator.commands.common import api_call, client, emit, err, json_option
from orchestrator.commands.queue import each


@click.command()
@click.argument("job_id", type=int)
@click.option("--head", "against_head", is_flag=True, help="What landing it now would change on the branch head.")
@json_option
@api_call
def diff(job_id: int, against_head: bool, as_json: bool) -> None:
    """Show a finished job's change: against its base, or (--head) against the current branch head."""
    data = client().diff(job_id, "head" if against_head else "base")
    if as_json:
        emit(data)
        return
    if data.get("conflicts"):
        term.echo(f"job {job_id} conflicts with the branch head in: {', '.join(data['conflicts'])}", err=True)
        sys.exit(1)
    # The job wrote what the diff shows: on a terminal, nothing in it may drive the terminal (`term.output`).
    sys.stdout.write(term.output(data["diff"], colours=False) if sys.stdout.isatty() else data["diff"])
    if not data["diff"]:
        err(f"job {job_id}: no difference against {data['against']}")


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
