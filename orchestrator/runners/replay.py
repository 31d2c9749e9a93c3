"""The `replay` runner: apply a recorded change to the job's worktree after a given duration.

No model, no agent: real diffs applied with real git, for benchmarks, demos and tests. The job's text
says what to replay, in one of two forms:

- lines of `key: value` (any other line is free text, so the first line can be the commit subject)::

      Fix the typo in the tutorial
      commit: 3f2a9c1        # a commit (sha or ref) of the same repository: its change against its parent
      after: 2.5             # seconds to wait before applying (default 0)
      hold: 4                # seconds it goes on running after applying, as an agent testing its edit (default 0)
      conflict: theirs       # on a conflicting hunk keep the recorded side (default: fail)
      end: 9b1c0de           # with theirs: a hunk the base has as this later commit has it stays (see below)

- or one JSON object: `{"commit": "3f2a9c1", "after": 2.5}` / `{"patch": "/abs/change.patch"}`.

`commit` is cherry-picked onto the worktree (a three-way merge with the commit's first parent as base, as
`git cherry-pick --no-commit` does), so a change recorded on an older base still applies where it
would for a person; a real conflict is a conflict (code `Conflict`: the daemon runs the job again once the
jobs beside it have landed, or leaves it conflicted), unless `conflict: theirs` (as `git cherry-pick -X
theirs`: a change recorded on top of one that has not landed yet still runs, and the daemon's landing check
sees the conflict, re-running the job on the moved base; a union-mergeable file, a changelog, keeps both
sides' lines). `end`, a commit recorded after it (the recorded end state): a conflicting hunk whose base side is
what `end` has there, and whose recorded side is not, keeps the base side: a change recorded later (made on top of
this one) landed first, and applying this older one after it does not undo it. `patch` is a unified diff file
(`git diff` / `git format-patch` output) applied to the worktree as `git apply` does. The daemon commits
the result like any runner's. The runner logs `replay.started` and `replay.applied` (the benchmark's
clock for when the work itself began and ended).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pygit2

from orchestrator import logging as olog
from orchestrator.core import claims
from orchestrator.core.models import Code
from orchestrator.git import merging, union
from orchestrator.git.merging import Mergeable
from orchestrator.git.workspace import Workspace
from orchestrator.runners.base import RunContext, RunResult, note

_KEYS = ("commit", "patch", "after", "hold", "conflict", "end")
_CONFLICT = ("fail", "theirs")
_LINE = re.compile(r"^\s*(commit|patch|after|hold|conflict|end)\s*:\s*(\S.*?)\s*(?:#.*)?$", re.I)


class ReplayError(ValueError):
    """The replay spec is malformed or the recorded change does not apply; the message says which."""


class NotApplied(ReplayError):
    """The recorded change does not apply on this base (a conflict): another base may take it."""


@dataclass(frozen=True, slots=True)
class ReplaySpec:
    commit: str | None = None
    patch: str | None = None
    after: float = 0.0
    theirs: bool = False
    """On a conflicting hunk keep the recorded change's side instead of failing (commits only)."""
    hold: float = 0.0
    """Seconds the job goes on running after its change is in the worktree (an agent testing its edit): the
    window in which a job beside it can meet the change while both run."""
    end: str | None = None
    """With `theirs`: a commit recorded after this one; a conflicting hunk the base already has as it has it stays."""


def parse(text: str) -> ReplaySpec:
    """Read a replay spec from a job's text (JSON object, or `key: value` lines)."""
    raw: dict[str, object]
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            loaded = json.loads(stripped)
        except json.JSONDecodeError as e:
            raise ReplayError(f"the replay spec is not valid JSON ({e})") from None
        if not isinstance(loaded, dict):
            raise ReplayError("the replay spec must be a JSON object")
        unknown = set(loaded) - set(_KEYS)
        if unknown:
            raise ReplayError(f"unknown replay keys {sorted(unknown)}: use {', '.join(_KEYS)}")
        raw = loaded
    else:
        raw = {}
        for line in text.splitlines():
            if m := _LINE.match(line):
                raw[m.group(1).lower()] = m.group(2)
    commit, patch, after, end = raw.get("commit"), raw.get("patch"), raw.get("after", 0), raw.get("end")
    conflict = str(raw.get("conflict", "fail")).lower()
    if conflict not in _CONFLICT:
        raise ReplayError(f"conflict: expected fail or theirs, got {conflict!r}")
    if (commit is None) == (patch is None):
        raise ReplayError(
            "a replay job names exactly one change: a line `commit: SHA` (a commit of this repository) "
            "or `patch: /path/to/file.patch`, optionally `after: SECONDS`"
        )
    delay, hold = _seconds("after", after), _seconds("hold", raw.get("hold", 0))
    return ReplaySpec(
        commit=None if commit is None else str(commit),
        patch=None if patch is None else str(patch),
        after=delay,
        theirs=conflict == "theirs",
        hold=hold,
        end=None if end is None else str(end),
    )


