"""`orchestrator bench team`: a team of daemons on this machine against one daemon with as many slots.

Everything is real: a throwaway PostgreSQL (`lab.localpg`, Debian's `postgresql` package), a bare remote, one
clone and one home per node, daemons driven over their sockets (stopped once every job landed). Two
measurements, side by side in one run so the machine's load weighs on both alike:

1. The same queue (`--jobs`, a third of them appending to one of four shared files, the rest each writing a file
   of its own; every job sleeps `--sleep` s) through 3 nodes × 2 slots and through 1 node × 6 slots: makespan
   (first enqueue → last landing), admission wait p50/p99 (planned → admitted: capacity and overlap included),
   landing latency p50/p99 (finished → landed on the remote). Each run checks every job landed exactly once
   (one commit per job on the remote's main), that no two jobs claiming one file were ever active at once on
   any nodes (from the shared events), and `git fsck`.
2. Admission latency with 1, 2 and 3 nodes (`--probe` disjoint jobs that do nothing, queued one every
   `--gap` s so a slot is always free: planned → admitted is the cost of admitting, not waiting), `--repeat`
   rounds interleaved, medians reported.
3. `--measure files`: two nodes (2 slots each, `--lease` s); node n0 runs one job writing `--files` files (the
   `bench files` writer; it fails on purpose, so the figures are the watch's and the lease's, not a commit of a
   million files) while small jobs are queued one after another from both nodes and n0's API (`status`, `show`)
   is sampled every `--every` s; a watcher reads every node's lease margin (`lease_until` less the server's
   clock) twice a second. Reported: the API's p50/p99/max on n0, each node's least lease margin (negative: its
   lease ended), the jobs taken over (0: no lease lost), whether every small job landed once.
`--measure` picks which run (repeatable; default: 1 and 2).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import click

from orchestrator.core.seal import SECRET_ENV
from orchestrator.lab.bench import schedule as sched
from orchestrator.lab.bench.daemon import BenchDaemon, BenchError, epoch, machine
from orchestrator.lab.bench.files import WRITER, _Sampler
from orchestrator.lab.bench.report.team import print_report
from orchestrator.lab.localpg import INSTALL_HINT, LocalPostgres, LocalPostgresError, find_bindir


class Node(BenchDaemon):
    """A bench daemon that serves until stopped (not burst mode: a node idle a moment may get work from the team)."""

    ARGS = ()
    READY = 60.0


def _git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def _remote(root: Path) -> Path:
    seed = root / "seed"
    seed.mkdir(parents=True)
    _git(seed, "init", "-q", "-b", "main")
    for i in range(4):
        (seed / f"shared{i}.txt").write_text("start\n")
    _git(seed, "add", "-A")
    _git(seed, "-c", "user.name=bench", "-c", "user.email=bench@example.com", "commit", "-q", "-m", "initial")
    bare = root / "remote.git"
    _git(root, "clone", "-q", "--bare", str(seed), str(bare))
    return bare


def _config(
    url: str, node: str, slots: int, clone: Path, *, lease: float = 10, labels: Iterable[str] = (), timeout: float = 0
) -> str:
    jobs = f'max_concurrent = {slots}\nper_repo = {slots}\nsandbox = "none"\n'
    jobs += f"timeout = {timeout}\n" if timeout else ""
    return (
        f'[jobs]\n{jobs}\n[store]\nurl = "{url}"\n\n'
        f'[team]\nnode = "{node}"\nlease = {lease}\nlabels = {json.dumps(list(labels))}\n\n[repos."{clone}"]\n'
    )


_ENDS = ("landed", "requeued", "failed", "conflicted", "cancelled", "interrupted", "check_failed")


def _overlapping(events: dict[int, dict[str, list[float]]], path_of: dict[int, str]) -> int:
    """Pairs of jobs claiming one path that were active (admitted → out of running and landing) at once, on any
    nodes: the shared events' times, one clock (every node is on this machine)."""
    spans: dict[str, list[tuple[float, float, int]]] = {}
    for job, kinds in events.items():
        ends = sorted(t for k in _ENDS for t in kinds.get(k, ()))
        for start in kinds.get("admitted", ()):
            end = next((t for t in ends if t >= start), float("inf"))
            spans.setdefault(path_of.get(job, ""), []).append((start, end, job))
    bad = 0
    for runs in spans.values():
        reach, holder = float("-inf"), None  # the latest end so far among earlier starts, and whose
        for start, end, job in sorted(runs):
            if start < reach and job != holder:
                bad += 1
            if end > reach:
                reach, holder = end, job
    return bad


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))], 3)


