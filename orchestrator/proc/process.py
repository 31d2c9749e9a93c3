"""The one way the daemon runs a command of someone else's: owned, bounded, logged, killed as a group.

Every runner and the landing check go through `run`:

- The command starts in its own session and process group, behind a gate: it waits on a pipe until the
  owner callback has recorded the group (pgid, its start time, the boot) in the store, so a `kill -9`
  of the daemon at any instruction leaves nothing running that a restarted daemon does not know about.
  If the daemon dies before opening the gate, the gate sees end-of-file and the command never runs.
- A timeout sends SIGTERM to the group, then SIGKILL after a grace period; so does cancellation (a
  graceful stop of the daemon). Whatever the command left running in its group is killed when it exits,
  and `run` returns only once the group is empty: no worktree is handed on while a process works in it.
- Output (stdout and stderr interleaved) is appended to a log file up to a size cap (the log says so
  when it is capped); the last `TAIL_BYTES` are kept for the job's reason either way.
- The environment is built from an allow-list (`environment`), never the daemon's whole environment:
  its secrets and git location variables stay out unless a runner names them.
- A long shell text is written to a private file and run as `/bin/sh FILE`, never passed through argv
  (a 1 MB job text would fail with "Argument list too long").

`survivors` and `end_groups` are the other half: on start, a daemon ends the groups a dead one owned,
after checking that each pgid still belongs to the process group it recorded (not a recycled pid).

A process can leave its group (`setsid`, a daemonising double fork), so every command also carries a
mark in its environment, `ORCHESTRATOR_RUN=<home tag>.<run id>`, which its descendants inherit whatever
group or session they move to. When a command's group has ended, processes still carrying its run's
mark are ended too (`end_marked`); on start, a daemon ends every process carrying its home's tag (only a
dead predecessor on the same state dir can have started them: one daemon owns a state dir). A process
that leaves its group and scrubs its own environment escapes that, so where the machine allows it each
command also gets a cgroup of its own (`proc.cgroups`, set up once by `use_cgroups`), killed with it; and a
sandboxed command lives in a PID namespace that dies with it (`proc.sandbox`).
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import hashlib
import os
import resource
import shlex
import signal
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from orchestrator import logging as olog
from orchestrator.core.records import Group
from orchestrator.paths import open_private, private_dir
from orchestrator.proc import cgroups, jobpath
from orchestrator.proc.cgroups import Cgroups

TAIL_BYTES = 4096
"""How much of a command's output `ProcessResult.output_tail` keeps."""
KILL_GRACE = 5.0
"""Seconds between SIGTERM and SIGKILL for a command that timed out or was stopped."""
LOG_CAP = 50 * 1024 * 1024
"""Default size cap of a job's log file, in bytes."""
ARGV_TEXT_LIMIT = 32 * 1024
"""Shell texts longer than this go to a private script file instead of `sh -c`."""
EMPTY_WAIT = 10.0
"""Seconds `run` waits for a killed group to be gone before it gives up and says so."""

BASE_ENV: tuple[str, ...] = (
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "LC_*", "TZ", "TERM", "TMPDIR",
    "COLORTERM", "NO_COLOR",
)  # fmt: skip
"""Variables every command sees (patterns allowed); anything else only when a runner names it."""

GIT_LOCATION_ENV: tuple[str, ...] = (
    "GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_COMMON_DIR", "GIT_PREFIX", "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_NAMESPACE", "GIT_CEILING_DIRECTORIES", "GIT_DISCOVERY_ACROSS_FILESYSTEM",
)  # fmt: skip
"""Inherited from a git hook, these would point git at the wrong repository: never passed on."""

STORE_ENV_PREFIX = "PG"
"""libpq's and asyncpg's variables (PGHOST, PGPASSWORD, PGPASSFILE, ...): in team mode they name the daemon's
way into the team's store, so none passes to a command, whatever its `pass_env` says."""

RUN_MARK = "ORCHESTRATOR_RUN"
"""The environment variable that marks every process a command starts (see the module docstring)."""

