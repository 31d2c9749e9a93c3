"""End to end for the job plane: real daemon, real CLI, real repositories, `shell` jobs.

Jobs coordinate through marker files outside the repository so the tests can pin overlap in time
without sleeping on guesses. Every wait loop is bounded.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from tests import harness
from tests.conftest import FOUR_SLOTS, git


def until(cond, timeout: float = 30.0, what: str = "condition") -> None:
    harness.until(what, cond, timeout)


def wait_for_file(path: Path, limit: int = 400) -> str:
    """A shell fragment that waits (bounded, ~20 s) for `path` to exist."""
    return f"n=0; while [ ! -e {path} ] && [ $n -lt {limit} ]; do sleep 0.05; n=$((n+1)); done"


def ts(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


def test_disjoint_jobs_run_at_the_same_time_and_both_land(make_repo, daemon_factory, tmp_path):
    """Two jobs with disjoint claims are admitted together, overlap in time, and both land (end to end: a daemon
    process, the CLI as processes)."""
    repo, d = make_repo(), daemon_factory(env=FOUR_SLOTS, process=True).start()
    a_up, b_up = tmp_path / "a.up", tmp_path / "b.up"
    a = d.enqueue(
        repo, f"touch {a_up}; {wait_for_file(b_up)}; [ -e {b_up} ] && echo a > src/a.py", "--path", "src/a.py"
    )
    b = d.enqueue(repo, f"touch {b_up}; {wait_for_file(a_up)}; [ -e {a_up} ] && echo b > docs/x.md", "--path", "docs/")
    assert d.cli("wait", str(a), str(b), "--timeout", "60").returncode == 0
    ja, jb = d.cli_json("show", str(a)), d.cli_json("show", str(b))
    assert ja["state"] == jb["state"] == "landed"
    assert ts(ja["started_at"]) < ts(jb["finished_at"]) and ts(jb["started_at"]) < ts(ja["finished_at"])
    assert git(repo, "show", "main:src/a.py") == "a" and git(repo, "show", "main:docs/x.md") == "b"


def test_overlapping_jobs_never_overlap_in_time_and_land_in_order(started, tmp_path):
    """A job whose claim meets an active job's waits (Overlap), then runs and lands after it."""
    repo, d = started
    go = tmp_path / "a.go"  # a runs until the test has seen b wait: no race with a loaded machine
    a = d.enqueue(repo, f"{wait_for_file(go)}; echo first > src/a.py", "--path", "src/a.py")
    b = d.enqueue(repo, "echo second >> src/a.py", "--path", "src/")
    until(lambda: d.cli_json("show", str(a))["state"] == "running", what="a running")
    until(lambda: (d.cli_json("why", str(b))["decision"] or {}).get("reason") == "Overlap", what="b deferred")
    why = d.cli_json("why", str(b))
    go.touch()
    assert a in why["decision"]["blocking"]
    assert d.cli("wait", str(a), str(b), "--timeout", "60").returncode == 0
    ja, jb = d.cli_json("show", str(a)), d.cli_json("show", str(b))
    assert ts(jb["started_at"]) >= ts(ja["finished_at"]), "b never ran while a held src/a.py"
    assert git(repo, "merge-base", "--is-ancestor", ja["landed_sha"], jb["landed_sha"]) == ""
    assert git(repo, "show", "main:src/a.py").splitlines() == ["first", "second"]
    deferred = [e for e in d.events() if e["event"] == "admission.deferred" and e["job_id"] == b]
    assert (
        deferred
        and deferred[0]["blocking"] == [a]
        and "src/" in " ".join(deferred[0]["paths"]) + deferred[0]["message"]
    )


