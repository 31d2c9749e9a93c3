"""`orchestrator bench load`: what a long queue costs, through the real daemon, as ratios taken in one run.

- `throughput`: N trivial disjoint jobs on one repository (K slots): end-to-end jobs/s beside a plain
  serial `git commit` loop making the same changes in a clone of the same repository, the events stored
  per job, and `status --json` latency sampled while the queue drains (the API call, and the CLI as a
  person runs it).
- `latency`: M jobs waiting behind one running job (one slot): from that job's landing to the next
  admission, over a few landings.
"""

from __future__ import annotations

import itertools
import json
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import click

from orchestrator.lab.bench import schedule as sched
from orchestrator.lab.bench.daemon import BenchDaemon, BenchError, machine
from orchestrator.lab.bench.history import git


def _repo(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "README.md").write_text("bench\n")
    git(path, "init", "-q", "-b", "main")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "base")
    return path


def _config(slots: int) -> str:
    return f"[jobs]\nmax_concurrent = {slots}\nper_repo = {slots}\nwarm_worktrees = {slots}\n"


def serialgit(repo: Path, n: int) -> float:
    """Jobs/s of a plain serial loop: write the file, `git add`, `git commit` (the same changes as the jobs)."""
    t = time.perf_counter()
    for i in range(n):
        (repo / f"f{i}.txt").write_text(f"{i}\n")
        git(repo, "add", f"f{i}.txt")
        git(repo, "commit", "-q", "-m", f"change {i}")
    return n / (time.perf_counter() - t)


class _Sampler(threading.Thread):
    """Times `status --json` (API and CLI) while the queue drains."""

    def __init__(self, d: BenchDaemon, every: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.d, self.every = d, every
        self.api: list[float] = []
        self.cli: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.every):
            t = time.perf_counter()
            self.d.client.jobs()
            self.api.append(time.perf_counter() - t)
            t = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "orchestrator", "status", "--json"],
                env=self.d.env, capture_output=True, timeout=120, check=False,
            )  # fmt: skip
            self.cli.append(time.perf_counter() - t)


def _events_per_job(home: Path) -> tuple[float, int]:
    db = sqlite3.connect(home / "state" / "orchestrator.db")
    try:
        jobs = db.execute("SELECT count(*) FROM jobs").fetchone()[0]
        events = db.execute("SELECT count(*) FROM job_events").fetchone()[0]
        worst = db.execute("SELECT max(c) FROM (SELECT count(*) c FROM job_events GROUP BY job_id)").fetchone()[0]
    finally:
        db.close()
    return events / max(jobs, 1), int(worst or 0)


def throughput(work: Path, n: int, slots: int) -> dict[str, Any]:
    repo = _repo(work / "repo")
    shutil.copytree(repo, work / "serial", symlinks=True)
    git_rate = serialgit(work / "serial", n)
    with BenchDaemon(work / "home", _config(slots)) as d:
        sampler = _Sampler(d)
        t = time.perf_counter()
        ids = [
            d.client.enqueue(repo=str(repo), text=f"echo {i} > f{i}.txt", paths=[f"f{i}.txt"])["id"] for i in range(n)
        ]
        sampler.start()
        result = d.client.wait(ids, timeout=3600)
        elapsed = time.perf_counter() - t
        sampler.stop.set()
        sampler.join(timeout=120)
        states = [j["state"] for j in result["jobs"]]
    per_job, worst = _events_per_job(work / "home")
    rate = n / elapsed
    return {
        "bench": "throughput",
        "jobs": n,
        "slots": slots,
        "landed": states.count("landed"),
        "jobs_per_s": round(rate, 2),
        "git_commits_per_s": round(git_rate, 2),
        "ratio_to_git": round(rate / git_rate, 3),
        "events_per_job": round(per_job, 2),
        "events_max_job": worst,
        "status_api_p50_s": sched.fig(sched.pct(sampler.api, 0.5), 3),
        "status_api_p99_s": sched.fig(sched.pct(sampler.api, 0.99), 3),
        "status_cli_p50_s": sched.fig(sched.pct(sampler.cli, 0.5), 3),
        "status_cli_p99_s": sched.fig(sched.pct(sampler.cli, 0.99), 3),
        "status_samples": len(sampler.api),
    }


