"""A cgroup per command, where the daemon may make them: what a job leaves cannot outlive it, and what it starts
cannot take the machine's processes or memory.

Where the daemon's own cgroup (v2) is writable — systemd's `Delegate=yes` gives the service one (the unit
`orchestrator service install` writes asks for it), so does running as root — each command the daemon starts
(runner, agent `run`, landing check) is moved into a child cgroup of the daemon's before it may run, named for
its run mark (`orchestrator-<home tag>.<run id>`). Every process it starts is born there, whatever group or
session it moves to and whatever environment it clears. When the command ends, the cgroup is killed
(`cgroup.kill`; on kernels before 5.14, frozen and each member killed) and removed; a restarted daemon kills
and removes every cgroup its home tag names.

Limits (`Limits`: `jobs.pids_max`, `jobs.memory_max`): each command's cgroup gets `pids.max` (processes and
threads together: a fork bomb stops there) and `memory.max` (past it the kernel reclaims, then kills inside
the group only), where those controllers can be had. On cgroup v2 they are enabled for the daemon's children
(`cgroup.subtree_control`; a cgroup with processes of its own cannot give them, so the daemon first moves
itself into a leaf of its cgroup, `orchestrator-daemon-<pid>`). Where a controller is still bound to a v1
hierarchy (a "hybrid" machine), the command also gets a cgroup of that hierarchy, with the limit there
(`pids.max`, `memory.limit_in_bytes`). `find` says which limits hold and why the others do not.

What this does not stop: a process that writes its own pid into a cgroup outside its own (the daemon's,
which the daemon must be able to write to make the children). Without a sandbox a job runs as you and
can do that if it knows to; inside bubblewrap its PID namespace holds it anyway.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

PREFIX = "orchestrator-"
DAEMON_LEAF = f"{PREFIX}daemon-"
"""The leaf of its own cgroup a daemon moves into, so that its cgroup may give controllers to its children."""
KILL_WAIT = 10.0
"""Seconds to wait for a killed cgroup to be empty before it is left (and logged)."""
_V2_FILES = {"pids": "pids.max", "memory": "memory.max"}
_V1_FILES = {"pids": "pids.max", "memory": "memory.limit_in_bytes"}


@dataclass(frozen=True, slots=True)
class Limits:
    """What each command's cgroup may hold at most (0: no limit)."""

    pids: int = 0
    """Processes and threads together."""
    memory: int = 0
    """Bytes of memory (page cache included, as the kernel counts it)."""

    @classmethod
    def of(cls, pids: int, memory: int) -> Limits:
        """The configured limits (`jobs.pids_max`, `jobs.memory_max`): memory 0 is half the machine's memory."""
        return cls(pids=pids, memory=memory or half_the_memory())

    def wanted(self) -> dict[str, int]:
        return {name: value for name, value in (("pids", self.pids), ("memory", self.memory)) if value > 0}


def half_the_memory() -> int:
    """Half the machine's physical memory, in bytes (0 where it cannot be asked)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (ValueError, OSError):
        return 0


@dataclass(frozen=True, slots=True)
class Bound:
    """One limit set on every command's cgroup: in its v2 cgroup (`v1` None), or in a cgroup of its own made under
    `v1`, the daemon's cgroup in that controller's v1 hierarchy."""

    controller: str
    value: int
    v1: Path | None = None

    @property
    def file(self) -> str:
        return (_V2_FILES if self.v1 is None else _V1_FILES)[self.controller]

    def shown(self) -> str:
        return f"{self.file}={self.value}" + (" (v1)" if self.v1 is not None else "")


@dataclass(frozen=True, slots=True)
class Cgroups:
    """The daemon's own cgroup, under which it makes one per command, and the limits each one gets."""

    base: Path
    bounds: tuple[Bound, ...] = ()

    def path(self, mark: str) -> Path:
        return self.base / f"{PREFIX}{mark}"

    def make(self, mark: str) -> Path:
        """The command's cgroup (and one per v1 limit), each with its limit written before anything runs there."""
        path = self.path(mark)
        os.mkdir(path, 0o755)
        try:
            for b in self.bounds:
                where = path if b.v1 is None else b.v1 / path.name
                if b.v1 is not None:
                    os.mkdir(where, 0o755)
                (where / b.file).write_text(f"{b.value}\n")
        except BaseException:
            self.end(path)
            raise
        return path

    def enter(self, cgroup: Path, pid: int) -> None:
        """Move process `pid` (and so all it will start) into `cgroup` and its v1 companions."""
        for where in (cgroup, *(b.v1 / cgroup.name for b in self.bounds if b.v1 is not None)):
            with open(where / "cgroup.procs", "w") as f:
                f.write(f"{pid}\n")

    def end(self, cgroup: Path, within: float = KILL_WAIT) -> bool:
        """Kill every process in `cgroup`, wait until it is empty, remove it and its v1 companions; False if it
        would not empty."""
        if not _kill(cgroup, within):
            return False
        for b in self.bounds:
            if b.v1 is not None:
                _remove(b.v1 / cgroup.name)
        return True

    def leftovers(self, tag: str) -> list[Path]:
        """The cgroups a daemon of home tag `tag` made (a dead one's, on start)."""
        try:
            return sorted(p for p in self.base.iterdir() if p.name.startswith(f"{PREFIX}{tag}.") and p.is_dir())
        except OSError:
            return []

    def shown(self) -> str:
        return ", ".join(b.shown() for b in self.bounds) or "none"


