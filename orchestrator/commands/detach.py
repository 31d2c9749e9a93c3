"""`orchestrator daemon --detach`: start the daemon in the background and return once it answers (like pueued -d);
`orchestrator daemon --stop`: stop it and return once it has ended (like pueue shutdown).

For a shell or a script without a service manager: the next command (`enqueue`) never races the daemon's start.
Its output goes to `<state dir>/daemon.log` (0600); it runs in a session of its own, so closing the terminal does
not stop it. `orchestrator service install` is the way to keep it running across logins.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time

from orchestrator import paths
from orchestrator.client import Client, Unreachable

READY = 60.0
"""Seconds the daemon has to answer on its socket."""
STOPPED = 120.0
"""Seconds `--stop` waits for the daemon to end (it stops its jobs' processes, each given `jobs.kill_grace`)."""


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


def stop(p: paths.Paths) -> int:
    """SIGTERM to the daemon answering on this home's socket, then wait until it has ended: 0 once it has, 3 if none
    answers, 2 if it runs as the systemd service (stopped there, else systemd would not know), 1 if it did not end
    in `STOPPED` seconds. The process is the socket's peer (its kernel credentials), never a pid a file names."""
    try:
        health = Client(p.socket, timeout=5).health()
        pid = _peer(p.socket)
    except (Unreachable, OSError):
        print(f"orchestrator: no daemon answers on {p.socket}: nothing to stop", file=sys.stderr)
        return 3
    if _in_service(pid):
        print(
            f"orchestrator: daemon {pid} runs as the systemd service: `systemctl --user stop orchestrator` stops it",
            file=sys.stderr,
        )
        return 2
    running = len(Client(p.socket, timeout=5).jobs("running"))
    try:
        handle = os.pidfd_open(pid)
    except OSError:
        handle = None
    os.kill(pid, signal.SIGTERM)
    ended = _wait_gone(pid, handle, STOPPED)
    if not ended:
        print(f"orchestrator: daemon {pid} did not end in {STOPPED:.0f} s (its log: {p.state_dir / 'daemon.log'})",
              file=sys.stderr)  # fmt: skip
        return 1
    said = f"orchestrator: daemon {pid} (version {health.get('version', '?')}) stopped"
    if running:
        said += (f"; {running} running job{'s were' if running > 1 else ' was'} interrupted: "
                 "`orchestrator retry --failed` queues them again")  # fmt: skip
    print(said, file=sys.stderr)
    return 0


def _peer(sock: os.PathLike[str] | str) -> int:
    """The pid of the process that answers on the UNIX socket `sock` (SO_PEERCRED), if it is this user's."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(os.fspath(sock))
        pid, uid, _ = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    if uid != os.getuid():
        raise OSError(f"the process on {sock} is not yours (uid {uid})")
    return pid


def _in_service(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            return "/orchestrator.service" in f.read()
    except OSError:
        return False


def _wait_gone(pid: int, handle: int | None, timeout: float) -> bool:
    """Whether process `pid` ended within `timeout` (its pidfd readable; without one, checked every 0.1 s)."""
    deadline = time.monotonic() + timeout
    try:
        if handle is not None:
            return bool(select.select([handle], [], [], timeout)[0])
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            time.sleep(0.1)
        return False
    finally:
        if handle is not None:
            os.close(handle)
