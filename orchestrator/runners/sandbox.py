"""Confine a job's processes with bubblewrap: the worktree writable, the rest of the file system read-only.

Config `jobs.sandbox` (env `ORCHESTRATOR_SANDBOX`): `auto` uses bwrap when it is installed and works here
(unprivileged user namespaces may be off; a probe run says), and says once in the log when it cannot;
`bwrap` requires it (a job fails with the reason rather than run unconfined); `none` never uses it.

Inside the sandbox a command sees the whole file system read-only, with these writable: its worktree;
the parts of the repository's git dir a commit on the job's own branch needs (objects, the worktree's
own git dir, `refs/heads/orchestrator/` and its reflogs, so the user's branches stay read-only); its own
tmp dir (`TMPDIR`); and a scratch HOME when its runner asks for one. The network stays on (agents call
APIs). Everything else a command tries to write fails with "Read-only file system".
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator import logging as olog
from orchestrator.git.worktrees import branch_name
from orchestrator.runners.base import RunContext

MODES = ("auto", "bwrap", "none")


@dataclass(frozen=True, slots=True)
class Sandbox:
    """How this daemon confines job processes: `bwrap` (the path of the binary) or nothing, and why."""

    bwrap: str | None = None
    required: bool = False
    reason: str = ""
    """Why there is no sandbox (empty when there is one, or when none was asked for)."""

    @property
    def active(self) -> bool:
        return self.bwrap is not None

    def check(self) -> str | None:
        """Why a job must not run (sandbox required but unusable), or None."""
        if self.required and not self.active:
            return f'sandbox = "bwrap" but {self.reason}; install bubblewrap or set jobs.sandbox = "auto"'
        return None

    def prefix(self, ctx: RunContext, *, home: Path | None = None) -> list[str]:
        """What goes before a command's argv to run it inside the sandbox (`process.run(prefix=...)`)."""
        if self.bwrap is None:
            return []
        return [self.bwrap, *binds(ctx, home=home), "--"]

    def env(self, ctx: RunContext, env: Mapping[str, str]) -> dict[str, str]:
        """The command's environment: its own tmp dir as TMPDIR when sandboxed."""
        out = dict(env)
        if self.bwrap is not None:
            out["TMPDIR"] = str(job_tmp(ctx))
        return out


def job_tmp(ctx: RunContext) -> Path:
    base = ctx.private_dir or ctx.log_path.parent / f"{ctx.job.id}.private"
    tmp = base / "tmp"
    tmp.mkdir(parents=True, exist_ok=True, mode=0o700)
    return tmp


def _git_dirs(worktree: Path, job_id: int) -> tuple[Path | None, list[Path]]:
    """(the repository's common git dir, the parts of it a commit on the job's branch writes)."""
    dotgit = worktree / ".git"
    try:
        text = dotgit.read_text().strip() if dotgit.is_file() else ""
    except OSError:
        return None, []
    if not text.startswith("gitdir:"):
        return None, []
    gitdir = (worktree / text.removeprefix("gitdir:").strip()).resolve()
    try:
        common = (gitdir / (gitdir / "commondir").read_text().strip()).resolve()
    except OSError:
        return None, [gitdir]
    branch = branch_name(job_id)
    parts = [gitdir, common / "objects", common / "refs" / "heads" / Path(branch).parent]
    parts.append(common / "logs" / "refs" / "heads" / Path(branch).parent)
    for p in parts:
        p.mkdir(parents=True, exist_ok=True)
    return common, parts


def binds(ctx: RunContext, *, home: Path | None = None) -> list[str]:
    """bwrap's arguments for one job: read-only root, then the writable parts on top."""
    args = ["--die-with-parent", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    common, parts = _git_dirs(ctx.worktree, ctx.job.id)
    # Later mounts win: read-only views first (the git dir, the job's private dir with its scripts), then
    # the writable parts on top of them.
    for p in (common, ctx.private_dir):
        if p is not None:
            args += ["--ro-bind", str(p), str(p)]
    writable = [ctx.worktree, *parts, job_tmp(ctx)]
    if home is not None:
        writable.append(home)
    for p in writable:
        args += ["--bind", str(p), str(p)]
    args += ["--chdir", str(ctx.worktree)]
    return args


def probe(bwrap: str) -> str | None:
    """Why bwrap cannot confine a command here (None: it can). Runs `true` inside a minimal sandbox."""
    try:
        out = subprocess.run(
            [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--", "true"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bwrap could not start ({e})"
    if out.returncode != 0:
        return f"bwrap does not work here: {out.stderr.strip() or f'exit {out.returncode}'}"
    return None


def resolve(mode: str) -> Sandbox:
    """The daemon's sandbox for `mode`, probed once at start; `auto` logs once why it runs without."""
    if mode == "none":
        return Sandbox()
    found = shutil.which("bwrap")
    why = "bubblewrap (bwrap) is not installed" if found is None else probe(found)
    if why is None:
        olog.get().info(olog.Event.SANDBOX_READY, bwrap=found, mode=mode)
        return Sandbox(bwrap=found)
    olog.get().warning(
        olog.Event.SANDBOX_UNAVAILABLE,
        mode=mode,
        reason=why,
        message=f"jobs run without a sandbox: {why}; writes outside a worktree are only detected afterwards"
        if mode == "auto"
        else f"sandbox required but {why}: shell and command jobs fail until it works",
    )
    return Sandbox(required=mode == "bwrap", reason=why)


def private_home(ctx: RunContext, copy: Sequence[str], source: Path | None = None) -> Path:
    """A scratch HOME for one job, with copies of the named entries (files or dirs) of the real HOME."""
    base = ctx.private_dir or ctx.log_path.parent / f"{ctx.job.id}.private"
    home = base / "home"
    if home.exists():
        shutil.rmtree(home)
    home.mkdir(parents=True, mode=0o700)
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