def _kill(cgroup: Path, within: float) -> bool:
    if not cgroup.exists():
        return True
    kill = cgroup / "cgroup.kill"
    if kill.exists():
        kill.write_text("1\n")
    deadline = time.monotonic() + within
    while True:
        pids = _members(cgroup)
        if not pids:
            break
        if not kill.exists():
            _freeze_and_kill(cgroup, pids)
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return _remove(cgroup)


def _remove(cgroup: Path) -> bool:
    try:
        os.rmdir(cgroup)
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True


def _members(cgroup: Path) -> list[int]:
    try:
        return [int(x) for x in (cgroup / "cgroup.procs").read_text().split()]
    except FileNotFoundError:
        return []


def _freeze_and_kill(cgroup: Path, pids: list[int]) -> None:
    # Frozen first, so a member cannot fork a new one between the read and the kill.
    freeze = cgroup / "cgroup.freeze"
    if freeze.exists():
        freeze.write_text("1\n")
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if freeze.exists():
        freeze.write_text("0\n")


def _proc_lines() -> tuple[list[str], list[str]] | None:
    try:
        return (
            Path("/proc/self/cgroup").read_text().splitlines(),
            Path("/proc/self/mountinfo").read_text().splitlines(),
        )
    except OSError:
        return None


def _own() -> Path | None:
    """This process's cgroup v2 directory, or None (no unified hierarchy mounted)."""
    lines = _proc_lines()
    if lines is None:
        return None
    groups, mounts = lines
    line = next((ln for ln in groups if ln.startswith("0::")), None)
    mount = next((m.split()[4] for m in mounts if " - cgroup2 " in m), None)
    if line is None or mount is None:
        return None
    return Path(mount) / line[3:].lstrip("/")


def _own_v1(controller: str) -> Path | None:
    """This process's cgroup in the v1 hierarchy that holds `controller`, or None."""
    lines = _proc_lines()
    if lines is None:
        return None
    groups, mounts = lines
    path = next(
        (ln.split(":", 2)[2] for ln in groups if controller in ln.split(":", 2)[1].split(",")), None
    )  # "8:pids:/user.slice"
    for m in mounts:
        if " - cgroup " not in m:
            continue
        options = m.rsplit(" ", 1)[-1].split(",")
        if controller in options and path is not None:
            return Path(m.split()[4]) / path.lstrip("/")
    return None


def _writable(base: Path) -> str:
    """ "" if a child cgroup can be made in `base`, else why not."""
    if not (os.access(base, os.W_OK) and os.access(base / "cgroup.procs", os.W_OK)):
        return f"{base} is not writable"
    probe = base / f"{PREFIX}probe-{os.getpid()}"
    try:
        os.mkdir(probe, 0o755)
        os.rmdir(probe)
    except OSError as e:
        return f"no child cgroup can be made in {base} ({e.strerror})"
    return ""


def _enable_v2(base: Path, controllers: list[str]) -> tuple[list[str], str]:
    """Give `controllers` to the children of `base` (moving this process into a leaf first if `base` holds it):
    the ones enabled, and why any are not."""
    try:
        available = set((base / "cgroup.controllers").read_text().split())
        enabled = set((base / "cgroup.subtree_control").read_text().split())
    except OSError as e:
        return [], f"the controllers of {base} cannot be read ({e.strerror})"
    todo = [c for c in controllers if c in available and c not in enabled]
    missing = [c for c in controllers if c not in available]
    why = f"no {' or '.join(missing)} controller in {base}" if missing else ""
    if todo:
        try:
            _subtree(base, todo)
        except OSError as e:
            if e.errno != errno.EBUSY:
                return [c for c in controllers if c in enabled], f"{base} gives no {', '.join(todo)} ({e.strerror})"
            try:  # the daemon's own processes are in `base`: into a leaf of it, then again
                _tidy_leaves(base)
                leaf = base / f"{DAEMON_LEAF}{os.getpid()}"
                os.mkdir(leaf, 0o755)
                (leaf / "cgroup.procs").write_text(f"{os.getpid()}\n")
                _subtree(base, todo)
            except OSError as e2:
                return [c for c in controllers if c in enabled], f"{base} gives no {', '.join(todo)} ({e2.strerror})"
        enabled.update(todo)
    return [c for c in controllers if c in enabled], why


def _subtree(base: Path, controllers: list[str]) -> None:
    (base / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in controllers) + "\n")


def _tidy_leaves(base: Path) -> None:
    """Remove the leaves dead daemons left (an empty cgroup's rmdir succeeds; a live daemon's fails)."""
    for p in base.iterdir():
        if p.name.startswith(DAEMON_LEAF) and p.is_dir():
            with contextlib.suppress(OSError):
                os.rmdir(p)


def find(limits: Limits | None = None) -> tuple[Cgroups | None, str]:
    """The daemon's cgroups with the `limits` that can hold, or None; and why not (or why some limit does not
    hold), for the log. Probed by making and removing a child."""
    base = _own()
    if base is None:
        return None, "no cgroup v2 hierarchy is mounted"
    why = _writable(base)
    if why:
        return None, f"{why} (under systemd: Delegate=yes)" if "not writable" in why else why
    wanted = (limits or Limits()).wanted()
    enabled, why = _enable_v2(base, list(wanted)) if wanted else ([], "")
    bounds = [Bound(c, wanted[c]) for c in enabled]
    notes = []
    for controller in (c for c in wanted if c not in enabled):
        v1 = _own_v1(controller)
        if v1 is not None and not _writable(v1):
            bounds.append(Bound(controller, wanted[controller], v1))
        else:
            notes.append(f"no {controller} limit ({why or 'controller unavailable'})")
    return Cgroups(base, tuple(bounds)), "; ".join(notes)
