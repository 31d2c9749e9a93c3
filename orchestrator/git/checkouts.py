"""A landing's work in the checkouts of its branch: which worktrees are on it, whether each is clean where the
landing writes and has room for it, carrying it from the old head to the new one, putting it back.

Every function here is sync (run it in a thread) and speaks for one checkout; `git.landing` sequences them
around the ref move so that the whole is all or nothing.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pygit2
from pygit2.enums import FileStatus

from orchestrator.git import journal, repos

LOCK_WAIT = 2.0
"""Seconds to wait for a user's running git command to release a checkout's index.lock."""
SPACE_MARGIN = 1 << 20
"""Bytes a checkout's file system keeps free beyond what a landing writes there."""


def on_branch(repo: pygit2.Repository, refname: str) -> list[Path]:
    """Worktrees (main and linked) whose HEAD is `refname`. git lets two share a branch only if forced."""
    return [path for path, head in repos.worktrees(repo) if _head_is(head, refname)]


def _head_is(head: Path, refname: str) -> bool:
    try:
        return head.read_text().strip() == f"ref: {refname}"
    except (FileNotFoundError, NotADirectoryError):
        return False


Blocked = tuple[tuple[str, ...], str, str]
"""Why a checkout blocks a landing: the paths, a reason for a person, and its kind (REFUSED, LOCKED or FAULT)."""
REFUSED, LOCKED, FAULT = "refused", "locked", "fault"


def short_of_space(
    repo: pygit2.Repository, checkout: Path, new: pygit2.Oid, changed: frozenset[str]
) -> tuple[int, int] | None:
    """(bytes the landing writes in `checkout`, bytes free there) when that does not fit with a margin; None if
    it fits. The files git writes are the changed paths' contents at NEW."""
    tree = repo[new].peel(pygit2.Tree)
    needed = 0
    for path in changed:
        try:
            obj = tree[path]
        except KeyError:
            continue  # deleted: frees space
        if isinstance(obj, pygit2.Blob):
            needed += obj.size
    if not needed:
        return None
    st = os.statvfs(checkout)
    free = st.f_bavail * st.f_frsize
    return (needed, free) if needed + SPACE_MARGIN > free else None


def in_the_way(checkout: Path, changed: frozenset[str]) -> Blocked | None:
    """The checkout's uncommitted paths that the landing would overwrite, with a reason; None if none."""
    repo = repos.open_repo(checkout)
    index = repo.index
    if index.conflicts is not None:
        unmerged = sorted({e.path for c in index.conflicts for e in c if e is not None})
        return tuple(unmerged), "has an unfinished merge", REFUSED
    dirty: set[str] = set()
    for path in changed:
        # Per path, not a status of the whole tree: cost follows the landing's size, not the repo's.
        try:
            flags = repo.status_file(path)
        except KeyError:  # in neither HEAD, index nor work tree
            flags = FileStatus.CURRENT
        # Anything but "unchanged" is the user's: staged, unstaged, untracked, even ignored files (git
        # itself would overwrite ignored ones, but an ignored `.env` is still someone's work).
        if flags != FileStatus.CURRENT or (path not in index and os.path.lexists(checkout / path)):
            dirty.add(path)
        for parent in PurePosixPath(path).parents:  # a file where the landing needs a directory
            p = str(parent)
            if p != "." and p not in index and os.path.lexists(checkout / p) and not (checkout / p).is_dir():
                dirty.add(p)
    if dirty:
        return tuple(sorted(dirty)), "has uncommitted work where the landing writes", REFUSED
    return None


def dry_run(checkout: Path, old: pygit2.Oid, new: pygit2.Oid) -> Blocked | None:
    """git's own verdict on the two-tree merge, for whatever `in_the_way` does not model. On a copy of the index
    (refreshed there: stat-only changes are not edits), so the person's git commands never meet a lock of the
    landing's but the one short hold of `hold_index`."""
    gitdir = Path(repos.open_repo(checkout).path)
    with tempfile.TemporaryDirectory(prefix="orchestrator-dry-run-") as tmp:
        copy = Path(tmp) / "index"
        with contextlib.suppress(FileNotFoundError):  # no index: git reads none as empty
            shutil.copyfile(gitdir / "index", copy)
        repos.run_git(checkout, "update-index", "-q", "--refresh", index=copy)
        dry = repos.run_git(checkout, "read-tree", "-m", "-u", "-n", str(old), str(new), index=copy)
    return _refusal(dry.stderr) if dry.returncode != 0 else None


