"""Queue verbs like pueue's: each takes several ids and filters (`--failed`, `--cancelled`, `--unchanged`, `--repo`,
`--all`).

`cancel`, `retry` and `clean` act on jobs one by one and report each; one refusal does not stop the
rest (the exit code says some were refused).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import click

from orchestrator.client import ApiError, Client
from orchestrator.commands import term
from orchestrator.commands.common import (
    CANCELLABLE_STATES,
    ENDED_STATES,
    REJECTED,
    RETRYABLE_STATES,
    api_call,
    client,
    emit,
    err,
    json_option,
)
from orchestrator.core import models

PICKS: dict[str, frozenset[str]] = {
    "failed": frozenset({models.JobState.FAILED, models.JobState.CONFLICTED, models.JobState.INTERRUPTED}),
    "cancelled": frozenset({models.JobState.CANCELLED}),
    "unchanged": frozenset({models.JobState.UNCHANGED}),
}
"""The filters that pick ended jobs by how they ended: `--failed` (failed, conflicted, or interrupted by a daemon
stop: never the ones you cancelled), `--cancelled`, `--unchanged` (ended well with nothing to land)."""


def _filters(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option("--all", "all_", is_flag=True, help="Every job this verb applies to.")(fn)
    fn = click.option("--failed", is_flag=True, help="Jobs that failed, conflicted or were interrupted.")(fn)
    fn = click.option("--cancelled", is_flag=True, help="Jobs that were cancelled.")(fn)
    fn = click.option("--unchanged", is_flag=True, help="Jobs that ended with nothing to land.")(fn)
    fn = click.option(
        "--repo", type=click.Path(path_type=Path), help="Only jobs of this repository (with a filter: theirs)."
    )(fn)
    return click.argument("job_ids", type=int, nargs=-1)(fn)


def picked_states(states: Iterable[str], all_: bool, picks: Iterable[str]) -> set[str]:
    """Of the verb's `states`, those the filters name: every one with `--all` (or `--repo` alone), else the union of
    the filters' (`PICKS`). Pure."""
    named = set(picks)
    if all_ or not named:
        return set(states)
    return set(states) & set().union(*(PICKS[p] for p in named))


def select(
    c: Client, ids: Iterable[int], *, states: Iterable[str], all_: bool, picks: Iterable[str], repo: Path | None
) -> list[int]:
    """The ids named, plus every job in `states` that the filters pick; a usage error when nothing is named."""
    picked = list(dict.fromkeys(ids))
    picks = list(picks)
    if all_ or picks or repo is not None:
        wanted = picked_states(states, all_, picks)
        where = str(repo.expanduser().resolve()) if repo is not None else None
        for j in c.jobs(",".join(sorted(wanted))) if wanted else []:
            if (where is None or j["repo"] == where) and j["id"] not in picked:
                picked.append(j["id"])
        return picked
    if not picked:
        raise click.UsageError("name job ids, or pick them with --all, --failed, --cancelled, --unchanged or --repo")
    return picked


def _picks(**flags: bool) -> list[str]:
    return [name for name, on in flags.items() if on]


def each(
    ids: list[int], act: Callable[[int], dict[str, Any]], line: Callable[[dict[str, Any]], str], as_json: bool
) -> None:
    """Act on every id, report each (stderr, or one JSON list), exit 2 if any was refused."""
    done: list[dict[str, Any]] = []
    refused = 0
    for i in ids:
        try:
            result = act(i)
        except ApiError as e:
            refused += 1
            done.append({"id": i, "error": e.message})
            if not as_json:
                term.echo(f"job {i}: {e.message}", err=True)
            continue
        done.append(result)
        if not as_json:
            term.echo(line(result), err=True)
    if as_json:
        emit(done)
    elif not ids:
        err("no job matched")
    if refused:
        sys.exit(REJECTED)