def test_a_job_with_no_claim_runs_alone(started):
    """An unclaimed job waits for the repo to empty, runs alone, and later jobs wait for it."""
    repo, d = started
    gate = repo.parent / "gate-alone"
    a = d.enqueue(repo, f"{wait_for_file(gate)}; echo a > src/a.py", "--path", "src/a.py")
    alone = d.enqueue(repo, "sleep 0.5; echo alone > alone.txt")
    c = d.enqueue(repo, "echo c > docs/x.md", "--path", "docs/x.md")
    # Planning runs off the loop: hold job a until the lone job has been planned and told to wait.
    until(
        lambda: any(e["event"] == "admission.deferred" and e["job_id"] == alone for e in d.events()),
        what="the lone job deferred",
    )
    gate.touch()
    assert d.cli("wait", str(a), str(alone), str(c), "--timeout", "60").returncode == 0
    jobs = {j["id"]: j for j in d.cli_json("status")}
    assert all(j["state"] == "landed" for j in jobs.values())
    start, end = ts(jobs[alone]["started_at"]), ts(jobs[alone]["finished_at"])
    for other in (a, c):
        o = jobs[other]
        assert ts(o["finished_at"]) <= start or ts(o["started_at"]) >= end, f"job {other} ran beside the lone job"
    reasons = {e["reason"] for e in d.events() if e["event"] == "admission.deferred" and e["job_id"] == alone}
    assert "Ambiguous" in reasons


def test_touching_an_unclaimed_path_raises_overlap_within_a_second(started, tmp_path):
    """A job that writes a path another active job claims is flagged as job.overlap within 1 s of the write."""
    repo, d = started
    gate, wrote = tmp_path / "gate", tmp_path / "wrote"
    holder = d.enqueue(repo, f"{wait_for_file(gate)}; echo held > src/a.py", "--path", "src/a.py")
    until(lambda: d.cli_json("show", str(holder))["state"] == "running", what="holder running")
    escaper = d.enqueue(
        repo, f"sleep 0.3; echo sneaky > src/a.py; date +%s.%N > {wrote}; {wait_for_file(gate)}", "--path", "src/b.py"
    )
    until(lambda: wrote.exists() and wrote.read_text().strip(), what="the escaping write")  # the shell creates it first
    written = float(wrote.read_text())

    def overlap_seen() -> bool:
        return any(e["event"] == "job.overlap" and e["job_id"] == escaper for e in d.events())

    until(overlap_seen, timeout=10, what="job.overlap")
    ev = next(e for e in d.events() if e["event"] == "job.overlap" and e["job_id"] == escaper)
    assert ev["other"] == holder and ev["paths"] == ["src/a.py"]
    assert ts(ev["timestamp"]) - written < 1.0, "flagged within 1 s of the write"
    # The overlap is logged, then the order written: the later job lands after the holder.
    until(lambda: holder in d.cli_json("show", str(escaper))["land_after"], what="the later job lands after the holder")
    assert not any(e["event"] == "job.overlap_checked" for e in d.events()), "the holder has written nothing yet"
    gate.touch()
    assert d.cli("wait", str(holder), str(escaper), "--timeout", "90").returncode in (0, 1)
    states = {d.cli_json("show", str(i))["state"] for i in (holder, escaper)}
    assert d.cli_json("show", str(holder))["state"] == "landed"
    assert states <= {"landed", "conflicted"}


def test_a_real_conflict_stops_the_later_job_at_once_and_it_lands_after_the_earlier(started, tmp_path):
    """Two running jobs write one line differently: within 5 s of the later job's write it is stopped (its processes
    end, one `job.stopped` event names the earlier job), the earlier runs on and lands with all its work, and the
    later runs again behind it, on a base that has its change, and lands; its stopped attempt is kept on a branch."""
    repo, d = started
    a_wrote, b_wrote, once, release = (tmp_path / n for n in ("a.wrote", "b.wrote", "b.once", "release"))
    earlier = d.enqueue(
        repo,
        f"echo 'a = \"A\"' > src/a.py; echo notes > docs/a-notes.md; touch {a_wrote}; {wait_for_file(release, 1200)}",
        "--path", "src/a.py", "--path", "docs/a-notes.md",
    )  # fmt: skip
    later = d.enqueue(
        repo,
        f"{wait_for_file(a_wrote)}; if [ -e {once} ]; then echo 'a = \"B\"' > src/a.py; exit 0; fi; touch {once}; "
        f"echo 'a = \"B\"' > src/a.py; date +%s.%N > {b_wrote}; sleep 120",
        "--path", "src/b.py",
    )  # fmt: skip

    def requeued() -> dict | None:
        shown = d.cli_json("show", str(later))
        return next((e for e in shown["events"] if e["kind"] == "requeued"), None)

    until(lambda: requeued() is not None, timeout=30, what="the later job stopped")
    event, written = requeued(), float(b_wrote.read_text())
    assert event["at"] - written <= 5.0, f"stopped {event['at'] - written:.1f} s after the write"
    assert event["code"] == "Conflict" and event["behind"] == [earlier] and event["conflicts"] == ["src/a.py"]
    stopped = [e for e in d.events() if e["event"] == "job.stopped"]
    assert [(e["job_id"], e["blocking"], e["stopped"]) for e in stopped] == [(later, [earlier], True)]
    assert d.cli_json("show", str(earlier))["state"] == "running", "the earlier job runs on"
    release.touch()
    assert d.cli("wait", str(earlier), str(later), "--timeout", "90").returncode == 0
    ja, jb = d.cli_json("show", str(earlier)), d.cli_json("show", str(later))
    assert ja["state"] == jb["state"] == "landed" and jb["attempts"] == 1
    assert ts(jb["started_at"]) >= ts(ja["finished_at"]), "the later job ran again after the earlier landed"
    assert git(repo, "merge-base", "--is-ancestor", ja["landed_sha"], "main") == ""
    assert git(repo, "show", f"{ja['landed_sha']}:src/a.py") == 'a = "A"', "the earlier job's work landed whole"
    assert git(repo, "show", "main:docs/a-notes.md") == "notes" and git(repo, "show", "main:src/a.py") == 'a = "B"'
    assert git(repo, "show", f"orchestrator/{later}-attempt-1:src/a.py") == 'a = "B"', "its stopped attempt kept"


