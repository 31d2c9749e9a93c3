"""In-memory merges: conflicts between two jobs' trees, and the merge a landing would make."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pygit2

from orchestrator.git.merging import merge_conflicts, merge_for_landing, tree_of_worktree
from orchestrator.git.workspace import Workspace
from tests.conftest import git, workspace, write

LINES = "".join(f"line {i}\n" for i in range(1, 21))


def branch(repo: Path, name: str, base: str, files: dict[str, str], deleted: tuple[str, ...] = ()) -> str:
    """Commit `files` (and delete `deleted`) on a new branch `name` from `base`; return its sha."""
    git(repo, "checkout", "-q", "-b", name, base)
    write(repo, files)
    for path in deleted:
        git(repo, "rm", "-q", path)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", f"{name} change")
    sha = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    return sha


def blob(repo: Path, rev: str, path: str) -> str:
    return git(repo, "show", f"{rev}:{path}") + "\n"


def setup(make_repo: Callable[..., Path], extra: dict[str, str] | None = None) -> tuple[Path, str]:
    repo = make_repo(files={"f.txt": LINES, "CHANGES.rst": "Changes\n=======\n\n- old entry\n", **(extra or {})})
    return repo, git(repo, "rev-parse", "HEAD")


def test_disjoint_hunks_merge_clean(make_repo: Callable[..., Path]) -> None:
    """One file changed in distant hunks by both sides is not a conflict."""
    repo, base = setup(make_repo)
    ours = branch(repo, "ours", base, {"f.txt": LINES.replace("line 2\n", "line 2 ours\n")})
    theirs = branch(repo, "theirs", base, {"f.txt": LINES.replace("line 19\n", "line 19 theirs\n")})
    assert merge_conflicts(repo, base, ours, theirs) == ()


def test_same_lines_conflict(make_repo: Callable[..., Path]) -> None:
    """Both sides changing the same line is a conflict on that path."""
    repo, base = setup(make_repo)
    ours = branch(repo, "ours", base, {"f.txt": LINES.replace("line 5\n", "five ours\n")})
    theirs = branch(repo, "theirs", base, {"f.txt": LINES.replace("line 5\n", "five theirs\n")})
    assert merge_conflicts(repo, base, ours, theirs) == ("f.txt",)


def test_worktree_trees_conflict(make_repo: Callable[..., Path], tmp_path: Path) -> None:
    """Uncommitted states of two job worktrees (via tree_of_worktree) are compared like commits."""
    repo, base = setup(make_repo)
    trees = []
    for n, text in ((1, "one\n"), (2, "two\n")):
        wt = workspace(repo, tmp_path / f"wt{n}", base, f"orchestrator/{n}")
        write(wt, {"f.txt": LINES.replace("line 7\n", text), f"only{n}.txt": "x\n"})
        trees.append(tree_of_worktree(wt))
    quarantines = [Workspace(tmp_path / f"wt{n}").quarantine for n in (1, 2)]
    assert all(quarantines), "each tree went to its workspace's quarantine, not the repository"
    assert merge_conflicts(repo, base, trees[0], trees[1], objects=quarantines) == ("f.txt",)  # type: ignore[arg-type]


def test_mergeable_changelog_is_union_merged(make_repo: Callable[..., Path]) -> None:
    """CHANGES.rst edited at the top by both sides is no conflict when mergeable; the merge keeps both lines."""
    repo, base = setup(make_repo)
    top = "Changes\n=======\n\n"
    ours = branch(repo, "ours", base, {"CHANGES.rst": top + "- ours\n- old entry\n"})
    theirs = branch(repo, "theirs", base, {"CHANGES.rst": top + "- theirs\n- old entry\n"})
    assert merge_conflicts(repo, base, ours, theirs) == ("CHANGES.rst",)
    assert merge_conflicts(repo, base, ours, theirs, lambda p: p == "CHANGES.rst") == ()

    result = merge_for_landing(repo, ours, theirs, lambda p: p == "CHANGES.rst")
    assert result.kind == "merge" and result.sha is not None
    assert blob(repo, result.sha, "CHANGES.rst") == top + "- ours\n- theirs\n- old entry\n"


def test_mergeable_does_not_hide_other_conflicts(make_repo: Callable[..., Path]) -> None:
    """A union-merged changelog beside a real conflict still reports the real one, and only it."""
    repo, base = setup(make_repo)
    ours = branch(repo, "ours", base, {"CHANGES.rst": "- ours\n", "f.txt": "ours\n"})
    theirs = branch(repo, "theirs", base, {"CHANGES.rst": "- theirs\n", "f.txt": "theirs\n"})
    assert merge_conflicts(repo, base, ours, theirs, lambda p: p.endswith(".rst")) == ("f.txt",)
    result = merge_for_landing(repo, ours, theirs, lambda p: p.endswith(".rst"))
    assert (result.kind, result.sha, result.conflicts) == ("conflict", None, ("f.txt",))


def test_mergeable_modify_delete_keeps_the_edit(make_repo: Callable[..., Path]) -> None:
    """A mergeable file edited on one side and deleted on the other keeps the edited lines."""
    repo, base = setup(make_repo)
    ours = branch(repo, "ours", base, {"CHANGES.rst": "- ours\n"})
    theirs = branch(repo, "theirs", base, {}, deleted=("CHANGES.rst",))
    result = merge_for_landing(repo, ours, theirs, lambda p: p == "CHANGES.rst")
    assert result.kind == "merge" and result.sha is not None
    assert blob(repo, result.sha, "CHANGES.rst") == "- ours\n"


def test_a_union_merged_rewording_beside_an_entry_added_above_it_is_kept(make_repo: Callable[..., Path]) -> None:
    """A release rewords the changelog's heading while another job adds a section above it: both land, and the old
    heading is gone (a union that writes both sides' lines brought it back beside the new one), in every style."""
    head = "# Changes\n\n\n## Unreleased\n\n- an entry\n"
    repo, base = setup(make_repo, {"CHANGELOG.md": head})
    release = branch(repo, "release", base, {"CHANGELOG.md": head.replace("## Unreleased", "## 26.1.0")})
    cycle = branch(repo, "cycle", base, {"CHANGELOG.md": head.replace("## Unreleased", "## Next\n\n\n## Unreleased")})
    for style in ("merge", "rebase", "squash"):
        result = merge_for_landing(repo, cycle, release, lambda p: p == "CHANGELOG.md", style=style)
        assert result.sha is not None, style
        assert blob(repo, result.sha, "CHANGELOG.md") == "# Changes\n\n\n## Next\n\n\n## 26.1.0\n\n- an entry\n", style


def test_gitattributes_union_honoured(make_repo: Callable[..., Path]) -> None:
    """`merge=union` in the committed .gitattributes is honoured even when the checkout is on a branch without it."""
    repo, base = setup(make_repo, {".gitattributes": "NEWS merge=union\n", "NEWS": "- old\n"})
    ours = branch(repo, "ours", base, {"NEWS": "- ours\n- old\n"})
    theirs = branch(repo, "theirs", base, {"NEWS": "- theirs\n- old\n"})
    git(repo, "checkout", "-q", "-b", "elsewhere")
    git(repo, "rm", "-q", ".gitattributes")
    git(repo, "commit", "-q", "-m", "no attributes here")
    assert not (repo / ".gitattributes").exists()

    assert merge_conflicts(repo, base, ours, theirs) == ()
    result = merge_for_landing(repo, ours, theirs)
    assert result.kind == "merge" and result.sha is not None
    assert blob(repo, result.sha, "NEWS") == "- ours\n- theirs\n- old\n"


def test_landing_merge_kinds(make_repo: Callable[..., Path]) -> None:
    """Ancestor head → fast-forward to the job; job already in head → noop; diverged → merge commit, no ref moved."""
    repo, base = setup(make_repo)
    job = branch(repo, "job", base, {"f.txt": LINES.replace("line 1\n", "job\n")})
    other = branch(repo, "other", base, {"new.txt": "new\n"})

    ff = merge_for_landing(repo, base, job)
    assert (ff.kind, ff.sha, ff.head) == ("fast-forward", job, base)
    assert merge_for_landing(repo, job, base).kind == "noop"
    assert merge_for_landing(repo, job, job).sha == job

    refs_before = git(repo, "show-ref")
    merged = merge_for_landing(repo, other, job, message="Merge orchestrator job 3: job change")
    assert merged.kind == "merge" and merged.sha is not None
    commit = pygit2.Repository(str(repo))[merged.sha].peel(pygit2.Commit)
    assert [str(p) for p in commit.parent_ids] == [other, job]
    assert commit.message == "Merge orchestrator job 3: job change"
    assert blob(repo, merged.sha, "new.txt") == "new\n"
    assert blob(repo, merged.sha, "f.txt").startswith("job\n")
    assert git(repo, "show-ref") == refs_before


def test_tree_of_worktree_touches_nothing(make_repo: Callable[..., Path], tmp_path: Path) -> None:
    """tree_of_worktree captures tracked, deleted and untracked files; no index file (the job's or the
    daemon's) and no HEAD changes."""
    repo, base = setup(make_repo, {".gitignore": "*.log\n"})
    wt = workspace(repo, tmp_path / "wt1", base, "orchestrator/1")
    write(wt, {"f.txt": "changed\n", "untracked.txt": "u\n", "x.log": "ignored\n"})
    (wt / "CHANGES.rst").unlink()
    index_files = [wt / ".git" / "index", Workspace(wt).admin / "index"]
    status = git(wt, "--no-optional-locks", "status", "--porcelain")  # plain `status` may rewrite the index
    before = [(f.read_bytes(), f.stat().st_mtime_ns) for f in index_files], git(wt, "rev-parse", "HEAD")

    tree = str(tree_of_worktree(wt))

    assert subprocess.run(["git", "cat-file", "-e", tree], cwd=repo).returncode != 0, "nothing in the repository"
    admin = str(Workspace(wt).admin)  # the workspace's own object dir (its quarantine) has it
    assert set(git(repo, f"--git-dir={admin}", "ls-tree", "-r", "--name-only", tree).splitlines()) == {
        ".gitignore",
        "f.txt",
        "untracked.txt",
    }
    assert git(repo, f"--git-dir={admin}", "show", f"{tree}:f.txt") == "changed"
    assert ([(f.read_bytes(), f.stat().st_mtime_ns) for f in index_files], git(wt, "rev-parse", "HEAD")) == before
    assert git(wt, "--no-optional-locks", "status", "--porcelain") == status
