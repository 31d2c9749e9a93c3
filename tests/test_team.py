"""Team mode end to end: real daemons (each with its own home and clone) sharing one real PostgreSQL and one bare
remote on this machine."""

from __future__ import annotations

import itertools
import json
import os
import signal
from pathlib import Path

import pytest

from orchestrator.core.admission import decide
from orchestrator.core.models import Claim, ClaimSource, JobView, Outcome, Policy, Reason, Snapshot
from tests.conftest import bare_remote, git
from tests.harness import Daemon, until
from tests.teamkit import Node

pytestmark = pytest.mark.timeout(240)

LEASE = 3


def _claim(*paths: str) -> Claim:
    return Claim(frozenset(paths), 1.0, ClaimSource.DECLARED)


def test_other_nodes_jobs_hold_their_paths_but_take_no_slot():
    """Admission reads other nodes' active jobs as holding what they claim (Overlap) without taking a slot here."""
    theirs = JobView(1, "/r", "main", _claim("a.py"))
    snap = Snapshot(
        elsewhere=(theirs,),
        waiting=(JobView(2, "/r", "main", _claim("a.py")), JobView(3, "/r", "main", _claim("b.py"))),
        policy=Policy(max_concurrent=1, per_repo=1),
    )
    overlap, disjoint = decide(snap.waiting[0], snap), decide(snap.waiting[1], snap)
    assert overlap.reason is Reason.OVERLAP and overlap.blocking == (1,)
    assert disjoint.outcome is Outcome.ADMIT


# -- the team on this machine -------------------------------------------------------------------------------


@pytest.fixture
def team(tmp_path: Path, pg_url: str):
    """`team(n)`: a bare remote with one commit on main, and n daemons (nodes a, b, c) each with its own clone and
    home, sharing one fresh database. Every daemon is stopped at the end."""
    bare = bare_remote(tmp_path, {"README.md": "hi\n", "shared.txt": "start\n"})
    made: list[Daemon] = []

    def start(n: int, **env: str) -> tuple[Path, list[tuple[Daemon, Path]]]:
        nodes = []
        for name in "abc"[:n]:
            clone = tmp_path / f"clone-{name}"
            git(tmp_path, "clone", "-q", str(bare), clone.name)
            d = Node(tmp_path / f"home-{name}", {"MAX_CONCURRENT_JOBS": "2", **env})
            (d.home / "config").mkdir(parents=True)
            (d.home / "config" / "config.toml").write_text(
                f'[store]\nurl = "{pg_url}"\n\n[team]\nnode = "{name}"\nlease = {LEASE}\n\n[repos."{clone}"]\n'
            )
            made.append(d)
            nodes.append((d, clone))
        for d, _ in nodes:
            d.start(wait=False)
        for d, _ in nodes:
            d.wait_ready()
        return bare, nodes

    yield start
    for d in made:
        d.stop()


def _states(d: Daemon) -> dict[int, dict]:
    out = d.cli("status", "--json")
    assert out.returncode == 0, out.stderr
    return {j["id"]: j for j in json.loads(out.stdout)}


def _landed_once(bare: Path) -> list[int]:
    """The job ids whose commits are on the remote's main, one entry per commit (a job landed twice shows twice)."""
    out = git(bare, "log", "main", "--format=%(trailers:key=Orchestrator-Job,valueonly,separator=)")
    return sorted(int(line) for line in out.split() if line.strip())


def _intervals(d: Daemon, ids: list[int]) -> dict[int, list[tuple[float, float]]]:
    """Each job's active spans (admitted → the move out of running/landing), from the shared events."""
    spans: dict[int, list[tuple[float, float]]] = {}
    for i in ids:
        start = None
        for e in d.cli_json("show", str(i))["events"]:
            if e["kind"] == "admitted":
                start = e["at"]
            elif start is not None and e.get("state") not in (None, "running", "landing"):
                spans.setdefault(i, []).append((start, e["at"]))
                start = None
    return spans


