"""Without a sandbox, notice after the fact when a job wrote into the user's checkout of its repository.

What is detected: files of the repository's own work tree (tracked, untracked and ignored, an ignored
directory as one entry) created, changed or deleted while the job ran, other than by a landing (a file whose
content is the branch head's before or after, or any commit the branch moved through in between, is not
counted: landings of other jobs that update the checkout, one after another or still under way, are not a
false alarm). A change is seen by size, mtime, ctime and inode, so content rewritten with its size and mtime
put back still shows (a process cannot set ctime). What is not: writes elsewhere (`$HOME`, other
repositories), inside an ignored directory, or to the repository's git dir. A person editing their checkout
during the job is indistinguishable from the job doing it; the job's reason says so.

Sync pygit2 code: the daemon calls it with `asyncio.to_thread`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import pygit2


@dataclass(frozen=True)
class CheckoutState:
    head: str | None
    dirty: dict[str, tuple[int, int, int, int, int]] = field(default_factory=dict)
    """path -> (git status flags, mtime_ns, ctime_ns, inode, size) of every path that differs from HEAD."""


def _stat(root: Path, path: str) -> tuple[int, int, int, int]:
    try:
        st = os.lstat(root / path)
    except OSError:
        return (0, 0, 0, -1)
    return (st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_size)


READS = 12
"""Times `snapshot` reads the checkout before it gives up: a file rewritten while git hashes it (another job's
landing updating the checkout, a person's editor saving) fails that read, and the next one sees it whole."""


def snapshot(repo_path: Path) -> CheckoutState:
    """The checkout's head and what differs from it. A read that meets a file changing under it is taken again
    (`READS` times, pausing a little longer each time): another job's landing updates this checkout while a job
    starts or ends, and a file it rewrites mid-read ("error reading file for hashing": shorter than its stat
    said) failed the job whose snapshot it was."""
    for n in range(READS - 1):
        try:
            return _read(repo_path)
        except (pygit2.GitError, OSError):
            time.sleep(0.02 * (n + 1))
    return _read(repo_path)


def _read(repo_path: Path) -> CheckoutState:
    repo = pygit2.Repository(str(repo_path), pygit2.enums.RepositoryOpenFlag.NO_SEARCH)
    if repo.is_bare or repo.workdir is None:
        return CheckoutState(None)
    head = None if repo.head_is_unborn else str(repo.head.target)
    root = Path(repo.workdir)
    status = repo.status(untracked_files="all", ignored=True)
    return CheckoutState(head, {p: (int(flags), *_stat(root, p)) for p, flags in status.items()})


MOVES_LOOKED_AT = 1000
"""At most this many commits between the two heads are taken as the states a landing may have left a file in."""


def _blob_matches(repo: pygit2.Repository, head: str | None, path: str, data: bytes | None) -> bool:
    if head is None:
        return data is None
    tree = repo[head].peel(pygit2.Tree)
    try:
        entry = tree[path]
    except KeyError:
        return data is None
    return data is not None and entry.id == pygit2.hash(data)


def _heads_between(repo: pygit2.Repository, before: str | None, after: str | None) -> list[str | None]:
    """`before`, `after` and every commit reachable from `after` but not from `before` (newest first, capped):
    each is a state some landing may have left the checkout's files in."""
    heads: list[str | None] = [before, after]
    if after is None:
        return heads
    walker = repo.walk(pygit2.Oid(hex=after), pygit2.enums.SortMode.TOPOLOGICAL)
    if before is not None:
        walker.hide(pygit2.Oid(hex=before))
    for i, commit in enumerate(walker):
        if i >= MOVES_LOOKED_AT:
            break
        heads.append(str(commit.id))
    return list(dict.fromkeys(heads))


def written(repo_path: Path, before: CheckoutState, after: CheckoutState) -> list[str]:
    """Paths of the user's checkout that changed between the snapshots and are not explained by a landing."""
    changed = [p for p, st in after.dirty.items() if before.dirty.get(p) != st]
    changed += [p for p in before.dirty if p not in after.dirty and before.head == after.head]
    if not changed:
        return []
    repo = pygit2.Repository(str(repo_path), pygit2.enums.RepositoryOpenFlag.NO_SEARCH)
    root = Path(repo.workdir or repo_path)
    heads = _heads_between(repo, before.head, after.head) if before.head != after.head else []
    out = []
    for path in sorted(set(changed)):
        if path.endswith("/"):  # an ignored directory: no landing writes there
            out.append(path)
            continue
        try:
            data: bytes | None = (root / path).read_bytes() if (root / path).is_file() else None
        except OSError:
            data = None
        if any(_blob_matches(repo, h, path, data) for h in heads):
            continue  # landings moved the branch and updated (or are updating) the checkout
        out.append(path)
    return out
