"""The jobs benchmark: its ideal schedule, its replay repository and scripts, and one small real run."""

from __future__ import annotations

import json
import subprocess
import sys

from orchestrator.bench import history as hist
from orchestrator.bench import schedule as sched
from tests.conftest import git

MERGEABLE = ("CHANGES*",)


def test_ideal_schedule_never_overtakes_an_overlapping_earlier_job():
    """List scheduling: disjoint jobs fill the slots; a later job waits behind an earlier one it overlaps."""
    a, b = frozenset({"a.py"}), frozenset({"b.py"})
    assert sched.ideal_makespan([2, 2, 2], [a, b, frozenset({"c.py"})], slots=2) == 4
    # Job 2 (b) must not start before job 1 (a, then b) although a slot is free: job 1 waits on job 0.
    assert sched.ideal_makespan([3, 1, 1], [a, a | b, b], slots=4) == 5
    assert sched.ideal_makespan([1, 1, 1], [a, None, b], slots=4) == 3, "a job that runs alone runs alone"


def test_over_serialised_pairs_count_claims_that_overlap_where_real_files_do_not():
    """A directory claim keeps apart two jobs whose real files differ: one over-serialised pair."""
    real = [frozenset({"src/a.py"}), frozenset({"src/b.py"}), frozenset({"src/a.py"})]
    coarse = [frozenset({"src/"})] * 3
    assert sched.over_serialized_pairs(coarse, real) == 2
    assert sched.over_serialized_pairs(real, real) == 0
    assert sched.max_concurrency([sched.Interval(0, 2), sched.Interval(1, 3), sched.Interval(2, 4)]) == 2


def test_bundled_history_loads_and_predictors_shape_claims():
    """The packaged history reads without any file outside the package; predictors give files or top dirs."""
    changes = hist.from_file(hist.bundled())
    assert len(changes) > 400 and all(c.files for c in changes)
    c = hist.Change(0, "x", "s", ("src/flask/app.py", "CHANGES.rst"), 10)
    assert hist.predict(c, "oracle") == ["src/flask/app.py", "CHANGES.rst"]
    assert hist.predict(c, "declared") == ["CHANGES.rst", "src/"]


def test_replayed_changes_conflict_when_they_share_a_file_and_changelogs_union(tmp_path):
    """Two changes to one file made side by side conflict; their changelog lines merge by union."""
    changes = [hist.Change(0, "a", "", ("pkg/x.py", "CHANGES.rst"), 3), hist.Change(1, "b", "", ("pkg/x.py",), 3)]
    repo = hist.synthesise(changes, tmp_path / "repo", MERGEABLE)
    stamps = tmp_path / "stamps"
    stamps.mkdir()
    for c in changes:
        git(repo, "checkout", "-q", "-b", f"c{c.index}", "main")
        subprocess.run(["sh", "-c", hist.script(c, 0, MERGEABLE, stamps)], cwd=repo, check=True)
        git(repo, "commit", "-qam", f"change {c.index}")
    assert (repo / "pkg" / "x.py").read_text().startswith("change 1\n")
    assert (stamps / "0.start").exists() and (stamps / "1.exit").exists()
    git(repo, "checkout", "-q", "c0")
    merge = subprocess.run(["git", "merge", "-q", "c1"], cwd=repo, capture_output=True, text=True)
    assert merge.returncode != 0 and "pkg/x.py" in merge.stdout + merge.stderr


def test_bench_jobs_replays_through_the_real_daemon(tmp_path):
    """A tiny run lands every change under `oracle`, loses none, and reports the documented JSON keys."""
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator", "bench", "jobs", "--last", "4", "--scale", "0.05",
         "--policy", "oracle", "--json"],
        capture_output=True, text=True, timeout=110,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    (row,) = data["rows"]
    keys = "policy predictor slots jobs makespan_s max_concurrency wait_p50_s wait_p95_s overlaps conflicts redone lost"
    assert set(keys.split()) | {"over_serialized_pairs"} <= set(row)
    assert (row["policy"], row["jobs"], row["lost"]) == ("oracle", 4, 0)
    assert row["makespan_s"] >= row["ideal_s"] > 0
    assert data["machine"]["cores"] >= 1
