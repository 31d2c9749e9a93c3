"""The git hooks on real temp repositories: commits queue work, and never fail or wait for the daemon."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from orchestrator.service import hooks, spool
from orchestrator.service.tickets import Ticket
from tests.conftest import git, write
from tests.harness import Daemon
from tests.harness import until as _wait


@pytest.fixture(autouse=True)
def _users_own_commits(monkeypatch) -> None:
    """The user commits their own work here: committer = author (conftest gives the two apart)."""
    monkeypatch.setenv("GIT_COMMITTER_NAME", os.environ["GIT_AUTHOR_NAME"])
    monkeypatch.setenv("GIT_COMMITTER_EMAIL", os.environ["GIT_AUTHOR_EMAIL"])


def _commit(d: Daemon, repo: Path, message: str, files: dict[str, str] | None = None, **env: str) -> float:
    """Commit with the real git CLI (hooks and all) in the daemon's environment; returns the seconds it took."""
    write(repo, files or {f"f-{time.monotonic_ns()}.txt": "x\n"})
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True, env=d.env, timeout=30)
    started = time.monotonic()
    subprocess.run(["git", "commit", "-q", "-m", message], cwd=repo, check=True, env={**d.env, **env}, timeout=30)
    return time.monotonic() - started


def _install(d: Daemon, repo: Path) -> None:
    out = d.cli("hook", "install", "--repo", str(repo))
    assert out.returncode == 0, out.stderr


def _log_lines(d: Daemon) -> list[str]:
    path = d.home / "state" / "hook.log"
    return path.read_text().splitlines() if path.exists() else []


def _spooled(d: Daemon) -> list[Path]:
    folder = d.home / "state" / "spool"
    return sorted(folder.glob("*.json")) if folder.exists() else []


def test_trailer_and_ticket_file_queue_jobs_when_daemon_up(make_repo, daemon_factory) -> None:
    """A trailer and an added ticket file each queue one job with their paths; SKIP and own commits queue none."""
    repo = make_repo()
    d = daemon_factory().start()
    _install(d, repo)
    _commit(d, repo, "skipped\n\nOrchestrator: true skipped", ORCHESTRATOR_SKIP="1")
    _commit(d, repo, "own\n\nOrchestrator: true own\nOrchestrator-Job: 7")
    _commit(d, repo, "add login\n\nOrchestrator: true login\nOrchestrator-Paths: src/a.py, docs/")
    ticket = "---\nid: docs\npaths: [docs/x.md]\npriority: 2\n---\ntrue docs\n"
    _commit(d, repo, "plan docs", {".orchestrator/tickets/docs.md": ticket})
    jobs = _wait("two jobs", lambda: (js := d.cli_json("status")) and len(js) >= 2 and js)
    by_text = {j["text"]: j for j in jobs}
    assert set(by_text) == {"true login", "true docs"}
    assert by_text["true login"]["claim"]["paths"] == ["docs/", "src/a.py"]
    assert by_text["true docs"]["claim"]["paths"] == ["docs/x.md"] and by_text["true docs"]["priority"] == 2
    lines = _wait("three hook runs", lambda: len(ls := _log_lines(d)) >= 3 and ls)
    assert len(lines) == 3, lines  # the skipped commit never started the Python side
    assert sum("no tickets" in ln for ln in lines) == 1  # the daemon's own commit (runs may finish in any order)
    assert not _spooled(d)


def test_commit_spools_when_daemon_down_and_start_queues_it(make_repo, daemon_factory) -> None:
    """With no daemon the request is spooled (0600); the daemon queues it at start and empties the spool."""
    repo = make_repo()
    d = daemon_factory()
    _install(d, repo)
    _commit(d, repo, "work\n\nOrchestrator: true spooled\nOrchestrator-Paths: src/b.py")
    files = _wait("a spooled request", lambda: _spooled(d))
    assert oct(files[0].stat().st_mode & 0o777) == "0o600"
    d.start()
    jobs = _wait("the spooled job", lambda: d.cli_json("status"))
    assert [(j["text"], j["claim"]["paths"]) for j in jobs] == [("true spooled", ["src/b.py"])]
    assert not _spooled(d)
    # The same commit's request again (an amend, a late copy) queues nothing new.
    _commit(d, repo, "work\n\nOrchestrator: true spooled\nOrchestrator-Paths: src/b.py")
    _wait("the second hook run", lambda: len(_log_lines(d)) >= 2)
    assert "duplicate" in _log_lines(d)[-1]
    assert len(d.cli_json("status")) == 1
    # While it runs, the daemon watches the spool: a request left there is queued without a restart.
    ticket = Ticket("true watched").keyed("main").to_json()
    spool.write(d.home / "state" / "spool", {"repo": str(repo), "branch": "main", "commit": "c0", "tickets": [ticket]})
    _wait("the watched spool's job", lambda: any(j["text"] == "true watched" for j in d.cli_json("status")))
    _wait("the spool to empty", lambda: not _spooled(d))


