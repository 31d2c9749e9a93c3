"""A real daemon for a benchmark: its own home and config, burst mode, the real socket, its JSON log kept.

Benchmarks drive the daemon exactly as a user does (`orchestrator daemon --burst`, the CLI's client), so
what they measure includes every cost the product has.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Any, Self

from orchestrator.client import Client, Unreachable


class BenchError(RuntimeError):
    """The benchmark could not run; the message says why and what to do."""


class BenchDaemon:
    ARGS: tuple[str, ...] = ("--burst", "--grace", "30")
    """How the daemon runs: burst mode, it exits once its queue is drained and it was idle for 30 s, long enough for
    the benchmark to read every job after the last one ended on a loaded machine (it is stopped then anyway)."""
    READY = 30.0
    """Seconds it has to answer on its socket."""

    def __init__(self, home: Path, config: str, env: dict[str, str] | None = None) -> None:
        self.home = home
        self.log_path = home / "daemon.log"
        self.socket = home / "run" / "orchestrator.sock"
        self.env = {**os.environ, "ORCHESTRATOR_HOME": str(home), **(env or {})}
        for name in ("MAX_CONCURRENT_JOBS", "JOURNAL_STREAM", "NOTIFY_SOCKET"):
            self.env.pop(name, None)
        (home / "config").mkdir(parents=True, exist_ok=True)
        (home / "config" / "config.toml").write_text(config)
        self.proc: subprocess.Popen[bytes] | None = None
        self.client = Client(self.socket, timeout=60)

    def __enter__(self) -> Self:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "orchestrator", "daemon", *self.ARGS],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + self.READY
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(f"the daemon exited {self.proc.returncode}: see {self.log_path}")
            try:
                self.client.health()
                return self
            except (Unreachable, OSError):
                time.sleep(0.05)
        raise BenchError(f"the daemon did not answer within {self.READY:.0f} s: see {self.log_path}")

    def __exit__(self, *_exc: object) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def log_events(self, *names: str) -> list[dict[str, Any]]:
        """The daemon's JSON log lines with these event names, each with `ts` as epoch seconds."""
        out = []
        wanted = set(names)
        for line in self.log_path.read_text(errors="replace").splitlines():
            if not line.startswith("{"):
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec.get("event") in wanted and "timestamp" in rec:
                rec["ts"] = epoch(rec["timestamp"])
                out.append(rec)
        return out


def epoch(iso: str | None) -> float:
    """Seconds since the epoch of an ISO timestamp from the API or the log (0 for none)."""
    if not iso:
        return 0.0
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def machine() -> dict[str, Any]:
    """What the figures were measured on: cores, RAM, Python, git, the package's versions."""
    ram_mb = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram_mb = int(line.split()[1]) // 1024
    except OSError:
        pass
    git = subprocess.run(["git", "--version"], capture_output=True, text=True).stdout.strip()
    versions: dict[str, str | None] = {"sqlite": sqlite3.sqlite_version}
    for dist in ("orchestrator", "pygit2", "aiohttp"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    return {
        "cores": os.cpu_count(),
        "ram_mb": ram_mb,
        "load_1m": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git": git,
        "versions": versions,
    }
