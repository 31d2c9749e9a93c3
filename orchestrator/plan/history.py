"""A repository's own past changes as planning evidence: files that change together, and changes described
in the same words. Mined from `git log`: the authored changes (each commit against its one parent, merge
commits left out: a merge's files are a whole branch's sum and its subject says nothing of them), kept per
repo in the store and extended incrementally from the last mined head.

`History` is plain data plus counting, no I/O; `mine` reads git (call it in a thread).
"""

from __future__ import annotations

import heapq
import itertools
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pygit2

from orchestrator.core import claims
from orchestrator.git import repos

MAX_FILES = 40
"""A change touching more files than this (a sweep, a vendored update) says nothing about co-change."""
KEEP = 3000
"""Most recent changes kept per repository."""

_TOKEN = re.compile(r"[a-z][a-z0-9_]+")
_NOISE = frozenset(
    """merge pull request branch from into the and for with to of in on a an is be by fix fixes fixed add adds
    update updates use remove release version bump start main master origin remote tracking""".split()  # noqa: SIM905 - a word list reads better as prose
)


@dataclass(frozen=True, slots=True)
class Change:
    """One past change: its commit, the first line of its message, the files it touched."""

    sha: str
    subject: str
    files: tuple[str, ...]

    def to_json(self) -> list[object]:
        return [self.sha, self.subject, list(self.files)]

    @classmethod
    def from_json(cls, row: Sequence[object]) -> Change:
        sha, subject, files = row
        assert isinstance(files, list)
        return cls(str(sha), str(subject), tuple(str(f) for f in files))