def test_commit_with_hung_daemon_is_fast_and_spools(make_repo, daemon_factory) -> None:
    """A daemon that accepts but never answers: the commit still ends at once; the request is spooled."""
    repo = make_repo()
    d = daemon_factory()
    _install(d, repo)
    d.socket.parent.mkdir(parents=True, exist_ok=True)
    held: list[socket.socket] = []
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(d.socket))
    server.listen(8)
    server.settimeout(0.2)
    stop = threading.Event()

    def accept_and_hang() -> None:
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    t = threading.Thread(target=accept_and_hang, daemon=True)
    t.start()
    try:
        took = _commit(d, repo, "hung\n\nOrchestrator: true hung")
        assert took < 1.0, f"the commit took {took:.2f} s with a hung daemon"
        _wait("the spooled request", lambda: _spooled(d), timeout=20)
        assert held, "the hook did reach the hung daemon first"
    finally:
        stop.set()
        t.join(timeout=5)
        for c in held:
            c.close()
        server.close()


def test_existing_hook_chained_then_restored(make_repo, daemon_factory) -> None:
    """A hook that was there still runs after install, and uninstall puts it back unchanged."""
    repo = make_repo()
    d = daemon_factory()
    hook = repo / ".git" / "hooks" / "post-commit"
    original = "#!/bin/sh\necho ran >> chained.txt\n"
    hook.write_text(original)
    hook.chmod(0o755)
    _install(d, repo)
    assert hooks.MARK in hook.read_text()
    _commit(d, repo, "one\n\nOrchestrator: true chained", {"a.txt": "a\n"})
    assert (repo / "chained.txt").read_text() == "ran\n"
    _wait("the spooled request", lambda: _spooled(d))
    status = d.cli_json("hook", "status", "--repo", str(repo))
    assert {h["hook"]: (h["state"], h["chained"]) for h in status["hooks"]} == {
        "post-commit": ("installed", True),
        "post-rewrite": ("installed", False),
    }
    out = d.cli("hook", "uninstall", "--repo", str(repo))
    assert out.returncode == 0, out.stderr
    assert hook.read_text() == original and os.access(hook, os.X_OK)
    assert not (hook.parent / "post-rewrite").exists()
    assert not (hook.parent / ("post-commit" + hooks.CHAINED)).exists()


def test_hooks_path_of_another_tool_is_reported_not_clobbered(make_repo, daemon_factory) -> None:
    """core.hooksPath (husky) is left alone; install says which line to add to that tool's hooks."""
    repo = make_repo()
    d = daemon_factory()
    git(repo, "config", "core.hooksPath", ".husky")
    out = d.cli("hook", "install", "--repo", str(repo))
    assert out.returncode == 2
    assert ".husky/post-commit" in out.stderr and "orchestrator.service.hookrun post-commit" in out.stderr
    assert not (repo / ".husky").exists() and not (repo / ".git" / "hooks" / "post-commit").exists()


def test_rebase_of_three_commits_queues_nothing_again(make_repo, daemon_factory) -> None:
    """Three ticket commits queue three jobs; rebasing them onto a moved main queues no more."""
    repo = make_repo()
    d = daemon_factory().start()
    git(repo, "switch", "-q", "-c", "feature")
    _install(d, repo)
    for name in ("a", "b", "c"):
        _commit(d, repo, f"{name}\n\nOrchestrator: true {name}", {f"{name}.txt": name})
    _wait("three jobs", lambda: len(d.cli_json("status")) == 3)
    git(repo, "switch", "-q", "main")
    _commit(d, repo, "main moves", {"m.txt": "m"})
    git(repo, "switch", "-q", "feature")
    subprocess.run(["git", "rebase", "-q", "main"], cwd=repo, check=True, env=d.env, timeout=60)
    lines = _wait("the post-rewrite run", lambda: [ln for ln in _log_lines(d) if "post-rewrite" in ln])
    assert "rebase of 3 commits: no new tickets" in lines[0]
    assert len(d.cli_json("status")) == 3
    # The three ticket commits; main's names nothing and starts no Python; none ran mid-rebase.
    assert sum("post-commit" in ln for ln in _log_lines(d)) == 3


