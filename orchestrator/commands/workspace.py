"""A job's workspace and terminal, as claude-squad gives them: `open ID` (the path, or a shell there) and
`attach ID` (the running agent CLI's terminal, to watch it and type to it).

The workspace is the job's: it may have rewritten anything in it, its `.git` included, and git run there reads that
`.git`'s config and runs what it names (an fsmonitor, a filter). So `open --shell` starts your shell there with
git pointed at no repository (`GIT_DIR`), and says so; `orchestrator diff ID` shows the job's change.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any

import click

from orchestrator import paths
from orchestrator.commands import term
from orchestrator.commands.common import REJECTED, api_call, client, err

BUILTIN = ("shell", "replay", "claude")
"""Runners that run no CLI in a terminal: nothing to attach to."""
NO_GIT = "/nonexistent/orchestrator: the workspace's .git is the job's"
"""`GIT_DIR` in `open --shell`: git there finds no repository (and says which path it tried)."""


def refuse(message: str) -> None:
    err(f"orchestrator: {message}")
    sys.exit(REJECTED)


def _elsewhere(job: dict[str, Any]) -> str | None:
    """Team mode: the node that holds `job` when it is not this one (its workspace and terminal are there)."""
    if not job.get("node"):
        return None
    from orchestrator import config

    try:
        cfg = config.load(paths.resolve().config_file)
    except config.ConfigError:
        return None
    return job["node"] if cfg.store.url and job["node"] != cfg.team.node_name() else None


def _no_workspace(job: dict[str, Any]) -> str:
    i, state = job["id"], job["state"]
    if state in ("queued", "planning", "planned"):
        return f"job {i} is {state}: it gets a workspace when it starts (`orchestrator why {i}` says when)"
    if state == "landed":
        return f"job {i} landed; its workspace was given back (`orchestrator show {i}` has its commit)"
    return f"job {i} is {state} and has no workspace kept (`orchestrator logs {i}` shows what it did)"


@click.command("open")
@click.argument("job_id", type=int)
@click.option("--shell", is_flag=True, help="Start your $SHELL in it (git there points at no repository).")
@api_call
def open_(job_id: int, shell: bool) -> None:
    """Print a job's workspace path (or, with --shell, open a shell there; `exit` comes back).

    The job wrote everything in it, its .git included: git run in it obeys that .git's config. `orchestrator diff
    ID` shows the job's change safely.
    """
    job = client().job(job_id)
    if (node := _elsewhere(job)) is not None:
        refuse(f"job {job_id} is on node {node!r} of the team: its workspace is on that machine")
    where = str(job.get("worktree") or "")
    if not where:
        refuse(_no_workspace(job))
    if not os.path.isdir(where):
        refuse(f"job {job_id}'s workspace {term.visible(where)} is gone (cleaned, or taken back by the pool)")
    if not shell:
        click.echo(where)
        return
    program = os.environ.get("SHELL") or "/bin/sh"
    env = {**os.environ, "GIT_DIR": NO_GIT, "ORCHESTRATOR_JOB_ID": str(job_id)}
    err(f"job {job_id}'s workspace ({job['state']}); git is off here (the .git is the job's), `exit` comes back")
    os.chdir(where)
    os.execvpe(program, [program], env)


@click.command()
@click.argument("job_id", type=int)
@api_call
def attach(job_id: int) -> None:
    """Join a running job's terminal: see its agent CLI as it draws itself and type to it (`C-b d` detaches;
    the job goes on). Agent CLIs run in a tmux of the job's own when tmux is installed (`terminal` in
    `[runners.NAME]`); built-in runners and CLIs on a pipe have none: `orchestrator logs -f ID` follows them."""
    job = client().job(job_id)
    i, runner = job["id"], term.visible(job["runner"])
    if job["state"] != "running":
        then = (
            "it gets one when it starts"
            if job["state"] in ("queued", "planning", "planned")
            else f"`orchestrator logs {i}` shows what it printed"
        )
        refuse(f"job {i} is {job['state']}: only a running job has a terminal to attach to; {then}")
    if (node := _elsewhere(job)) is not None:
        refuse(f"job {i} runs on node {node!r} of the team: attach there")
    if job["runner"] in BUILTIN:
        refuse(
            f"job {i} runs the built-in `{runner}` runner, which runs in no terminal of its own: "
            f"`orchestrator logs -f {i}` follows its output"
        )
    from orchestrator.proc import terminal

    tmux = terminal.tmux()
    dir_ = paths.resolve().job_terminal(i)
    if tmux is None:
        refuse(f"tmux is not installed here, and `attach` joins a job's tmux: `orchestrator logs -f {i}`")
    assert tmux is not None
    if not terminal.socket(dir_).exists():
        refuse(
            f'job {i}\'s runner `{runner}` runs its CLI on a pipe, with no terminal to join (terminal = "none" in '
            f"[runners.{runner}], or tmux was missing when it started): `orchestrator logs -f {i}` follows it"
        )
    if not sys.stdin.isatty():
        refuse("attach needs a terminal: run it in one")
    env = {k: v for k, v in os.environ.items() if k != "TMUX"}  # from inside a tmux too
    argv = terminal.attach_argv(tmux, dir_)
    os.execvpe(shutil.which(argv[0]) or argv[0], argv, env)
