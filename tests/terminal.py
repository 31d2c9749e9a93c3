"""A real terminal for tests of what a person sees: a tmux server of the test's own, a command in a pane of a given
size, keys typed, the screen read back, and what the terminal was made to do (its title, its clipboard)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

END = "<<view ended>>"
BEGIN = "<<view begins>>"


class Terminal:
    """One tmux server (`-L name`) with one pane of `width` × `height`; OSC 52 is taken into its buffers
    (`set-clipboard on`), so a clipboard write shows as a buffer."""

    def __init__(self, name: str, width: int = 80, height: int = 50) -> None:
        # Its socket is /tmp/tmux-UID/NAME: the pid keeps servers of parallel workers and other runs apart.
        self.base = ["tmux", "-L", f"{name}-{os.getpid()}", "-f", "/dev/null"]
        self.width, self.height = width, height
        self._tmux("new-session", "-d", "-x", str(width), "-y", str(height), "-s", "w", "sleep 600")
        self._tmux("set-option", "-g", "set-clipboard", "on")
        self._tmux("set-option", "-g", "remain-on-exit", "on")

    def _tmux(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.base, *args], capture_output=True, text=True, timeout=20, check=check)

    def start(self, command: str) -> None:
        """Run `command` (a shell line) in the pane, in place of what ran there."""
        self._tmux("respawn-pane", "-k", "-t", "w", command)

    def screen(self, joined: bool = False) -> str:
        """The visible screen; `joined`: lines the terminal wrapped joined back (a line wider than the pane shows
        as one line longer than `width`)."""
        return self._tmux("capture-pane", "-p", *(["-J"] if joined else []), "-t", "w").stdout

    def title(self) -> str:
        return self._tmux("display-message", "-p", "-t", "w", "#{pane_title}").stdout.strip()

    def buffers(self) -> str:
        return self._tmux("list-buffers", check=False).stdout.strip()

    def ended(self) -> bool:
        """The command in the pane has exited."""
        return self._tmux("display-message", "-p", "-t", "w", "#{pane_dead}").stdout.strip() == "1"

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "w", *keys)

    def resize(self, width: int) -> None:
        self.width = width
        self._tmux("resize-window", "-t", "w", "-x", str(width), "-y", str(self.height))

    def shows(self, text: str, what: str, timeout: float = 30) -> str:
        """Wait until the screen shows `text`; the screen then (or fail with the screen as it is)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            shot = self.screen()
            if text in shot:
                return shot
            time.sleep(0.1)
        raise AssertionError(f"the screen never showed {what} ({text!r}):\n{self.screen()}")

    def view(self, home: Path, *args: str, timeout: float = 60, env: dict[str, str] | None = None) -> str:
        """Run `orchestrator ARGS` in the pane after a line of its own, wait for it to end, and return the screen
        (the command's lines between the two marks); `env`: variables it gets besides."""
        extra = [f"{k}={v}" for k, v in (env or {}).items()]
        cli = shlex.join(["env", "-u", "COLUMNS", "-u", "LINES", f"ORCHESTRATOR_HOME={home}", *extra, sys.executable,
                          "-m", "orchestrator", *args])  # fmt: skip
        self.start(f"clear; echo '{BEGIN}'; {cli}; echo '{END}'; sleep 600")
        return self.shows(END, f"`orchestrator {' '.join(args)}` ending", timeout)

    def close(self) -> None:
        self._tmux("kill-server", check=False)