def _seconds(key: str, value: object) -> float:
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ReplayError(f"{key}: expected seconds, got {value!r}") from None
    if seconds < 0:
        raise ReplayError(f"{key}: expected seconds >= 0, got {seconds:g}")
    return seconds


def apply_commit(
    worktree: Path, rev: str, theirs: bool = False, mergeable: Mergeable | None = None, end: str | None = None
) -> list[str]:
    """Cherry-pick `rev`'s change (against its first parent) into the worktree, uncommitted. Returns its paths.

    `theirs`: a conflicting hunk takes the recorded change's side (`-X theirs`) instead of failing, but in a
    union-mergeable file (`mergeable`, or `merge=union`) both sides' lines stay, as a landing merges them, and a
    hunk the base has as `end` (a commit recorded later) has it keeps the base's side."""
    ws = Workspace.at(worktree)
    repo = ws.repo()
    commit, later = _commit(repo, rev), _commit(repo, end) if end else None
    head = repo[ws.head()].peel(pygit2.Commit)
    tree = replayed_on(repo, commit, head, theirs, mergeable, later)
    changed = sorted(_paths(head.tree.diff_to_tree(tree)))
    # Write the merged tree into the workspace (its admin index follows), leaving HEAD where it is: the
    # daemon commits the result like any runner's.
    repo.checkout_tree(tree, strategy=pygit2.enums.CheckoutStrategy.FORCE)
    return changed


def _commit(repo: pygit2.Repository, rev: str) -> pygit2.Commit:
    try:
        return repo.revparse_single(rev).peel(pygit2.Commit)
    except (KeyError, ValueError, pygit2.GitError) as e:
        raise ReplayError(f"commit {rev!r} is not a commit of this repository ({e})") from None


def replayed_on(
    repo: pygit2.Repository,
    commit: pygit2.Commit,
    onto: pygit2.Commit,
    theirs: bool,
    mergeable: Mergeable | None = None,
    end: pygit2.Commit | None = None,
) -> pygit2.Tree:
    """`replayed_tree` onto a commit, as the replay runner applies a change: NotApplied also when the change
    deletes or edits a file `onto` has not had yet."""
    if commit.parents and (absent := _needs_unborn(repo, commit, onto)):
        # A three-way merge takes "deleted by both" as clean, but the change was made where the file was: it
        # needs the change that adds it (a release folding news fragments another job adds). Not settled by
        # `theirs` either: no landing check would see it later, the deletion would just be missing. An edit of such
        # a file is a modify/delete conflict, which `theirs` would settle by writing the whole file as the change
        # left it, ahead of the change that makes it (a move, or the first version): that one's landing then
        # writes over it or beside it, and the edit is broken or lost.
        said = " and ".join(f"{verb} {', '.join(paths)}" for verb, paths in absent.items())
        raise NotApplied(f"commit {commit.id} {said}, which this base does not have yet")
    return replayed_tree(repo, commit, onto.tree, theirs, mergeable, end)


def replayed_tree(
    repo: pygit2.Repository,
    commit: pygit2.Commit,
    onto: pygit2.Tree,
    theirs: bool,
    mergeable: Mergeable | None = None,
    end: pygit2.Commit | None = None,
) -> pygit2.Tree:
    """`onto` with `commit`'s change (against its first parent) merged in, three-way; with `theirs`, each
    conflict settled with the recorded side (a file it deleted, deleted), except that a union-mergeable file
    (`mergeable`, or `merge=union`: a changelog) keeps the lines of both, as a person adding an entry beside
    another does, and that a hunk `onto` has as `end` (a later recorded state, made on top of `commit`) has it, and
    the recorded side does not, keeps `onto`'s side (a later change made on this one landed first). ReplayError on a
    conflict left."""
    base_tree = commit.parents[0].tree if commit.parents else repo.get(repo.TreeBuilder().write())
    assert isinstance(base_tree, pygit2.Tree)
    favor = pygit2.enums.MergeFavor.THEIRS if theirs else pygit2.enums.MergeFavor.NORMAL
    index = repo.merge_trees(base_tree, onto, commit.tree, favor=favor)
    if theirs:
        # Only a state made on top of this change is newer than it: of two branches replayed side by side (without
        # their merges), the end of one says nothing of the other's lines.
        newer = end.tree if end is not None and repo.descendant_of(end.id, commit.id) else None
        _union_merged(repo, index, base_tree, onto, commit, mergeable, newer)
        if newer is not None:
            is_union = merging.union_paths(repo, commit.id, mergeable)
            _newer_kept(repo, index, base_tree, onto, commit, newer, is_union)
    if index.conflicts and theirs:
        _settle_theirs(index)
    if index.conflicts:
        paths = sorted({(e.path) for entries in index.conflicts for e in entries if e is not None})
        raise NotApplied(f"commit {commit.id} does not apply on this base: conflict in {', '.join(paths)}")
    tree = repo.get(index.write_tree(repo))
    assert isinstance(tree, pygit2.Tree)
    return tree