# The gate: wait for the owner to record the group, then become the command. EOF (daemon died) → never run.
_GATE = 'IFS= read -r _ || exit 125; exec </dev/null; exec "$@"'


def home_tag(home: object) -> str:
    """A short tag for a state dir (or database path): the prefix of its commands' `RUN_MARK`."""
    return hashlib.sha256(str(home).encode()).hexdigest()[:16]


class Owner:
    """Where groups are recorded: the store (`ProcessTable.own`) in the daemon, nothing in unit tests."""

    @property
    def tag(self) -> str:
        """The owner's `home_tag`: the first part of every mark its commands carry."""
        return "unowned"

    async def own(self, group: Group) -> None:
        """Record `group` durably; `run` opens the gate only after this returns."""

    async def disown(self, group: Group) -> None:
        """The group is gone (empty); forget it."""


@dataclass(frozen=True, slots=True)
class CallbackOwner(Owner):
    own_cb: Callable[[Group], Awaitable[None]]
    disown_cb: Callable[[Group], Awaitable[None]]

    async def own(self, group: Group) -> None:
        await self.own_cb(group)

    async def disown(self, group: Group) -> None:
        await self.disown_cb(group)


@dataclass(frozen=True, slots=True)
class ProcessResult:
    returncode: int | None
    """The command's exit status (negative: killed by that signal); None if it never ran."""
    output_tail: str
    """The last `TAIL_BYTES` of its output."""
    timed_out: bool = False
    capped: bool = False
    """The log file reached its cap; later output is only in `output_tail`."""
    stopped: bool = False
    """`stop_when` saw what it watches for in the output: the command was ended early (SIGTERM, then SIGKILL)."""

    @property
    def ok(self) -> bool:
        return not self.timed_out and self.returncode == 0

    @property
    def status(self) -> str:
        """`exited 0`, `killed by SIGTERM`, `timed out after ...` for a person."""
        if self.returncode is None:
            return "did not start"
        if self.returncode < 0:
            try:
                return f"killed by {signal.Signals(-self.returncode).name}"
            except ValueError:
                return f"killed by signal {-self.returncode}"
        return f"exited {self.returncode}"


