"""Where orchestrator keeps its files: XDG dirs through platformdirs, or all under `ORCHESTRATOR_HOME`.

`ORCHESTRATOR_HOME=DIR` puts config, state and runtime under DIR, for tests and side-by-side instances.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

APP = "orchestrator"


SOCKET_PATH_MAX = 107
"""Longest path a UNIX socket can be bound or reached at (Linux `sun_path` is 108 bytes with its NUL)."""


class PathError(RuntimeError):
    """A directory orchestrator needs cannot be used; the message says what to set instead."""


def socket_too_long(socket: Path) -> str | None:
    """Why `socket` cannot be used as a UNIX socket path, with what to do; None when it fits."""
    n = len(os.fsencode(socket))
    if n <= SOCKET_PATH_MAX:
        return None
    return (
        f"the socket path {socket} is {n} bytes, longer than the {SOCKET_PATH_MAX} a UNIX socket allows: "
        "set ORCHESTRATOR_HOME to a shorter directory (the socket is its run/orchestrator.sock), or without "
        "ORCHESTRATOR_HOME set XDG_RUNTIME_DIR to a shorter one"
    )


@dataclass(frozen=True, slots=True)
class Paths:
    config_dir: Path
    state_dir: Path
    runtime_dir: Path

    @property
    def config_file(self) -> Path:
        return self.config_dir / "config.toml"

    @property
    def db(self) -> Path:
        return self.state_dir / "orchestrator.db"

    @property
    def job_logs(self) -> Path:
        return self.state_dir / "jobs"

    @property
    def worktrees(self) -> Path:
        return self.state_dir / "worktrees"

    @property
    def scratch(self) -> Path:
        """Short-lived worktrees for landing checks."""
        return self.state_dir / "scratch"

    @property
    def spool(self) -> Path:
        """Requests the git hook could not hand to the daemon; drained at start and watched."""
        return self.state_dir / "spool"

    @property
    def hook_log(self) -> Path:
        """One line per request the git hook sent, spooled or had refused."""
        return self.state_dir / "hook.log"

    @property
    def socket(self) -> Path:
        return self.runtime_dir / "orchestrator.sock"

    @property
    def lock(self) -> Path:
        """Next to the database: whichever runtime dir a daemon was started with, one state dir has one owner."""
        return self.state_dir / "daemon.lock"

    def job_log(self, job_id: int) -> Path:
        return self.job_logs / f"{job_id}.log"

    def job_private(self, job_id: int) -> Path:
        """A job's own dir for what its runner writes outside the worktree (scripts, prompts)."""
        return self.state_dir / "private" / str(job_id)

    def ensure(self) -> None:
        """Create the dirs. State and runtime dirs are 0700 whatever the umask: job texts, logs and the
        database are private, and only the owner may reach the socket."""
        if (problem := socket_too_long(self.socket)) is not None:
            raise PathError(problem)
        for d in (self.config_dir, self.state_dir, self.job_logs, self.worktrees, self.scratch):
            d.mkdir(parents=True, exist_ok=True)
        for d in (self.state_dir, self.runtime_dir):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
            st = d.stat()
            if st.st_uid != os.getuid():
                raise PathError(
                    f"{d} belongs to another user (uid {st.st_uid}): set XDG_RUNTIME_DIR (or ORCHESTRATOR_HOME) "
                    "to a directory of your own"
                )
            os.chmod(d, 0o700)


def resolve(env: dict[str, str] | None = None) -> Paths:
    """The paths for this user, honouring `ORCHESTRATOR_HOME` then the XDG variables."""
    env = dict(os.environ) if env is None else env
    home = env.get("ORCHESTRATOR_HOME")
    if home:
        root = Path(home).expanduser().resolve()
        return Paths(root / "config", root / "state", root / "run")
    import platformdirs  # here: with ORCHESTRATOR_HOME (tests, benchmarks, scripts) the CLI never needs it

    state = Path(platformdirs.user_state_dir(APP))
    runtime = env.get("XDG_RUNTIME_DIR")
    # Without XDG_RUNTIME_DIR (an ssh session, a container) the socket lives in the private state dir,
    # never in a shared /tmp/runtime-<uid> that another user may own.
    runtime_dir = Path(runtime) / APP if runtime else state / "run"
    return Paths(Path(platformdirs.user_config_dir(APP)), state, runtime_dir)