def title(message: str) -> str:
    """The line that says what a change does: the first one, or for a merged pull request (`Merge pull
    request #1 from user/branch`) the pull request's title below it."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if not lines:
        return ""
    if lines[0].startswith("Merge pull request") and len(lines) > 1:
        return lines[1]
    return lines[0]


_VERSION = re.compile(r"(?<![\w.])v?\d+(\.\d+)+([.-]?(dev|rc|a|b|post)\d*)*(?!\w|\.\w)")
VERSION_TOKEN = "versionnumber"
"""Stands for any version number (`v2.34.0`, `3.1.0rc1`): releases are alike whatever their number."""


def tokens(text: str) -> frozenset[str]:
    """Content words of a change description, for similarity (refs and noise words dropped). A description
    that is only a version number (`v2.34.0`, `release version 3.1.0`) is `VERSION_TOKEN`, whatever the
    number: releases are alike; elsewhere (`require werkzeug >= 2.3`) the number says nothing."""
    text = re.sub(r"#\d+|\b[0-9a-f]{7,40}\b", " ", text.lower())
    versioned = _VERSION.search(text) is not None
    words = frozenset(t for t in _TOKEN.findall(_VERSION.sub(" ", text)) if t not in _NOISE and len(t) > 2)
    return words or (frozenset({VERSION_TOKEN}) if versioned else words)


class History:
    """Co-change counts and a word index over past changes, oldest first; `add` extends it."""

    window = 1000
    """Recent changes the similarity and closure estimates look at."""

    def __init__(self, changes: Iterable[Change] = (), tip: str | None = None) -> None:
        self.tip = tip
        """The commit this history was mined up to (a merge, perhaps: not one of `changes`)."""
        self.changes: list[Change] = []
        self.count: Counter[str] = Counter()
        self.pairs: dict[str, Counter[str]] = defaultdict(Counter)
        self.index: dict[str, list[int]] = defaultdict(list)
        self._tokens: list[frozenset[str]] = []
        for c in changes:
            self.add(c)

    def add(self, change: Change) -> None:
        i = len(self.changes)
        self.changes.append(change)
        toks = tokens(change.subject)
        self._tokens.append(toks)
        for t in toks:
            self.index[t].append(i)
        files = change.files
        if len(files) > MAX_FILES:
            return
        for f in files:
            self.count[f] += 1
            row = self.pairs[f]
            for g in files:
                if g != f:
                    row[g] += 1

    def cochanged(self, path: str, min_ratio: float = 0.5, min_support: int = 2) -> list[tuple[str, int, int]]:
        """Files that changed in at least `min_ratio` of the changes touching `path` (and `min_support` of
        them): (file, together, changes of path), most frequent first."""
        n = self.count.get(path, 0)
        if n < min_support:
            return []
        out = [(g, k, n) for g, k in self.pairs[path].items() if k >= min_support and k / n >= min_ratio]
        return sorted(out, key=lambda t: (-t[1], t[0]))

    def closure(self, seeds: Iterable[str], claim: Iterable[str], ignore: Sequence[str] = ()) -> tuple[int, int]:
        """Of the recent past changes that touched a seed file: (how many, how many stayed inside `claim`).

        The share is the repo's own estimate of how likely a change to these files stays within the claim:
        what local evidence's confidence rests on. Files matching `ignore` (union-mergeable) do not count.
        """
        index = claims.PathIndex(claim)
        wanted = set(seeds)
        n = inside = 0
        for change in reversed(self.changes[-self.window :]):
            if len(change.files) > MAX_FILES or wanted.isdisjoint(change.files):
                continue
            n += 1
            rest = [f for f in change.files if not (ignore and claims.matches(f, tuple(ignore)))]
            inside += len(index.meeting(rest)) == len(rest)
        return n, inside

    def escapes(self, seeds: Iterable[str], claim: Iterable[str], ignore: Sequence[str] = ()) -> Counter[str]:
        """Files outside `claim` that recent past changes to a seed file touched, by how many of them."""
        index = claims.PathIndex(claim)
        wanted = set(seeds)
        out: Counter[str] = Counter()
        for change in self.changes[-self.window :]:
            if len(change.files) > MAX_FILES or wanted.isdisjoint(change.files):
                continue
            for f in change.files:
                if not index.meets(f) and not (ignore and claims.matches(f, tuple(ignore))):
                    out[f] += 1
        return out

    def word_support(self, word: str, files: Iterable[str]) -> tuple[int, int]:
        """Of the recent past changes whose description has `word`: (how many, how many touched one of
        `files`). How far this repo's own history says the word means those files."""
        wanted = set(files)
        first = max(0, len(self.changes) - self.window)
        n = k = 0
        for i in self.index.get(word, ()):
            if i >= first:
                n += 1
                k += not wanted.isdisjoint(self.changes[i].files)
        return n, k

    def similar(self, text: str, limit: int = 5) -> list[tuple[float, Change]]:
        """Recent past changes described in the most similar words (Jaccard on content words), best first."""
        q = tokens(text)
        if not q:
            return []
        first = max(0, len(self.changes) - self.window)
        hits: Counter[int] = Counter()
        for t in q:
            for i in self.index.get(t, ()):
                if i >= first:
                    hits[i] += 1
        scored = []
        for i, shared in hits.items():
            union = len(q | self._tokens[i])
            scored.append((shared / union, i))
        scored.sort(key=lambda t: (-t[0], -t[1]))
        return [(s, self.changes[i]) for s, i in scored[:limit]]


def _files(repo: pygit2.Repository, commit: pygit2.Commit) -> tuple[str, ...]:
    diff = repo.diff(commit.parents[0], commit) if commit.parents else commit.tree.diff_to_tree(swap=True)
    paths: set[str] = set()
    for d in diff.deltas:
        paths.add(d.new_file.path)
        paths.add(d.old_file.path)
    return tuple(sorted(paths))


def _ancestor(repo: pygit2.Repository, tip: pygit2.Oid, since: str) -> bool:
    """`since` is `tip` or one of its ancestors (False when it is not a commit of this repository)."""
    try:
        oid = pygit2.Oid(hex=since)
        return oid == tip or repo.descendant_of(tip, oid)
    except (ValueError, KeyError, pygit2.GitError):
        return False


LANDING_DEPTH = 20_000
"""Commits of the first-parent line `landings` walks at most."""


