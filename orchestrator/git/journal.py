"""The landing journal: a landing that moves a branch someone has checked out is two steps (the ref, then
each checkout's index and work tree), so its intent is stored first and recovery can finish or undo it.

`advance` (git/landing.py) calls `Journal.begin` with the `Intent` before the ref moves and `Journal.end`
once every checkout is level again (updated, or put back with the ref). A daemon killed in between
leaves the intent; on start `settle` brings each checkout level with wherever the branch points now:

- the branch at the intent's `new`: the landing happened; the checkouts are carried to `new` (finished);
- the branch at `old`: the ref never moved or was swapped back; the checkouts are put back to `old`;
- the branch somewhere else: someone moved it since; the checkouts are left alone and reported.

Only the paths that differ between `old` and `new` are touched, only in a checkout that is one of the
repository's own worktrees (an intent naming any other directory is not obeyed there: reported), and only
where the index entry and the file hold `old`'s or `new`'s content (the landing's own bytes): anything else
there is a person's edit, kept and reported. A `.git/index.lock`, or the branch's own ref lock, is removed
only when recovery owns it: it appeared after the intent was stored, in a checkout (or the repository) the intent
names, and no live process holds it open (its git, or the daemon moving the ref, died).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pygit2

from orchestrator.core.records import Intent
from orchestrator.git import repos


class Journal(Protocol):
    """Where intents are stored durably (the daemon's store). Called from a worker thread."""

    def begin(self, intent: Intent) -> object: ...

    def end(self, token: object) -> None: ...


class NoJournal:
    """For callers without a store (tests, benches): nothing is recorded."""

    def begin(self, intent: Intent) -> object:
        return None

    def end(self, token: object) -> None:
        return None


NOT_A_CHECKOUT = "(not a worktree of the intent's repository: left alone)"
"""What recovery reports for a checkout an intent names that is no worktree of its repository."""


@dataclass(frozen=True, slots=True)
class Settled:
    """What recovery did with one intent."""

    outcome: str
    """`finished` (branch at new), `rolled-back` (branch at old), `moved-on` (branch elsewhere)."""
    head: str
    fixed: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Per checkout, the paths recovery carried to the branch's state."""
    left: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Per checkout, the paths it could not bring level (a person's edit there, or the branch moved on)."""
    locks: tuple[str, ...] = ()
    """The stale lock files it removed (its own: the branch's ref lock, index.lock)."""

    @property
    def consistent(self) -> bool:
        return not self.left

    def message(self, intent: Intent) -> str:
        short = intent.branch.removeprefix("refs/heads/")
        what = {
            "finished": f"the landing on {short} was finished after a restart",
            "rolled-back": f"the interrupted landing on {short} was rolled back after a restart",
            "moved-on": f"{short} moved on to {self.head[:12]} after an interrupted landing",
        }[self.outcome]
        if self.consistent:
            fixed = sum(len(p) for p in self.fixed.values())
            return f"{what}; checkouts level with {short} ({fixed} path{'s' * (fixed != 1)} brought level)"
        parts = "; ".join(f"{c}: {', '.join(p[:5])}" for c, p in self.left.items())
        return (
            f"{what}; NOT level with {short} at {parts} (edited since, or the branch moved): check `git status` "
            f"there; `git read-tree -m -u {intent.old[:12]} {self.head[:12]}` brings an unedited checkout level"
        )


def settle(intent: Intent) -> Settled:
    """Bring every checkout the intent names level with where its branch points now (sync; run in a thread)."""
    repo = repos.open_repo(intent.repo)
    locks: list[str] = []
    # The ref's own lock, left by a daemon killed while it moved the branch: it would fail every later landing.
    ref_lock = Path(repo.path) / f"{intent.branch}.lock"
    if ref_lock.exists() and _owned_stale_lock(ref_lock, intent.at):
        ref_lock.unlink()
        locks.append(str(ref_lock))
    try:
        head = str(repo.lookup_reference(intent.branch).target)
    except (KeyError, pygit2.InvalidSpecError):
        head = ""
    if head not in (intent.old, intent.new):
        moved: dict[str, tuple[str, ...]] = {c: ("(branch moved on)",) for c in intent.checkouts if Path(c).is_dir()}
        return Settled("moved-on", head, left=moved, locks=tuple(locks))
    target, other = (intent.new, intent.old) if head == intent.new else (intent.old, intent.new)
    changed = sorted(repos.changed_paths(Path(intent.repo), intent.old, intent.new))
    fixed: dict[str, tuple[str, ...]] = {}
    left: dict[str, tuple[str, ...]] = {}
    own = {os.path.realpath(p) for p, _ in repos.worktrees(repo)}
    for checkout in intent.checkouts:
        path = Path(checkout)
        if not path.is_dir():
            continue
        if os.path.realpath(path) not in own:
            left[checkout] = (NOT_A_CHECKOUT,)
            continue
        lock = _index_lock(path)
        if lock is not None and lock.exists():
            if not _owned_stale_lock(lock, intent.at):
                left[checkout] = ("(index.lock held by another git command)",)
                continue
            lock.unlink()
            locks.append(str(lock))
        # git's own lock on the landing's copy of the index (`checkouts.hold_index` runs git on index.lock): left by
        # a git of ours killed with the daemon, it would fail every later landing in this checkout.
        inner = lock.with_name("index.lock.lock") if lock is not None else None
        if inner is not None and inner.exists() and _owned_stale_lock(inner, intent.at):
            inner.unlink()
            locks.append(str(inner))
        done, stuck = _level(path, changed, repo, target, other)
        if done:
            fixed[checkout] = tuple(done)
        if stuck:
            left[checkout] = tuple(stuck)
        repos.run_git(path, "update-index", "-q", "--refresh")  # stat info for what we wrote; not an edit
    return Settled("finished" if head == intent.new else "rolled-back", head, fixed, left, tuple(locks))


def _level(
    checkout: Path, changed: list[str], repo: pygit2.Repository, target: str, other: str
) -> tuple[list[str], list[str]]:
    """Set each changed path's index entry and file to `target`'s where they hold target's or other's content."""
    wt = repos.open_repo(checkout)
    index = wt.index
    want_tree = repo.revparse_single(target).peel(pygit2.Tree)
    other_tree = repo.revparse_single(other).peel(pygit2.Tree)
    done: list[str] = []
    stuck: list[str] = []
    for p in changed:
        want = _entry(want_tree, p)
        was = _entry(other_tree, p)
        allowed = {want, was}
        staged = _staged(index, p)
        on_disk = _on_disk(checkout / p, repo)
        if staged not in allowed or on_disk not in allowed:
            stuck.append(p)
            continue
        if staged == want and on_disk == want:
            continue
        _write(checkout / p, repo, want)
        if want is None:
            if p in index:
                index.remove(p)
        else:
            index.add(pygit2.IndexEntry(p, pygit2.Oid(hex=want[0]), pygit2.enums.FileMode(want[1])))
        done.append(p)
    if done:
        index.write()
    return done, stuck


Blob = tuple[str, int] | None
"""(blob sha, file mode) of a path, or None where the path does not exist."""


def put_back(repo: pygit2.Repository, checkout: Path, changed: list[str], old: str) -> tuple[str, ...]:
    """After a landing failed part way through `checkout` (a full disk, a file git could not write): every changed
    path's file and index entry back to `old`'s, whatever git left there (the landing checked a moment ago that
    these paths held `old`'s content: nothing of the person's is lost). The paths that could not be written."""
    wt = repos.open_repo(checkout)
    index = wt.index
    tree = repo.revparse_single(old).peel(pygit2.Tree)
    wanted = {p: _entry(tree, p) for p in changed}
    wrong = [p for p in wanted if _on_disk(checkout / p, repo) != wanted[p]]
    stuck: set[str] = set()
    # Room first (a full disk is the usual reason to be here): what git wrote goes, deepest first (a file it
    # made inside a directory it made goes before that directory); then what was there comes back.
    for p in sorted(wrong, key=lambda c: (-c.count("/"), c)):
        try:
            _write(checkout / p, repo, None)
        except OSError:
            stuck.add(p)
    for p in sorted(wrong):
        if p not in stuck and wanted[p] is not None:
            try:
                _write(checkout / p, repo, wanted[p], room_first=True)
            except OSError:
                stuck.add(p)
    staged = False
    for p, want in wanted.items():
        if p in stuck or _staged(index, p) == want:
            continue
        staged = True
        if want is None:
            index.remove(p)
        else:
            index.add(pygit2.IndexEntry(p, pygit2.Oid(hex=want[0]), pygit2.enums.FileMode(want[1])))
    if staged:
        index.write()
    repos.run_git(checkout, "update-index", "-q", "--refresh")  # stat info for what we wrote; not an edit
    return tuple(sorted(stuck))


def _entry(tree: pygit2.Tree, path: str) -> Blob:
    try:
        obj = tree[path]
    except KeyError:
        return None
    return (str(obj.id), int(obj.filemode)) if obj.type_str == "blob" else None


def _staged(index: pygit2.Index, path: str) -> Blob:
    try:
        e = index[path]
    except KeyError:
        return None
    return (str(e.id), int(e.mode))


def _on_disk(path: Path, repo: pygit2.Repository) -> Blob:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return ("(blocked)", 0)
    if stat.S_ISLNK(st.st_mode):
        return (str(pygit2.hash(os.readlink(path).encode())), pygit2.enums.FileMode.LINK)
    if not stat.S_ISREG(st.st_mode):
        return ("(not a file)", 0)
    mode = pygit2.enums.FileMode.BLOB_EXECUTABLE if st.st_mode & 0o111 else pygit2.enums.FileMode.BLOB
    return (str(pygit2.hashfile(str(path))), int(mode))


def _write(path: Path, repo: pygit2.Repository, blob: Blob, *, room_first: bool = False) -> None:
    """`path` as `blob` (None: no file). `room_first`: what is there goes before the new content is written (on a
    full disk the old content's room is needed), at the cost of a moment without the file."""
    if path.is_dir() and not path.is_symlink():
        path.rmdir()  # a directory where a file belongs (or none): empty by now (its files came first), else OSError
    if blob is None:
        if path.is_symlink() or path.exists():
            path.unlink()
        return
    sha, mode = blob
    data = repo[sha].read_raw()
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        path.unlink()
    if mode == pygit2.enums.FileMode.LINK:
        os.symlink(data.decode(), path)
        return
    if room_first:
        path.write_bytes(data)
        os.chmod(path, 0o755 if mode == pygit2.enums.FileMode.BLOB_EXECUTABLE else 0o644)
        return
    tmp = path.with_name(f".{path.name}.orchestrator-tmp")
    tmp.write_bytes(data)
    os.chmod(tmp, 0o755 if mode == pygit2.enums.FileMode.BLOB_EXECUTABLE else 0o644)
    os.replace(tmp, path)


def _index_lock(checkout: Path) -> Path | None:
    try:
        gitdir = repos.open_repo(checkout).path
    except repos.RepoError:
        return None
    return Path(gitdir) / "index.lock"


def _owned_stale_lock(lock: Path, since: float) -> bool:
    """The lock appeared after our intent and nobody holds it open: a git of ours that died mid-update."""
    try:
        if lock.stat().st_mtime < since - 1.0:  # coarse file times: a second of slack
            return False
    except FileNotFoundError:
        return False
    return not _held_open(lock)


def _held_open(path: Path) -> bool:
    target = str(path.resolve())
    proc = Path("/proc")
    if not proc.is_dir():
        return True  # cannot tell: assume a writer lives, and leave the lock
    for pid in os.listdir(proc):
        if not pid.isdigit():
            continue
        try:
            fds = os.listdir(proc / pid / "fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(proc / pid / "fd" / fd) == target:
                    return True
            except OSError:
                continue
    return False