def test_landing_conflict_requeues_on_the_new_head_and_lands(started, tmp_path):
    """A result that conflicts with the moved branch never lands as is; it re-runs on the new head and lands."""
    repo, d = started
    gate = tmp_path / "gate"
    job = d.enqueue(repo, f"{wait_for_file(gate)}; echo job >> README.md", "--path", "README.md")
    until(lambda: d.cli_json("show", str(job))["state"] == "running", what="job running")
    (repo / "README.md").write_text("hello\nuser\n")
    git(repo, "commit", "-qam", "user change")
    gate.touch()
    assert d.cli("wait", str(job), "--timeout", "60").returncode == 0
    j = d.cli_json("show", str(job))
    assert j["state"] == "landed" and j["attempts"] == 1
    kinds = [e["kind"] for e in j["events"]]
    assert "requeued" in kinds and kinds.index("requeued") < kinds.index("landed")
    assert git(repo, "show", "main:README.md").splitlines() == ["hello", "user", "job"]
    assert f"orchestrator/{job}-attempt-1" in git(repo, "branch", "--list", "orchestrator/*"), "first attempt kept"
    assert any(e["event"] == "landing.conflict" for e in d.events())


def test_dirty_user_checkout_is_never_overwritten(started):
    """Landing into the checked-out branch keeps the user's edits; in the way, it waits and says why."""
    repo, d = started
    (repo / "docs" / "x.md").write_text("user's unsaved work\n")
    (repo / "README.md").write_text("user's draft\n")
    other = d.enqueue(repo, "echo landed > src/a.py", "--path", "src/a.py")
    blocked = d.enqueue(repo, "echo job > README.md", "--path", "README.md")
    assert d.cli("wait", str(other), "--timeout", "60").returncode == 0
    assert (repo / "src" / "a.py").read_text() == "landed\n", "the landing updated the user's checkout"
    assert (repo / "docs" / "x.md").read_text() == "user's unsaved work\n"

    until(lambda: "README.md" in d.cli_json("show", str(blocked))["reason"], what="landing waits")
    assert d.cli_json("show", str(blocked))["state"] == "landing"
    assert (repo / "README.md").read_text() == "user's draft\n", "never overwritten"
    git(repo, "checkout", "--", "README.md")  # the user gives way
    assert d.cli("wait", str(blocked), "--timeout", "60").returncode == 0
    assert (repo / "README.md").read_text() == "job\n"
    assert (repo / "docs" / "x.md").read_text() == "user's unsaved work\n"
    assert git(repo, "status", "--porcelain") == "M docs/x.md"


