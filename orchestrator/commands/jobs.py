"""Commands about one job: `enqueue`, `show`, `why`, `logs`, `plan`."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from orchestrator.commands.common import api_call, client, emit, err, json_option


@click.command()
@click.option(
    "--repo",
    "repo",
    type=click.Path(path_type=Path),
    default=".",
    show_default=True,
    help="The repository the job works on.",
)
@click.option("--branch", help="Target branch (default: the branch the repository has checked out).")
@click.option("--path", "paths_", multiple=True, help="A path the job will touch (repo-relative; dirs end with /).")
@click.option("--runner", help="Runner name (default from config: shell).")
@click.option("--priority", type=int, default=0, show_default=True, help="Higher runs first.")
@click.option("--after", type=int, multiple=True, help="Start only after this job has landed.")
@json_option
@click.argument("text", nargs=-1, required=True)
@api_call
def enqueue(
    repo: Path,
    branch: str | None,
    paths_: tuple[str, ...],
    runner: str | None,
    priority: int,
    after: tuple[int, ...],
    as_json: bool,
    text: tuple[str, ...],
) -> None:
    """Queue a job; prints its id."""
    body: dict[str, Any] = {
        "repo": str(repo.expanduser().resolve()),
        "text": " ".join(text),
        "paths": list(paths_),
        "priority": priority,
        "after": list(after),
    }
    if branch:
        body["branch"] = branch
    if runner:
        body["runner"] = runner
    job = client().enqueue(**body)
    if as_json:
        emit(job)
    else:
        click.echo(job["id"])
        claim = ", ".join(job["claim"]["paths"]) or "no paths declared: it will run alone in its repo"
        err(f"job {job['id']} queued on {job['branch']} of {job['repo']} ({claim})")


@click.command()
@click.argument("job_id", type=int)
@json_option
@api_call
def show(job_id: int, as_json: bool) -> None:
    """Show one job in full, with its history."""
    job = client().job(job_id)
    if as_json:
        emit(job)
        return
    for key in (
        "id",
        "state",
        "repo",
        "branch",
        "runner",
        "text",
        "base",
        "landed_sha",
        "reason",
        "attempts",
        "created_at",
        "started_at",
        "finished_at",
    ):
        click.echo(f"{key:12} {job[key]}")
    click.echo(
        f"{'claim':12} {', '.join(job['claim']['paths']) or '-'} "
        f"(confidence {job['claim']['confidence']}, {job['claim']['source']})"
    )
    click.echo(f"{'actual':12} {', '.join(job['actual']) or '-'}")
    click.echo("events:")
    for ev in job["events"]:
        extra = {k: v for k, v in ev.items() if k not in ("at", "kind")}
        click.echo(f"  {time.strftime('%H:%M:%S', time.localtime(ev['at']))} {ev['kind']} {json.dumps(extra)}")


@click.command()
@click.argument("job_id", type=int)
@json_option
@api_call
def why(job_id: int, as_json: bool) -> None:
    """Why a job is where it is: its latest admission decision, every check."""
    data = client().why(job_id)
    if as_json:
        emit(data)
        return
    click.echo(f"job {data['id']} is {data['state']}: {data['reason']}")
    d = data.get("decision")
    if d:
        click.echo(f"decision: {d['reason']} — {d['message']}")
        if d.get("next"):
            click.echo(f"next: {d['next']}")
        if d.get("shared"):
            click.echo(f"shared (union-merged): {', '.join(d['shared'])}")
        for c in d.get("checks", []):
            click.echo(f"  [{'ok' if c['ok'] else 'no'}] {c['name']}: {c['detail']}")
    if data.get("land_after"):
        click.echo(f"lands after: {', '.join(map(str, data['land_after']))}")


@click.command()
@click.argument("job_id", type=int, required=False)
@click.option("-f", "--follow", is_flag=True, help="Keep printing until the job ends.")
@json_option
@api_call
def logs(job_id: int | None, follow: bool, as_json: bool) -> None:
    """Print a job's output (the runner's stdout and stderr); without ID, every job's."""
    c = client()
    ids = [job_id] if job_id is not None else [j["id"] for j in c.jobs()]
    if follow and job_id is None:
        raise click.UsageError("--follow needs a job id")
    out: dict[str, str] = {}
    for i in ids:
        stream = c.stream(f"/jobs/{i}/log?follow={'1' if follow else '0'}")
        if as_json:
            out[str(i)] = b"".join(stream).decode(errors="replace")
            continue
        if job_id is None:
            click.echo(f"==> job {i} <==")
        for chunk in stream:
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
    if as_json:
        emit(out)


@click.command()
@click.option("--repo", type=click.Path(path_type=Path), default=".", show_default=True)
@click.option("--branch")
@click.option("--base", help="Plan against this revision (default: the branch head).")
@click.option("--path", "paths_", multiple=True)
@json_option
@click.argument("text", nargs=-1)
@api_call
def plan(
    repo: Path, branch: str | None, base: str | None, paths_: tuple[str, ...], as_json: bool, text: tuple[str, ...]
) -> None:
    """Print the claim the daemon would make for a job, without queueing it."""
    body: dict[str, Any] = {"repo": str(repo.expanduser().resolve()), "text": " ".join(text), "paths": list(paths_)}
    if branch:
        body["branch"] = branch
    if base:
        body["base"] = base
    data = client().plan(**body)
    if as_json:
        emit(data)
        return
    claim = data["claim"]
    click.echo(f"base        {data['base']} ({data['branch']})")
    click.echo(f"claim       {', '.join(claim['paths']) or '-'}")
    click.echo(f"confidence  {claim['confidence']} ({claim['source']})")
    if not claim["paths"]:
        err("no paths predicted: this job would run alone in its repo")
