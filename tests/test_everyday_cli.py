"""Output that never leaves a person guessing: status that fits, wait and logs -f outcomes, why at every stage."""

from __future__ import annotations

import json
import subprocess
import sys

from orchestrator.commands import fit
from tests.conftest import git
from tests.test_e2e_jobs import until, wait_for_file


def test_cut_middle_keeps_what_to_do() -> None:
    """A long reason is cut from the middle: its start and its advice at the end both stay."""
    reason = (
        "waits: your uncommitted changes to README.md in /home/someone/src/a-long-project-name are in the way "
        "of this landing; commit or stash them and it lands"
    )
    cut = fit.cut_middle(reason, 60)
    assert len(cut) == 60 and cut.startswith("waits:") and cut.endswith("commit or stash them and it lands")
    assert fit.cut_middle("short", 60) == "short"


def test_summary_counts_waiting_jobs_by_code() -> None:
    """The summary line breaks waiting jobs down by their code."""
    jobs = [{"state": "running"}] * 3 + [{"state": "planned", "code": "Overlap"}] * 3
    jobs += [{"state": "planned", "code": "Concurrency"}] * 2
    assert fit.summary(jobs) == "3 running, 5 waiting: 3 Overlap, 2 Concurrency"


def test_status_is_one_line_per_job_with_filters_and_summary(started, make_repo, tmp_path):
    """At 100 columns each job is one line; --repo and --state filter; the summary counts codes."""
    repo, d = started
    other = make_repo("other")
    gate = tmp_path / "gate"
    holder = d.enqueue(repo, f"{wait_for_file(gate, 2400)}; echo a > src/a.py", "--path", "src/a.py")
    until(lambda: d.cli_json("show", str(holder))["state"] == "running", what="running")
    waiter = d.enqueue(repo, "echo b >> src/a.py " + "x" * 80, "--path", "src/")
    done = d.enqueue(other, "echo o > o.txt", "--path", "o.txt")
    assert d.cli("wait", str(done), "--timeout", "60").returncode == 0
    until(lambda: d.cli_json("show", str(waiter))["code"] == "Overlap", what="overlap")
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator", "status", "--repo", str(repo)],
        env={**d.env, "COLUMNS": "100"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = out.stdout.splitlines()
    assert len(lines) == 2 and all(len(line) <= 100 for line in lines), out.stdout
    assert "Overlap" in lines[1] and lines[1].rstrip().endswith("to land"), "the end of the reason stays"
    assert out.stderr.strip() == "1 running, 1 waiting: 1 Overlap"
    assert [j["id"] for j in d.cli_json("status", "--state", "waiting")] == [waiter]
    assert [j["id"] for j in d.cli_json("status", "--since", "1h", "--repo", str(other))] == [done]
    wide = d.cli("status", "--wide", "--repo", str(repo)).stdout
    assert "x" * 80 in wide
    assert len(wide.splitlines()) == 2, f"--wide into a pipe: still a line a job, whole (grep, awk):\n{wide}"
    gate.touch()
    assert d.cli("wait", str(holder), str(waiter), "--timeout", "60").returncode == 0


def test_wait_timeout_exits_4_and_names_the_open_jobs(started, tmp_path):
    """`wait --timeout` that runs out exits 4 (not 1 like a failure) and says what is still open."""
    repo, d = started
    gate = tmp_path / "gate"
    job = d.enqueue(repo, f"{wait_for_file(gate, 2400)}; echo a > src/a.py", "--path", "src/a.py")
    out = d.cli("wait", str(job), "--timeout", "1")
    assert out.returncode == 4, out.stderr
    assert "timed out" in out.stderr and f"job {job}: running" in out.stderr
    gate.touch()
    assert d.cli("wait", str(job), "--timeout", "60").returncode == 0


def test_logs_follow_waits_for_a_queued_job_then_exits_with_its_failure(started, tmp_path):
    """`logs -f` on a waiting job waits for it, shows each attempt's header and exit status, exits 1 on failure."""
    repo, d = started
    gate = tmp_path / "gate"
    holder = d.enqueue(repo, f"{wait_for_file(gate, 2400)}; echo a > src/a.py", "--path", "src/a.py")
    until(lambda: d.cli_json("show", str(holder))["state"] == "running", what="running")
    job = d.enqueue(repo, "echo doomed-output; exit 3", "--path", "src/")
    until(lambda: d.cli_json("show", str(job))["state"] == "planned", what="waiting")
    follower = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "logs", "-f", str(job)],
        env=d.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert follower.stderr is not None
    first = follower.stderr.readline()  # the job is held back until the gate opens, so this comes first
    gate.touch()
    out, errs = follower.communicate(timeout=60)
    assert follower.returncode == 1, errs
    assert first.startswith(f"job {job} is planned (") and f"job {job}: failed (RunnerFailed)" in errs
    lines = out.splitlines()
    assert lines[0].startswith(f"==> attempt 1 of job {job}") and "doomed-output" in lines
    assert lines[-1].startswith("==> exit status 3")
    assert d.cli("retry", str(job)).returncode == 0
    assert d.cli("wait", str(job), "--timeout", "60").returncode == 1
    log = d.cli("logs", str(job)).stdout
    assert log.count("==> attempt") == 2 and f"==> attempt 2 of job {job}" in log