def test_union_mergeable_changelog_is_shared_not_overlapping(started, tmp_path):
    """Two jobs that both edit the changelog run together and both entries land."""
    repo, d = started
    (repo / "CHANGES.md").write_text("# Changes\n\n")
    git(repo, "add", "CHANGES.md")
    git(repo, "commit", "-qm", "changelog")
    a_up, b_up = tmp_path / "a.up", tmp_path / "b.up"
    a = d.enqueue(
        repo,
        f"touch {a_up}; {wait_for_file(b_up)}; sed -i '2a - a' CHANGES.md; echo a > src/a.py",
        "--path",
        "src/a.py",
        "--path",
        "CHANGES.md",
    )
    b = d.enqueue(
        repo,
        f"touch {b_up}; {wait_for_file(a_up)}; sed -i '2a - b' CHANGES.md; echo b > src/b.py",
        "--path",
        "src/b.py",
        "--path",
        "CHANGES.md",
    )
    assert d.cli("wait", str(a), str(b), "--timeout", "60").returncode == 0
    changes = git(repo, "show", "main:CHANGES.md")
    assert "- a" in changes and "- b" in changes
    admitted = [e for e in d.events() if e["event"] == "admission.admitted" and e["job_id"] == b]
    assert admitted and "CHANGES.md" in admitted[0]["shared"]


def test_final_branch_contains_every_jobs_change(started):
    """Many small jobs, some overlapping: every change is on the branch at the end."""
    repo, d = started
    ids = []
    for i in range(6):
        path = f"src/f{i % 3}.py"
        ids.append(d.enqueue(repo, f"echo line{i} >> {path}", "--path", path))
    assert d.cli("wait", *map(str, ids), "--timeout", "90").returncode == 0
    for i in range(6):
        assert f"line{i}" in git(repo, "show", f"main:src/f{i % 3}.py")


def test_plan_prints_the_declared_claim(started):
    """`plan` shows the claim the daemon would make, without queueing a job."""
    repo, d = started
    out = d.cli_json("plan", "--repo", str(repo), "--path", "src/", "--path", "./README.md", "refactor")
    assert out["claim"] == {"paths": ["README.md", "src/"], "confidence": 1.0, "source": "declared"}
    assert out["base"] == git(repo, "rev-parse", "main")
    assert d.cli_json("status") == []


def test_failed_job_keeps_its_worktree_and_output_until_clean(started):
    """A failing runner leaves the job failed with its exit code, its output in its log, its work kept."""
    repo, d = started
    job = d.enqueue(repo, "echo to-stdout; echo to-stderr >&2; echo partial > src/a.py; exit 3", "--path", "src/a.py")
    assert d.cli("wait", str(job), "--timeout", "60").returncode == 1
    j = d.cli_json("show", str(job))
    assert j["state"] == "failed" and j["exit_code"] == 3 and "exited 3" in j["reason"]
    assert j["actual"] == ["src/a.py"]
    log = d.cli("logs", str(job))
    assert "to-stdout" in log.stdout and "to-stderr" in log.stdout
    followed = d.cli("logs", "-f", str(job), timeout=20)
    assert followed.returncode == 1 and followed.stdout == log.stdout, "--follow ends with the outcome"
    assert d.cli_json("logs")[str(job)] == log.stdout
    assert "to-stdout" not in d.log_path.read_text(), "runner output stays out of the daemon log"
    worktree = Path(j["worktree"])
    assert (worktree / "src" / "a.py").read_text() == "partial\n", "nothing is lost"
    assert git(repo, "show", "main:src/a.py") == "a = 1", "a failed job never lands"
    assert d.cli("clean", str(job)).returncode == 0
    assert not worktree.exists()
    assert "orchestrator/" not in git(repo, "branch", "--list", f"orchestrator/{job}")


def test_retry_of_a_failed_job_keeps_the_first_attempt(started, tmp_path):
    """Retrying a failed job runs it again on the current head; the failed attempt stays on a branch."""
    repo, d = started
    flag = tmp_path / "second-time"
    job = d.enqueue(repo, f"echo try >> src/a.py; [ -e {flag} ] || {{ touch {flag}; exit 1; }}", "--path", "src/a.py")
    assert d.cli("wait", str(job), "--timeout", "60").returncode == 1
    assert d.cli("retry", str(job)).returncode == 0
    assert d.cli("wait", str(job), "--timeout", "60").returncode == 0
    assert git(repo, "show", "main:src/a.py").splitlines() == ["a = 1", "try"]
    kept = f"orchestrator/{job}-attempt-1"
    assert git(repo, "show", f"{kept}:src/a.py").splitlines() == ["a = 1", "try"], "the failed attempt is kept"