def test_three_nodes_land_every_job_once_never_overlapping_through_a_postgresql_restart(team, postgres, tmp_path):
    """Three daemons, jobs queued from all three (overlapping and disjoint): each lands on the remote exactly once,
    no two overlapping jobs are ever active at once on any pair of nodes, PostgreSQL restarted mid-run loses and
    doubles nothing, `git fsck` is clean; `status` shows every node's jobs with the node that ran them; a cancel
    from one node stops the runner of a job running on another."""
    bare, nodes = team(3)
    pidfile = tmp_path / "long.pid"
    long = nodes[2][0].enqueue(nodes[2][1], f"echo $$ > {pidfile}; sleep 120", "--path", "long.txt")
    shared, disjoint = [], []
    for i in range(12):
        d, clone = nodes[i % 3]
        if i % 2 == 0:
            shared.append(d.enqueue(clone, f"sleep 0.3; echo {i} >> shared.txt", "--path", "shared.txt"))
        else:
            disjoint.append(d.enqueue(clone, f"sleep 0.3; echo {i} > f{i}.txt", "--path", f"f{i}.txt"))
        if i == 5:
            postgres.restart()
    every = sorted(shared + disjoint)
    a = nodes[0][0]
    until("every job landed", lambda: all(_states(a)[i]["state"] == "landed" for i in every), timeout=150)
    runner = int(until("the long job runs", lambda: pidfile.exists() and pidfile.read_text().strip()))
    holder = _states(a)[long]["node"]
    elsewhere = next(d for (d, _), name in zip(nodes, "abc", strict=True) if name != holder)
    assert elsewhere.cli("cancel", str(long)).returncode == 0
    until("the cancelled job's runner ended on its node", lambda: not _alive(runner), timeout=LEASE * 3)
    assert _states(a)[long]["state"] == "cancelled"
    assert _landed_once(bare) == every
    jobs = _states(a)
    assert {jobs[i]["node"] for i in every} <= {"a", "b", "c"} and len({jobs[i]["node"] for i in every}) >= 2
    spans = _intervals(a, shared)
    flat = sorted((s, e, i) for i, ss in spans.items() for s, e in ss)
    for (_s1, e1, i1), (s2, _e2, i2) in itertools.pairwise(flat):
        assert s2 >= e1, f"jobs {i1} and {i2} (both claim shared.txt) were active at once"
    # A push that lost the race inside the remote (another node moved the branch between the lease check and the
    # update) leaves its uploaded commit unreferenced there: dangling is expected, damage is not.
    assert git(bare, "fsck", "--no-progress", "--no-dangling", "--strict") == ""
    table = a.cli("status").stdout.splitlines()
    assert len(table) == len(every) + 1  # and the cancelled one first
    assert all(f"@{jobs[i]['node']}" in line for i, line in zip(every, table[1:], strict=True))


@pytest.mark.parametrize("what", ["daemon", "group"])
def test_a_killed_node_s_job_lands_once_on_another_node_and_it_rejoins(team, tmp_path, what):
    """kill -9 of a node mid-run (its daemon alone, or with its process group): after its lease ends another node
    takes its job over and lands it once; the restarted node ends the orphaned runner it left and rejoins."""
    bare, [(a, clone_a), (b, clone_b)] = team(2)
    gate, pidfile = tmp_path / "gate", tmp_path / "first.pid"
    script = f'if [ ! -e {gate} ]; then touch {gate}; echo $$ > {pidfile}; sleep 120; fi; echo done > out.txt'
    pinned = a.enqueue(clone_a, script, "--path", "out.txt")
    until("the first attempt runs", lambda: pidfile.exists() and pidfile.read_text().strip())
    runner = int(pidfile.read_text())
    owner = _states(a)[pinned]["node"]
    first, other = (a, b) if owner == "a" else (b, a)
    assert first.proc is not None
    if what == "group":
        os.killpg(first.proc.pid, signal.SIGKILL)
        first.proc.wait(timeout=30)
    else:
        first.kill(signal.SIGKILL)
    assert _alive(runner)  # the runner has a process group (and cgroup) of its own: it outlives the daemon
    until("taken over and landed", lambda: _states(other)[pinned]["state"] == "landed", timeout=LEASE * 6 + 30)
    job = _states(other)[pinned]
    assert job["node"] == ("b" if owner == "a" else "a") and _landed_once(bare) == [pinned]
    kinds = [e["kind"] for e in other.cli_json("show", str(pinned))["events"]]
    assert "requeued" in kinds and kinds.count("landed") == 1
    first.start()
    until("the orphaned runner ended", lambda: not _alive(runner), timeout=30)
    again = first.enqueue(clone_a if first is a else clone_b, "echo again > again.txt", "--path", "again.txt")
    until("the rejoined node's job landed", lambda: _states(other).get(again, {}).get("state") == "landed", timeout=60)
    assert _landed_once(bare) == sorted([pinned, again])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False
