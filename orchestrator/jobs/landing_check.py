"""The landing check: a repository's shell command run on a job's merged result before its target moves.

It runs in a scratch workspace made like a job's, confined like the job itself (the merged result is the job's
code), and is handed to the landing (`git.landing.Check`) by the lander.
"""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import dataclass
from pathlib import Path

from orchestrator.git import repos
from orchestrator.git.landing import CheckResult
from orchestrator.git.workspace import Workspace, WorkspaceError, remove_tree
from orchestrator.proc import process
from orchestrator.proc.sandbox import Sandbox

TAIL_BYTES = process.TAIL_BYTES
"""How much of a check's output `CheckResult.output_tail` keeps."""
KILL_GRACE = 2.0
"""Seconds between SIGTERM and SIGKILL for a check that timed out."""


@dataclass(frozen=True, slots=True)
class ShellCheck:
    """A repository's landing check: a shell command run on the merged result before the branch moves."""

    command: str
    timeout: float
    log_path: Path | None = None
    scratch_root: Path | None = None
    owner: process.Owner | None = None
    sandbox: Sandbox | None = None
    """Where the check runs: the merged result is the job's code, confined like the job itself."""

    async def run(self, repo_path: Path, sha: str) -> CheckResult:
        """This check on the commit `sha` of the repository at `repo_path` (`run_check`)."""
        return await run_check(
            repo_path,
            sha,
            self.command,
            timeout=self.timeout,
            log_path=self.log_path,
            scratch_root=self.scratch_root,
            owner=self.owner,
            sandbox=self.sandbox,
        )

    def status(self, ran: CheckResult) -> str:
        """How a run of it ended, for a person."""
        return f"timed out after {self.timeout:g}s" if ran.timed_out else f"exited {ran.returncode}"


async def run_check(
    repo_path: Path,
    sha: str,
    command: str,
    *,
    timeout: float,
    log_path: Path | None = None,
    scratch_root: Path | None = None,
    owner: process.Owner | None = None,
    sandbox: Sandbox | None = None,
) -> CheckResult:
    """Run the shell `command` in a scratch workspace at `sha`, confined like a job; always remove it.

    The workspace is made like a job's (its own git dir, no shared writable git state), and the command
    runs in `sandbox` when there is one: the merged result is the job's code, so the check is the job's
    code running. Through `process.run`: its own process group, recorded by `owner`; on timeout the group
    gets SIGTERM, then SIGKILL after `KILL_GRACE`, and whatever it left running is ended once it exits
    (its workspace is about to go). Output is appended to `log_path` if given.
    """
    if sandbox is not None and (why := sandbox.check()):
        return CheckResult(False, None, why)
    scratch = Path(tempfile.mkdtemp(prefix="orchestrator-check-", dir=scratch_root))
    ws = Workspace(scratch / sha[:12])
    tmp = scratch / "tmp"
    try:
        try:
            await asyncio.to_thread(ws.create, repo_path, sha, None)
        except (WorkspaceError, repos.RepoError, OSError) as e:
            return CheckResult(False, None, f"could not make a workspace at {sha}: {e}")
        tmp.mkdir(mode=0o700)
        shown = repos.borrowed_dirs(repo_path) if sandbox is not None and sandbox.active else []
        prefix = sandbox.confine(ws.root, tmp=tmp, readonly=shown) if sandbox is not None else []
        env = process.environment((), {"TMPDIR": str(tmp)} if prefix else None)
        done = await process.run(
            command,
            cwd=ws.root,
            env=env,
            timeout=timeout,
            log_path=log_path,
            grace=KILL_GRACE,
            owner=owner,
            what=f"landing check in {ws.root}",
            prefix=prefix,
        )
        return CheckResult(done.ok, done.returncode, done.output_tail, timed_out=done.timed_out)
    finally:
        await asyncio.to_thread(remove_tree, scratch)


def remove_stale_scratch(repo_path: Path, scratch_root: Path, state_root: Path | None = None) -> list[str]:
    """On start: the landing-check workspaces a killed daemon left under `scratch_root`, removed.

    Also git's metadata of the linked worktrees older versions made there (under `state_root`, default
    `scratch_root`): a half-made one with an empty `commondir` makes every `git worktree list` in the
    repository fail, the user's included.
    """
    root = scratch_root.resolve()
    ours = (state_root or scratch_root).resolve()
    admin_root = repos.common_dir(repos.open_repo(repo_path)) / "worktrees"
    for admin in sorted(admin_root.iterdir()) if admin_root.is_dir() else []:
        pointer = admin / "gitdir"
        try:
            target = Path(pointer.read_text().strip()).parent.resolve()
        except OSError:
            continue
        if target.is_relative_to(root) or (target.is_relative_to(ours) and not (admin / "commondir").is_file()):
            remove_tree(admin)
    stale = [str(p) for p in sorted(root.glob("orchestrator-check-*"))] if root.is_dir() else []
    for path in stale:
        remove_tree(Path(path))
    return stale
