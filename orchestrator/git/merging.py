"""In-memory merges: "would these two changes conflict?" and "what would landing this job produce?".

Nothing here checks anything out or moves a ref; results are trees and commits in the object database.
Paths the caller declares `mergeable` (changelogs and the like) and paths with the `merge=union`
attribute are merged line-wise union (both sides' added lines kept, and their removals: `git.union`) instead
of conflicting.

Sync pygit2 code: the daemon calls it with `asyncio.to_thread`.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pygit2
from pygit2.enums import AttrCheck

from orchestrator.git import repos, union
from orchestrator.git.commits import person_of, signature
from orchestrator.git.workspace import Workspace

Mergeable = Callable[[str], bool]
"""True for a repo-relative path whose concurrent edits are merged line-wise union, never a conflict."""

MergeKind = Literal["fast-forward", "merge", "rebase", "squash", "noop", "conflict"]


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
    """Write the workspace's current files (tracked and untracked non-ignored) as a tree object, into the
    workspace's quarantine (see `git.workspace`): read it with that quarantine as an extra object dir.

    Read from the files through the workspace's admin dir, on an in-memory copy of its index (nothing on
    disk changes), so this is safe while the job still works there; the job's own git dir plays no part.
    """
    return Workspace.at(worktree).tree(record=False)


def merge_conflicts(
    repo_path: Path,
    base: str,
    ours_tree: str | pygit2.Oid,
    theirs_tree: str | pygit2.Oid,
    mergeable: Mergeable | None = None,
    objects: Sequence[Path] = (),
) -> tuple[str, ...]:
    """Paths that would conflict in a 3-way merge of two trees over `base`, like `git merge-tree`.

    `objects`: more object dirs to read the trees from (jobs' quarantines), added in memory only.

    Hunk-level: one file changed in disjoint hunks on both sides merges clean and is not reported.
    Mergeable and `merge=union` paths (attributes read from `base`'s commit and the checkout) are union
    merged and not reported, unless even a union merge cannot settle them (binary files, a rename on
    one side). Any tree-ish works for the three arguments (a commit sha is peeled to its tree).
    """
    repo = repos.open_repo(repo_path)
    for extra in objects:
        repo.odb.add_disk_alternate(str(extra))
    base_obj = repo.revparse_single(base)
    ancestor, ours, theirs = (_tree(repo, t) for t in (base_obj.id, ours_tree, theirs_tree))
    index = repo.merge_trees(ancestor, ours, theirs)
    try:
        attr_commit: pygit2.Oid | None = base_obj.peel(pygit2.Commit).id
    except (pygit2.GitError, ValueError):  # a bare tree as base: attributes from the checkout only
        attr_commit = None
    # Only the conflicts are asked for: what a union merge writes is no conflict either way.
    return _settle(repo, index, None, is_union=union_paths(repo, attr_commit, mergeable))


def workspaces_conflict(
    repo_path: Path, a: tuple[str, Path], b: tuple[str, Path], mergeable: Mergeable | None = None
) -> tuple[str, ...]:
    """Paths where the files of two workspaces of one repository, each made at its base (`(base, workspace)`),
    would conflict now: a three-way merge of both over the bases' merge base (the older base, when both come from
    one branch), hunk-level, union-mergeable paths merged. Safe while the jobs still work in them."""
    repo = repos.open_repo(repo_path)
    ancestor = repo.merge_base(repo.revparse_single(a[0]).id, repo.revparse_single(b[0]).id)
    if ancestor is None:
        raise ValueError(f"{a[0]} and {b[0]} have no common ancestor")
    ours, theirs = tree_of_worktree(a[1]), tree_of_worktree(b[1])
    return merge_conflicts(repo_path, str(ancestor), ours, theirs, mergeable, objects=_quarantines(a[1], b[1]))


def workspace_conflicts_with(
    repo_path: Path, mine: tuple[str, Path], commit: str, mergeable: Mergeable | None = None
) -> tuple[str, ...]:
    """Paths where a workspace's files (made at its base: `(base, workspace)`) would conflict now with `commit`
    (a branch head that moved on): a three-way merge over the workspace's base, as its landing would make."""
    return merge_conflicts(
        repo_path, mine[0], tree_of_worktree(mine[1]), commit, mergeable, objects=_quarantines(mine[1])
    )


def _quarantines(*worktrees: Path) -> list[Path]:
    """Where `tree_of_worktree` wrote each workspace's tree: its quarantine (never the repository's objects)."""
    return [q for w in worktrees if (q := Workspace.at(w).quarantine) is not None]


LandStyle = Literal["merge", "rebase", "squash"]  # models.LAND_STYLES, the names `_STYLES` maps


def merge_for_landing(
    repo_path: Path,
    head: str,
    job_commit: str,
    mergeable: Mergeable | None = None,
    *,
    message: str | None = None,
    style: LandStyle = "merge",
) -> MergeResult:
    """Land `job_commit` onto `head` in memory; write the resulting commit(s) to the odb, move no ref.

    - `job_commit` is already contained in `head` (or, squashed, changes nothing): noop, `sha` is `head`.
    - a conflict (any style): kind "conflict" with the paths and no commit. Mergeable and `merge=union`
      paths (attributes read from `head` and the checkout) are union merged, never a conflict.
    - otherwise the landing `style` decides the commit the branch moves to (`_STYLES`, one table):
      `merge`: fast-forward when `head` is an ancestor of `job_commit`, else a merge commit with parents
      `[head, job_commit]` and `message` (default "Merge <short sha>: <job subject>");
      `rebase`: the job's commits replayed one by one onto `head` (authors and messages kept): a linear
      history; a fast-forward when there is nothing to replay over;
      `squash`: one commit on `head` with the job's whole change and `message` (default: the job
      commit's own message): linear, one commit per job.
    """
    if style not in _STYLES:
        raise ValueError(f"unknown landing style {style!r}: use one of {', '.join(_STYLES)}")
    repo = repos.open_repo(repo_path)
    ours = repo.revparse_single(head).peel(pygit2.Commit)
    theirs = repo.revparse_single(job_commit).peel(pygit2.Commit)
    if ours.id == theirs.id or repo.descendant_of(ours.id, theirs.id):
        return MergeResult(head=str(ours.id), sha=str(ours.id), conflicts=(), kind="noop")
    return _STYLES[style](repo, ours, theirs, union_paths(repo, ours.id, mergeable), message)


def _merge(
    repo: pygit2.Repository, ours: pygit2.Commit, theirs: pygit2.Commit, is_union: Mergeable, message: str | None
) -> MergeResult:
    head_sha = str(ours.id)
    if repo.descendant_of(theirs.id, ours.id):
        return MergeResult(head=head_sha, sha=str(theirs.id), conflicts=(), kind="fast-forward")
    tree, conflicts = _merged_tree(repo, ours, theirs, is_union)
    if tree is None:
        return MergeResult(head=head_sha, sha=None, conflicts=conflicts, kind="conflict")
    if message is None:
        subject = theirs.message.splitlines()[0] if theirs.message.strip() else ""
        message = f"Merge {theirs.short_id}: {subject}"
    # Without an identity of the daemon's own, the merge is authored as the job's commit is (who queued it).
    author = signature(repo, "author", person=person_of(theirs.author))
    sha = repo.create_commit(None, author, signature(repo, "committer"), message, tree, [ours.id, theirs.id])
    return MergeResult(head=head_sha, sha=str(sha), conflicts=(), kind="merge")


def _squash(
    repo: pygit2.Repository, ours: pygit2.Commit, theirs: pygit2.Commit, is_union: Mergeable, message: str | None
) -> MergeResult:
    head_sha = str(ours.id)
    if repo.descendant_of(theirs.id, ours.id):
        tree: pygit2.Oid | None = theirs.tree_id
        conflicts: tuple[str, ...] = ()
    else:
        tree, conflicts = _merged_tree(repo, ours, theirs, is_union)
    if tree is None:
        return MergeResult(head=head_sha, sha=None, conflicts=conflicts, kind="conflict")
    if tree == ours.tree_id:
        return MergeResult(head=head_sha, sha=head_sha, conflicts=(), kind="noop")
    sha = repo.create_commit(
        None, theirs.author, signature(repo, "committer"), message or theirs.message, tree, [ours.id]
    )
    return MergeResult(head=head_sha, sha=str(sha), conflicts=(), kind="squash")


def _rebase(
    repo: pygit2.Repository, ours: pygit2.Commit, theirs: pygit2.Commit, is_union: Mergeable, message: str | None
) -> MergeResult:
    head_sha = str(ours.id)
    if repo.descendant_of(theirs.id, ours.id):
        return MergeResult(head=head_sha, sha=str(theirs.id), conflicts=(), kind="fast-forward")
    base = repo.merge_base(ours.id, theirs.id)
    todo: list[pygit2.Commit] = []
    commit = theirs
    while commit.id != base:  # first-parent walk back to the merge base: the job's own commits
        todo.append(commit)
        if not commit.parents:
            break
        commit = commit.parents[0]
    onto = ours
    for pick in reversed(todo):
        parent: pygit2.Tree = (
            pick.parents[0].tree if pick.parents else repo[repo.TreeBuilder().write()].peel(pygit2.Tree)
        )
        index = repo.merge_trees(parent, onto.tree, pick.tree)
        conflicts = _settle(repo, index, (parent, onto.tree, pick.tree), is_union=is_union)
        if conflicts:
            return MergeResult(head=head_sha, sha=None, conflicts=conflicts, kind="conflict")
        tree = index.write_tree(repo)
        if tree == onto.tree_id:
            continue  # already there: replaying it changes nothing
        oid = repo.create_commit(None, pick.author, signature(repo, "committer"), pick.message, tree, [onto.id])
        onto = repo[oid].peel(pygit2.Commit)
    if onto.id == ours.id:
        return MergeResult(head=head_sha, sha=head_sha, conflicts=(), kind="noop")
    return MergeResult(head=head_sha, sha=str(onto.id), conflicts=(), kind="rebase")


def _merged_tree(
    repo: pygit2.Repository, ours: pygit2.Commit, theirs: pygit2.Commit, is_union: Mergeable
) -> tuple[pygit2.Oid | None, tuple[str, ...]]:
    """The 3-way merge of two commits as a tree (union paths settled), or None and the conflicting paths."""
    index = repo.merge_commits(ours, theirs)
    base = repo.merge_base(ours.id, theirs.id)
    ancestor = repo[base].peel(pygit2.Tree) if base is not None else repo[repo.TreeBuilder().write()].peel(pygit2.Tree)
    conflicts = _settle(repo, index, (ancestor, ours.tree, theirs.tree), is_union=is_union)
    return (None, conflicts) if conflicts else (index.write_tree(repo), ())


_STYLES = {"merge": _merge, "rebase": _rebase, "squash": _squash}


def merged_trees(
    repo: pygit2.Repository, ancestor: pygit2.Tree, ours: pygit2.Tree, theirs: pygit2.Tree, is_union: Mergeable
) -> tuple[pygit2.Tree | None, tuple[str, ...]]:
    """Whether three trees merge: the merged tree, written to `repo`'s object database, or None and the conflicting
    paths. A union path both sides changed always merges (unless binary): it keeps `ours`' version here, its merged
    lines not asked for (a record of past changes merges hundreds of pairs)."""
    index = repo.merge_trees(ancestor, ours, theirs)
    conflicts = _settle(repo, index, None, is_union=is_union)
    if conflicts:
        return None, conflicts
    return repo[index.write_tree(repo)].peel(pygit2.Tree), ()


@contextmanager
def scratch(repo_path: Path | str) -> Iterator[pygit2.Repository]:
    """A repository that reads `repo_path`'s objects and writes its own elsewhere (a temporary directory,
    removed on exit): merges of past changes leave nothing in the repository they read."""
    source = repos.open_repo(repo_path)
    with tempfile.TemporaryDirectory(prefix="orchestrator-merges-") as tmp:
        g = Path(tmp)
        for d in ("objects/info", "refs/heads"):
            (g / d).mkdir(parents=True)
        (g / "HEAD").write_text("ref: refs/heads/main\n")
        (g / "objects" / "info" / "alternates").write_text(f"{repos.common_dir(source) / 'objects'}\n")
        yield pygit2.Repository(str(g))


def _tree(repo: pygit2.Repository, treeish: str | pygit2.Oid) -> pygit2.Tree:
    obj = repo.revparse_single(treeish) if isinstance(treeish, str) else repo[treeish]
    return obj.peel(pygit2.Tree)


def union_paths(repo: pygit2.Repository, commit: pygit2.Oid | None, mergeable: Mergeable | None) -> Mergeable:
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


def union_blob(
    repo: pygit2.Repository, base: pygit2.Oid | None, ours: pygit2.Oid, theirs: pygit2.Oid
) -> pygit2.Oid | None:
    """The line-wise union merge (`git.union`: both sides' additions and removals kept) of two versions of a file
    over `base` (None: added on both sides), written to `repo`'s object database; None for binary content."""
    texts = [b"" if oid is None else repo[oid].peel(pygit2.Blob).data for oid in (base, ours, theirs)]
    merged = union.merge(texts[0], texts[1], texts[2])
    return None if merged is None else repo.create_blob(merged)


Trees = tuple[pygit2.Tree, pygit2.Tree, pygit2.Tree]
"""A merge's (ancestor, ours, theirs)."""


def _settle(
    repo: pygit2.Repository, index: pygit2.Index, trees: Trees | None, *, is_union: Mergeable
) -> tuple[str, ...]:
    """Resolve union-mergeable conflicts in `index` (the merge of `trees`) in place, and merge again the union paths
    libgit2 settled itself; return the paths still in conflict. `trees` None: only whether it merges is wanted (a
    union path keeps ours' version, unmerged)."""
    remaining: set[str] = set()
    resolved: dict[str, pygit2.IndexEntry | None] = {}
    for ancestor, ours, theirs in list(index.conflicts or ()):
        paths = {e.path for e in (ours, theirs) if e is not None} or {ancestor.path}
        path = min(paths)
        if len(paths) > 1 or not is_union(path):  # a rename on one side is no line-wise matter
            remaining.update(paths)
        elif ours is None or theirs is None:
            # Changed on one side, deleted on the other: the union of some lines and none keeps them.
            resolved[path] = ours or theirs
        elif any(repo[e.id].peel(pygit2.Blob).is_binary for e in (ours, theirs)):
            remaining.add(path)  # binary content: no line-wise matter
        elif trees is None:
            resolved[path] = ours  # only whether it merges is asked: it does
        elif (merged := union_blob(repo, ancestor.id if ancestor else None, ours.id, theirs.id)) is None:
            remaining.add(path)
        else:
            resolved[path] = pygit2.IndexEntry(path, merged, ours.mode)
    if remaining:
        return tuple(sorted(remaining))
    for path, entry in resolved.items():
        del index.conflicts[path]
        if entry is not None:
            index.add(pygit2.IndexEntry(path, entry.id, entry.mode))
    if trees is not None:
        _union_again(repo, index, trees, is_union, settled=set(resolved))
    return ()


def _union_again(
    repo: pygit2.Repository, index: pygit2.Index, trees: Trees, is_union: Mergeable, settled: set[str]
) -> None:
    """The union paths both sides changed that the merge settled without a conflict, merged again with `git.union`:
    libgit2 runs a `merge=union` attribute of the checkout itself, writing both sides of a conflicting stretch whole
    (a reworded line back beside its new wording); the same file merges one way whoever marked it union."""
    ancestor, ours, theirs = trees
    for path in sorted(_changed(ancestor, ours) & _changed(ancestor, theirs) - settled):
        if not is_union(path):
            continue
        try:
            mine, other = ours[path], theirs[path]
            had = ancestor[path].id if path in ancestor else None
        except KeyError:
            continue
        if mine.id == other.id or mine.type_str != "blob" or other.type_str != "blob":
            continue
        if (merged := union_blob(repo, had, mine.id, other.id)) is not None:
            index.add(pygit2.IndexEntry(path, merged, mine.filemode))


def _changed(ancestor: pygit2.Tree, tree: pygit2.Tree) -> set[str]:
    """The files `tree` modified or added over `ancestor`."""
    kinds = (pygit2.enums.DeltaStatus.MODIFIED, pygit2.enums.DeltaStatus.ADDED)
    return {d.new_file.path for d in ancestor.diff_to_tree(tree).deltas if d.status in kinds}