@click.command()
@_filters
@json_option
@api_call
def cancel(
    job_ids: tuple[int, ...], all_: bool, failed: bool, cancelled: bool, unchanged: bool, repo: Path | None,
    as_json: bool,
) -> None:  # fmt: skip
    """Cancel jobs that have not landed (`--all`: every open job)."""
    if picks := _picks(failed=failed, cancelled=cancelled, unchanged=unchanged):
        raise click.UsageError(f"--{picks[0]} jobs have ended already; nothing to cancel")
    c = client()
    ids = select(c, job_ids, states=CANCELLABLE_STATES, all_=all_, picks=(), repo=repo)
    each(ids, c.cancel, lambda j: f"job {j['id']}: {j['state']}", as_json)


@click.command()
@_filters
@json_option
@api_call
def retry(
    job_ids: tuple[int, ...], all_: bool, failed: bool, cancelled: bool, unchanged: bool, repo: Path | None,
    as_json: bool,
) -> None:  # fmt: skip
    """Queue ended jobs again: `--failed` (failed, conflicted, interrupted), `--cancelled`, `--unchanged`, `--all`."""
    c = client()
    picks = _picks(failed=failed, cancelled=cancelled, unchanged=unchanged)
    ids = select(c, job_ids, states=RETRYABLE_STATES, all_=all_, picks=picks, repo=repo)
    each(ids, c.retry, lambda j: f"job {j['id']}: {j['state']} ({j['reason']})", as_json)


@click.command()
@_filters
@json_option
@api_call
def clean(
    job_ids: tuple[int, ...], all_: bool, failed: bool, cancelled: bool, unchanged: bool, repo: Path | None,
    as_json: bool,
) -> None:  # fmt: skip
    """Remove ended jobs: their worktrees, kept branches, logs and records (landed commits stay in git)."""
    c = client()
    picks = _picks(failed=failed, cancelled=cancelled, unchanged=unchanged)
    ids = select(c, job_ids, states=ENDED_STATES, all_=all_, picks=picks, repo=repo)

    def line(d: dict[str, Any]) -> str:
        return f"job {d['id']}: cleaned" + (f" (dropped {', '.join(d['branches'])})" if d["branches"] else "")

    each(ids, c.clean, line, as_json)


def _scope_line(data: dict[str, Any]) -> str:
    scope = data["scope"]
    c = data["controls"].get(scope, {"paused": False, "slots": None})
    where = "every repo" if scope == "*" else scope
    slots = "" if c["slots"] is None else f", {c['slots']} slot{'s' if c['slots'] != 1 else ''}"
    return f"{where}: {'paused' if c['paused'] else 'running'}{slots}"


_repo_option = click.option(
    "--repo", type=click.Path(path_type=Path), help="Only this repository (default: the whole daemon)."
)


def _where(repo: Path | None) -> str | None:
    return None if repo is None else str(repo.expanduser().resolve())


@click.command()
@_repo_option
@json_option
@api_call
def pause(repo: Path | None, as_json: bool) -> None:
    """Start nothing new (in one repo, or anywhere); running jobs and landings go on."""
    data = client().pause(_where(repo))
    emit(data) if as_json else err(_scope_line(data) + "; running jobs go on (`orchestrator resume` lifts it)")


@click.command()
@_repo_option
@json_option
@api_call
def resume(repo: Path | None, as_json: bool) -> None:
    """Lift a pause (of one repo, or of the whole daemon)."""
    data = client().resume(_where(repo))
    emit(data) if as_json else err(_scope_line(data))


@click.command()
@click.option("--repo", type=click.Path(path_type=Path), required=True, help="The repository.")
@click.argument("slots", required=False)
@json_option
@api_call
def limit(repo: Path, slots: str | None, as_json: bool) -> None:
    """Set a repo's slot count (active jobs at once) at run time, kept in the store; `none` restores the config's."""
    c = client()
    where = _where(repo)
    assert where is not None
    if slots is None:
        controls = c.controls()
        data = {"scope": where, "controls": controls}
    else:
        if slots.lower() in ("none", "default"):
            n: int | None = None
        else:
            try:
                n = int(slots)
            except ValueError:
                raise click.UsageError(f"SLOTS must be a number or `none`, got {slots!r}") from None
        data = c.limit(where, n)
    emit(data) if as_json else err(_scope_line(data))
