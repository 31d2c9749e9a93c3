"""Editing the waiting queue, like pueue: `edit` (a job's text, paths and priority, in `$EDITOR` or by flags),
`move --before` and `switch` (its place). Only waiting jobs (queued, planning, planned) change; one whose text or
paths changed is planned again, in its place. A job that starts meanwhile is not edited: the daemon says so.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import click

from orchestrator.commands import term
from orchestrator.commands.common import REJECTED, api_call, client, emit, err, json_option

SEPARATOR = "--- text: the job's text is everything below this line ---"
HEADER = """\
# Job {id} ({state}), on {branch} of {repo}
# Change what you want, save and quit; quit without saving to leave it as is.
# Lines starting with # are left out (above the text only). priority: higher
# runs first. paths: the paths it will touch, space-separated (quote a name
# with a space); none: it is planned from its text. A new text or new paths
# plan it again, in its place in the queue.
"""
"""Above the job's fields, in lines that fit an 80-column editor (the first names the job and its repository)."""


def draft(job: dict[str, Any]) -> str:
    """The file a person edits: the job's priority and declared paths, then its text."""
    head = HEADER.format(**{k: term.visible(job[k]) for k in ("id", "state", "repo", "branch")})
    return f"{head}priority: {job['priority']}\npaths: {shlex.join(job['declared'])}\n{SEPARATOR}\n{job['text']}\n"


def parse(edited: str) -> dict[str, Any]:
    """The fields of an edited draft: `priority`, `paths` and `text`; ValueError says which line is wrong."""
    head, sep, text = edited.partition(SEPARATOR + "\n")
    if not sep:
        head, sep, text = edited.partition(SEPARATOR)
    if not sep:
        raise ValueError(f"the line {SEPARATOR!r} is gone: the text starts below it")
    out: dict[str, Any] = {"text": text.removesuffix("\n")}
    for n, line in enumerate(head.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, colon, value = line.partition(":")
        key = key.strip()
        if not colon or key not in ("priority", "paths"):
            raise ValueError(f"line {n}: {line.strip()!r}: only `priority:` and `paths:` go above the text")
        if key == "priority":
            try:
                out["priority"] = int(value.strip())
            except ValueError:
                raise ValueError(f"line {n}: the priority must be a whole number, not {value.strip()!r}") from None
        else:
            try:
                out["paths"] = shlex.split(value)
            except ValueError as e:
                raise ValueError(f"line {n}: paths: {e}") from None
    return out


def changes(job: dict[str, Any], edited: dict[str, Any]) -> dict[str, Any]:
    """What the edit changed, as the API takes it (nothing: an empty dict)."""
    out: dict[str, Any] = {}
    if "priority" in edited and edited["priority"] != job["priority"]:
        out["priority"] = edited["priority"]
    if "paths" in edited and sorted(edited["paths"]) != sorted(job["declared"]):
        out["paths"] = edited["paths"]
    if edited["text"].rstrip("\n") != job["text"].rstrip("\n"):
        out["text"] = edited["text"]
    return out


def in_editor(job: dict[str, Any]) -> dict[str, Any]:
    """Open the job in `$VISUAL` / `$EDITOR` (else `vi`); what the person changed."""
    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    with tempfile.TemporaryDirectory(prefix="orchestrator-edit-") as tmp:  # 0700: the job's text is the user's
        path = Path(tmp) / f"job-{job['id']}.txt"
        path.write_text(draft(job))
        before = path.stat().st_mtime_ns
        try:
            done = subprocess.run([*shlex.split(editor), str(path)], check=False)
        except OSError as e:
            raise click.ClickException(f"could not start the editor {editor!r} ({e}): set $EDITOR") from None
        if done.returncode != 0:
            raise click.ClickException(f"the editor {editor!r} exited {done.returncode}: job {job['id']} not edited")
        if path.stat().st_mtime_ns == before:
            return {}
        try:
            return changes(job, parse(path.read_text()))
        except ValueError as e:
            again = f"run `orchestrator edit {job['id']}` again"
            raise click.ClickException(f"{e}; job {job['id']} not edited ({again})") from None


@click.command()
@click.argument("job_id", type=int)
@click.option("--text", help="The job's new text (`-` reads it from stdin).")
@click.option("--path", "paths_", multiple=True, help="Its new paths (repeat for each; replaces the old ones).")
@click.option("--no-paths", is_flag=True, help="Drop its declared paths: it is planned from its text.")
@click.option("--priority", type=int, help="Its new priority (higher runs first).")
@json_option
@api_call
def edit(
    job_id: int, text: str | None, paths_: tuple[str, ...], no_paths: bool, priority: int | None, as_json: bool
) -> None:
    """Change a waiting job's text, paths or priority: in $EDITOR on a terminal, or by flags.

    A new text or new paths plan it again, keeping its place in the queue; a job that started meanwhile is not
    edited (the daemon says so).
    """
    if paths_ and no_paths:
        raise click.UsageError("give --path or --no-paths, not both")
    change: dict[str, Any] = {}
    if text is not None:
        change["text"] = sys.stdin.read() if text == "-" else text
    if paths_ or no_paths:
        change["paths"] = list(paths_)
    if priority is not None:
        change["priority"] = priority
    c = client()
    if not change:
        if not (sys.stdin.isatty() and sys.stdout.isatty()):
            raise click.UsageError("give --text, --path, --no-paths or --priority (on a terminal: $EDITOR opens)")
        job = c.job(job_id)
        if job["state"] not in ("queued", "planning", "planned"):
            err(f"orchestrator: job {job_id} is {job['state']}; only a waiting job can be edited")
            sys.exit(REJECTED)
        change = in_editor(job)
        if not change:
            err(f"job {job_id}: nothing changed; not edited")
            return
    job = c.edit(job_id, **change)
    if as_json:
        emit(job)
        return
    said = job["reason"] if "text" in change or "paths" in change else f"priority {job['priority']}"
    term.echo(f"job {job_id}: {said}", err=True)


@click.command()
@click.argument("job_id", type=int)
@click.option("--before", type=int, required=True, help="The waiting job it goes just before.")
@json_option
@api_call
def move(job_id: int, before: int, as_json: bool) -> None:
    """Move a waiting job just before another waiting job in the queue (it takes that job's priority)."""
    job = client().move(job_id, before)
    if as_json:
        emit(job)
    else:
        err(f"job {job_id}: now just before job {before} in the queue (priority {job['priority']})")


@click.command()
@click.argument("first", type=int)
@click.argument("second", type=int)
@json_option
@api_call
def switch(first: int, second: int, as_json: bool) -> None:
    """Two waiting jobs take each other's place (and priority) in the queue."""
    jobs = client().switch(first, second)
    if as_json:
        emit(jobs)
    else:
        err(f"jobs {first} and {second} switched places in the queue")
