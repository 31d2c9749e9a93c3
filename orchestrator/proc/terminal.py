"""A command in a terminal a person can attach to: a tmux server of the job's own, the command in its one pane.

`orchestrator attach ID` connects to that server (`tmux -S SOCKET attach`), so a person sees the agent CLI as it
draws itself and can type to it, then detaches (`C-b d`) and the job goes on. The runner runs this module as its
command, through `process.run` like any other (owned, timed, its output in the job's log, ended with its group
and its mark), and the module:

1. starts the server (its socket in a dir of the job's own under the daemon's runtime dir, which a sandboxed job
   cannot see: the server runs outside the sandbox, and a job that could reach it could make it run anything),
   with a configuration of its own (no clipboard, title or passthrough escapes reach an attached terminal:
   tmux draws what the command printed, it does not forward it);
2. opens a session whose pane runs the command (the sandbox's prefix and the CLI's argv), held back on a FIFO
   until the pane's output is piped to this module, so none of it is lost;
3. copies that output to its own stdout (the job's log), until the pane's end closes the pipe;
4. exits with the command's exit status (what the pane's shell wrote, else what tmux says), ending the server.

A SIGTERM (the job's timeout, a cancel, the daemon's stop) ends the server first, which ends the pane.
Sync code, run as a command of its own (`python -m orchestrator.proc.terminal`).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

SESSION = "job"
SOCKET = "sock"
CONFIG = """\
set -g exit-empty off
set -g remain-on-exit off
set -g set-clipboard off
set -g set-titles off
set -g allow-rename off
set -g history-limit 20000
set -g status-left "[job JOB] "
set -g status-right "C-b d detaches: the job goes on"
"""
"""The job's tmux: no escape sequence of the command reaches an attached terminal (tmux 3.3 and later refuse
passthrough unless asked); the pane closes when its command ends, which ends the pipe of its output. `JOB`: the
job's id (its terminal dir's name), shown to whoever attaches."""
PASSTHROUGH_OFF = "set -g allow-passthrough off\n"
WIDTH, HEIGHT = 200, 50
"""The pane's size until a person attaches (then it takes the attached terminal's)."""


def tmux() -> str | None:
    """The tmux program, or None when it is not installed."""
    return shutil.which("tmux")


def socket(dir_: Path) -> Path:
    """The socket of the job's tmux server, in the job's terminal dir."""
    return dir_ / SOCKET


def wrap(tmux_path: str, dir_: Path, command: Sequence[str]) -> list[str]:
    """The argv that runs `command` in the job's own tmux server in `dir_` (see the module's docstring)."""
    return [sys.executable, "-m", "orchestrator.proc.terminal", tmux_path, str(dir_), *command]


def attach_argv(tmux_path: str, dir_: Path) -> list[str]:
    """What a person runs to attach to the job's terminal."""
    return [tmux_path, "-S", str(socket(dir_)), "attach-session", "-t", SESSION]


def _version_ok(tmux_path: str) -> bool:
    out = subprocess.run([tmux_path, "-V"], capture_output=True, text=True, timeout=10).stdout.split()
    try:
        major, minor = out[-1].rstrip("abcdefghijklmnopqrstuvwxyz").split(".")[:2]
        return (int(major), int(minor)) >= (3, 3)
    except (IndexError, ValueError):
        return False


def run(tmux_path: str, dir_: Path, command: Sequence[str]) -> int:
    """Run `command` in the job's tmux (see the module's docstring); its exit status."""
    dir_.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(dir_, 0o700)
    for name in ("gate", "out", "gate.status", SOCKET):
        (dir_ / name).unlink(missing_ok=True)
    os.mkfifo(dir_ / "gate", 0o600)
    os.mkfifo(dir_ / "out", 0o600)
    config = dir_ / "tmux.conf"
    job = "".join(c for c in dir_.name if c.isalnum()) or "?"
    config.write_text(CONFIG.replace("JOB", job) + (PASSTHROUGH_OFF if _version_ok(tmux_path) else ""))
    base = [tmux_path, "-S", str(socket(dir_)), "-f", str(config)]
    # The pane's shell waits for the gate, runs the command, and writes its exit status.
    held = 'read _ < "$0"; "$@"; echo "$?" > "$0.status"'
    pane = ["sh", "-c", held, str(dir_ / "gate"), *command]
    size = ["-x", str(WIDTH), "-y", str(HEIGHT)]

    def end(*_: object) -> None:
        pane = subprocess.run([*base, "display-message", "-p", "-t", SESSION, "#{pane_pid}"], capture_output=True,
                              text=True, timeout=30).stdout.strip()  # fmt: skip
        if pane.isdigit():  # the pane's session (its shell and the command); what left it carries the run's mark
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(pane), signal.SIGTERM)
        subprocess.run([*base, "kill-server"], capture_output=True, timeout=30)
        shutil.rmtree(dir_, ignore_errors=True)
        os._exit(128 + signal.SIGTERM)

    def stuck(*_: object) -> None:
        raise TimeoutError(f"the job's terminal did not start within {START_WAIT}s (its pane or its output pipe)")

    signal.signal(signal.SIGTERM, end)
    signal.signal(signal.SIGALRM, stuck)
    try:
        subprocess.run([*base, "new-session", "-d", "-s", SESSION, *size, "--", *pane], check=True, timeout=30)
        out_fifo = shlex.quote(str(dir_ / "out"))
        subprocess.run([*base, "pipe-pane", "-O", "-t", SESSION, f"cat >> {out_fifo}"], check=True, timeout=30)
        signal.alarm(START_WAIT)  # the two FIFOs open once their other ends do: never wait on them for ever
        with open(dir_ / "out", "rb", buffering=0) as out:  # blocks until the pipe's `cat` opens it
            with open(dir_ / "gate", "w") as gate:
                gate.write("go\n")
            signal.alarm(0)
            while chunk := out.read(65536):
                os.write(1, chunk)
        return _status(dir_)
    finally:
        subprocess.run([*base, "kill-server"], capture_output=True, timeout=30)
        shutil.rmtree(dir_, ignore_errors=True)  # no socket left: `attach` says the job's terminal is gone


START_WAIT = 60
"""Seconds the pane's output pipe and the pane's shell may take to open their ends of the FIFOs (SIGALRM after)."""
KILLED = 128 + signal.SIGKILL
"""The exit status when the pane's shell wrote none (it was killed: a person closed the pane, `kill -9`)."""


def _status(dir_: Path) -> int:
    """The command's exit status, as the pane's shell wrote it."""
    try:
        written = (dir_ / "gate.status").read_text().strip()
    except FileNotFoundError:
        return KILLED
    return int(written) if written.isdigit() else KILLED


def main(argv: Sequence[str]) -> int:
    if len(argv) < 3:
        print("usage: python -m orchestrator.proc.terminal TMUX DIR COMMAND...", file=sys.stderr)
        return 2
    return run(argv[0], Path(argv[1]), argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
