"""Noticing writes into the user's checkout without a sandbox: landings of other jobs are never taken for one."""

from __future__ import annotations

from orchestrator.jobs import escapes
from tests.conftest import git


def test_a_file_left_at_a_commit_between_the_heads_is_a_landing_not_an_escape(make_repo):
    """Head moved h1 → h2 → h3 (two landings) while the checkout's file still holds h2's content (the second
    landing's checkout update under way): not counted. A file matching no state of the branch is."""
    repo = make_repo(files={"a.txt": "one\n", "b.txt": "b\n"})
    before = escapes.snapshot(repo)
    for text in ("two\n", "three\n"):
        (repo / "a.txt").write_text(text)
        git(repo, "commit", "-qam", f"land {text.strip()}")
    (repo / "a.txt").write_text("two\n")  # the checkout update to h3 has not reached this file yet
    (repo / "b.txt").write_text("written by the job\n")
    after = escapes.snapshot(repo)
    assert escapes.written(repo, before, after) == ["b.txt"]


def test_no_move_and_no_change_is_nothing(make_repo):
    """Two snapshots of an untouched checkout: nothing written."""
    repo = make_repo()
    before = escapes.snapshot(repo)
    assert escapes.written(repo, before, escapes.snapshot(repo)) == []
