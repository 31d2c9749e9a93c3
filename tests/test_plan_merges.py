"""Which past changes that met would not have merged: a real repository's commits merged three ways."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from orchestrator.plan import merges
from orchestrator.plan.history import mine
from orchestrator.plan.merges import Result
from tests.conftest import git, write

LINES = "".join(f"line {i}\n" for i in range(1, 31))


_CLOCK = iter(range(1_700_000_000, 1_800_000_000, 60))


def commit(repo: Path, files: dict[str, str], message: str) -> str:
    """Commit `files`, a minute after the last commit (history is mined in time order)."""
    write(repo, files)
    git(repo, "add", "-A")
    when = f"{next(_CLOCK)} +0000"
    subprocess.run(
        ["git", "commit", "-q", "-m", message],
        cwd=repo,
        check=True,
        env={**os.environ, "GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when},
    )
    return git(repo, "rev-parse", "HEAD")


def objects(repo: Path) -> set[str]:
    """Every object the repository holds, loose or packed."""
    out = git(repo, "cat-file", "--batch-all-objects", "--batch-check=%(objectname)")
    return set(out.split())


def test_distant_edits_merge_a_rewrite_of_the_same_lines_conflicts_an_edit_of_new_lines_depends(
    make_repo: Callable[..., Path],
) -> None:
    """Three pairs in one file: edits far apart merge clean; two edits of one line (the later made beside the
    earlier, on its parent) conflict; an edit of the lines the earlier change added does not even apply without
    it (dependent). Both of the last two are pairs that would not merge."""
    repo = make_repo(files={"src/app.py": LINES, "CHANGES.rst": "- old\n"})
    base = git(repo, "rev-parse", "HEAD")
    top = commit(repo, {"src/app.py": LINES.replace("line 2\n", "line 2 top\n")}, "edit the top")
    bottom = commit(repo, {"src/app.py": LINES.replace("line 2\n", "line 2 top\n").replace("line 28\n", "b\n")}, "b")
    changes, _ = mine(repo, "HEAD", base)
    assert merges.record(repo, changes) == [merges.Met(top, bottom, ("src/app.py",), Result.CLEAN)]

    git(repo, "checkout", "-q", "-b", "side", base)
    first = commit(repo, {"src/app.py": LINES.replace("line 9\n", "nine, first\n")}, "first")
    git(repo, "checkout", "-q", "-b", "beside", base)  # made beside `first`, on its parent, merged after it
    second = commit(repo, {"src/app.py": LINES.replace("line 9\n", "nine, second\n")}, "second")
    git(repo, "checkout", "-q", "side")
    subprocess.run(["git", "merge", "-q", "beside"], cwd=repo, capture_output=True, check=False)  # conflicts
    merged = commit(repo, {"src/app.py": LINES.replace("line 9\n", "nine, both\n")}, "merge beside")
    on_it = commit(repo, {"src/app.py": LINES.replace("line 9\n", "nine, both, then more\n")}, "builds on it")
    changes, _ = mine(repo, "HEAD", base)
    assert [c.sha for c in changes] == [first, second, on_it]  # the merge itself is no change
    got = {(m.earlier, m.later): m.result for m in merges.record(repo, changes)}
    assert got[first, second] is Result.CONFLICT  # it applies on first's base, but not beside it
    assert got[second, on_it] is Result.DEPENDENT  # its lines exist only once the merge is in
    assert not Result.CONFLICT.merges and not Result.DEPENDENT.merges and Result.CLEAN.merges
    del merged


def test_changes_that_meet_in_a_changelog_only_or_far_apart_are_no_pair(make_repo: Callable[..., Path]) -> None:
    """Two changes that meet only in a changelog (union-merged) are no pair; neither are two further apart than
    the window."""
    repo = make_repo(files={"CHANGES.rst": "- old\n", "a.py": LINES, "b.py": LINES})
    base = git(repo, "rev-parse", "HEAD")
    one = commit(repo, {"CHANGES.rst": "- one\n- old\n", "a.py": LINES + "one\n"}, "one")
    commit(repo, {"CHANGES.rst": "- two\n- one\n- old\n", "b.py": LINES + "two\n"}, "two")
    changes, _ = mine(repo, "HEAD", base)
    assert merges.record(repo, changes, ["CHANGES*"]) == []
    assert len(merges.record(repo, changes)) == 1  # without the changelog rule they meet there
    three = commit(repo, {"a.py": LINES + "one\nthree\n"}, "three")
    changes, _ = mine(repo, "HEAD", base)
    assert [(m.earlier, m.later) for m in merges.record(repo, changes, ["CHANGES*"])] == [(one, three)]
    assert merges.record(repo, changes, ["CHANGES*"], window=1) == []


def test_merging_past_changes_writes_nothing_into_the_repository(make_repo: Callable[..., Path]) -> None:
    """The merges happen in a scratch repository borrowing the objects: the repository read holds no new object."""
    repo = make_repo(files={"f.py": LINES})
    base = git(repo, "rev-parse", "HEAD")
    commit(repo, {"f.py": LINES.replace("line 3\n", "three\n")}, "a")
    commit(repo, {"f.py": LINES.replace("line 3\n", "three\n").replace("line 25\n", "x\n")}, "b")
    before = objects(repo)
    changes, _ = mine(repo, "HEAD", base)
    assert [m.result for m in merges.record(repo, changes)] == [Result.CLEAN]
    assert objects(repo) == before


def test_the_table_counts_a_pair_at_each_level_of_each_area_it_met_in() -> None:
    """A pair that met in `src/pkg/a.py` and `docs/x.md` counts under ROOT once, `src`, `src/pkg` and `docs`."""
    mets = [
        merges.Met("1", "2", ("docs/x.md", "src/pkg/a.py"), Result.DEPENDENT),
        merges.Met("2", "3", ("src/pkg/b.py",), Result.CLEAN),
        merges.Met("3", "4", ("README.md",), Result.CONFLICT),
    ]
    assert merges.table(mets) == (
        ("", 3, 2),
        ("README.md", 1, 1),
        ("docs", 1, 1),
        ("src", 2, 1),
        ("src/pkg", 2, 1),
    )
