"""`orchestrator daemon --detach`: start the daemon in the background and return once it answers (like pueued -d).

For a shell or a script without a service manager: the next command (`enqueue`) never races the daemon's start.
Its output goes to `<state dir>/daemon.log` (0600); it runs in a session of its own, so closing the terminal does
not stop it. `orchestrator service install` is the way to keep it running across logins.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from orchestrator import paths
from orchestrator.client import Client, Unreachable

READY = 60.0
"""Seconds the daemon has to answer on its socket."""


def detach(p: paths.Paths, args: list[str]) -> int:
    """Start `orchestrator daemon ARGS` detached; 0 once it answers, else its exit code (its log's end said)."""
    try:
        Client(p.socket, timeout=2).health()
        print(f"orchestrator: a daemon already answers on {p.socket}", file=sys.stderr)
        return 0
    except (Unreachable, OSError):
        pass
    p.ensure()
    log = p.state_dir / "daemon.log"
    fd = paths.open_private(log, os.O_WRONLY | os.O_APPEND)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "daemon", *args],
            stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, start_new_session=True,
        )  # fmt: skip
    finally:
        os.close(fd)
    deadline = time.monotonic() + READY
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").splitlines()[-10:]
            print("\n".join(tail), file=sys.stderr)
            print(f"orchestrator: the daemon exited {proc.returncode} (its log: {log})", file=sys.stderr)
            return proc.returncode or 1
        try:
            Client(p.socket, timeout=2).health()
        except (Unreachable, OSError):
            time.sleep(0.05)
            continue
        print(f"orchestrator: daemon {proc.pid} answers on {p.socket}; its log: {log}", file=sys.stderr)
        return 0
    print(f"orchestrator: the daemon {proc.pid} did not answer in {READY:.0f} s; its log: {log}", file=sys.stderr)
    return 1
