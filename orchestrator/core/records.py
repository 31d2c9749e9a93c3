"""Records the store keeps for the rooms below the job plane (pure data): a process group a command started
(`proc.process`), a landing's intent (`git.journal`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Group:
    """A process group the daemon started (`proc.process`), as recorded in the store."""

    pgid: int
    start_time: int
    """The leader's start time in clock ticks after boot (`/proc/<pid>/stat` field 22); 0 if unknown."""
    boot_id: str
    """The kernel's boot id when it started: a group from before a reboot is long gone."""
    what: str = ""
    """What runs, for a person: `job 3 runner shell`, `job 3 landing check`."""
    mark: str = ""
    """The `RUN_MARK` value its processes carry ("" for a group recorded before marks existed)."""


@dataclass(frozen=True, slots=True)
class Intent:
    """A landing that moves a checked-out branch, stored before the ref moves (`git.journal`)."""

    repo: str
    branch: str
    """The full ref name, `refs/heads/<branch>`."""
    old: str
    new: str
    checkouts: tuple[str, ...]
    job_id: int | None
    at: float
    """When the intent was stored (time.time()); a lock file older than this is not ours."""