_CHANGED = (pygit2.enums.DeltaStatus.DELETED, pygit2.enums.DeltaStatus.MODIFIED, pygit2.enums.DeltaStatus.TYPECHANGE)


def _needs_unborn(repo: pygit2.Repository, commit: pygit2.Commit, onto: pygit2.Commit) -> dict[str, list[str]]:
    """The paths `commit` deletes or edits (against its first parent) that `onto` has not had yet: absent from
    `onto` and from the history it shares with the change (their merge base). One the merge base has was deleted
    already by something `onto` has (two branches removing one file): "deleted by both" is then what it is, clean,
    and an edit of it a conflict like any other. By what it does: `deletes`, `edits`."""
    parent = commit.parents[0]
    gone = [
        d
        for d in parent.tree.diff_to_tree(commit.tree).deltas
        if d.status in _CHANGED and d.old_file.path not in onto.tree
    ]
    if not gone:
        return {}
    shared = repo.merge_base(parent.id, onto.id)
    had = repo[shared].peel(pygit2.Commit).tree if shared is not None else None
    out: dict[str, list[str]] = {}
    for d in sorted(gone, key=lambda d: d.old_file.path):
        if had is None or d.old_file.path not in had:
            verb = "deletes" if d.status == pygit2.enums.DeltaStatus.DELETED else "edits"
            out.setdefault(verb, []).append(d.old_file.path)
    return out


def _union_merged(
    repo: pygit2.Repository,
    index: pygit2.Index,
    base: pygit2.Tree,
    onto: pygit2.Tree,
    commit: pygit2.Commit,
    mergeable: Mergeable | None,
    newer: pygit2.Tree | None = None,
) -> None:
    """The union-mergeable files the recorded change edits, merged line-wise union into `index` (in place of the
    recorded side a conflicting hunk took): an entry it adds beside one `onto` has keeps both. `newer`: a later
    recorded state made on top of the change; what a later change made on it rewrote and has landed already is not
    replayed (`union.undone`: the union must not bring back the lines it took away)."""
    is_union = merging.union_paths(repo, commit.id, mergeable)
    touched = [p for p in _paths(base.diff_to_tree(commit.tree)) if is_union(p)]
    if not touched:
        return
    for path in touched:
        if path not in onto or path not in commit.tree:  # deleted on one side: the recorded side stands
            continue
        had = base[path].id if path in base else None
        recorded = commit.tree[path].id
        if newer is not None and had is not None and path in newer:
            texts = [repo[oid].peel(pygit2.Blob).data for oid in (had, recorded, newer[path].id, onto[path].id)]
            kept = union.undone(*texts)
            recorded = recorded if kept is None else repo.create_blob(kept)
        merged = merging.union_blob(repo, had, onto[path].id, recorded)
        if merged is None:  # no line-wise matter (binary): the recorded side stands
            continue
        left = index.conflicts
        if left is not None and path in left:
            del left[path]
        index.add(pygit2.IndexEntry(path, merged, commit.tree[path].filemode))


def _newer_kept(
    repo: pygit2.Repository,
    index: pygit2.Index,
    base: pygit2.Tree,
    onto: pygit2.Tree,
    commit: pygit2.Commit,
    end: pygit2.Tree,
    is_union: Mergeable,
) -> None:
    """The files both `onto` and the recorded change edited (union-mergeable ones aside) merged again, each
    conflicting hunk keeping `onto`'s side when that is what `end` has and the recorded side is not: a change recorded
    after this one, made on top of it, landed first; this older one applied after it must not undo it."""
    for path in sorted(_paths(base.diff_to_tree(onto)) & _paths(base.diff_to_tree(commit.tree))):
        if is_union(path) or path not in end or path not in onto or path not in commit.tree:
            continue
        if path not in base or (index.conflicts is not None and path in index.conflicts):
            continue
        blobs = [repo[t[path].id] for t in (base, onto, commit.tree, end)]
        texts = [b.data for b in blobs if isinstance(b, pygit2.Blob)]
        if len(texts) != len(blobs):
            continue
        merged = union.merge(texts[0], texts[1], texts[2], settle=union.newer(texts[3]))
        if merged is not None:
            index.add(pygit2.IndexEntry(path, repo.create_blob(merged), commit.tree[path].filemode))