def test_why_tells_a_landing_waits_on_the_users_uncommitted_edit(started):
    """While a landing waits on the user's edit, `why` says so with its code; the wait is logged at start and end."""
    repo, d = started
    (repo / "README.md").write_text("user's draft\n")
    job = d.enqueue(repo, "echo job > README.md", "--path", "README.md")
    until(lambda: d.cli_json("show", str(job))["code"] == "UserDirty", what="landing waits")
    why = d.cli_json("why", str(job))
    assert why["state"] == "landing" and why["code"] == "UserDirty" and why["decision"] is None
    assert "commit or stash" in why["next"]
    text = d.cli("why", str(job)).stdout
    assert "landing (UserDirty)" in text and "starts now" not in text
    until(lambda: len([e for e in d.events() if e["event"] == "landing.waiting"]) >= 1, what="logged")
    until(lambda: len(_attempts(d, job)) >= 3, what="two retries of the landing (the second one done)")
    waits = [e for e in d.events() if e["event"] == "landing.waiting"]
    assert len(waits) == 1 and waits[0]["code"] == "UserDirty", "logged when it starts, not on every retry"
    git(repo, "checkout", "--", "README.md")
    assert d.cli("wait", str(job), "--timeout", "60").returncode == 0
    ended = [e for e in d.events() if e["event"] == "landing.wait_ended"]
    assert ended and ended[0]["code"] == "UserDirty"
    show = d.cli("show", str(job)).stdout
    assert "None" not in show and "code         Landed" in show
    failed = [e for e in d.events() if e["event"] in ("job.failed", "job.cancelled", "landing.waiting")]
    assert all("code" in e for e in failed)
    assert json.loads(d.cli("why", str(job), "--json").stdout)["next"].startswith("nothing: it has landed")


def _attempts(d, job: int) -> list[dict]:
    return [e for e in d.events() if e["event"] == "landing.started" and e.get("job_id") == job]


def test_a_detached_daemon_is_stopped_by_daemon_stop(daemon_factory, make_repo, tmp_path):
    """`daemon --detach`, then `daemon --stop`: back once the daemon has ended, saying which job it interrupted
    (and how to queue it again); with none running, `--stop` says so and exits 3."""
    import contextlib
    import os
    import signal

    from orchestrator.client import Client

    repo = make_repo()
    d = daemon_factory(process=True)
    started = d.cli("daemon", "--detach")
    assert started.returncode == 0, started.stderr
    pid = Client(d.socket, timeout=5).health()["pid"]
    try:
        d.enqueue(repo, wait_for_file(tmp_path / "never", 600), "--path", "a.txt")
        until(lambda: d.cli_json("status", "--state", "running"), timeout=60)
        stopped = d.cli("daemon", "--stop", timeout=150)
        assert stopped.returncode == 0, stopped.stderr
        assert f"daemon {pid} (version" in stopped.stderr and "1 running job was interrupted" in stopped.stderr
        gone = d.cli("status")
        assert gone.returncode == 3, gone.stderr
        again = d.cli("daemon", "--stop")
        assert again.returncode == 3 and "no daemon answers" in again.stderr, again.stderr
    finally:  # however the test went, no daemon of it is left running
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