def landings(repo_path: Path | str, tip: str, shas: Iterable[str], depth: int = LANDING_DEPTH) -> dict[str, str]:
    """For each of `shas` reachable from `tip`: the commit of tip's first-parent line that brought it there
    (itself, when it is on that line; the merge whose branch held it, otherwise). The commits of one pull
    request share theirs: they are steps of one task, where two jobs queued together are two tasks."""
    repo = repos.open_repo(repo_path)
    wanted = set(shas)
    out: dict[str, str] = {}
    try:
        commit: pygit2.Commit | None = repo.revparse_single(tip).peel(pygit2.Commit)
    except (KeyError, ValueError, pygit2.GitError):
        return out
    for _ in range(depth):
        if commit is None or len(out) == len(wanted):
            break
        here = str(commit.id)
        if here in wanted:
            out[here] = here
        if len(commit.parent_ids) > 1:
            walker = repo.walk(commit.parent_ids[1], pygit2.enums.SortMode.TOPOLOGICAL)
            walker.hide(commit.parent_ids[0])
            for other in commit.parent_ids[2:]:
                walker.push(other)
            for brought in walker:
                if (sha := str(brought.id)) in wanted:
                    out.setdefault(sha, here)
        commit = commit.parents[0] if commit.parents else None
    return out


def _newest_first(tip: pygit2.Commit) -> Iterator[pygit2.Commit]:
    """Every commit reachable from `tip`, newest first by commit time (a parent is met only after one of its
    children), lazily: libgit2's sorted walks read the whole history before yielding the first commit."""
    order = itertools.count()
    seen = {tip.id}
    heap = [(-tip.commit_time, next(order), tip)]
    while heap:
        commit = heapq.heappop(heap)[2]
        yield commit
        for parent in commit.parents:
            if parent.id not in seen:
                seen.add(parent.id)
                heapq.heappush(heap, (-parent.commit_time, next(order), parent))


def _first_parent_line(repo: pygit2.Repository, tip: pygit2.Commit) -> Iterator[pygit2.Commit]:
    commit: pygit2.Commit | None = tip
    while commit is not None:
        yield commit
        commit = commit.parents[0] if commit.parents else None


def mine(
    repo_path: Path | str, head: str, since: str | None = None, limit: int = KEEP, first_parent: bool = False
) -> tuple[list[Change], bool]:
    """The authored changes reachable from `head` and not from `since`, at most the newest `limit`, in history
    order (oldest first, by commit time). Merge commits are left out: the
    commits a merge brings are each a change of their own. With `first_parent`, the first-parent line as
    it is instead: a merge is one change (its files against its first parent), its branch's commits none.

    Returns (changes, incremental): incremental is True when `since` is `head` or one of its ancestors and
    every change since fit in `limit`; else (history rewritten, no `since`, too many) the changes are the
    newest `limit` and replace any cache.
    """
    repo = repos.open_repo(repo_path)
    tip = repo.revparse_single(head).peel(pygit2.Commit)
    known = since is not None and _ancestor(repo, tip.id, since)
    if first_parent:
        commits: Iterator[pygit2.Commit] = _first_parent_line(repo, tip)
    else:
        if known and since is not None:  # what is new since a cached head: a short walk
            walker = repo.walk(tip.id, pygit2.enums.SortMode.TOPOLOGICAL | pygit2.enums.SortMode.TIME)
            walker.hide(pygit2.Oid(hex=since))
            commits = iter(walker)
        else:
            commits = _newest_first(tip)
        commits = (c for c in commits if len(c.parent_ids) < 2)
    out: list[Change] = []
    met = not first_parent  # the hidden walk never yields `since`; the first-parent line must meet it
    complete = True
    for commit in commits:
        if known and str(commit.id) == since:
            met = True
            break
        if len(out) >= limit:
            complete = False
            break
        out.append(Change(str(commit.id), title(commit.message), _files(repo, commit)))
    out.reverse()
    return out, known and met and complete
