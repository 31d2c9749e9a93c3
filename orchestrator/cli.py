"""The command line: a thin client of the daemon's API (and the daemon itself).

Data goes to stdout, human messages to stderr; `--json` on every command. Exit codes: 0 ok, 1 failed,
2 rejected or usage, 3 daemon unreachable, 78 invalid config.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click

from orchestrator import __version__, paths
from orchestrator.client import ApiError, Client, Unreachable
from orchestrator.config import EX_CONFIG, ConfigError

OK, FAILED, REJECTED, UNREACHABLE = 0, 1, 2, 3
F = TypeVar("F", bound=Callable[..., Any])


def err(message: str) -> None:
    click.echo(message, err=True)


def client() -> Client:
    return Client(paths.resolve().socket)


def api_call(fn: F) -> F:
    """Map the client's failures onto exit codes with the daemon's own message."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Unreachable as e:
            err(f"orchestrator: {e}")
            sys.exit(UNREACHABLE)
        except ApiError as e:
            err(f"orchestrator: {e.message}")
            sys.exit(REJECTED if e.status < 500 else FAILED)

    return wrapper  # type: ignore[return-value]


def emit(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False))


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout.")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="orchestrator")
def main() -> None:
    """A git-aware worktree orchestrator: runs coding jobs side by side when their paths are disjoint."""


@main.command()
@click.option("--burst", is_flag=True, help="Process until nothing is queued or running, then exit 0.")
@click.option(
    "--grace",
    type=float,
    default=2.0,
    show_default=True,
    help="In burst mode, how long to stay idle (for a client about to enqueue) before exiting.",
)
def daemon(burst: bool, grace: float) -> None:
    """Run the daemon in the foreground (systemd runs it this way)."""
    from orchestrator import config
    from orchestrator import daemon as daemon_mod

    p = paths.resolve()
    try:
        cfg = config.load(p.config_file)
    except ConfigError as e:
        err(f"orchestrator: invalid config: {e}")
        sys.exit(EX_CONFIG)
    sys.exit(daemon_mod.run(cfg, p, burst=burst, grace=grace))


@main.command()
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


@main.command()
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


@main.command()
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


@main.command()
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


FAILED_STATES = {"failed", "conflicted", "cancelled", "interrupted"}


@main.command()
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


@main.command()
@click.argument("job_id", type=int)
@json_option
@api_call
def cancel(job_id: int, as_json: bool) -> None:
    """Cancel a job that has not landed."""
    job = client().cancel(job_id)
    emit(job) if as_json else err(f"job {job_id}: {job['state']}")


@main.command()
@click.argument("job_id", type=int)
@json_option
@api_call
def retry(job_id: int, as_json: bool) -> None:
    """Queue a failed, cancelled, conflicted or interrupted job again."""
    job = client().retry(job_id)
    emit(job) if as_json else err(f"job {job_id}: {job['state']} ({job['reason']})")


@main.command()
@click.argument("job_ids", type=int, nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Every ended job.")
@json_option
@api_call
def clean(job_ids: tuple[int, ...], all_: bool, as_json: bool) -> None:
    """Remove what ended jobs kept: worktrees and branches of failed, conflicted or cancelled attempts."""
    c = client()
    ids = list(job_ids)
    if all_:
        ids = [j["id"] for j in c.jobs("landed,failed,conflicted,cancelled,interrupted")]
    if not ids:
        raise click.UsageError("name job ids, or pass --all")
    done = [c.clean(i) for i in ids]
    if as_json:
        emit(done)
    else:
        for d in done:
            err(f"job {d['id']}: cleaned" + (f" (dropped {', '.join(d['branches'])})" if d["branches"] else ""))


@main.command()
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


@main.command()
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
    click.echo(f"confidence  {claim['confidence']} ({claim['source']}, from {data.get('basis', 'none')})")
    for e in data.get("evidence", []):
        click.echo(f"  {e['path']:<40} {e['kind']:<9} {e['why']}")
    for n in data.get("notes", []):
        err(f"note: {n['code']}: {n['reason']}")
    if data.get("plan_text"):
        click.echo("plan:")
        click.echo(data["plan_text"])
    if not claim["paths"]:
        err("no paths predicted: this job would run alone in its repo")


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("name", type=click.Choice(["admission", "worktrees", "predict"]))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench(name: str, args: tuple[str, ...]) -> None:
    """Benchmark mode: `admission` (decision time) or `worktrees` (pooled vs fresh); --help for each."""
    import importlib

    importlib.import_module(f"orchestrator.bench.{name}").main(list(args))


@main.command()
@click.option("--keep", type=click.Path(path_type=Path), help="Keep the demo here instead of a temp dir.")
@json_option
def demo(keep: Path | None, as_json: bool) -> None:
    """Run the main job on embedded defaults: a demo repo, a burst daemon, shell jobs side by side."""
    from orchestrator import demo as demo_mod

    sys.exit(demo_mod.run(keep, as_json=as_json))


if __name__ == "__main__":  # pragma: no cover
    main()