MOVES_HEAD = frozenset({"commit", "merge", "rebase", "cherry-pick", "revert", "am", "pull", "reset"})
"""git commands that read HEAD and later move it with a compare-and-swap: a ref moved in between fails them."""
_GLOBAL_WITH_VALUE = frozenset({"-C", "-c", "--git-dir", "--work-tree", "--namespace", "--exec-path"})


def git_command(argv: list[str], cwd: Path) -> tuple[str, Path] | None:
    """For a process's argv and working directory: the git subcommand it runs and the directory it runs it in
    (`-C` followed), or None if it is not git (pure)."""
    if not argv or os.path.basename(argv[0]) != "git":
        return None
    where, args = cwd, iter(argv[1:])
    for arg in args:
        if arg in _GLOBAL_WITH_VALUE:
            value = next(args, "")
            if arg == "-C" and value:
                where = where / value
        elif not arg.startswith("-"):
            return arg, where
    return None


def git_under_way(checkouts: list[Path]) -> tuple[int, str, Path] | None:
    """A git command of the person's that will move HEAD (`MOVES_HEAD`) running in one of `checkouts`: its pid,
    subcommand and checkout; None if none. `git commit` reads HEAD when it starts and moves it at its end, after
    its hooks and the editor: a landing that moves the branch in between makes git refuse the commit."""
    proc = Path("/proc")
    tops = [c.resolve() for c in checkouts]
    try:
        pids = [int(n) for n in os.listdir(proc) if n.isdigit()]
        ours = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None  # no /proc: nothing to wait for that we can see
    for pid in pids:
        try:
            if _comm(pid) != b"git\n":  # the cheap look first: the landing holds the index meanwhile
                continue
            # A job's processes live in a PID namespace of their sandbox: one named git there, in a checkout the
            # job sees read-only, is no person's commit, and must not hold landings back.
            if os.readlink(proc / str(pid) / "ns" / "pid") != ours:
                continue
            argv = (proc / str(pid) / "cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
            cwd = Path(os.readlink(proc / str(pid) / "cwd"))
        except OSError:  # ended as we looked, or not ours to read
            continue
        found = git_command(argv, cwd)
        if found is None or found[0] not in MOVES_HEAD:
            continue
        where = Path(os.path.normpath(found[1]))
        for top in tops:
            if where == top or top in where.parents:
                return pid, found[0], top
    return None


def _comm(pid: int) -> bytes:
    fd = os.open(f"/proc/{pid}/comm", os.O_RDONLY)
    try:
        return os.read(fd, 32)
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class Held:
    """A checkout's `index.lock`, held by the landing (`hold_index`)."""

    lock: Path
    waited: bool
    """Another git command held it first: one that read HEAD before the landing may be under way still."""


def hold_index(checkout: Path, wait: float = LOCK_WAIT) -> Held | Blocked:
    """Take the checkout's `index.lock` as git does (created exclusively), waiting up to `wait` for a git command
    of the person's to let it go; the lock starts as a copy of the index. Returns the lock (for `read_tree`'s
    `index`, then `keep_index` or `drop_index`) and whether it had to wait for it, or why it could not be had.

    Why the landing holds it across the ref move and the checkout update: `git commit` holds this lock from
    reading HEAD until it moves HEAD, so a branch moved while a commit runs (its pre-commit hook, say) fails the
    person's commit (`cannot lock ref 'HEAD'`), and a commit that starts between the ref move and the checkout
    update would commit the old tree on top of the landing, undoing it. Held, a commit under way is waited for,
    and one that starts meanwhile stops at once, saying another git process runs there."""
    gitdir = Path(repos.open_repo(checkout).path)
    lock, index = gitdir / "index.lock", gitdir / "index"
    deadline = time.monotonic() + wait
    waited = False
    while True:
        try:
            fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            break
        except FileExistsError:
            if time.monotonic() > deadline:
                return _refusal(f"fatal: Unable to create '{lock}': File exists.")
            waited = True
            time.sleep(0.02)  # a git command of the person's holds the index; it will be quick
    try:
        with os.fdopen(fd, "wb") as out, open(index, "rb") as src:
            shutil.copyfileobj(src, out)
    except FileNotFoundError:
        lock.unlink(missing_ok=True)
        return (), f"has no index file ({index}): `git reset` there rebuilds it from HEAD", FAULT
    except BaseException:
        lock.unlink(missing_ok=True)
        raise
    return Held(lock, waited)


def keep_index(lock: Path) -> None:
    """The held index (updated in place by `read_tree`) becomes the checkout's index; the lock is gone."""
    os.replace(lock, lock.with_name("index"))


def drop_index(lock: Path) -> None:
    """Let go of a held index unchanged: the checkout's index stays what it was."""
    lock.unlink(missing_ok=True)


def read_tree(
    checkout: Path, old: pygit2.Oid, new: pygit2.Oid, *, refreshed: bool = False, index: Path | None = None
) -> Blocked | None:
    """Carry the checkout from `old` to `new` (two-tree merge); why not, if git refuses or fails.

    `refreshed`: the first try skips refreshing the index's stat data (a process; the dry run found the checkout
    clean an instant ago). `index`: a lock taken by `hold_index`, whose copy of the index git updates: no wait then
    (nobody else can hold it), and a refusal is tried once more after a refresh (a stat-only change is no edit).
    """
    deadline = time.monotonic() + LOCK_WAIT
    fresh = not refreshed
    while True:
        if not refreshed:
            repos.run_git(checkout, "update-index", "-q", "--refresh", index=index)
        refreshed = False
        done = repos.run_git(checkout, "read-tree", "-m", "-u", str(old), str(new), index=index)
        if done.returncode == 0:
            return None
        if index is not None:
            refusal = _refusal(done.stderr)
            if fresh or refusal[2] != REFUSED:  # a fault (a full disk) is never tried again here
                return refusal
            fresh = True
            continue
        if "index.lock" not in done.stderr or time.monotonic() > deadline:
            return _refusal(done.stderr)
        time.sleep(0.05)  # a git command of the user's holds the index; it will be quick


_REFUSALS = ("not uptodate", "would be overwritten", "would be removed", "would be lost", "unmerged")
"""What git says when the two-tree merge refuses to touch a person's work (the rest is a failure)."""


def _refusal(stderr: str) -> Blocked:
    """Why git's two-tree merge did not go through: a person's work in the way ("error: Entry 'p' not
    uptodate", "... file 'p' would be overwritten"), an index.lock, or a failure (a full disk, a file it
    cannot write)."""
    lines = [line.removeprefix("error: ").removeprefix("fatal: ") for line in stderr.splitlines() if line.strip()]
    first = lines[0] if lines else "refused"
    lock = next((m for line in lines for m in re.findall(r"'([^']+index\.lock)'", line)), None)
    if lock is not None:
        return (
            (),
            (
                f"is locked: a git command holds {lock}, or one that was killed left it behind; if no git runs "
                f"there, remove that file (rm {lock})"
            ),
            LOCKED,
        )
    if any(r in line for line in lines for r in _REFUSALS):
        paths = tuple(sorted({m for line in lines for m in re.findall(r"'([^']+)'", line)}))
        return paths, f"is not clean where the landing writes (git: {first})", REFUSED
    return (), f"git: {first}", FAULT


def swap_back(repo: pygit2.Repository, refname: str, new: pygit2.Oid, old: pygit2.Oid, message: str) -> bool:
    ref = repo.lookup_reference(refname)
    if ref.target != new:
        return False
    try:
        ref.set_target(old, message)
    except (pygit2.GitError, OSError):
        return False
    return True


def put_back(repo: pygit2.Repository, checkout: Path, changed: frozenset[str], old: pygit2.Oid) -> tuple[str, ...]:
    """Every changed path of `checkout` back to OLD, index entry and file; the paths that could not be."""
    try:
        return journal.put_back(repo, checkout, sorted(changed), str(old))
    except (OSError, pygit2.GitError, repos.RepoError) as e:
        return (f"(all: {type(e).__name__}: {e})",)
