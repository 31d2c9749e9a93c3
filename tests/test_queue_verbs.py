"""Queue verbs like pueue's: several ids and filters per verb, pause/resume, limit at run time, clean."""

from __future__ import annotations

import contextlib
import json
import time

from tests.conftest import git
from tests.test_e2e_jobs import until, wait_for_file


def states(d, *ids: int) -> list[str]:
    return [d.cli_json("show", str(i))["state"] for i in ids]


def test_cancel_and_retry_take_several_ids_and_filters(started, make_repo, tmp_path):
    """`cancel 1 2` cancels both; `retry --cancelled --repo R` re-queues only that repo's cancelled jobs."""
    repo, d = started
    other = make_repo("other")
    gate = tmp_path / "gate"
    a = d.enqueue(repo, f"{wait_for_file(gate, 2400)}; echo a > src/a.py", "--path", "src/a.py")
    b = d.enqueue(repo, f"{wait_for_file(gate, 2400)}; echo b > src/b.py", "--path", "src/b.py")
    c = d.enqueue(other, "exit 3", "--path", "x.txt")
    assert d.cli("wait", str(c), "--timeout", "60").returncode == 1
    out = d.cli("cancel", str(a), str(b))
    assert out.returncode == 0, out.stderr
    assert states(d, a, b) == ["cancelled", "cancelled"]
    assert f"job {a}: cancelled" in out.stderr and f"job {b}: cancelled" in out.stderr

    refused = d.cli("cancel", str(a), "999")
    assert refused.returncode == 2 and "already ended" in refused.stderr and "no job 999" in refused.stderr

    gate.touch()
    retried = json.loads(d.cli("retry", "--cancelled", "--repo", str(repo), "--json").stdout)
    assert sorted(r["id"] for r in retried) == [a, b], "the other repo's failed job stays failed"
    assert states(d, c) == ["failed"]
    assert d.cli("wait", str(a), str(b), "--timeout", "60").returncode == 0
    assert git(repo, "show", "main:src/a.py") == "a" and git(repo, "show", "main:src/b.py") == "b"
    assert d.cli("retry").returncode == 2, "naming nothing is a usage error"


def test_each_filter_picks_jobs_by_how_they_ended(started, tmp_path):
    """`--failed` is failed (never what you cancelled), `--cancelled` and `--unchanged` have filters of their own; for
    retry and clean alike."""
    repo, d = started
    gate = tmp_path / "gate"
    failed = d.enqueue(repo, "exit 3", "--path", "src/a.py")
    unchanged = d.enqueue(repo, "true", "--path", "src/b.py")
    cancelled = d.enqueue(repo, f"{wait_for_file(gate, 2400)}; echo c > docs/x.md", "--path", "docs/x.md")
    d.cli("wait", str(failed), str(unchanged), "--timeout", "60")
    assert d.cli("cancel", str(cancelled)).returncode == 0
    assert states(d, failed, unchanged, cancelled) == ["failed", "unchanged", "cancelled"]

    def picked(verb: str, *flags: str) -> list[int]:
        out = d.cli(verb, *flags, "--json")
        assert out.returncode == 0, out.stderr
        return sorted(r["id"] for r in json.loads(out.stdout))

    assert picked("retry", "--failed") == [failed]
    assert d.cli("wait", str(failed), "--timeout", "60").returncode == 1
    assert picked("retry", "--unchanged") == [unchanged]
    assert d.cli("wait", str(unchanged), "--timeout", "60").returncode == 5
    assert states(d, cancelled) == ["cancelled"], "neither filter touched the job you cancelled"
    assert picked("clean", "--cancelled") == [cancelled]
    assert picked("clean", "--failed", "--unchanged") == [failed, unchanged]
    assert d.cli_json("status") == []
    refused = d.cli("cancel", "--failed")
    assert refused.returncode == 2 and "ended already" in refused.stderr


def test_clean_removes_ended_jobs_records_and_logs(started):
    """`clean --all` drops ended jobs from the list with their logs; landed commits stay in git."""
    repo, d = started
    landed = d.enqueue(repo, "echo landed > src/a.py", "--path", "src/a.py")
    failed = d.enqueue(repo, "echo oops; exit 1", "--path", "src/b.py")
    d.cli("wait", str(landed), str(failed), "--timeout", "60")
    sha = d.cli_json("show", str(landed))["landed_sha"]
    log = d.home / "state" / "jobs" / f"{failed}.log"
    assert log.exists()
    out = d.cli("clean", "--all")
    assert out.returncode == 0, out.stderr
    assert d.cli_json("status") == []
    assert not log.exists()
    assert d.cli("show", str(landed)).returncode == 2
    assert git(repo, "cat-file", "-t", sha) == "commit" and git(repo, "show", "main:src/a.py") == "landed"


