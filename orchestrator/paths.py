"""Where orchestrator keeps its files: XDG dirs through platformdirs, or all under `ORCHESTRATOR_HOME`.

`ORCHESTRATOR_HOME=DIR` puts config, state and runtime under DIR, for tests and side-by-side instances.

Private by construction: every dir orchestrator creates is 0700 and every file 0600 whatever the umask
(`private_dir`, `open_private`), and what it reads as configuration must be writable by its owner alone
(`unsafe`, the rule ssh applies to its files).
"""

from __future__ import annotations

import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

APP = "orchestrator"


SOCKET_PATH_MAX = 107
"""Longest path a UNIX socket can be bound or reached at (Linux `sun_path` is 108 bytes with its NUL)."""


class PathError(RuntimeError):
    """A directory orchestrator needs cannot be used; the message says what to set instead."""


def private_dir(path: Path) -> Path:
    """Make `path` and any missing parents, each 0700 whatever the umask (an existing dir is left as it is)."""
    missing: list[Path] = []
    p = path
    while not os.path.lexists(p):
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            continue  # made by a concurrent caller: its owner and mode are checked where they matter
        # The umask may have taken bits of 0700 too (umask 0277 would leave 0500); never more than 0700.
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fchmod(fd, 0o700)
        finally:
            os.close(fd)
    return path


def open_private(path: Path, flags: int) -> int:
    """Open `path` (created if missing) as a file of the owner's alone: parents 0700, the file 0600."""
    private_dir(path.parent)
    fd = os.open(path, flags | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        if os.fstat(fd).st_mode & 0o7777 != 0o600:
            os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _who(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def unsafe(path: Path, *, secret: bool = False) -> str | None:
    """Why another user may have written `path` (an existing file or dir), with the command that fixes it;
    None when only its owner (or root) can have.

    ssh's rule: `path` and every directory above it belong to you or root and are writable by nobody else
    (a sticky dir such as /tmp above it is fine: others cannot rename or remove what is yours in it).
    `secret`: others must not read it either (a file of API keys).
    """
    me = os.getuid()
    real = Path(os.path.realpath(path))
    for p in (real, *real.parents):
        st = os.stat(p)
        if st.st_uid not in (me, 0):
            return (
                f"{p} belongs to {_who(st.st_uid)}, not to you ({_who(me)}): another user could make the daemon "
                f"run their commands; check what is in it, then `sudo chown {_who(me)} {p}`, or move it aside"
            )
        if st.st_mode & 0o022 and not (p != real and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
            whom = "group and others" if st.st_mode & 0o022 == 0o022 else "group" if st.st_mode & 0o020 else "others"
            return (
                f"{p} is writable by {whom} (mode {stat.S_IMODE(st.st_mode):04o}): another user could make the "
                f"daemon run their commands; check what is in it, then `chmod go-w {p}`"
            )
    if secret and os.stat(real).st_mode & 0o077:
        mode = stat.S_IMODE(os.stat(real).st_mode)
        return f"{real} holds secrets but others can read it (mode {mode:04o}): `chmod 600 {real}`"
    return None


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

    def job_terminal(self, job_id: int) -> Path:
        """The dir of a job's own terminal (its tmux socket): under the runtime dir, which no sandboxed job sees."""
        return self.runtime_dir / "tmux" / str(job_id)

    def job_private(self, job_id: int) -> Path:
        """A job's own dir for what its runner writes outside the worktree (scripts, prompts)."""
        return self.state_dir / "private" / str(job_id)

    @property
    def env_file(self) -> Path:
        """KEY=value lines the systemd unit loads into the daemon's environment (API keys): 0600."""
        return self.config_dir / "env"

    def own_dirs(self) -> tuple[Path, ...]:
        """The dirs that hold only orchestrator's own files: each one 0700 and the owner's."""
        private = self.state_dir / "private"
        return (self.state_dir, self.job_logs, self.worktrees, self.scratch, self.spool, private, self.runtime_dir)

    def ensure(self) -> None:
        """Create the dirs, all 0700 whatever the umask (the config dir and any parent made here too): job
        texts, logs and the database are private, only the owner may reach the socket, and nobody else may
        put a config, a spooled request or a dir of their own where the daemon reads one."""
        if (problem := socket_too_long(self.socket)) is not None:
            raise PathError(problem)
        private_dir(self.config_dir)
        for d in self.own_dirs():
            private_dir(d)
            st = os.stat(d)
            if st.st_uid != os.getuid() or not stat.S_ISDIR(st.st_mode):
                what = "is not a directory" if not stat.S_ISDIR(st.st_mode) else f"belongs to {_who(st.st_uid)}"
                raise PathError(
                    f"{d} {what}, not one of yours: move it aside, or set XDG_RUNTIME_DIR (or ORCHESTRATOR_HOME) "
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
