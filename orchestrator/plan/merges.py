"""Which of a repository's past changes that met would not have merged: the second factor of a pair's risk.

Two jobs that touch a common file at different places merge in memory and cost nothing; what costs is a
conflict the landing cannot merge (the later job runs again). For the pairs of past changes at most `WINDOW`
apart that touched a common file (union-mergeable files aside; two steps of one pull request count as any two
changes do: a queue holds such steps too), `record` three-way merges them on their common base, in a scratch
repository that borrows the objects (`git.merging.scratch`): the later change is replayed onto the earlier
one's parent first, and where it does not apply there it was built on the earlier one or on changes between them
(`DEPENDENT`: it could not have run beside the earlier one either); else the two are merged (`CONFLICT` or
`CLEAN`).

`table` (pure) counts per area (the directories of the files a pair met in, down to `score.AREA_DEPTH`; ROOT
for all) how many pairs met and how many would not have merged; `score.Calibration.nonmerge` reads it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import pygit2

from orchestrator.core import claims
from orchestrator.core.risk import area_of
from orchestrator.git import merging
from orchestrator.plan.history import MAX_FILES, Change
from orchestrator.plan.score import prefixes

WINDOW = 8
"""Past changes at most this far apart count as a pair that could have run side by side."""


class Result(StrEnum):
    """What landing the later of two past changes that met would have met."""

    CLEAN = "clean"
    """Replayed onto the earlier one's base, it merges with the earlier one."""
    CONFLICT = "conflict"
    """It applies on the earlier one's base, but the two conflict."""
    DEPENDENT = "dependent"
    """It does not apply on the earlier one's base: it was built on the earlier one, or on changes between."""

    @property
    def merges(self) -> bool:
        return self is Result.CLEAN


@dataclass(frozen=True, slots=True)
class Met:
    """Two past changes that touched a common file, and whether the later one would have merged."""

    earlier: str
    later: str
    common: tuple[str, ...]
    """The files both touched (union-mergeable ones aside)."""
    result: Result


def result(
    repo: pygit2.Repository, earlier: pygit2.Commit, later: pygit2.Commit, is_union: merging.Mergeable
) -> Result:
    """Replay `later` onto `earlier`'s parent, then merge it with `earlier` (both on their first parents)."""
    return conflicts(repo, earlier, later, is_union)[0]


def conflicts(
    repo: pygit2.Repository, earlier: pygit2.Commit, later: pygit2.Commit, is_union: merging.Mergeable
) -> tuple[Result, tuple[str, ...]]:
    """`result`, with the paths that did not apply or did not merge."""
    base = earlier.parents[0].tree
    onto, paths = merging.merged_trees(repo, later.parents[0].tree, base, later.tree, is_union)
    if onto is None:
        return Result.DEPENDENT, paths
    _, paths = merging.merged_trees(repo, base, earlier.tree, onto, is_union)
    return (Result.CONFLICT, paths) if paths else (Result.CLEAN, ())


def record(
    repo_path: Path | str,
    changes: Sequence[Change],
    ignore: Sequence[str] = (),
    window: int = WINDOW,
) -> list[Met]:
    """For the pairs of `changes` (oldest first) at most `window` apart that touched a common file: whether the
    later would have merged (blocking: run it in a thread). A change of more than `history.MAX_FILES` files (a
    sweep) is left out."""
    ignored = tuple(ignore)
    files = [
        frozenset(f for f in c.files if not (ignored and claims.matches(f, ignored))) if len(c.files) <= MAX_FILES
        else frozenset()
        for c in changes
    ]  # fmt: skip
    out: list[Met] = []
    mergeable = (lambda p: claims.matches(p, ignored)) if ignored else None
    with merging.scratch(repo_path) as repo:
        commits: dict[str, pygit2.Commit | None] = {}
        for i, a in enumerate(changes):
            for j in range(i + 1, min(len(changes), i + 1 + window)):
                b = changes[j]
                common = files[i] & files[j]
                if not common:
                    continue
                ca, cb = _commit(repo, commits, a.sha), _commit(repo, commits, b.sha)
                if ca is None or cb is None:
                    continue
                is_union = merging.union_paths(repo, ca.id, mergeable)  # as the earlier one's tree says
                out.append(Met(a.sha, b.sha, tuple(sorted(common)), result(repo, ca, cb, is_union)))
    return out


def _commit(repo: pygit2.Repository, cache: dict[str, pygit2.Commit | None], sha: str) -> pygit2.Commit | None:
    if sha not in cache:
        try:
            commit = repo.revparse_single(sha).peel(pygit2.Commit)
        except (KeyError, ValueError, pygit2.GitError):
            commit = None
        cache[sha] = commit if commit is not None and commit.parents else None
    return cache[sha]


def table(mets: Iterable[Met]) -> tuple[tuple[str, int, int], ...]:
    """(area, pairs, would not merge) per area the pairs met in (each of its levels, ROOT for all): a pair that
    met in two areas counts once in each, and once at a level they share."""
    counts: dict[str, list[int]] = {}
    for m in mets:
        for area in sorted({a for f in m.common for a in prefixes(area_of(f))}):
            c = counts.setdefault(area, [0, 0])
            c[0] += 1
            c[1] += not m.result.merges
    return tuple((a, n, k) for a, (n, k) in sorted(counts.items()))