def test_pause_holds_new_jobs_back_and_resume_lets_them_start(started, make_repo, tmp_path):
    """A paused repo starts nothing new (code Paused) while its running job goes on; other repos run."""
    repo, d = started
    other = make_repo("other")
    gate = tmp_path / "gate"
    running = d.enqueue(repo, f"{wait_for_file(gate, 2400)}; echo r > src/a.py", "--path", "src/a.py")
    until(lambda: states(d, running) == ["running"], what="running")
    assert d.cli("pause", "--repo", str(repo)).returncode == 0
    held = d.enqueue(repo, "echo h > src/b.py", "--path", "src/b.py")
    free = d.enqueue(other, "echo f > f.txt", "--path", "f.txt")
    assert d.cli("wait", str(free), "--timeout", "60").returncode == 0, "another repo is not paused"
    until(lambda: d.cli_json("show", str(held))["code"] == "Paused", what="held back")
    assert states(d, held, running) == ["planned", "running"]
    assert "resume" in d.cli("why", str(held)).stdout
    gate.touch()
    assert d.cli("wait", str(running), "--timeout", "60").returncode == 0, "the running job went on"
    assert states(d, held) == ["planned"]
    assert d.cli("pause").returncode == 0 and d.cli("resume", "--repo", str(repo)).returncode == 0
    time.sleep(0.5)
    assert states(d, held) == ["planned"], "the whole daemon is still paused"
    assert d.cli("resume").returncode == 0
    assert d.cli("wait", str(held), "--timeout", "60").returncode == 0
    deferred = [e for e in d.events() if e["event"] == "admission.deferred" and e["job_id"] == held]
    assert deferred and deferred[0]["reason"] == "Paused"


def test_limit_changes_a_repos_slots_at_run_time_and_is_kept(started, tmp_path):
    """`limit --repo R 1` makes the repo's jobs run one at a time at once, and survives a daemon restart."""
    repo, d = started
    assert d.cli("limit", "--repo", str(repo), "1").returncode == 0
    gate = tmp_path / "gate"
    a = d.enqueue(repo, f"{wait_for_file(gate, 2400)}; echo a > src/a.py", "--path", "src/a.py")
    b = d.enqueue(repo, "echo b > src/b.py", "--path", "src/b.py")
    until(lambda: d.cli_json("show", str(b))["code"] == "Concurrency", what="b held by the limit")
    assert "per-repo limit 1" in d.cli_json("why", str(b))["reason"]
    assert states(d, a) == ["running"]
    assert d.cli("limit", "--repo", str(repo), "2").returncode == 0
    assert d.cli("wait", str(b), "--timeout", "60").returncode == 0, "two slots now: b runs beside a"
    assert states(d, a) == ["running"]
    gate.touch()
    assert d.cli("wait", str(a), "--timeout", "60").returncode == 0
    d.stop()
    d.start()
    controls = json.loads(d.cli("limit", "--repo", str(repo), "--json").stdout)["controls"]
    assert controls[str(repo)]["slots"] == 2
    assert d.cli("limit", "--repo", str(repo), "-1").returncode == 2


async def test_a_restarted_daemon_answers_with_its_kept_limit_before_its_first_round(started):
    """The limits a stopped daemon kept are in force, and told, from the first request its API answers: its
    start-up is run here up to a listening socket, before its scheduler has made a round."""
    from orchestrator import config, daemon, paths
    from tests.chatkit import get

    repo, d = started
    assert d.cli("limit", "--repo", str(repo), "2").returncode == 0
    d.stop()
    p = paths.resolve(d.env)
    async with contextlib.AsyncExitStack() as parts:
        await daemon.Daemon(config.load(p.config_file, d.env), p).startup(parts)
        controls = (await get(p.socket, "/controls"))["controls"]
    assert controls[str(repo)]["slots"] == 2


def test_argv_job_keeps_spaces_quotes_and_dollar_parens(started):
    """`enqueue -- cmd arg "a b"` runs exactly that argv: no shell, no re-splitting, `$(...)` kept literal."""
    repo, d = started
    args = ["a b", "it's", 'say "hi"', "$(touch pwned)", "*"]
    out = d.cli(
        "enqueue",
        "--repo",
        str(repo),
        "--path",
        "out.txt",
        "--",
        "sh",
        "-c",
        'printf "%s\\n" "$@" > out.txt',
        "sh",
        *args,
    )
    assert out.returncode == 0, out.stderr
    job = int(out.stdout)
    assert d.cli("wait", str(job), "--timeout", "60").returncode == 0
    j = d.cli_json("show", str(job))
    assert j["argv"][-5:] == args
    assert git(repo, "show", "main:out.txt").splitlines() == args
    assert not (repo / "pwned").exists() and "pwned" not in git(repo, "ls-tree", "-r", "--name-only", "main")
    assert d.cli("enqueue", "--repo", str(repo), "echo", "two").returncode == 2, "several words need quotes or --"
    assert d.cli_json("plan", "--repo", str(repo), "pytest", "-q")["claim"]["source"] == "none"
