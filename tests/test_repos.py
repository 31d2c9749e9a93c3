"""orchestrator.git.repos: naming a repository, its branches and what changed between two commits."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.git import repos
from tests.conftest import git, write

MakeRepo = Callable[..., Path]


def test_canonical_from_subdir_and_symlink(make_repo: MakeRepo, tmp_path: Path) -> None:
    """Any path inside the repository, through a symlink or not, names its top-level work dir."""
    root = make_repo()
    link = tmp_path / "link"
    link.symlink_to(root)
    assert repos.canonical(root / "src") == root.resolve()
    assert repos.canonical(link / "docs") == root.resolve()


def test_canonical_from_linked_worktree_is_main(make_repo: MakeRepo, tmp_path: Path) -> None:
    """A linked worktree names the repository's main work tree, so all its jobs share one key."""
    root = make_repo()
    git(root, "worktree", "add", "-q", "--detach", str(tmp_path / "wt"))
    assert repos.canonical(tmp_path / "wt" / "src") == root.resolve()


def test_canonical_not_a_repository_says_git_init(tmp_path: Path) -> None:
    """A plain directory is refused with a message that says to run git init or pass --repo."""
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(repos.RepoError, match="is not inside a git repository") as err:
        repos.canonical(plain)
    assert "git init" in str(err.value) and "--repo" in str(err.value)


def test_canonical_missing_path(tmp_path: Path) -> None:
    """A path that does not exist is refused with a message saying so."""
    with pytest.raises(repos.RepoError, match="does not exist"):
        repos.canonical(tmp_path / "nope")


def test_canonical_bare_repository_says_pass_a_clone(tmp_path: Path) -> None:
    """A bare repository is refused with a message asking for the path of a clone."""
    bare = tmp_path / "bare.git"
    git(tmp_path, "init", "-q", "--bare", str(bare))
    with pytest.raises(repos.RepoError, match="is a bare repository") as err:
        repos.canonical(bare)
    assert "pass the path of a clone" in str(err.value)


def test_branch_head_and_missing_branch_names_the_fix(make_repo: MakeRepo) -> None:
    """branch_head returns the sha; a missing branch names `git branch x` and the branches that exist."""
    root = make_repo()
    git(root, "branch", "dev")
    assert repos.branch_head(root, "main") == git(root, "rev-parse", "main")
    with pytest.raises(repos.RepoError) as err:
        repos.branch_head(root, "feature")
    msg = str(err.value)
    assert "branch 'feature' does not exist" in msg
    assert "git branch feature" in msg and "--branch with one of: dev, main" in msg


def test_default_branch(make_repo: MakeRepo, tmp_path: Path) -> None:
    """default_branch is the branch HEAD points at; a repository without commits says to commit first."""
    assert repos.default_branch(make_repo(branch="trunk")) == "trunk"
    empty = tmp_path / "empty"
    empty.mkdir()
    git(empty, "init", "-q")
    with pytest.raises(repos.RepoError, match="no commits yet: commit first"):
        repos.default_branch(empty)


def test_default_branch_detached_head(make_repo: MakeRepo) -> None:
    """A detached HEAD has no default branch; the message says to check one out or pass --branch."""
    root = make_repo()
    git(root, "checkout", "-q", "--detach")
    with pytest.raises(repos.RepoError, match=r"detached.*--branch"):
        repos.default_branch(root)


def test_changed_paths_counts_both_sides_of_a_rename(make_repo: MakeRepo) -> None:
    """Modified, added, deleted and both sides of a renamed file are reported, repo-relative."""
    root = make_repo()
    old = git(root, "rev-parse", "HEAD")
    git(root, "mv", "src/a.py", "src/renamed.py")
    git(root, "rm", "-q", "docs/x.md")
    write(root, {"README.md": "changed\n", "new/deep/file.txt": "n\n"})
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "change")
    new = git(root, "rev-parse", "HEAD")
    assert repos.changed_paths(root, old, new) == {
        "src/a.py",
        "src/renamed.py",
        "docs/x.md",
        "README.md",
        "new/deep/file.txt",
    }
    assert repos.changed_paths(root, new, new) == frozenset()


def test_changed_paths_unknown_revision(make_repo: MakeRepo) -> None:
    """An unknown revision is a RepoError, not a pygit2 KeyError."""
    root = make_repo()
    with pytest.raises(repos.RepoError, match="is not a commit"):
        repos.changed_paths(root, "deadbeef" * 5, "HEAD")


def test_gitattributes_union(make_repo: MakeRepo) -> None:
    """Patterns set to merge=union are returned; ones unset later, or with other drivers, are not."""
    root = make_repo(
        files={
            ".gitattributes": (
                "# comment\n"
                "CHANGELOG.md merge=union\n"
                "*.txt text merge=union\n"
                "docs/*.md merge=union\n"
                "docs/*.md -merge\n"
                "*.lock merge=ours\n"
            ),
            "a.txt": "a\n",
        }
    )
    assert repos.gitattributes_union(root, "HEAD") == {"CHANGELOG.md", "*.txt"}
    os.remove(root / ".gitattributes")
    git(root, "commit", "-q", "-am", "drop")
    assert repos.gitattributes_union(root, "HEAD") == frozenset()
