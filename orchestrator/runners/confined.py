"""A job's command inside the daemon's sandbox (`proc.sandbox`): what of the job the sandbox shows and gives it.

Writable: the job's workspace, its own tmp dir (`TMPDIR`) and, when its runner asks, a scratch HOME; shown
read-only: its private dir and the repository whose objects its git dir borrows. Without a sandbox the
command's argv and environment are left as they are.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from orchestrator.git import repos
from orchestrator.paths import private_dir
from orchestrator.proc.sandbox import Sandbox
from orchestrator.runners.base import RunContext


def prefix(sandbox: Sandbox, ctx: RunContext, *, home: Path | None = None) -> list[str]:
    """What goes before a job command's argv to run it inside the sandbox (`process.run(prefix=...)`)."""
    if not sandbox.active:
        return []
    readonly = [*([ctx.private_dir] if ctx.private_dir is not None else []), *repos.borrowed_dirs(Path(ctx.job.repo))]
    return sandbox.confine(ctx.worktree, tmp=job_tmp(ctx), home=home, readonly=readonly)


def env(sandbox: Sandbox, ctx: RunContext, env: Mapping[str, str]) -> dict[str, str]:
    """The command's environment: its own tmp dir as TMPDIR when sandboxed."""
    out = dict(env)
    if sandbox.active:
        out["TMPDIR"] = str(job_tmp(ctx))
    return out


def job_tmp(ctx: RunContext) -> Path:
    base = ctx.private_dir or ctx.log_path.parent / f"{ctx.job.id}.private"
    return private_dir(base / "tmp")


def private_home(ctx: RunContext, copy: Sequence[str], source: Path | None = None) -> Path:
    """A scratch HOME for one job, with copies of the named entries (files or dirs) of the real HOME. A run that
    goes on from the last one (`ctx.resume`) keeps the HOME that run left (the CLI's session is in it)."""
    base = ctx.private_dir or ctx.log_path.parent / f"{ctx.job.id}.private"
    home = base / "home"
    if ctx.resume and home.is_dir() and not home.is_symlink():
        # Nothing is copied into it again: the job wrote it, and a copy could follow a link it left.
        return home
    if home.exists():
        shutil.rmtree(home)
    private_dir(home)
    real = source or Path(os.environ.get("HOME") or Path.home())
    for rel in copy:
        src = real / rel
        dst = home / rel
        if src.is_dir():
            shutil.copytree(src, dst, symlinks=True)
        elif src.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    return home