def test_landing_check_failure_leaves_the_job_unlanded(make_repo, daemon_factory):
    """A repo's landing check runs on the merged result; a failing check never moves the branch."""
    repo = make_repo()
    home = repo.parent / "home-check"
    (home / "config").mkdir(parents=True)
    (home / "config" / "config.toml").write_text(f'[repos."{repo}"]\ncheck = "test -e ok.txt && echo checked"\n')
    d = daemon_factory("home-check", env=FOUR_SLOTS).start()
    before = git(repo, "rev-parse", "main")
    bad = d.enqueue(repo, "echo x > src/a.py", "--path", "src/a.py")
    assert d.cli("wait", str(bad), "--timeout", "60").returncode == 1
    j = d.cli_json("show", str(bad))
    assert j["state"] == "failed" and "landing check" in j["reason"]
    assert git(repo, "rev-parse", "main") == before
    good = d.enqueue(repo, "echo y > ok.txt", "--path", "ok.txt")
    assert d.cli("wait", str(good), "--timeout", "60").returncode == 0
    assert git(repo, "show", "main:ok.txt") == "y"
    assert "checked" in d.cli("logs", str(good)).stdout


def test_cancel_a_running_job(started, tmp_path):
    """Cancelling a running job stops its process and keeps its worktree; it never lands."""
    repo, d = started
    job = d.enqueue(repo, "echo started > src/a.py; sleep 30", "--path", "src/a.py")
    until(lambda: d.cli_json("show", str(job))["state"] == "running", what="running")
    assert d.cli("cancel", str(job)).returncode == 0
    j = d.cli_json("show", str(job))
    assert j["state"] == "cancelled"
    assert d.cli("cancel", str(job)).returncode == 2, "cancelling twice is refused"
    assert git(repo, "show", "main:src/a.py") == "a = 1"


def test_branch_moving_in_declared_paths_starts_on_the_new_head(make_repo, daemon_factory, tmp_path):
    """A waiting job whose declared paths moved on the branch starts on the new head, keeping its place in
    the queue (a re-plan would give the same paths back), and lands on top of the move."""
    repo = make_repo()
    d = daemon_factory(env={"MAX_CONCURRENT_JOBS": "1"}).start()
    gate = tmp_path / "gate"
    first = d.enqueue(repo, f"{wait_for_file(gate)}; echo one > one.txt", "--path", "one.txt")
    until(lambda: d.cli_json("show", str(first))["state"] == "running", what="first running")
    waiting = d.enqueue(repo, "echo waiting >> README.md", "--path", "README.md")
    until(lambda: d.cli_json("show", str(waiting))["state"] == "planned", what="planned")
    planned_base = d.cli_json("show", str(waiting))["base"]
    (repo / "README.md").write_text("hello\nuser\n")
    git(repo, "commit", "-qam", "user moves README")
    user_head = git(repo, "rev-parse", "main")
    gate.touch()
    assert d.cli("wait", str(first), str(waiting), "--timeout", "60").returncode == 0
    j = d.cli_json("show", str(waiting))
    assert planned_base != user_head
    assert "replan" not in [e["kind"] for e in j["events"]]
    assert git(repo, "merge-base", "--is-ancestor", user_head, j["base"]) == "", "it started on the moved head"
    assert git(repo, "show", "main:README.md").splitlines() == ["hello", "user", "waiting"]


def test_after_waits_for_landing_and_fails_when_the_dependency_fails(started):
    """`--after` starts a job only once its dependency landed, and fails it if the dependency cannot land."""
    repo, d = started
    first = d.enqueue(repo, "sleep 0.5; echo first > first.txt", "--path", "first.txt")
    second = d.enqueue(repo, "cat first.txt > second.txt", "--path", "second.txt", "--after", str(first))
    broken = d.enqueue(repo, "exit 1", "--path", "broken.txt")
    orphan = d.enqueue(repo, "echo never > orphan.txt", "--path", "orphan.txt", "--after", str(broken))
    d.cli("wait", str(first), str(second), str(broken), str(orphan), "--timeout", "60")
    assert git(repo, "show", "main:second.txt") == "first", "it ran on a base that had its dependency"
    o = d.cli_json("show", str(orphan))
    assert o["state"] == "failed" and o["decision"]["reason"] == "DependencyFailed"
    assert d.cli("enqueue", "--repo", str(repo), "--after", "999", "true").returncode == 2