def _events(pg: LocalPostgres, db: str) -> dict[int, dict[str, list[float]]]:
    out = pg.psql("SELECT job_id, kind, at FROM job_events ORDER BY id", database=db)
    by_job: dict[int, dict[str, list[float]]] = {}
    for line in out.splitlines():
        job, kind, at = line.split("|")
        by_job.setdefault(int(job), {}).setdefault(kind, []).append(float(at))
    return by_job


def _spans(events: dict[int, dict[str, list[float]]], start: str, end: str) -> list[float]:
    """For each job, from its last `start` before its last `end` to that `end`."""
    out = []
    for kinds in events.values():
        if end in kinds and start in kinds:
            stop = kinds[end][-1]
            begun = [t for t in kinds[start] if t <= stop]
            if begun:
                out.append(stop - begun[-1])
    return out


def run_team(
    pg: LocalPostgres, root: Path, name: str, nodes: int, slots: int, jobs: Iterable[tuple[str, str]], *,
    gap: float = 0.0, timeout: float = 600.0,
) -> dict[str, Any]:  # fmt: skip
    """Queue `jobs` (text, path) round-robin from `nodes` daemons of `slots` slots each; figures once all land."""
    work = root / name
    bare = _remote(work)
    url = pg.create_database(name)
    jobs = list(jobs)
    with ExitStack() as stack:
        daemons = []
        for n in range(nodes):
            clone = work / f"clone{n}"
            _git(work, "clone", "-q", str(bare), clone.name)
            env = {"ORCHESTRATOR_SANDBOX": "none", SECRET_ENV: SECRET, **pg.env()}
            d = Node(work / f"home{n}", _config(url, f"n{n}", slots, clone), env)
            daemons.append((stack.enter_context(d), clone))
        started = time.time()
        path_of: dict[int, str] = {}
        for i, (text, path) in enumerate(jobs):
            d, clone = daemons[i % nodes]
            path_of[int(d.client.enqueue(repo=str(clone), text=text, paths=[path])["id"])] = path
            if gap:
                time.sleep(gap)
        deadline = time.monotonic() + timeout
        while int(pg.psql("SELECT count(*) FROM jobs WHERE state = 'landed'", database=name)) < len(jobs):
            if time.monotonic() > deadline or any(d.proc is None or d.proc.poll() is not None for d, _ in daemons):
                raise BenchError(f"{name}: the queue did not drain in {timeout:.0f} s (see {work}/home*/daemon.log)")
            time.sleep(0.2)
    events = _events(pg, name)
    landed = [kinds["landed"][-1] for kinds in events.values() if "landed" in kinds]
    trailers = _git(bare, "log", "main", "--format=%(trailers:key=Orchestrator-Job,valueonly,separator=)").split()
    admit = _spans(events, "planned", "admitted")
    land = _spans(events, "finished", "landed")
    return {
        "nodes": nodes,
        "slots": slots,
        "jobs": len(jobs),
        "landed": len(landed),
        "landed_once": sorted(map(int, trailers)) == sorted(events) and len(landed) == len(jobs),
        "fsck_clean": subprocess.run(["git", "fsck", "--no-progress"], cwd=bare, capture_output=True).returncode == 0,
        "makespan_s": round(max(landed) - started, 3) if landed else None,
        "admission_p50_s": _pct(admit, 0.5),
        "admission_p99_s": _pct(admit, 0.99),
        "landing_p50_s": _pct(land, 0.5),
        "landing_p99_s": _pct(land, 0.99),
        "overlapping_at_once": _overlapping(events, path_of),
        "requeued": sum(len(k.get("requeued", ())) for k in events.values()),
    }


def _medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median over repeated runs of each figure, and whether every run landed every job once."""
    out: dict[str, Any] = {"runs": len(runs), "landed_once": all(r["landed_once"] for r in runs)}
    for key in ("admission_p50_s", "admission_p99_s", "landing_p50_s", "landing_p99_s"):
        values = [r[key] for r in runs if r[key] is not None]
        out[key] = round(statistics.median(values), 3) if values else None
    return out


def queue(n: int, sleep: float) -> list[tuple[str, str]]:
    """A third overlapping (appending to one of four shared files), the rest disjoint."""
    out = []
    for i in range(n):
        if i % 3 == 0:
            out.append((f"sleep {sleep}; echo {i} >> shared{i % 4}.txt", f"shared{i % 4}.txt"))
        else:
            out.append((f"sleep {sleep}; echo {i} > f{i}.txt", f"f{i}.txt"))
    return out


SECRET = secrets.token_hex(32)
"""The team's secret of this run's nodes (`core.seal`)."""
MEASURES = ("queue", "admission", "files")
"""What `bench team` can run: the shared queue (1), admission latency by nodes (2), a job of many files (3)."""
BIG_LABEL = "big"
"""Only node n0 has it: the big job runs there."""


def _lease_margins(pg: LocalPostgres, db: str, stop: threading.Event, every: float = 0.5) -> dict[str, float]:
    """Each node's least lease margin (seconds its lease had left) while `stop` is not set."""
    least: dict[str, float] = {}
    sql = "SELECT name, lease_until - extract(epoch from clock_timestamp()) FROM nodes"
    while not stop.wait(every):
        with contextlib.suppress(LocalPostgresError):  # a slow psql under load: the next read counts
            for line in pg.psql(sql, database=db).splitlines():
                name, margin = line.split("|")
                least[name] = min(least.get(name, float("inf")), float(margin))
    return least