def test_newer_ticket_with_same_id_supersedes_a_waiting_job(make_repo, daemon_factory) -> None:
    """A changed ticket file (same id) cancels the job of the older version that has not started."""
    repo = make_repo()
    d = daemon_factory(env={"MAX_CONCURRENT_JOBS": "1"}).start()
    blocker = d.enqueue(repo, "sleep 60", "--path", "src/a.py")
    _wait("the blocker to run", lambda: d.cli_json("show", str(blocker))["state"] == "running")
    _install(d, repo)
    _commit(d, repo, "t1", {".orchestrator/tickets/docs.md": "---\npaths: [docs/]\n---\ntrue v1\n"})
    first = _wait("the first ticket's job", lambda: [j for j in d.cli_json("status") if j["text"] == "true v1"])[0]
    _commit(d, repo, "t2", {".orchestrator/tickets/docs.md": "---\npaths: [docs/]\n---\ntrue v2\n"})
    second = _wait("the second ticket's job", lambda: [j for j in d.cli_json("status") if j["text"] == "true v2"])[0]
    # The newer job is queued first, then the older one cancelled (the intake's next step).
    old = _wait("superseded", lambda: (j := d.cli_json("show", str(first["id"])))["state"] == "cancelled" and j)
    assert f"superseded by job {second['id']}" in old["reason"]
    assert d.cli_json("show", str(second["id"]))["state"] in ("queued", "planning", "planned")


def test_repository_copies_are_the_installed_scripts() -> None:
    """`hooks/` in the repository holds exactly what install writes (with python3 from PATH), as POSIX sh."""
    root = Path(__file__).resolve().parent.parent / "hooks"
    for hook in hooks.HOOKS:
        assert (root / hook).read_text() == hooks.script(hook, "python3"), (
            "hooks/ is stale: python -m orchestrator.service.hooks hooks/"
        )
        assert os.access(root / hook, os.X_OK)
        assert subprocess.run(["sh", "-n", str(root / hook)], timeout=30).returncode == 0


RECORDER = '#!/bin/sh\necho "$*" >> "$0.calls"\n'


def test_only_a_commit_that_can_queue_starts_the_python_side(make_repo, tmp_path) -> None:
    """The sh hook starts Python only for a trailer or a ticket file (any case, a linked worktree too)."""
    repo = make_repo()
    python = tmp_path / "python-recorder"
    python.write_text(RECORDER)
    python.chmod(0o755)
    hooks.install(repo, python=str(python))
    calls = Path(str(python) + ".calls")

    def commit(cwd: Path, message: str, files: dict[str, str]) -> None:
        write(cwd, files)
        git(cwd, "add", "-A")
        git(cwd, "commit", "-qm", message)

    commit(repo, "plain change\n\nmentions orchestrator in passing", {"a.txt": "1"})
    commit(repo, "paths only\n\nOrchestrator-Paths: src/a.py", {"a.txt": "2"})
    commit(repo, "own\n\nOrchestrator-Job: 3", {"a.txt": "3"})
    commit(repo, "a docs file\n", {"docs/tickets/x.md": "not a ticket"})
    commit(repo, "trailer\n\norchestrator: true lower-case", {"a.txt": "4"})
    commit(repo, "a ticket", {".orchestrator/tickets/t.md": "true ticket\n"})
    git(repo, "worktree", "add", "-q", "-b", "side", str(tmp_path / "side"))
    commit(tmp_path / "side", "plain in a worktree", {"b.txt": "1"})
    commit(tmp_path / "side", "side\n\nOrchestrator: true side", {"b.txt": "2"})
    _wait("three Python starts", lambda: calls.exists() and len(calls.read_text().splitlines()) >= 3)
    time.sleep(0.3)  # any start for an earlier commit would have been recorded by now
    lines = [ln.split()[2:] for ln in calls.read_text().splitlines()]
    assert lines == [
        ["post-commit", git(repo, "rev-parse", "main~1"), "main"],
        ["post-commit", git(repo, "rev-parse", "main"), "main"],
        ["post-commit", git(repo, "rev-parse", "side"), "side"],
    ]


