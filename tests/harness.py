"""Drive the real daemon and the real CLI as subprocesses on a temp ORCHESTRATOR_HOME."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.client import Client, Unreachable


def until(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    """Poll `check` until it returns something truthy (returned), or fail saying what never came."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class Daemon:
    """One daemon process with its own home; its JSON log lines land in `home/daemon.log`."""

    def __init__(self, home: Path, env: dict[str, str] | None = None) -> None:
        self.home = home
        # No bubblewrap unless a test asks for it: jobs in tests coordinate through files outside the repo.
        self.env = {**os.environ, "ORCHESTRATOR_HOME": str(home), "ORCHESTRATOR_SANDBOX": "none", **(env or {})}
        self.env.pop("JOURNAL_STREAM", None)
        self.log_path = home / "daemon.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.socket = home / "run" / "orchestrator.sock"

    def start(self, *args: str, wait: bool = True) -> Daemon:
        self.home.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "daemon", *args],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited {self.proc.returncode}:\n{self.log_path.read_text()}")
            try:
                Client(self.socket, timeout=2).health()
                return
            except (Unreachable, OSError):
                time.sleep(0.05)
        raise AssertionError(f"daemon not ready in {timeout}s:\n{self.log_path.read_text()}")

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "orchestrator", *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def cli_json(self, *args: str) -> Any:
        out = self.cli(*args, "--json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def enqueue(self, repo: Path, text: str, *args: str) -> int:
        out = self.cli("enqueue", "--repo", str(repo), *args, "--", text)
        assert out.returncode == 0, out.stderr
        return int(out.stdout.strip())

    def events(self) -> list[dict[str, Any]]:
        lines = self.log_path.read_text().splitlines() if self.log_path.exists() else []
        out = []
        for line in lines:
            if line.startswith("{"):
                out.append(json.loads(line))
        return out

    def wait_exit(self, timeout: float = 60) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

