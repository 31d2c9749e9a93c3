"""Confine a job's processes with bubblewrap: its workspace writable, the rest of the file system read-only.

Config `jobs.sandbox` (env `ORCHESTRATOR_SANDBOX`): `auto` uses bwrap when it is installed and works here
(unprivileged user namespaces may be off; a probe run says), and says once in the log when it cannot;
`bwrap` requires it (a job fails with the reason rather than run unconfined); `none` never uses it.

What a confined command sees (`confine`):

- the whole file system read-only, with these writable: its workspace (its files and its own git dir),
  its own tmp dir (`TMPDIR`), and a scratch HOME when its runner asks for one;
- nothing of the daemon: its state dir (database, logs, other jobs' workspaces), its config dir (the
  env file with API keys) and its runtime dir (the API socket) are empty dirs; in team mode nothing of the
  shared store either (its socket dirs empty, its password and key files empty: `team.reach`);
- no UNIX socket of the user's session: `/tmp` is a private, empty tmpfs (tmux, ssh-agent and X11
  sockets live there), and so are `$XDG_RUNTIME_DIR` and `/run/user` (the user's D-Bus and systemd);
  what of the repository lay in them is shown again read-only;
- its own PID and IPC namespaces: `/proc` shows only its own processes (no other process's environment,
  the daemon's least of all; `/proc/sys` read-only), and when its first process ends the kernel kills
  every process left in the namespace, `setsid`/double-forked ones included; `--die-with-parent` ends
  it with the daemon;
- a new session (no terminal to inject keystrokes into), and no capability even when the daemon runs as
  root (bwrap keeps root's otherwise: a remount would make the root file system writable again), with
  `no_new_privs` set, so no setuid program gives them back.

The network stays on (agents call APIs), so abstract UNIX sockets (the `@` namespace) stay reachable.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator import logging as olog

MODES = ("auto", "bwrap", "none")

SESSION_DIRS: tuple[str, ...] = ("/tmp", "/run/user", "/dev/shm")
"""Shared dirs where a user's session keeps its UNIX sockets; a confined command gets empty ones."""
PROC_READONLY: tuple[str, ...] = ("/proc/sys", "/proc/sysrq-trigger", "/proc/sys/fs/binfmt_misc")
"""Parts of the sandbox's /proc that act on the whole machine: shown read-only."""


@dataclass(frozen=True, slots=True)
class Sandbox:
    """How this daemon confines job processes: `bwrap` (the path of the binary) or nothing, and why."""

    bwrap: str | None = None
    required: bool = False
    reason: str = ""
    """Why there is no sandbox (empty when there is one, or when none was asked for)."""
    hidden: tuple[str, ...] = field(default=())
    """What a confined command must not see: the daemon's own dirs (state, config, runtime) and secrets (the env
    file; in team mode the store's socket dirs and password files). A dir reads as empty, a file as empty."""

    @property
    def active(self) -> bool:
        return self.bwrap is not None

    def check(self) -> str | None:
        """Why a job must not run (sandbox required but unusable), or None."""
        if self.required and not self.active:
            return f'sandbox = "bwrap" but {self.reason}; install bubblewrap or set jobs.sandbox = "auto"'
        return None

    def confine(
        self,
        workspace: Path,
        *,
        tmp: Path,
        home: Path | None = None,
        readonly: Sequence[Path] = (),
    ) -> list[str]:
        """bwrap and its arguments for a command working in `workspace` (empty without a sandbox), with the
        dirs in `readonly` shown to it read-only."""
        if self.bwrap is None:
            return []
        return [self.bwrap, *binds(workspace, tmp=tmp, home=home, shown=readonly, hidden=self.hidden), "--"]


def _under(path: Path, roots: Iterable[Path]) -> bool:
    return any(path == r or path.is_relative_to(r) for r in roots)