def test_trailers_of_someone_elses_commits_queue_nothing_unless_opted_in(make_repo, daemon_factory) -> None:
    """A real cherry-pick and a real rebase of another author's trailer commit queue nothing; opted in, they do."""
    repo = make_repo()
    d = daemon_factory().start()
    _install(d, repo)
    theirs = {"GIT_AUTHOR_NAME": "Someone Else", "GIT_AUTHOR_EMAIL": "else@example.org"}
    as_fetched = {**theirs, "GIT_COMMITTER_NAME": "Someone Else", "GIT_COMMITTER_EMAIL": "else@example.org",
                  "ORCHESTRATOR_SKIP": "1"}  # fmt: skip
    git(repo, "switch", "-q", "-c", "theirs")
    _commit(d, repo, "their change\n\nOrchestrator: true picked", {"t1.txt": "1"}, **as_fetched)
    _commit(d, repo, "their other change\n\nOrchestrator: true reworded", {"t2.txt": "1"}, **as_fetched)
    _commit(d, repo, "their third change\n\nOrchestrator: true opted-in", {"t3.txt": "1"}, **as_fetched)
    git(repo, "switch", "-q", "main")
    _commit(d, repo, "main moves", {"m.txt": "m"})
    git(repo, "cherry-pick", "theirs~2")
    _wait("the cherry-pick's hook run", lambda: any("not queued" in ln for ln in _log_lines(d)))
    # A rebase that rewords their trailer (a new ticket, were it the user's own commit) queues nothing either.
    git(repo, "switch", "-q", "-c", "rebased", "theirs~1")
    env = {**d.env, "GIT_SEQUENCE_EDITOR": "sed -i 's/^pick/reword/'", "GIT_EDITOR": "sed -i 's/reworded/reworded-2/'"}
    subprocess.run(["git", "rebase", "-q", "-i", "main"], cwd=repo, check=True, env=env, timeout=60,
                   capture_output=True)  # fmt: skip
    _wait("the rebase's hook run", lambda: any("post-rewrite" in ln for ln in _log_lines(d)))
    git(repo, "switch", "-q", "main")
    git(repo, "config", "orchestrator.foreignTickets", "true")
    git(repo, "cherry-pick", "theirs")
    jobs = _wait("the opted-in job", lambda: d.cli_json("status"))
    assert [j["text"] for j in jobs] == ["true opted-in"]
    log = _log_lines(d)
    assert any("not queued: a cherry-pick" in ln for ln in log), log
    assert any("post-rewrite" in ln and "not queued: authored by else@example.org" in ln for ln in log), log
    assert "orchestrator.foreignTickets true" in next(ln for ln in log if "not queued" in ln)


# A user's own post-commit hook that takes a while (a linter, a notifier): it waits for a landing to move the branch
# (or a tenth of a second), the window in which the orchestrator hook, chained after it, reads it. A landing waits
# for a commit under way, so the branch moves only once git has ended (the wait always runs out): the orchestrator
# hook's own part, which runs on after it in the background, must still queue the commit that ran it.
SLOW_USERS_HOOK = """#!/bin/sh
start=$(git rev-parse HEAD)
i=0
while [ "$(git rev-parse HEAD)" = "$start" ] && [ $i -lt 2 ]; do sleep 0.05; i=$((i + 1)); done
"""


def _git_beside_landings(d: Daemon, repo: Path, *args: str) -> None:
    """Run git as a user would while the daemon lands on the checkout: again when it starts in the instant a landing
    holds the index (git says another git process runs). Never refused because a landing moved the branch between
    git reading HEAD and updating it (`cannot lock ref 'HEAD'`): a landing waits for a commit under way."""
    for _ in range(100):
        out = subprocess.run(["git", *args], cwd=repo, env=d.env, capture_output=True, text=True, timeout=30)
        if out.returncode == 0:
            return
        assert "index.lock" in out.stderr, out.stderr
        time.sleep(0.05)
    raise AssertionError(f"git {args[0]}: the index stayed locked")


