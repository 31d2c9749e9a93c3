"""`orchestrator demo`: the main job on embedded defaults, on a fresh machine, in about ten seconds.

It makes a small repository, starts a real daemon in burst mode on a private home, queues shell jobs
through the real API (two disjoint, one overlapping, one that shares only the changelog, one with no
claim), waits for them, and shows when each ran, why, and what landed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from orchestrator.client import Client, Unreachable
from orchestrator.paths import open_private

FILES = {
    "README.md": "# demo\n",
    "CHANGES.md": "# Changes\n\n",
    "src/api.py": "def api():\n    return 1\n",
    "src/db.py": "def db():\n    return 1\n",
    "docs/guide.md": "# Guide\n",
}

# (text, declared paths): each job sleeps so that overlap in time is visible.
JOBS: list[tuple[str, list[str]]] = [
    (
        "sleep 1.5; printf 'def api_v2():\\n    return 2\\n' >> src/api.py; sed -i '2a - api v2' CHANGES.md",
        ["src/api.py", "CHANGES.md"],
    ),
    (
        "sleep 1.5; printf 'def db_v2():\\n    return 2\\n' >> src/db.py; sed -i '2a - db v2' CHANGES.md",
        ["src/db.py", "CHANGES.md"],
    ),
    ("sleep 1; sed -i 's/return 1/return 10/' src/api.py", ["src/api.py"]),
    ("sleep 1; echo 'More words.' >> docs/guide.md", ["docs/"]),
    ("sleep 1; echo 'demo' > VERSION", []),
]


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def make_repo(root: Path) -> Path:
    repo = root / "demo-repo"
    repo.mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.name", "Demo")
    _git(repo, "config", "user.email", "demo@example.com")
    for rel, text in FILES.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "demo: initial")
    return repo


def run(keep: Path | None = None, *, as_json: bool = False) -> int:
    """Run the demo in `keep` (kept afterwards) or in a temp dir (removed afterwards); the exit code."""
    if keep is not None:
        root = Path(keep).expanduser().resolve()
        if root.exists() and any(root.iterdir()):
            print(
                f"orchestrator: {root} is not empty (a demo kept there before?); "
                "name a new or empty directory for --keep, or remove that one",
                file=sys.stderr,
            )
            return 2
        return _run(root, root / "home" / "daemon.log", as_json)
    root = Path(tempfile.mkdtemp(prefix="orchestrator-demo-"))
    try:
        # The daemon's log outlives the temp dir (the demo names it): beside it, not in it.
        return _run(root, root.with_name(root.name + ".daemon.log"), as_json)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _run(root: Path, log_path: Path, as_json: bool) -> int:
    repo = make_repo(root)
    home = root / "home"
    env = {**os.environ, "ORCHESTRATOR_HOME": str(home), "MAX_CONCURRENT_JOBS": "4"}
    env.pop("JOURNAL_STREAM", None)
    home.mkdir(parents=True, exist_ok=True)
    say = (lambda *_: None) if as_json else (lambda m: print(m, file=sys.stderr))
    say(f"demo repo: {repo}\ndaemon home: {home}\ndaemon log: {log_path} (JSON lines; kept after the demo)")
    # A file of its own (0600, never one someone else put there first: it may sit in /tmp).
    with os.fdopen(open_private(log_path, os.O_WRONLY | os.O_APPEND | os.O_EXCL), "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "daemon", "--burst", "--grace", "3"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    client = Client(home / "run" / "orchestrator.sock")
    deadline = time.monotonic() + 20
    while True:
        try:
            client.health()
            break
        except (Unreachable, OSError):
            if proc.poll() is not None or time.monotonic() > deadline:
                print(log_path.read_text(), file=sys.stderr)
                return 1
            time.sleep(0.05)
    ids = [client.enqueue(repo=str(repo), text=text, paths=paths)["id"] for text, paths in JOBS]
    say(f"queued jobs {ids}; waiting for them to land...")
    while not client.wait(ids, 30)["done"]:
        pass
    jobs = client.jobs()
    proc.wait(timeout=60)
    events = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    if as_json:
        print(json.dumps({"repo": str(repo), "jobs": jobs, "events": events, "log": str(log_path)}, indent=2))
    else:
        _report(repo, jobs, events)
        say(f"the daemon's log: {log_path}")
    return 0 if all(j["state"] == "landed" for j in jobs) else 1


def _report(repo: Path, jobs: list[dict[str, Any]], events: list[dict[str, Any]]) -> None:
    from datetime import datetime

    from rich.console import Console
    from rich.table import Table

    console = Console()
    t0 = min(datetime.fromisoformat(j["created_at"]) for j in jobs)

    def rel(ts: str | None) -> str:
        return "-" if ts is None else f"{(datetime.fromisoformat(ts) - t0).total_seconds():5.1f}s"

    table = Table(title="jobs", box=None)
    for col in ("id", "claim", "started", "finished", "state", "landed"):
        table.add_column(col)
    for j in jobs:
        table.add_row(
            str(j["id"]),
            ", ".join(j["claim"]["paths"]) or "(none: runs alone)",
            rel(j["started_at"]),
            rel(j["finished_at"]),
            j["state"],
            (j["landed_sha"] or "")[:10],
        )
    console.print(table)
    decisions = Table(title="admission decisions (from the daemon's JSON log)", box=None)
    for col in ("job", "event", "reason", "message"):
        decisions.add_column(col, overflow="fold")
    for e in events:
        if e["event"].startswith("admission.") or e["event"] in ("job.overlap", "landing.landed"):
            decisions.add_row(
                str(e.get("job_id", "")),
                e["event"],
                str(e.get("reason", "")),
                str(e.get("message", e.get("sha", "")))[:100],
            )
    console.print(decisions)
    console.print(f"[bold]main now[/bold]:\n{_git(repo, 'log', '--oneline', '--graph', 'main')}")
    console.print(f"[bold]CHANGES.md[/bold] (union-merged by two jobs):\n{_git(repo, 'show', 'main:CHANGES.md')}")
