"""In-memory merges: "would these two changes conflict?" and "what would landing this job produce?".

Nothing here checks anything out or moves a ref; results are trees and commits in the object database.
Paths the caller declares `mergeable` (changelogs and the like) and paths with the `merge=union`
attribute are merged line-wise union (both sides' lines kept) instead of conflicting.

Sync pygit2 code: the daemon calls it with `asyncio.to_thread`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pygit2
from pygit2.enums import AttrCheck, MergeFavor

from orchestrator.git import repos
from orchestrator.git.commits import signature

Mergeable = Callable[[str], bool]
"""True for a repo-relative path whose concurrent edits are merged line-wise union, never a conflict."""

MergeKind = Literal["fast-forward", "merge", "noop", "conflict"]


@dataclass(frozen=True, slots=True)
class MergeResult:
    """What landing `job_commit` onto `head` would produce. No ref has moved."""

    head: str
    """The branch head merged onto (full sha)."""
    sha: str | None
    """The commit the branch should point at next: the job commit (fast-forward), a new merge commit
    (merge), `head` itself (noop); None on conflict."""
    conflicts: tuple[str, ...]
    """Paths that conflict, sorted; empty unless `kind == "conflict"`."""
    kind: MergeKind


def tree_of_worktree(worktree: Path) -> pygit2.Oid:
    """Write the worktree's current state (tracked and untracked non-ignored files) as a tree object.

    Works on an in-memory copy of the worktree's index: the index file on disk and HEAD are untouched,
    so this is safe while an agent works (and runs git) in that worktree.
    """
    repo = repos.open_repo(worktree)
    index = repo.index  # read from disk; changes below stay in memory because we never `write()` it
    index.add_all()
    return index.write_tree()


def merge_conflicts(
    repo_path: Path,
    base: str,
    ours_tree: str | pygit2.Oid,
    theirs_tree: str | pygit2.Oid,
    mergeable: Mergeable | None = None,
) -> tuple[str, ...]:
    """Paths that would conflict in a 3-way merge of two trees over `base`, like `git merge-tree`.

    Hunk-level: one file changed in disjoint hunks on both sides merges clean and is not reported.
    Mergeable and `merge=union` paths (attributes read from `base`'s commit and the checkout) are union
    merged and not reported, unless even a union merge cannot settle them (binary files, a rename on
    one side). Any tree-ish works for the three arguments (a commit sha is peeled to its tree).
    """
    repo = repos.open_repo(repo_path)
    base_obj = repo.revparse_single(base)
    ancestor, ours, theirs = (_tree(repo, t) for t in (base_obj.id, ours_tree, theirs_tree))
    index = repo.merge_trees(ancestor, ours, theirs)
    try:
        attr_commit: pygit2.Oid | None = base_obj.peel(pygit2.Commit).id
    except (pygit2.GitError, ValueError):  # a bare tree as base: attributes from the checkout only
        attr_commit = None
    return _settle(
        repo,
        index,
        union=lambda: repo.merge_trees(ancestor, ours, theirs, favor=MergeFavor.UNION),
        is_union=_union_paths(repo, attr_commit, mergeable),
    )


def merge_for_landing(
    repo_path: Path,
    head: str,
    job_commit: str,
    mergeable: Mergeable | None = None,
    *,
    message: str | None = None,
) -> MergeResult:
    """Merge `job_commit` onto `head` in memory; write the merge commit to the odb, move no ref.

    - `head` is an ancestor of `job_commit`: fast-forward, `sha` is the job commit.
    - `job_commit` is already contained in `head`: noop, `sha` is `head`.
    - otherwise a 3-way merge (recursive over several merge bases, as `git merge`); mergeable and
      `merge=union` paths (attributes read from `head` and the checkout) are union merged; any other
      conflict gives kind "conflict" with the paths and no commit; a clean result gives a merge commit
      with parents `[head, job_commit]` and `message` (default: "Merge <short sha>: <job subject>").
    """
    repo = repos.open_repo(repo_path)
    ours = repo.revparse_single(head).peel(pygit2.Commit)
    theirs = repo.revparse_single(job_commit).peel(pygit2.Commit)
    head_sha = str(ours.id)
    if ours.id == theirs.id or repo.descendant_of(ours.id, theirs.id):
        return MergeResult(head=head_sha, sha=head_sha, conflicts=(), kind="noop")
    if repo.descendant_of(theirs.id, ours.id):
        return MergeResult(head=head_sha, sha=str(theirs.id), conflicts=(), kind="fast-forward")

    index = repo.merge_commits(ours, theirs)
    conflicts = _settle(
        repo,
        index,
        union=lambda: repo.merge_commits(ours, theirs, favor=MergeFavor.UNION),
        is_union=_union_paths(repo, ours.id, mergeable),
    )
    if conflicts:
        return MergeResult(head=head_sha, sha=None, conflicts=conflicts, kind="conflict")
    tree = index.write_tree(repo)
    if message is None:
        subject = theirs.message.splitlines()[0] if theirs.message.strip() else ""
        message = f"Merge {theirs.short_id}: {subject}"
    sha = repo.create_commit(
        None, signature(repo, "author"), signature(repo, "committer"), message, tree, [ours.id, theirs.id]
    )
    return MergeResult(head=head_sha, sha=str(sha), conflicts=(), kind="merge")


def _tree(repo: pygit2.Repository, treeish: str | pygit2.Oid) -> pygit2.Tree:
    obj = repo.revparse_single(treeish) if isinstance(treeish, str) else repo[treeish]
    return obj.peel(pygit2.Tree)


def _union_paths(repo: pygit2.Repository, commit: pygit2.Oid | None, mergeable: Mergeable | None) -> Mergeable:
    """Mergeable by the caller's rule or by the `merge=union` attribute.

    libgit2 applies `merge=union` itself, but reads `.gitattributes` only from the checkout and its
    index, which may be on another branch (or absent, in a bare repo); so read the commit's too.
    """
    flags = AttrCheck.INCLUDE_COMMIT if commit is not None else AttrCheck.FILE_THEN_INDEX

    def is_union(path: str) -> bool:
        if mergeable is not None and mergeable(path):
            return True
        return repo.get_attr(path, "merge", flags=flags, commit=commit) == "union"

    return is_union


def _settle(
    repo: pygit2.Repository, index: pygit2.Index, *, union: Callable[[], pygit2.Index], is_union: Mergeable
) -> tuple[str, ...]:
    """Resolve union-mergeable conflicts in `index` in place; return the paths still in conflict, sorted."""
    if index.conflicts is None:
        return ()
    remaining: set[str] = set()
    resolved: dict[str, pygit2.IndexEntry | None] = {}
    union_index: pygit2.Index | None = None
    for ancestor, ours, theirs in list(index.conflicts):
        paths = {e.path for e in (ours, theirs) if e is not None} or {ancestor.path}
        path = min(paths)
        if len(paths) > 1 or not is_union(path):  # a rename on one side is no line-wise matter
            remaining.update(paths)
        elif ours is None or theirs is None:
            # Changed on one side, deleted on the other: the union of some lines and none keeps them.
            resolved[path] = ours or theirs
        else:
            # A second merge with the union favour, used only for its entries of these paths: libgit2's
            # own union of the three blobs, with the same rename and recursion handling.
            union_index = union_index or union()
            try:
                resolved[path] = union_index[path]
            except KeyError:  # still a conflict with the union favour: binary content
                remaining.add(path)
    if remaining:
        return tuple(sorted(remaining))
    for path, entry in resolved.items():
        del index.conflicts[path]
        if entry is not None:
            index.add(pygit2.IndexEntry(path, entry.id, entry.mode))
    return ()
