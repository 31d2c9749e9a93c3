"""The git facts a round and the overlap watch read, each cached and read off the event loop.

- `heads`: each target branch's head, read once per round for every (repo, branch) it names;
- `moved`: the paths a branch changed between two commits (BaseMoved), one diff per distinct pair;
- `mergeable`: a repository's union-mergeable entries at a head: its config's, and what `.gitattributes` marks
  `merge=union`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path

import pygit2

from orchestrator import logging as olog
from orchestrator.config import Config
from orchestrator.git import repos

CACHE_MAX = 4096
"""Entries each cache keeps (one per head or pair seen); past that it starts again, entries are cheap to redo."""


class GitFacts:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self._moved: dict[tuple[str, str, str], frozenset[str] | None] = {}
        self._attrs: dict[tuple[str, str], frozenset[str]] = {}
        self._attr_last: dict[str, frozenset[str]] = {}

    async def heads(self, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str | None]:
        """Each (repo, branch)'s head now; None where the branch cannot be read."""
        heads: dict[tuple[str, str], str | None] = {}
        for repo, branch in keys:
            if (repo, branch) not in heads:
                try:
                    heads[(repo, branch)] = await asyncio.to_thread(repos.branch_head, Path(repo), branch)
                except repos.RepoError:
                    heads[(repo, branch)] = None
        return heads

    async def moved(self, repo: str, base: str, head: str) -> frozenset[str] | None:
        """The paths that differ between `base` and `head`; None when that cannot be known (the base is gone)."""
        key = (repo, base, head)
        if len(self._moved) > CACHE_MAX:
            self._moved.clear()
        if key not in self._moved:
            try:
                self._moved[key] = await asyncio.to_thread(repos.changed_paths, Path(repo), base, head)
            except Exception:  # noqa: BLE001 - an unreadable base means "unknown": the job re-plans
                self._moved[key] = None
        return self._moved[key]

    async def mergeable(self, repo: str, head: str | None) -> frozenset[str]:
        """A repo's own union-mergeable entries: its config's, and what `.gitattributes` marks merge=union."""
        key = (repo, head or "")
        if key not in self._attrs:
            marked: frozenset[str] = frozenset()
            if head:
                with olog.best_effort("read .gitattributes", repos.RepoError, pygit2.GitError, OSError, repo=repo):
                    marked = await asyncio.to_thread(repos.gitattributes_union, Path(repo), head)
            value = marked | frozenset(self.cfg.repo(repo).mergeable)
            # The same object while the set is the same: every waiting job's cached view stays valid when
            # a landing moves the head (a new object made 5,000 views be rebuilt after each landing).
            last = self._attr_last.get(repo)
            if value == last:
                value = last
            self._attr_last[repo] = value
            if len(self._attrs) > CACHE_MAX:
                self._attrs.clear()
            self._attrs[key] = value
        return self._attrs[key]