@dataclass(slots=True)
class _Log:
    """Appends to the log file up to `cap` bytes; keeps the tail whatever the cap."""

    path: Path | None
    cap: int
    tail: bytearray = field(default_factory=bytearray)
    capped: bool = False
    _fd: int | None = None
    _size: int = 0

    def open(self) -> None:
        if self.path is None:
            return
        self._fd = open_private(self.path, os.O_WRONLY | os.O_APPEND)
        self._size = os.fstat(self._fd).st_size

    def note(self, text: str) -> None:
        """A line of the daemon's own in the log (never capped away, never in the tail)."""
        self._append(text.encode())

    def write(self, data: bytes) -> None:
        self.tail.extend(data)
        del self.tail[:-TAIL_BYTES]
        if self._fd is None or self.capped:
            return
        room = self.cap - self._size
        if len(data) > room:
            self._append(data[: max(room, 0)])
            self.capped = True
            self.note(f"\n[log capped at {self.cap} bytes: later output is dropped]\n")
            return
        self._append(data)

    def _append(self, data: bytes) -> None:
        """Write to the file; a write that fails (a full disk) ends the file, never the pump: the command's
        output is still read (so it never blocks on a full pipe), its tail kept, its timeout and cancel work."""
        if self._fd is None:
            return
        try:
            os.write(self._fd, data)
        except OSError as e:
            self.close()
            self.tail.extend(f"\n[the log file stopped: {e.strerror}; later output is not kept]\n".encode())
            del self.tail[:-TAIL_BYTES]
            return
        self._size += len(data)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def environment(
    pass_env: Iterable[str] = (),
    extra: Mapping[str, str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """A command's environment: `BASE_ENV` plus the names (or `fnmatch` patterns) in `pass_env` taken from
    `environ` (the daemon's), then `extra` on top. Git location variables and the store's (`PG*`) never pass
    through."""
    source = os.environ if environ is None else environ
    patterns = (*BASE_ENV, *pass_env)
    env = {
        k: v
        for k, v in source.items()
        if k not in GIT_LOCATION_ENV
        and not k.startswith(STORE_ENV_PREFIX)
        and any(fnmatch.fnmatchcase(k, p) for p in patterns)
    }
    if "PATH" in env:
        env["PATH"] = jobpath.job_path(env["PATH"])  # the user's login PATH first, never the daemon's venv
    env.update(extra or {})
    return env


async def run(
    command: str | Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout: float,
    log_path: Path | None = None,
    log_cap: int = LOG_CAP,
    grace: float = KILL_GRACE,
    owner: Owner | None = None,
    what: str = "",
    script_dir: Path | None = None,
    prefix: Sequence[str] = (),
    stop_when: Callable[[bytes], bool] | None = None,
) -> ProcessResult:
    """Run `command` (argv, or a shell text for `/bin/sh`) in `cwd` as described in the module docstring.

    `prefix` goes before the command's argv (a sandbox such as `bwrap ... --`). `stop_when` is given each chunk
    of output: once it answers True the command is ended as on a timeout (`ProcessResult.stopped`)."""
    owner = owner or Owner()
    mark = f"{owner.tag}.{uuid.uuid4().hex}"
    env = {**env, RUN_MARK: mark}
    log = _Log(log_path, log_cap)
    await asyncio.to_thread(log.open)
    log.note(f"$ {_shown(command)}\n")
    script: Path | None = None
    try:
        argv, script = await asyncio.to_thread(_argv, command, script_dir)
        argv = [*prefix, *argv]
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh",
            "-c",
            _GATE,
            "orchestrator-gate",
            *argv,
            cwd=cwd,
            env=dict(env),
            stdin=asyncio.subprocess.PIPE,  # the gate; the command itself gets /dev/null
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        assert proc.stdin is not None
        group = Group(proc.pid, _start_time(proc.pid), boot_id(), what, mark)
        try:
            await owner.own(group)
            # Recorded first: a crash from here on leaves a cgroup its home tag names, for the next start.
            await asyncio.to_thread(_contain, proc.pid, mark)
        except BaseException:
            proc.stdin.close()  # EOF: the gate exits 125 without running the command
            await _end_group(proc, group, grace=0.0)
            raise
        try:
            proc.stdin.write(b"go\n")
            await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the gate is already gone (killed from outside): its exit status says so
        finally:
            proc.stdin.close()
        return await _supervise(proc, group, owner, log, timeout, grace, spare_leader=bool(prefix), stop_when=stop_when)
    finally:
        await asyncio.to_thread(log.close)
        if script is not None:
            with contextlib.suppress(FileNotFoundError):
                script.unlink()


async def _supervise(
    proc: asyncio.subprocess.Process,
    group: Group,
    owner: Owner,
    log: _Log,
    timeout: float,
    grace: float,
    *,
    spare_leader: bool = False,
    stop_when: Callable[[bytes], bool] | None = None,
) -> ProcessResult:
    seen = asyncio.Event()

    async def pump() -> None:
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(65536):
            log.write(chunk)  # small appends to a local file: cheaper than a thread hop per chunk
            if stop_when is not None and not seen.is_set() and stop_when(chunk):
                seen.set()

    reader = asyncio.create_task(pump(), name=f"output-{proc.pid}")
    timed_out = stopped = False
    try:
        exited = asyncio.ensure_future(_exited(proc))
        watched = asyncio.ensure_future(seen.wait())
        try:
            done, _ = await asyncio.wait({exited, watched}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watched.cancel()
            if not exited.done():
                exited.cancel()
            await asyncio.gather(exited, watched, return_exceptions=True)
        if not done:
            timed_out = True
            log.note(f"\n[timed out after {timeout:g}s: SIGTERM, then SIGKILL after {grace:g}s]\n")
            await _terminate(proc, grace, spare_leader=spare_leader)
        elif exited not in done:
            stopped = True
            log.note(f"\n[stopped: its output says what it waited for; SIGTERM, then SIGKILL after {grace:g}s]\n")
            await _terminate(proc, grace, spare_leader=spare_leader)
    except asyncio.CancelledError:
        # A graceful stop or a cancel: the command gets SIGTERM and its grace, shielded from a second cancel.
        log.note(f"\n[stopped: SIGTERM, then SIGKILL after {grace:g}s]\n")
        await asyncio.shield(_end_group(proc, group, grace=grace, spare_leader=spare_leader))
        await asyncio.shield(owner.disown(group))
        reader.cancel()
        raise
    await _end_group(proc, group, grace=0.0)  # whatever it left running in the background
    try:
        await asyncio.wait_for(reader, 2.0)
    except TimeoutError:  # something outside the group still holds the pipe
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
    await owner.disown(group)
    if not timed_out:
        log.note(f"\n[exit {proc.returncode}]\n")
    return ProcessResult(
        returncode=proc.returncode,
        output_tail=log.tail.decode(errors="replace"),
        timed_out=timed_out,
        capped=log.capped,
        stopped=stopped,
    )


async def _exited(proc: asyncio.subprocess.Process) -> None:
    """Until the leader has exited. Not `proc.wait()`: that also waits for the output pipe to close, which a
    child the command left in the background holds open (it is killed once the leader is gone)."""
    if proc.returncode is not None:
        return
    loop = asyncio.get_running_loop()
    try:
        pidfd: int | None = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfd (old kernel, not Linux) or already reaped: poll below
        pidfd = None
    if pidfd is not None:
        ready = loop.create_future()
        loop.add_reader(pidfd, lambda: None if ready.done() else ready.set_result(None))
        try:
            await ready
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)
    delay = 0.002
    while proc.returncode is None:
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.1)


async def _terminate(proc: asyncio.subprocess.Process, grace: float, *, spare_leader: bool = False) -> None:
    """SIGTERM, `grace` seconds, SIGKILL. With `spare_leader` (the leader is a sandbox whose death kills all it
    holds at once), SIGTERM goes to the leader's descendants only, so the command gets its grace period."""
    if spare_leader:
        _signal_descendants(proc.pid, signal.SIGTERM)
    else:
        signal_group(proc.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(_exited(proc), grace)
    except TimeoutError:
        signal_group(proc.pid, signal.SIGKILL)
        await _exited(proc)


def _signal_descendants(pid: int, sig: signal.Signals) -> None:
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return
    for child in children:
        with contextlib.suppress(psutil.Error):  # gone meanwhile: nothing to signal
            child.send_signal(sig)


async def _end_group(
    proc: asyncio.subprocess.Process, group: Group, *, grace: float, spare_leader: bool = False
) -> None:
    """SIGTERM (with `grace`) then SIGKILL the whole group; return once the leader is reaped and the group empty."""
    if grace > 0 and proc.returncode is None:
        await _terminate(proc, grace, spare_leader=spare_leader)
    signal_group(group.pgid, signal.SIGKILL)
    await _exited(proc)
    if not await _all_gone([group], EMPTY_WAIT, kill=True):
        olog.get().warning(olog.Event.PROCESS_LINGERS, pgid=group.pgid, what=group.what)
    if group.mark:
        await end_marked(f"{RUN_MARK}={group.mark}", exact=True, what=group.what)
        cgroup = CGROUPS.path(group.mark) if CGROUPS is not None else None
        if cgroup is not None and CGROUPS is not None and not await asyncio.to_thread(CGROUPS.end, cgroup):
            olog.get().warning(olog.Event.PROCESS_LINGERS, cgroup=group.mark, what=group.what)


# ---- cgroups: what no mark or group can hold ---------------------------------------------------------------

CGROUPS: Cgroups | None = None
"""The daemon's cgroups (`proc.cgroups`) when it may make them; set once at start (`use_cgroups`)."""
LIMITS = cgroups.Limits()
"""What each command may take (`jobs.pids_max`, `jobs.memory_max`); set once at start (`use_cgroups`)."""
OOM_SCORE_ADJ = 500
"""Every command's processes are the kernel's first choice when memory runs out (the daemon and your session
last): what protects the machine's memory where no memory limit holds."""


def use_cgroups(limits: cgroups.Limits | None = None) -> tuple[bool, str]:
    """Probe for cgroups and use them (with `limits`) for every command from now on: whether they are used, and why
    not (or why a limit does not hold)."""
    global CGROUPS, LIMITS
    LIMITS = limits or cgroups.Limits()
    CGROUPS, why = cgroups.find(LIMITS)
    return CGROUPS is not None, why


def _contain(pid: int, mark: str) -> None:
    """Move the gate (not yet running its command) into a cgroup of its own, where the machine allows, with its
    limits; where no pids limit holds, RLIMIT_NPROC bounds what it can fork (see `_fallback`)."""
    _fallback(pid)
    if CGROUPS is None:
        return
    path = CGROUPS.make(mark)
    try:
        CGROUPS.enter(path, pid)
    except BaseException:
        CGROUPS.end(path)
        raise


def _fallback(pid: int) -> None:
    """What holds a command without a cgroup limit: its OOM score raised (so the kernel ends it first, not the
    daemon or your session), and, with no pids limit, RLIMIT_NPROC at the processes you run now plus
    `jobs.pids_max` (the kernel counts every process of your user, and exempts root)."""
    with contextlib.suppress(OSError):  # gone already, or /proc not mounted: nothing to raise
        Path(f"/proc/{pid}/oom_score_adj").write_text(f"{OOM_SCORE_ADJ}\n")
    held = CGROUPS is not None and any(b.controller == "pids" for b in CGROUPS.bounds)
    if LIMITS.pids and not held and os.getuid() != 0:
        n = _user_processes() + LIMITS.pids
        resource.prlimit(pid, resource.RLIMIT_NPROC, (n, n))


def _user_processes() -> int:
    uid, n = os.getuid(), 0
    with contextlib.suppress(OSError), os.scandir("/proc") as entries:
        for e in entries:
            if e.name.isdigit():
                with contextlib.suppress(OSError):
                    n += e.stat(follow_symlinks=False).st_uid == uid
    return n


async def end_cgroups(tag: str) -> list[str]:
    """On start: kill and remove every cgroup a dead daemon of this home made; their names."""
    if CGROUPS is None:
        return []
    left = await asyncio.to_thread(CGROUPS.leftovers, tag)
    for path in left:
        if not await asyncio.to_thread(CGROUPS.end, path):
            olog.get().warning(olog.Event.PROCESS_LINGERS, cgroup=path.name)
    return [p.name for p in left]


def _shown(command: str | Sequence[str], limit: int = 2000) -> str:
    text = command if isinstance(command, str) else shlex.join(command)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def _argv(command: str | Sequence[str], script_dir: Path | None) -> tuple[list[str], Path | None]:
    if not isinstance(command, str):
        return list(command), None
    if len(command.encode()) <= ARGV_TEXT_LIMIT:
        return ["/bin/sh", "-c", command], None
    if script_dir is not None:
        private_dir(script_dir)
    fd, name = tempfile.mkstemp(prefix="job-", suffix=".sh", dir=script_dir)  # mode 0600
    with os.fdopen(fd, "wb") as f:
        f.write(command.encode())
    return ["/bin/sh", name], Path(name)


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Send `sig` to the group; a group that is already gone is fine."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        olog.get().warning(olog.Event.PROCESS_NOT_OURS, pgid=pgid, signal=sig.name)


# ---- /proc facts: start times, group members -------------------------------------------------------------


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, pgrp, session, starttime) of a process from `/proc/<pid>/stat`; None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = raw[raw.rindex(b")") + 2 :].split()
    return fields[0].decode(), int(fields[2]), int(fields[3]), int(fields[19])


def alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    st = _stat(pid)
    return st is not None and st[0] != "Z"


def _start_time(pid: int) -> int:
    st = _stat(pid)
    return st[3] if st else 0


def members(pgid: int) -> list[int]:
    """Live (not zombie) processes in process group `pgid`."""
    # The kernel first, in one call: a group it does not know has no process at all (a job's group is
    # usually gone by the time we ask), so the scan of every process below is only for groups that remain.
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        pass
    if not Path("/proc/self/stat").exists():  # no procfs: the kernel's answer (zombies count as alive then)
        return [pgid]
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        st = _stat(int(entry.name))
        if st is not None and st[1] == pgid and st[0] != "Z":
            found.append(int(entry.name))
    return found


def group_alive(pgid: int) -> bool:
    return bool(members(pgid))


def is_ours(group: Group) -> bool:
    """Whether `group.pgid` still names the group we started (not a recycled pid that became a leader).

    A record is checkable only with the boot it was made in (this one) and its leader's start time: one without
    them (`start_time` 0, an empty boot id) or from another boot names nothing we can check, and nothing is
    ever signalled on it. While any member of a group lives, the kernel keeps its pgid from being reused; so
    if the recorded leader is gone but members remain, they are ours. If a process with the leader's pid
    exists, it must lead that group and have started when we recorded.
    """
    here = boot_id()
    if not group.boot_id or not here or group.boot_id != here or group.start_time <= 0:
        return False
    leader = _stat(group.pgid)
    if leader is not None and leader[0] != "Z":
        return leader[1] == group.pgid and leader[3] == group.start_time
    return group_alive(group.pgid)


async def end_groups(groups: Iterable[Group], *, grace: float = KILL_GRACE) -> list[Group]:
    """End the survivors among `groups` (SIGTERM, `grace`, SIGKILL); return the ones that were still running."""
    alive = [g for g in groups if await asyncio.to_thread(is_ours, g)]
    for g in alive:
        signal_group(g.pgid, signal.SIGTERM)
    if await _all_gone(alive, grace):
        return alive
    for g in alive:
        signal_group(g.pgid, signal.SIGKILL)
    if not await _all_gone(alive, EMPTY_WAIT, kill=True):
        olog.get().warning(olog.Event.PROCESS_LINGERS, pgids=[g.pgid for g in alive if group_alive(g.pgid)])
    return alive


async def _all_gone(groups: list[Group], within: float, *, kill: bool = False) -> bool:
    deadline = time.monotonic() + within
    while True:
        left = [g for g in groups if await asyncio.to_thread(group_alive, g.pgid)]
        if not left:
            return True
        if time.monotonic() > deadline:
            return False
        for g in left if kill else ():
            signal_group(g.pgid, signal.SIGKILL)  # a member may have forked after the first signal
        await asyncio.sleep(0.05)


# ---- marks: processes that left their group ---------------------------------------------------------------


def marked(entry: str, *, exact: bool) -> list[int]:
    """Live processes of this user whose environment has `entry` (`NAME=value`; with `exact=False`, an
    entry that starts with it). Never this process."""
    want = entry.encode()
    uid, me, found = os.getuid(), os.getpid(), []
    try:
        entries = list(os.scandir("/proc"))
    except OSError:  # no procfs: nothing can be found this way
        return []
    for e in entries:
        if not e.name.isdigit() or int(e.name) == me:
            continue
        try:
            if e.stat(follow_symlinks=False).st_uid != uid:
                continue
            with open(f"/proc/{e.name}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:  # gone, or not ours to read
            continue
        if any(v == want if exact else v.startswith(want) for v in env) and alive(int(e.name)):
            found.append(int(e.name))
    return found


async def end_marked(entry: str, *, exact: bool, what: str = "") -> list[int]:
    """SIGKILL every process carrying `entry` in its environment (see `marked`) until none is left."""
    deadline = time.monotonic() + EMPTY_WAIT
    ended: set[int] = set()
    while pids := await asyncio.to_thread(marked, entry, exact=exact):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        ended.update(pids)
        if time.monotonic() > deadline:
            olog.get().warning(olog.Event.PROCESS_LINGERS, pids=pids, what=what)
            break
        await asyncio.sleep(0.02)
    if ended:
        olog.get().warning(olog.Event.PROCESS_ESCAPEES_ENDED, pids=sorted(ended), what=what)
    return sorted(ended)
