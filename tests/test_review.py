"""Review before landing: a finished job waits `ready`, holding its paths, until `land` or `reject`."""

from __future__ import annotations

from pathlib import Path

from tests import harness
from tests.conftest import git


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
    assert git(repo, "show", f"orchestrator/{c}:docs/x.md") == "rejected", "its branch is kept for inspection"
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