def binds(
    workspace: Path,
    *,
    tmp: Path,
    home: Path | None = None,
    shown: Sequence[Path] = (),
    hidden: Sequence[str] = (),
) -> list[str]:
    """bwrap's arguments: read-only root, emptied session and daemon dirs, then what is shown again on top.

    Later mounts win: the read-only root first, then empty tmpfs over every hidden dir, then the dirs
    that must be seen inside a hidden one, read-only (`shown`), then /dev/null over every hidden file
    (one inside a dir shown again stays hidden), then the writable ones.
    """
    # No capability, whoever runs the daemon: bwrap started by root keeps them all otherwise, and
    # CAP_SYS_ADMIN in the job's mount namespace would remount the read-only root writable.
    args = [
        "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc", "--cap-drop", "ALL",
        "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
    ]  # fmt: skip
    # The new /proc is writable where the kernel's sysctls and sysrq live: root's uid may write those
    # (owner bits; core_pattern runs a program as root on the next crash). Read-only, as on the host.
    for p in PROC_READONLY:
        if os.path.exists(p):
            args += ["--ro-bind", p, p]
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    empty: list[Path] = []
    files: list[Path] = []
    for d in (*SESSION_DIRS, *([runtime] if runtime else []), *hidden):
        real = Path(os.path.realpath(d))
        if real.is_dir() and real != Path("/"):
            empty.append(real)
        elif real.exists():
            files.append(real)
    empty = [d for d in empty if not _under(d, [e for e in empty if e != d])]
    for dir_ in sorted(set(empty)):
        args += ["--tmpfs", str(dir_)]
    again: list[Path] = []
    for wanted in shown:
        real = Path(os.path.realpath(wanted))
        if real.exists() and _under(real, empty):
            args += ["--ro-bind", str(real), str(real)]
            again.append(real)
    for file in sorted(set(files)):
        if not _under(file, empty) or _under(file, again):
            args += ["--dev-bind", "/dev/null", str(file)]  # reads as empty (a plain bind is nodev: EACCES)
    writable = [workspace, tmp, *([home] if home is not None else [])]
    for w in writable:
        bound = os.path.realpath(w)
        args += ["--bind", bound, bound]
    args += ["--chdir", os.path.realpath(workspace)]
    return args


def probe(bwrap: str) -> str | None:
    """Why bwrap cannot confine a command here (None: it can). Runs `true` in a sandbox like a job's."""
    try:
        out = subprocess.run(
            [bwrap, "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--new-session", "--cap-drop", "ALL",
             "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--", "true"],
            capture_output=True,
            text=True,
            timeout=10,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bwrap could not start ({e})"
    if out.returncode != 0:
        return f"bwrap does not work here: {out.stderr.strip() or f'exit {out.returncode}'}"
    return None


def mode_for(mode: str, team: bool) -> str:
    """The mode jobs run under: in team mode an unconfined job could reach the shared store, so `auto` is `bwrap`."""
    return "bwrap" if team and mode == "auto" else mode


def detect(mode: str, hide: Iterable[Path | str] = ()) -> Sandbox:
    """The sandbox for `mode` as a job started now would get it (bwrap probed), without a word in the log."""
    hidden = tuple(str(p) for p in hide)
    if mode == "none":
        return Sandbox(hidden=hidden)
    found = shutil.which("bwrap")
    why = "bubblewrap (bwrap) is not installed" if found is None else probe(found)
    if why is None:
        return Sandbox(bwrap=found, hidden=hidden)
    return Sandbox(required=mode == "bwrap", reason=why, hidden=hidden)


def resolve(mode: str, hide: Iterable[Path | str] = ()) -> Sandbox:
    """The daemon's sandbox for `mode`, probed once at start; `auto` logs once why it runs without.

    `hide`: the daemon's own dirs (state, config, runtime), emptied for every confined command."""
    box = detect(mode, hide)
    if mode == "none":
        return box
    if box.active:
        olog.get().info(olog.Event.SANDBOX_READY, bwrap=box.bwrap, mode=mode)
        return box
    why = box.reason
    olog.get().warning(
        olog.Event.SANDBOX_UNAVAILABLE,
        mode=mode,
        reason=why,
        message=f"jobs run without a sandbox: {why}; writes outside a worktree are only detected afterwards"
        if mode == "auto"
        else f"sandbox required but {why}: shell and command jobs fail until it works",
    )
    return box


def emptied(box: Sandbox) -> list[Path]:
    """The dirs a confined command sees empty: the session's (`/tmp`, `$XDG_RUNTIME_DIR`, ...) and the hidden ones."""
    if not box.active:
        return []
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    out = []
    for d in (*SESSION_DIRS, *([runtime] if runtime else []), *box.hidden):
        real = Path(os.path.realpath(d))
        if real.is_dir() and real != Path("/"):
            out.append(real)
    return out
