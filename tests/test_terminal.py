"""A command in a tmux of its own (`proc.terminal`): its output and exit status as on a pipe, nothing left after."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time

import pytest

from orchestrator.proc import terminal

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (.ci/run installs it)")


def test_the_commands_output_and_exit_status_come_through_and_its_terminal_goes(tmp_path):
    """What the command prints reaches the wrapper's stdout (escapes and all: the job's log keeps them), its exit
    status is the wrapper's, and its tmux server and dir are gone after."""
    where = tmp_path / "t"
    script = "printf 'one\\n\\033[31mred\\033[0m\\n'; printf 'two\\n' >&2; exit 3"
    argv = terminal.wrap(str(terminal.tmux()), where, ["sh", "-c", script])
    done = subprocess.run(argv, capture_output=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert done.stdout.replace(b"\r\n", b"\n") == b"one\n\x1b[31mred\x1b[0m\ntwo\n"
    assert not where.exists()


def test_a_stop_ends_the_command_in_its_pane_even_one_that_ignores_hangups(tmp_path):
    """SIGTERM to the wrapper (a timeout, a cancel) ends the pane's command, though it ignores SIGHUP, and the
    server."""
    where = tmp_path / "t"
    tag = f"orch-terminal-{tmp_path.name}"
    loop = "trap '' HUP; echo up; while :; do sleep 0.1; done"
    argv = terminal.wrap(str(terminal.tmux()), where, ["sh", "-c", loop, tag])
    with subprocess.Popen(argv, stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"up"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    deadline = time.monotonic() + 10
    while subprocess.run(["pgrep", "-f", tag], capture_output=True).returncode == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert subprocess.run(["pgrep", "-af", tag], capture_output=True, text=True).stdout == ""
    assert not where.exists()