def latency(work: Path, waiting: int, landings: int) -> dict[str, Any]:
    repo = _repo(work / "repo")
    # The first job waits for this file. Inside the repository's git dir: a job's sandbox shows the repository to it
    # (read-only) wherever it is, while /tmp, where the bench works, is empty there.
    gate = repo / ".git" / "orchestrator-bench-gate"
    with BenchDaemon(work / "home", _config(1)) as d:
        first = d.client.enqueue(
            repo=str(repo),
            text=f"n=0; while [ ! -e {gate} ] && [ $n -lt 36000 ]; do sleep 0.05; n=$((n+1)); done; echo 0 > f0.txt",
            paths=["f0.txt"],
        )["id"]
        ids = [first] + [
            d.client.enqueue(repo=str(repo), text=f"echo {i} > f{i}.txt", paths=[f"f{i}.txt"])["id"]
            for i in range(1, waiting + 1)
        ]
        deadline = time.monotonic() + 1800
        while len(d.client.jobs("planned")) < waiting and time.monotonic() < deadline:
            time.sleep(1.0)
        time.sleep(2.0)  # let the rounds settle on the full queue
        gate.touch()
        d.client.wait(ids[: landings + 1], timeout=600)
        jobs = [d.client.job(i) for i in ids[: landings + 1]]
    stuck = [j for j in jobs if j["state"] != "landed"]
    if stuck:
        j = stuck[0]
        why = j.get("reason") or "no reason given"
        raise BenchError(f"job {j['id']} did not land ({j['state']}: {why}): there is no landing to time")
    gaps = []
    for before, after in itertools.pairwise(jobs):
        landed = next((e["at"] for e in before["events"] if e["kind"] == "landed"), None)
        admitted = next((e["at"] for e in after["events"] if e["kind"] == "admitted"), None)
        if landed is not None and admitted is not None:
            gaps.append(admitted - landed)
    return {
        "bench": "latency",
        "waiting": waiting,
        "landings": len(gaps),
        "landing_to_admission_p50_s": sched.fig(sched.pct(gaps, 0.5), 3),
        "landing_to_admission_max_s": sched.fig(sched.most(gaps), 3),
    }


@click.command("load")
@click.option("--jobs", "n", type=int, default=1000, show_default=True, help="Trivial disjoint jobs (throughput).")
@click.option("--slots", type=int, default=4, show_default=True)
@click.option("--waiting", type=int, default=5000, show_default=True, help="Jobs queued behind one (latency).")
@click.option("--landings", type=int, default=5, show_default=True, help="Landings timed (latency).")
@click.option("--only", type=click.Choice(["throughput", "latency"]), help="Run one of the two.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON on stdout.")
def main(n: int, slots: int, waiting: int, landings: int, only: str | None, as_json: bool) -> None:
    """What a long queue costs: throughput against a serial git loop, events per job, status and admission latency."""
    if min(n, slots, waiting, landings) < 1:
        raise click.UsageError("--jobs, --slots, --waiting and --landings must be 1 or more")
    rows = []
    work = Path(tempfile.mkdtemp(prefix="orchestrator-load-"))
    try:
        if only in (None, "throughput"):
            click.echo(f"throughput: {n} trivial disjoint jobs, {slots} slots ...", err=True)
            rows.append(throughput(work / "throughput", n, slots))
        if only in (None, "latency"):
            click.echo(f"latency: {waiting} jobs behind one running job ...", err=True)
            rows.append(latency(work / "latency", waiting, landings))
    except BenchError as e:
        click.echo(f"orchestrator bench load: {e}", err=True)
        sys.exit(1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    m = machine()
    if as_json:
        click.echo(json.dumps({"machine": m, "rows": rows}, indent=2))
        return
    for line in report(m, rows):
        click.echo(line)


def report(m: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """The figures, one a line; one no sample gave (None) is "-"."""
    out = [f"load bench: {m['cores']} cores, {m['ram_mb']} MB RAM, Python {m['python']}, load {m['load_1m']}"]
    for row in rows:
        out.append(f"  {row['bench']}:")
        out += [f"    {k:<30} {'-' if v is None else v}" for k, v in row.items() if k != "bench"]
    return out