def _settle_theirs(index: pygit2.Index) -> None:
    """What favouring a side leaves (a file one side deleted or moved) settled with the recorded side: the
    file as the recorded change left it, or, where it has none (it deleted or moved the file), no file.

    A conflict's entries live only at stages 1-3: dropping them leaves nothing at the path (stage 0), which
    is the deletion; a conflict may name up to three paths (a rename on one side), each dropped."""
    for entries in list(index.conflicts or ()):
        for path in {e.path for e in entries if e is not None}:
            left = index.conflicts
            if left is not None and path in left:
                del left[path]
        recorded = entries[2]
        if recorded is not None:
            index.add(pygit2.IndexEntry(recorded.path, recorded.id, recorded.mode))


def apply_patch(worktree: Path, patch_file: Path) -> list[str]:
    """Apply a unified diff file to the worktree (as `git apply`). Returns its paths."""
    try:
        text = patch_file.read_text()
    except OSError as e:
        raise ReplayError(f"cannot read patch {patch_file}: {e.strerror}") from None
    repo = Workspace.at(worktree).repo()
    try:
        diff = pygit2.Diff.parse_diff(text)
    except pygit2.GitError as e:
        raise ReplayError(f"{patch_file} is not a unified diff ({e})") from None
    if not repo.applies(diff, pygit2.enums.ApplyLocation.WORKDIR):
        raise NotApplied(f"{patch_file} does not apply on this base (its context lines differ)")
    repo.apply(diff, pygit2.enums.ApplyLocation.WORKDIR)
    return sorted(_paths(diff))


def _paths(diff: pygit2.Diff) -> set[str]:
    out: set[str] = set()
    for delta in diff.deltas:
        out.update(p for p in (delta.old_file.path, delta.new_file.path) if p)
    return out


class ReplayRunner:
    name = "replay"
    rerun_safe = True  # applies a recorded change to a fresh worktree: the same result every time

    def __init__(self, mergeable: Callable[[str], tuple[str, ...]] = lambda repo: ()) -> None:
        self.mergeable = mergeable
        """A repository's union-mergeable path patterns (`jobs.mergeable` and the repo's own)."""

    def task(self, text: str) -> str:
        """The free text around the spec (a commit's message): the spec's lines name a commit and a wait,
        not what the change is about, and a JSON spec says nothing of it."""
        if text.strip().startswith("{"):
            return ""
        return "\n".join(line for line in text.splitlines() if not _LINE.match(line)).strip()

    async def run(self, ctx: RunContext) -> RunResult:
        try:
            spec = parse(ctx.job.text)
        except ReplayError as e:
            _log(ctx, f"[replay] {e}")
            return RunResult(False, None, str(e))
        if spec.after + spec.hold > ctx.timeout:
            _log(ctx, f"[replay] runs {spec.after + spec.hold:g}s, longer than the {ctx.timeout:g}s timeout")
            await asyncio.sleep(ctx.timeout)
            return RunResult(False, None, f"timed out after {ctx.timeout:g}s")
        what = f"commit {spec.commit}" if spec.commit else f"patch {spec.patch}"
        _log(ctx, f"[replay] {what} after {spec.after:g}s")
        log = olog.get()
        log.info(olog.Event.REPLAY_STARTED, after=spec.after)
        await asyncio.sleep(spec.after)
        try:
            if spec.commit:
                patterns = self.mergeable(ctx.job.repo)
                is_union = (lambda path: claims.matches(path, patterns)) if patterns else None
                paths = await asyncio.to_thread(
                    apply_commit, ctx.worktree, spec.commit, spec.theirs, is_union, spec.end
                )
            else:
                assert spec.patch is not None
                paths = await asyncio.to_thread(apply_patch, ctx.worktree, Path(spec.patch))
        except ReplayError as e:
            _log(ctx, f"[replay] {e}")
            # A change that does not apply here is a conflict: the daemon runs it again on another base.
            return RunResult(False, None, str(e), code=Code.CONFLICT if isinstance(e, NotApplied) else None)
        _log(ctx, f"[replay] applied {what}: {', '.join(paths) or 'no paths'}")
        if spec.hold:
            await asyncio.sleep(spec.hold)  # it goes on running with its change in the worktree
        log.info(olog.Event.REPLAY_APPLIED, paths=len(paths), hold=spec.hold)
        if not paths:  # it applied cleanly and left nothing: this base has its change already (not a conflict)
            return RunResult(True, 0, f"replayed {what}: its change is on this base already")
        return RunResult(True, 0, f"replayed {what} ({len(paths)} paths)")


def _log(ctx: RunContext, line: str) -> None:
    note(ctx.log_path, line)
