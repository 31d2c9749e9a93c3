"""Review before landing: a finished job waits `ready`, holding its paths, until `land` or `reject`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pygit2

from tests import harness
from tests.conftest import git


def _blob_id(text: str) -> str:
    return str(pygit2.hash(text.encode()))


def until(cond, timeout: float = 60.0, what: str = "condition") -> None:
    harness.until(what, cond, timeout)


def _state(d, job: int) -> str:
    return d.cli_json("show", str(job))["state"]


def test_review_mode_holds_paths_until_land_or_reject(make_repo, daemon_factory):
    """ready → diff shows it → an overlapping job waits → land lands it; reject drops one and frees its paths."""
    repo = make_repo()
    d = daemon_factory(env={"MAX_CONCURRENT_JOBS": "4"}).start()
    a = d.enqueue(repo, "echo reviewed > src/a.py", "--path", "src/a.py", "--land", "review")
    c = d.enqueue(repo, "echo rejected > docs/x.md", "--path", "docs/x.md", "--land", "review")
    until(lambda: _state(d, a) == "ready" and _state(d, c) == "ready", what="both ready")
    shown = d.cli_json("show", str(a))
    assert shown["code"] == "Ready" and f"orchestrator land {a}" in shown["reason"]
    assert git(repo, "show", "main:src/a.py") == "a = 1", "nothing lands before review"

    out = d.cli("diff", str(a))
    assert out.returncode == 0 and "+reviewed" in out.stdout and "src/a.py" in out.stdout
    head = d.cli_json("diff", str(c), "--head")
    assert head["against"] == "head" and "+rejected" in head["diff"]

    b = d.enqueue(repo, "echo second >> src/a.py", "--path", "src/")
    e = d.enqueue(repo, "echo after > docs/x.md", "--path", "docs/")
    until(lambda: (d.cli_json("why", str(b))["decision"] or {}).get("reason") == "Overlap", what="b waits")
    assert a in d.cli_json("why", str(b))["decision"]["blocking"]
    assert _state(d, e) == "planned"

    landed = d.cli("land", str(a))
    assert landed.returncode == 0, landed.stderr
    [rejected] = d.cli_json("reject", str(c))
    assert rejected["state"] == "cancelled" and rejected["code"] == "Rejected"
    assert d.cli("wait", str(a), str(b), str(e), "--timeout", "60").returncode == 0
    assert git(repo, "show", "main:src/a.py").splitlines() == ["reviewed", "second"]
    assert git(repo, "show", "main:docs/x.md") == "after", "the rejected change never landed"
    assert git(repo, "branch", "--list", f"orchestrator/{c}") == "", "nothing of a rejected job is in the repository"
    blob = _blob_id("rejected\n")
    assert subprocess.run(["git", "cat-file", "-e", blob], cwd=repo).returncode != 0, "not even its blob"
    assert "nothing of it was written" in rejected["reason"]
    assert d.cli("land", str(c)).returncode == 2, "only a ready job can be landed"


def test_review_is_a_repo_setting_too(make_repo, daemon_factory):
    """`land = "review"` under a repo's config holds its jobs without --land; --land auto overrides it."""
    repo = make_repo()
    d = daemon_factory()
    (d.home / "config").mkdir(parents=True)
    (d.home / "config" / "config.toml").write_text(f'[repos."{Path(repo).resolve()}"]\nland = "review"\n')
    d.start()
    held = d.enqueue(repo, "echo held > src/a.py", "--path", "src/a.py")
    auto = d.enqueue(repo, "echo auto > src/b.py", "--path", "src/b.py", "--land", "auto")
    assert d.cli("wait", str(auto), "--timeout", "60").returncode == 0
    until(lambda: _state(d, held) == "ready", what="held ready")
    assert d.cli_json("show", str(held))["land"] == "review"


def _objects_bytes(repo: Path) -> int:
    return sum(p.stat().st_size for p in (repo / ".git" / "objects").rglob("*") if p.is_file())


def test_a_review_jobs_result_stays_out_of_the_repository_until_it_lands(make_repo, daemon_factory):
    """A review job writes 8 files of 3 MiB of noise: while it waits `ready`, after `reject` and after `clean`, the
    repository's objects have not grown by its size (its blobs are in its workspace, not in your .git); one that
    is landed brings its objects along."""
    repo = make_repo()
    d = daemon_factory(env={"MAX_CONCURRENT_JOBS": "4"}).start()
    before = _objects_bytes(repo)
    noise = "for i in 1 2 3 4 5 6 7 8; do head -c 3000000 /dev/urandom > big$i.bin; done"
    dropped = d.enqueue(repo, noise, "--path", "big1.bin", "--land", "review")
    kept = d.enqueue(repo, "head -c 2000000 /dev/urandom > small.bin", "--path", "small.bin", "--land", "review")
    until(lambda: _state(d, dropped) == "ready" and _state(d, kept) == "ready", what="both ready")
    assert _objects_bytes(repo) - before < 1_000_000, "nothing of either result is in the repository yet"
    assert "big1.bin" in d.cli("diff", str(dropped)).stdout, "yet its diff is there to review"
    assert d.cli("reject", str(dropped)).returncode == 0
    assert d.cli("clean", str(dropped)).returncode == 0
    assert _objects_bytes(repo) - before < 1_000_000, "a rejected job leaves the repository as it was"
    assert d.cli("land", str(kept)).returncode == 0
    assert d.cli("wait", str(kept), "--timeout", "60").returncode == 0
    assert _objects_bytes(repo) - before > 1_900_000, "a landed job's objects are in the repository"
    assert subprocess.run(["git", "fsck", "--no-dangling"], cwd=repo, capture_output=True).returncode == 0