def run_files(
    pg: LocalPostgres, root: Path, *, files: int, every: float, lease: float, timeout: float = 7200.0
) -> dict[str, Any]:
    """Measurement 3 (see the module docstring): one node's job writes `files` files beside the team's other work;
    the API's latency on that node, the least lease margin of each node, the jobs taken over."""
    work = root / "files"
    bare = _remote(work)
    db = "files"
    url = pg.create_database(db)
    writer = work / "writer.py"
    writer.write_text(WRITER)
    with ExitStack() as stack:
        daemons = []
        for n in range(2):
            clone = work / f"clone{n}"
            _git(work, "clone", "-q", str(bare), clone.name)
            labels = [BIG_LABEL] if n == 0 else []
            text = _config(url, f"n{n}", 2, clone, lease=lease, labels=labels, timeout=timeout)
            env = {"ORCHESTRATOR_SANDBOX": "none", SECRET_ENV: SECRET, **pg.env()}
            daemons.append((stack.enter_context(Node(work / f"home{n}", text, env)), clone))
        big_node, big_clone = daemons[0]
        stop = threading.Event()
        margins: dict[str, float] = {}
        watcher = threading.Thread(target=lambda: margins.update(_lease_margins(pg, db, stop)), daemon=True)
        watcher.start()
        show: list[int] = []
        sampler = _Sampler(big_node, every, show)
        text = f"mkdir gen && python3 {writer} {files} && exit 3"
        big = big_node.client.enqueue(repo=str(big_clone), text=text, paths=["gen/"], labels=[BIG_LABEL])
        show.append(int(big["id"]))
        sampler.start()
        started = time.perf_counter()
        small: list[tuple[int, float]] = []
        i = 0
        try:
            while big_node.client.job(int(big["id"]))["state"] in ("queued", "planning", "planned", "running"):
                d, clone = daemons[i % 2]
                job = d.client.enqueue(repo=str(clone), text=f"echo {i} > s{i}.txt", paths=[f"s{i}.txt"])
                if i == 0:
                    show.append(int(job["id"]))
                done = d.client.wait([job["id"]], timeout=600)["jobs"][0]
                small.append((int(job["id"]), epoch(done["finished_at"]) - epoch(done["created_at"])))
                i += 1
                if time.perf_counter() - started > timeout:
                    raise BenchError(f"the big job did not end in {timeout:.0f} s (see {work}/home0/daemon.log)")
            big_s = time.perf_counter() - started
        finally:
            stop.set()
            sampler.stop.set()
            sampler.join(timeout=120)
            watcher.join(timeout=30)
        big_row = big_node.client.job(int(big["id"]))
    taken = pg.psql(
        "SELECT count(*) FROM job_events WHERE kind IN ('requeued', 'interrupted') AND data LIKE '%taken over%'",
        database=db,
    )
    landed = subprocess.run(
        ["git", "log", "main", "--format=%(trailers:key=Orchestrator-Job,valueonly,separator=)"], cwd=bare,
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    calls = sampler.status + sampler.shown
    return {
        "files": files,
        "lease_s": lease,
        "big_job_s": round(big_s, 1),
        "big_job_state": big_row["state"],
        "big_job_actual": len(big_row.get("actual") or []),
        "api_calls": len(calls),
        "api_p50_s": sched.fig(sched.pct(calls, 0.5), 4),
        "api_p99_s": sched.fig(sched.pct(calls, 0.99), 4),
        "api_max_s": sched.fig(sched.most(calls), 4),
        "api_unanswered": len(sampler.failed),
        "small_jobs": len(small),
        "small_landed_once": sorted(map(int, landed)) == sorted(j for j, _ in small),
        "small_job_mean_s": round(sum(s for _, s in small) / len(small), 3) if small else None,
        "lease_margin_min_s": {name: round(m, 2) for name, m in sorted(margins.items())},
        "taken_over": int(taken.strip() or 0),
    }


@click.command()
@click.option("--jobs", "n_jobs", type=int, default=60, show_default=True, help="Jobs in the shared queue.")
@click.option("--sleep", type=float, default=0.5, show_default=True, help="Seconds each job works.")
@click.option("--probe", type=int, default=15, show_default=True, help="Jobs per admission-latency run.")
@click.option("--gap", type=float, default=0.3, show_default=True, help="Seconds between probe enqueues.")
@click.option("--repeat", type=int, default=3, show_default=True, help="Probe rounds (1, 2, 3 nodes, interleaved).")
@click.option("--out", type=click.Path(path_type=Path), help="Also write the figures here (JSON).")
@click.option("--keep", is_flag=True, help="Keep the temp dir (homes, logs, remotes).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (default: tables).")
@click.option(
    "--measure", type=click.Choice(MEASURES), multiple=True, help="What to run (repeatable; default: queue, admission)."
)
@click.option("--files", type=int, default=1_000_000, show_default=True, help="--measure files: files the job writes.")
@click.option("--every", type=float, default=0.1, show_default=True, help="--measure files: API samples' gap (s).")
@click.option("--lease", type=float, default=15.0, show_default=True, help="--measure files: the nodes' lease (s).")
def main(
    n_jobs: int, sleep: float, probe: int, gap: float, repeat: int, out: Path | None, keep: bool, as_json: bool,
    measure: tuple[str, ...], files: int, every: float, lease: float,
) -> None:  # fmt: skip
    """3 nodes × 2 slots vs 1 node × 6 slots on one queue; admission latency with 1, 2 and 3 nodes; with --measure
    files, a node's job writing a million files beside the team's other work (the API's p99, the leases)."""
    if find_bindir() is None:
        raise click.ClickException(f"bench team needs PostgreSQL's server programs: {INSTALL_HINT}")
    measure = measure or ("queue", "admission")
    root = Path(tempfile.mkdtemp(prefix="orch-bench-team-"))
    pg = LocalPostgres(port=55440).start()  # a temp dir of its own (the server may run as another user)
    try:
        report: dict[str, Any] = {"machine": machine()}
        if "queue" in measure:
            jobs = queue(n_jobs, sleep)
            report["team_3x2"] = run_team(pg, root, "team3x2", 3, 2, jobs)
            report["single_1x6"] = run_team(pg, root, "single1x6", 1, 6, jobs)
            t, s = report["team_3x2"], report["single_1x6"]
            report["makespan_ratio_team_over_single"] = round(t["makespan_s"] / s["makespan_s"], 3)
        if "admission" in measure:
            probes = [(f"echo {i} > p{i}.txt", f"p{i}.txt") for i in range(probe)]
            runs: dict[int, list[dict[str, Any]]] = {1: [], 2: [], 3: []}
            for r in range(repeat):  # interleaved, so a change in the machine's load weighs on every count of nodes
                for n in runs:
                    runs[n].append(run_team(pg, root, f"probe{n}r{r}", n, 2, probes, gap=gap))
            report["admission_by_nodes"] = {str(n): _medians(rs) for n, rs in runs.items()}
            one = report["admission_by_nodes"]["1"]["admission_p50_s"] or 0
            for key in ("2", "3"):
                mine = report["admission_by_nodes"][key]["admission_p50_s"]
                report["admission_by_nodes"][key]["p50_over_1_node"] = round(mine / one, 3) if one and mine else None
        if "files" in measure:
            report["many_files"] = run_files(pg, root, files=files, every=every, lease=lease)
        report["load_1m_after"] = round(os.getloadavg()[0], 2)
    finally:
        pg.remove()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    text = json.dumps(report, indent=2)
    if as_json:
        click.echo(text)
    else:
        print_report(report)
    if out:
        out.write_text(text + "\n")
    if keep:
        click.echo(f"kept: {root}", err=True)
    bad: list[str] = [
        k for k in ("team_3x2", "single_1x6") if k in report
        and (not (report[k]["landed_once"] and report[k]["fsck_clean"]) or report[k]["overlapping_at_once"])
    ]  # fmt: skip
    many = report.get("many_files")
    if many is not None and (many["taken_over"] or not many["small_landed_once"]):
        bad.append("many_files")
    if bad:
        raise click.ClickException(
            f"{', '.join(bad)}: a job did not land exactly once, overlapping jobs ran at once, git fsck failed, or a "
            "node lost a job to another (its lease ended)"
        )
