"""Keep the daemon's memory its own: no core dumps, and no `/proc/<pid>/environ` (or `mem`, `maps`) for others.

The daemon holds API keys (in its environment and its heap) and every job's text. A core file (written in
its cwd, or handed to a crash collector) would hold them in a file; `/proc/<pid>/environ` is readable by
any process of the same user, sandboxed jobs included when they can see the daemon's pid. `harden()` at
start sets RLIMIT_CORE to 0 (soft and hard: nothing the daemon starts can raise it back, so a job's crash
leaves no core file in its worktree either) and PR_SET_DUMPABLE to 0, which makes the kernel refuse
ptrace and `/proc/<pid>/{environ,mem,maps,fd}` to every process without CAP_SYS_PTRACE, same user or not.
A program the daemon starts is dumpable again after its exec (the kernel resets it): that is the
program's own memory, not the daemon's.
"""

from __future__ import annotations

import ctypes
import os
import resource
from dataclasses import dataclass

from orchestrator import logging as olog

PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3


@dataclass(frozen=True, slots=True)
class Hardened:
    """What `harden` managed: each False comes with the reason in `problems`."""

    no_core: bool
    not_dumpable: bool
    problems: tuple[str, ...] = ()


def _prctl(option: int, arg: int = 0) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    result = int(libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0),
                            ctypes.c_ulong(0)))  # fmt: skip
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def dumpable() -> bool:
    """Whether this process may be ptraced and dumped by its user (`/proc/self/status` would say too)."""
    return _prctl(PR_GET_DUMPABLE) != 0


def harden() -> Hardened:
    """No core dumps and not dumpable, for this process; what could not be done is logged, not raised."""
    problems: list[str] = []
    no_core = not_dumpable = False
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        no_core = True
    except (OSError, ValueError) as e:
        problems.append(f"RLIMIT_CORE: {e}")
    try:
        _prctl(PR_SET_DUMPABLE, 0)
        not_dumpable = True
    except (OSError, AttributeError) as e:  # AttributeError: a libc without prctl (not Linux)
        problems.append(f"PR_SET_DUMPABLE: {e}")
    if problems:
        olog.get().warning(olog.Event.DAEMON_EXPOSED, problems=problems)
    return Hardened(no_core, not_dumpable, tuple(problems))