@pytest.mark.timeout(300)
def test_every_commit_is_queued_while_landings_move_the_checked_out_branch(make_repo, daemon_factory) -> None:
    """50 trailer commits on the checked-out main while the daemon lands jobs on it: 50 jobs, 50 hook.log lines."""
    repo = make_repo()
    d = daemon_factory(env={"MAX_CONCURRENT_JOBS": "4"}).start()
    hook = repo / ".git" / "hooks" / "post-commit"
    hook.write_text(SLOW_USERS_HOOK)
    hook.chmod(0o755)
    _install(d, repo)
    texts = [f"echo {k} > out-{k}.txt" for k in range(50)]
    for k, text in enumerate(texts):
        write(repo, {f"mine/{k}": "x"})
        _git_beside_landings(d, repo, "add", "-A")
        _git_beside_landings(
            d, repo, "commit", "-q", "-m", f"change {k}\n\nOrchestrator: {text}\nOrchestrator-Paths: out-{k}.txt"
        )
        if k in (9, 29):  # a landing waits for the person's commits: a pause lets one move the branch between them
            before = len(_landed_on(repo))
            _wait("a landing between the commits", lambda n=before: len(_landed_on(repo)) > n, timeout=90)
    jobs = _wait("50 jobs", lambda: len(js := d.cli_json("status")) >= len(texts) and js, timeout=60)
    assert sorted(j["text"] for j in jobs) == sorted(texts)
    lines = _wait("50 hook.log lines", lambda: len(ls := _log_lines(d)) >= len(texts) and ls, timeout=60)
    assert len(lines) == len(texts) and all("sent: queued" in ln for ln in lines), lines
    assert len(_landed_on(repo)) >= 2, "no landing moved the branch between the commits: the test proves nothing"


def _landed_on(repo: Path) -> list[str]:
    """The landings that moved the checked-out branch (HEAD's reflog entries the daemon wrote)."""
    return [ln for ln in git(repo, "reflog", "HEAD", "--format=%gs").splitlines() if ln.startswith("orchestrator: ")]


def test_hook_status_says_when_heads_reflog_is_off(make_repo, daemon_factory) -> None:
    """The hook names its commit from HEAD's reflog: with the reflog off, install and status say how to turn it on."""
    repo = make_repo()
    d = daemon_factory()
    git(repo, "config", "core.logAllRefUpdates", "false")
    out = d.cli("hook", "install", "--repo", str(repo))
    assert out.returncode == 0 and "git config core.logAllRefUpdates true" in out.stderr + out.stdout, out
    out = d.cli("hook", "status", "--repo", str(repo), "--json")
    status = {h["hook"]: h for h in json.loads(out.stdout)["hooks"]}
    assert out.returncode == 1 and "core.logAllRefUpdates" in status["post-commit"]["detail"]
    git(repo, "config", "core.logAllRefUpdates", "true")
    status = {h["hook"]: h for h in d.cli_json("hook", "status", "--repo", str(repo))["hooks"]}
    assert status["post-commit"]["python_ok"] and status["post-commit"]["detail"] == "ok"


# What a landing does to the checked-out branch: a commit on top, the ref moved with the daemon's reflog message.
LANDING_NOW = """#!/bin/sh
landed=$(git commit-tree -p HEAD -m "Merge orchestrator job 9: theirs" "HEAD^{tree}")
git update-ref -m "orchestrator: land job 9" HEAD "$landed"
"""


def test_the_hook_names_its_own_commit_when_a_landing_moved_the_branch_first(make_repo, tmp_path) -> None:
    """A landing between the commit and the hook reading it: both our hook and another tool's line name the commit."""
    python = tmp_path / "python-recorder"
    python.write_text(RECORDER)
    python.chmod(0o755)
    calls = Path(str(python) + ".calls")
    repo = make_repo()
    (repo / ".git" / "hooks" / "post-commit").write_text(LANDING_NOW)
    (repo / ".git" / "hooks" / "post-commit").chmod(0o755)
    hooks.install(repo, python=str(python))  # the landing runs first, as a chained hook
    write(repo, {"a.txt": "1"})
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "mine\n\nOrchestrator: true mine")
    assert git(repo, "log", "-1", "--format=%s") == "Merge orchestrator job 9: theirs"
    _wait("the hook's Python start", lambda: calls.exists() and calls.read_text())
    assert calls.read_text().split()[2:] == ["post-commit", git(repo, "rev-parse", "HEAD~1"), "main"]
    # Another tool owns the hooks (husky): the line `hook install` prints for it names the commit the same way.
    hooks.uninstall(repo)
    calls.unlink()
    git(repo, "config", "core.hooksPath", ".husky")
    (repo / ".husky").mkdir()
    (repo / ".husky" / "post-commit").write_text(LANDING_NOW + hooks.run_line("post-commit", str(python)) + "\n")
    (repo / ".husky" / "post-commit").chmod(0o755)
    write(repo, {"a.txt": "2"})
    git(repo, "add", "a.txt")
    git(repo, "commit", "-qm", "mine again\n\nOrchestrator: true again")
    _wait("the husky line's Python start", lambda: calls.exists() and calls.read_text())
    assert calls.read_text().split()[2:] == ["post-commit", git(repo, "rev-parse", "HEAD~1"), "main"]
