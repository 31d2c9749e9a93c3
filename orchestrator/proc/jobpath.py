"""The `PATH` a job's commands get: the user's login path, never the daemon's own venv first.

Under systemd the daemon's `PATH` starts with the orchestrator's installation (its venv's `bin`), and a
job inheriting it finds the daemon's Python as `python3` (no pytest there, other packages). So a job's
`PATH` is the one the user's login shell sets up (`$SHELL -lc`, asked once when the daemon starts), then
the daemon's other entries after it; the daemon's venv `bin` is left out unless the login path itself has
it. Where the login shell cannot say (missing, slow, broken profile), the daemon's `PATH` without its
venv stands in.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

from orchestrator import logging as olog

_login: list[str] | None = None


def own_bin() -> str | None:
    """The daemon's venv `bin` (None when it runs from no venv: the system's /usr/bin stays)."""
    return str(Path(sys.prefix) / "bin") if sys.prefix != sys.base_prefix else None


def merged(login: list[str], daemon: list[str], own: str | None) -> str:
    """Login entries first, then the daemon's others; its own venv only where the login path has it. Pure."""
    out: list[str] = []
    for entry in login + [d for d in daemon if d != own]:
        if entry and entry not in out:
            out.append(entry)
    return os.pathsep.join(out)


def ask_login_shell(timeout: float = 5.0, quiet: bool = False) -> list[str] | None:
    """The `PATH` the user's login shell sets up, or None when it cannot be had (logged unless `quiet`)."""
    try:
        user = pwd.getpwuid(os.getuid())
        shell = os.environ.get("SHELL") or user.pw_shell or "/bin/sh"
        env = {"HOME": os.environ.get("HOME") or user.pw_dir, "USER": user.pw_name, "LOGNAME": user.pw_name,
               "SHELL": shell, "TERM": "dumb"}  # fmt: skip
        out = subprocess.run(
            [shell, "-lc", 'printf "%s" "$PATH"'], env=env, capture_output=True, text=True, timeout=timeout,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except (OSError, KeyError, subprocess.SubprocessError) as e:
        if not quiet:
            olog.get().warning(olog.Event.JOB_PATH, reason=f"{type(e).__name__}: {e}", message="no login PATH for jobs")
        return None
    if out.returncode != 0 or not out.stdout.strip():
        if not quiet:
            olog.get().warning(olog.Event.JOB_PATH, reason=f"exit {out.returncode}", message="no login PATH for jobs")
        return None
    return [e for e in out.stdout.strip().split(os.pathsep) if e]


def learn(quiet: bool = False) -> str:
    """Ask the login shell once (off the event loop); returns the PATH a job gets from this process's."""
    global _login
    _login = ask_login_shell(quiet=quiet) or []
    return job_path(os.environ.get("PATH", ""))


def warm() -> None:
    """`learn`, and say in the log what jobs get (the daemon does at start)."""
    olog.get().info(olog.Event.JOB_PATH, path=learn())


def job_path(daemon_path: str) -> str:
    """A job's PATH from the daemon's own (never blocks: before `warm`, the daemon's PATH without its venv)."""
    return merged(_login or [], [e for e in daemon_path.split(os.pathsep) if e], own_bin())
