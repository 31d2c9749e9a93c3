"""A cgroup (v2) per command, where the daemon may make them: what a job leaves cannot outlive it.

Where the daemon's own cgroup is writable — systemd's `Delegate=yes` gives the service one (the unit
`orchestrator service install` writes asks for it), so does running as root on a cgroup v2 machine — each
command the daemon starts (runner, agent `run`, landing check) is moved into a child cgroup of the
daemon's before it may run, named for its run mark (`orchestrator-<home tag>.<run id>`). Every process it
starts is born there, whatever group or session it moves to and whatever environment it clears. When the
command ends, the cgroup is killed (`cgroup.kill`; on kernels before 5.14, frozen and each member killed)
and removed; a restarted daemon kills and removes every cgroup its home tag names.

What this does not stop: a process that writes its own pid into a cgroup outside its own (the daemon's,
which the daemon must be able to write to make the children). Without a sandbox a job runs as you and
can do that if it knows to; inside bubblewrap its PID namespace holds it anyway. No controller is enabled:
the cgroups only hold processes, they limit nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

PREFIX = "orchestrator-"
KILL_WAIT = 10.0
"""Seconds to wait for a killed cgroup to be empty before it is left (and logged)."""


@dataclass(frozen=True, slots=True)
class Cgroups:
    """The daemon's own cgroup, under which it makes one per command."""

    base: Path

    def make(self, mark: str) -> Path:
        path = self.base / f"{PREFIX}{mark}"
        os.mkdir(path, 0o755)
        return path

    @staticmethod
    def enter(cgroup: Path, pid: int) -> None:
        """Move process `pid` (and so all it will start) into `cgroup`."""
        with open(cgroup / "cgroup.procs", "w") as f:
            f.write(f"{pid}\n")

    @staticmethod
    def end(cgroup: Path, within: float = KILL_WAIT) -> bool:
        """Kill every process in `cgroup`, wait until it is empty, remove it; False if it would not empty."""
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
        try:
            os.rmdir(cgroup)
        except FileNotFoundError:
            pass
        except OSError:
            return False
        return True

    def leftovers(self, tag: str) -> list[Path]:
        """The cgroups a daemon of home tag `tag` made (a dead one's, on start)."""
        try:
            return sorted(p for p in self.base.iterdir() if p.name.startswith(f"{PREFIX}{tag}.") and p.is_dir())
        except OSError:
            return []


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


def _own() -> Path | None:
    """This process's cgroup v2 directory, or None (no unified hierarchy mounted)."""
    try:
        line = next(
            (ln for ln in Path("/proc/self/cgroup").read_text().splitlines() if ln.startswith("0::")), None
        )
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    if line is None:
        return None
    mount = next((m.split()[4] for m in mounts if " - cgroup2 " in m), None)
    if mount is None:
        return None
    return Path(mount) / line[3:].lstrip("/")


def find() -> tuple[Cgroups | None, str]:
    """The daemon's cgroups, or None and why not (for the log). Probed by making and removing a child."""
    base = _own()
    if base is None:
        return None, "no cgroup v2 hierarchy is mounted"
    if not (os.access(base, os.W_OK) and os.access(base / "cgroup.procs", os.W_OK)):
        return None, f"the daemon's cgroup {base} is not writable (under systemd: Delegate=yes)"
    probe = base / f"{PREFIX}probe-{os.getpid()}"
    try:
        os.mkdir(probe, 0o755)
        os.rmdir(probe)
    except OSError as e:
        return None, f"no child cgroup can be made in {base} ({e.strerror})"
    return Cgroups(base), ""
