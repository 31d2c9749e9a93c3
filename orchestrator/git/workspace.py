"""One job's workspace: files the job may rewrite at will, and a git dir of the daemon's own that describes them.

A workspace is two directories side by side under the pool's root::

    <home>/job-7/            the files, and the job's own `.git` (job-writable: untrusted data)
    <home>/.admin/job-7/     the daemon's git dir for them: HEAD, index, info/, and `objects`: the job's
                             quarantine, an object dir that borrows the repository's objects (alternates)

The job works in a git dir of its own (`job-7/.git`, a plain repository that borrows the repository's
objects read-only through `objects/info/alternates`), so `git status`, `diff`, `log` and commits work
inside the job and can break nothing but itself: it shares no writable git state with the repository.

The daemon never runs git in, or trusts the config, index, HEAD or hooks of, a directory the job could
write. Everything it does to a workspace goes through the admin dir: libgit2 opened on it with the
workspace as its work dir, or the git CLI with `--git-dir`/`--work-tree` set and hooks and fsmonitor off.
It takes the job's result as files: what differs from the admin index (stat, then content) is hashed
into blobs, a tree and, by `git.commits`, a commit; symlinks and exec bits as git records them, special
files and nested repositories left out, nothing read through a link. Those objects are written into the
quarantine, never into the repository: they reach it only when the job lands (`git.commits.publish`), so a
result that is rejected, or never lands, leaves the repository as it was. A recycled workspace is reset from
the admin index (its quarantine emptied) and then verified by a walk of its own, never trusted.

Sync code (pygit2, the git CLI, file walks): the pool calls it through `asyncio.to_thread`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pygit2
from pygit2.enums import FileStatus

from orchestrator import beneath
from orchestrator.core.models import Code
from orchestrator.git import repos
from orchestrator.paths import open_private, private_dir

__all__ = [
    "ADMIN",
    "MAX_FILE_BYTES",
    "Rebased",
    "ResultRefused",
    "Workspace",
    "WorkspaceError",
    "remove_tree",
    "shown_name",
]

ADMIN = ".admin"
"""The folder beside the workspaces that holds their admin git dirs."""
MAX_FILE_BYTES = 100 * 1024 * 1024
"""Largest file a job may commit (the largest a forge takes without LFS): a larger one fails its commit."""
GIT_TIMEOUT = repos.GIT_TIMEOUT

# Daemon-owned git dirs: no hook, no fsmonitor, no background maintenance, whatever the user's global config.
_OWN_CONFIG = (
    "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-c", "core.untrackedCache=false",
    "-c", "gc.auto=0", "-c", "maintenance.auto=false", "-c", "core.sparseCheckout=false",
)  # fmt: skip
_INFO_FILES = ("exclude", "attributes")
"""Files of the repository's `info/` a workspace inherits: ignore rules and attributes the user set there."""


@dataclass(frozen=True, slots=True)
class Rebased:
    """What bringing a kept workspace to a new base did (`Workspace.rebase`)."""

    old: str
    new: str
    moved: tuple[str, ...]
    """The paths that changed between the two bases (merged into the job's files)."""
    yours: dict[str, bytes]
    """Files where the job's edit conflicted with the new base's: the job's version (the files hold the base's)."""


class WorkspaceError(RuntimeError):
    """A workspace could not be made, reset or read; the message carries git's own words."""


class ResultRefused(WorkspaceError):
    """What the job left cannot be its result as it is (a name git cannot store, a file or a result too big):
    nothing was written. `code` says which (a `core.models.Code`); the message names the files and what to do."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class Workspace:
    """A workspace's files (`root`) and the daemon's git dir for them (`admin`)."""

    root: Path

    @property
    def admin(self) -> Path:
        return self.root.parent / ADMIN / self.root.name

    @property
    def private_git(self) -> Path:
        """The job's own git dir: job-writable, never read by the daemon."""
        return self.root / ".git"

    @classmethod
    def at(cls, root: Path | str) -> Workspace:
        return cls(Path(root))

    def exists(self) -> bool:
        return self.admin.is_dir()

    # -- reading it ---------------------------------------------------------------------------------

    def repo(self) -> pygit2.Repository:
        """The admin git dir opened with the workspace as its work dir (no parent search)."""
        try:
            repo = pygit2.Repository(str(self.admin), pygit2.enums.RepositoryOpenFlag.NO_SEARCH)
        except pygit2.GitError as exc:
            raise WorkspaceError(f"the workspace {self.root} has no usable admin dir ({exc})") from exc
        repo.workdir = str(self.root)  # in memory only: nothing in the admin dir points at the work dir
        return repo

    def objects(self) -> Path:
        """The repository's object dir this workspace borrows (its quarantine's alternate; the symlink of a
        workspace made before quarantines)."""
        own = self.admin / "objects"
        if own.is_symlink():
            return Path(os.path.realpath(own))
        try:
            line = (own / "info" / "alternates").read_text().splitlines()[0]
        except (OSError, IndexError):
            raise WorkspaceError(f"the workspace {self.root} has no repository to borrow objects from") from None
        return Path(os.path.realpath(line.strip()))

    @property
    def quarantine(self) -> Path | None:
        """Where the job's objects are written until it lands (None for a workspace made before quarantines,
        whose objects go straight into the repository)."""
        own = self.admin / "objects"
        return own if own.is_dir() and not own.is_symlink() else None

    def belongs_to(self, repo_path: Path) -> bool:
        """Whether this workspace was made from `repo_path` (its objects are that repository's)."""
        theirs = repos.common_dir(repos.open_repo(repo_path)) / "objects"
        return self.objects() == Path(os.path.realpath(theirs))

    def head(self) -> str:
        """The commit the workspace was checked out at."""
        return (self.admin / "HEAD").read_text().strip()

    def tree(self, *, max_file: int = MAX_FILE_BYTES, max_total: int = 0, record: bool = False) -> pygit2.Oid:
        """The workspace's files as a tree (blobs written to its quarantine).

        What git's `add -A` would stage, taken from the files themselves: every change against the admin
        index (which the job never sees), untracked files unless ignored; `.git`, special files (FIFOs,
        sockets, devices) and nested repositories left out; symlinks as links. Each file is opened beneath
        a handle on the workspace, following no link on the way or at the end, so a process of the job
        still running (swapping a directory for a link to outside) cannot make the daemon read a file
        outside into a blob. A file over `max_file` bytes, or more than `max_total` bytes to write in all (0:
        no limit), raise ResultRefused (TooBig) before a blob is written. With `record`, the admin index keeps
        the result (the job has ended); otherwise it stays in memory.
        """
        repo = self.repo()
        index = repo.index
        try:
            status = repo.status(untracked_files="all")
        except pygit2.GitError as e:  # libgit2 reads no tree nested over 100 directories deep
            raise ResultRefused(
                Code.BAD_NAMES,
                f"its files cannot be read as a commit ({e}; git takes directories nested up to 100 deep): flatten "
                "or delete them (or ignore them in .gitignore)",
            ) from None
        added = FileStatus.WT_NEW | FileStatus.WT_TYPECHANGE
        new = [p for p, f in status.items() if f & added and not p.endswith("/")]
        _storable([*new, *_git_spelled(self.root, repo)])
        taken = [p for p, f in status.items() if f & (added | FileStatus.WT_MODIFIED) and not p.endswith("/")]
        if max_total:
            _within(self.root, taken, max_total)
        # Deletions first: a file that became a directory (or a link where a directory was) then adds cleanly.
        for path, flags in status.items():
            if flags & FileStatus.WT_DELETED and path in index:
                index.remove(path)
        with beneath.Root(self.root) as root:
            for path, flags in status.items():
                if path.endswith("/"):
                    continue  # a nested repository (a directory with its own .git): never ours to take
                if not flags & (FileStatus.WT_NEW | FileStatus.WT_MODIFIED | FileStatus.WT_TYPECHANGE):
                    continue
                entry = _blob(repo, root, path, max_file)
                if entry is not None:
                    index.add(entry)
                elif path in index:
                    index.remove(path)  # a FIFO where a file was, or gone meanwhile: the file is not there
        tree = index.write_tree()
        if record:
            index.write()
        return tree

    def changed(self, base: str) -> pygit2.Diff:
        """`git diff --no-renames <base>` of the files as they are now, untracked (not ignored) files as additions
        (a rename is its two sides: finding renames would cost a content comparison per pair and name no other
        path)."""
        repo = self.repo()
        base_tree = repo.revparse_single(base).peel(pygit2.Tree)
        flags = (
            pygit2.enums.DiffOption.INCLUDE_UNTRACKED
            | pygit2.enums.DiffOption.RECURSE_UNTRACKED_DIRS
            | pygit2.enums.DiffOption.SHOW_UNTRACKED_CONTENT
        )
        # base→index merged with index→workdir: the admin index's stat cache spares hashing every file.
        diff = repo.index.diff_to_tree(base_tree, flags=flags)
        diff.merge(repo.index.diff_to_workdir(flags))
        return diff

    # -- making and resetting it --------------------------------------------------------------------

    def create(self, repo_path: Path, sha: str, branch: str | None) -> None:
        """Make the workspace at `sha`: admin dir, files, and the job's own git dir on `branch` (None: detached)."""
        common = repos.common_dir(repos.open_repo(repo_path))
        _mkdir(self.root.parent / ADMIN)
        _mkdir(self.admin)
        self._quarantine(common)
        _mkdir(self.admin / "refs")
        _mkdir(self.admin / "info")
        _write(self.admin / "config", "[core]\n\trepositoryformatversion = 0\n\tbare = false\n")
        _write(self.admin / "HEAD", f"{sha}\n")
        self._inherit_info(common)
        _mkdir(self.root)
        self.git("read-tree", "-u", "--reset", sha)
        self.private(common, sha, branch)

    def repoint(self, old: str, new: str, branch: str | None) -> None:
        """From a clean `old` to `new`: only the entries that differ are rewritten (git's two-tree merge).

        Only for a workspace no job has touched since it was made or reset: the merge refuses rather than
        overwrite anything unexpected, and the caller then resets it.
        """
        if old != new:
            self.git("read-tree", "-m", "-u", old, new)
            _write(self.admin / "HEAD", f"{new}\n")
        if self.private_git.is_dir() and not self.private_git.is_symlink():
            self._point(new, branch)  # ours since the last reset: only HEAD, the ref and the index change
        else:
            self.private(self._common(), new, branch)

    def reset(self, sha: str, branch: str | None) -> None:
        """Bring a workspace a job used back to exactly `sha`, trusting nothing the job left.

        The job's git dir goes first; then the files are reset from the admin index (`reset --hard`: git
        replaces a symlink where a directory belongs instead of writing through it) and every entry the
        index does not hold is removed by a walk of our own that never follows a link (untracked and
        ignored files, FIFOs, nested repositories). Verified at the end: any difference left is an error.
        """
        remove_tree(self.private_git)
        self.git("reset", "-q", "--hard", sha)
        self._empty_quarantine()  # after the reset: the index it starts from may name the last job's blobs
        _write(self.admin / "HEAD", f"{sha}\n")
        self._inherit_info(self._common())
        tracked = set(os.fsdecode(p) for p in self.git_bytes("ls-files", "-z").split(b"\0") if p)
        _prune_untracked(self.root, tracked)
        left = self.repo().status(untracked_files="all", ignored=True)
        if left:
            shown = ", ".join(sorted(left)[:5])
            raise WorkspaceError(f"workspace {self.root} is not clean after its reset: {shown}")
        self.private(self._common(), sha, branch)

    def private(self, common: Path, sha: str, branch: str | None) -> None:
        """(Re)write the job's own git dir: a repository borrowing `common`'s objects, at `sha` on `branch`.

        Written by hand (a `git init` would copy hook samples and read templates): HEAD, a ref, an
        alternates file, the admin index (same files, same stat data) and the inherited info files.
        """
        remove_tree(self.private_git)
        g = self.private_git
        for d in ("", "objects", "objects/info", "refs", "refs/heads", "refs/tags", "info"):
            _mkdir(g / d)
        _write(g / "objects" / "info" / "alternates", f"{common / 'objects'}\n")
        _write(g / "config", _private_config(common))
        for name in _INFO_FILES:
            src = self.admin / "info" / name
            if src.exists():
                shutil.copyfile(src, g / "info" / name)
        self._point(sha, branch)

    def _point(self, sha: str, branch: str | None) -> None:
        """The job's git dir at `sha` on `branch` (None: detached), with the admin index as its own."""
        g = self.private_git
        if branch is None:
            _write(g / "HEAD", f"{sha}\n")
        else:
            ref = g / "refs" / "heads" / branch
            _mkdir(ref.parent)
            _write(ref, f"{sha}\n")
            _write(g / "HEAD", f"ref: refs/heads/{branch}\n")
        index = self.admin / "index"
        if index.exists():
            shutil.copyfile(index, g / "index")

    def adopt(self, repo_path: Path, base: str) -> None:
        """Give a directory of files (a workspace from before admin dirs existed) an admin dir at `base`.

        Its index is `base`'s tree with no stat data, so every file is compared by content: nothing the
        directory holds is trusted.
        """
        common = repos.common_dir(repos.open_repo(repo_path))
        if not self.admin.exists():
            _mkdir(self.root.parent / ADMIN)
            _mkdir(self.admin)
            self._quarantine(common)
            _mkdir(self.admin / "refs")
            _mkdir(self.admin / "info")
            _write(self.admin / "config", "[core]\n\trepositoryformatversion = 0\n\tbare = false\n")
        _write(self.admin / "HEAD", f"{base}\n")
        self._inherit_info(common)
        self.git("read-tree", base)  # the index only: the files are not touched

    def rebase(self, new: str, branch: str | None) -> Rebased:
        """Bring a kept workspace (its job's processes all ended) from its base to `new`: what changed between them
        is merged into the job's files, three-way, and `new` becomes its base (the admin dir and the job's own git
        dir point at it), so its change is its files' difference from `new`. Where the job's edit and the new base's
        conflict, the file is the new base's and the job's version is handed back (`Rebased.yours`) instead:
        a conflict never stays in the files as markers that could land.

        The files are written by git from the admin dir (`read-tree --reset -u`), which never writes through a
        link the job left where a directory belongs."""
        repo = self.repo()
        old = self.head()
        if old == new:
            return Rebased(old, new, (), {})
        old_tree, new_tree = (repo.revparse_single(r).peel(pygit2.Tree) for r in (old, new))
        ours = repo[self.tree(record=False)].peel(pygit2.Tree)
        moved = sorted({p for d in old_tree.diff_to_tree(new_tree).deltas for p in (d.old_file.path, d.new_file.path)})
        index = repo.merge_trees(old_tree, ours, new_tree)
        yours: dict[str, bytes] = {}
        for entries in list(index.conflicts or ()):
            _, mine, landed = entries
            if mine is not None and mine.mode != pygit2.enums.FileMode.LINK:
                blob = repo[mine.id]
                if isinstance(blob, pygit2.Blob):
                    yours[mine.path] = blob.data
            for path in {e.path for e in entries if e is not None}:
                left = index.conflicts
                if left is not None and path in left:
                    del left[path]
            if landed is not None:
                index.add(pygit2.IndexEntry(landed.path, landed.id, landed.mode))
        merged = index.write_tree(repo)
        self.git("read-tree", "--reset", "-u", str(merged))  # the files: the job's change on the new base
        self.git("read-tree", "--reset", new)  # the admin index: the new base (the files stay as they are)
        _write(self.admin / "HEAD", f"{new}\n")
        self._point(new, branch)
        return Rebased(old, new, tuple(moved), yours)

    def move(self, dest: Workspace) -> None:
        """Rename files and admin dir together (the admin dir names no path, so nothing else changes)."""
        self.root.rename(dest.root)
        self.admin.rename(dest.admin)

    def remove(self) -> None:
        remove_tree(self.root)
        remove_tree(self.admin)

    # -- internals ----------------------------------------------------------------------------------

    def _common(self) -> Path:
        return self.objects().parent

    def _quarantine(self, common: Path) -> None:
        """The admin dir's own object dir, borrowing `common`'s objects: what the daemon writes for the job."""
        q = self.admin / "objects"
        for d in (q, q / "info", q / "pack"):
            _mkdir(d)
        _write(q / "info" / "alternates", f"{common / 'objects'}\n")

    def _empty_quarantine(self) -> None:
        """Drop every object the last job of this workspace left in its quarantine (its alternates stay)."""
        q = self.quarantine
        if q is None:
            return
        for entry in os.scandir(q):
            if entry.name != "info":
                remove_tree(Path(entry.path))
        _mkdir(q / "pack")

    def _inherit_info(self, common: Path) -> None:
        for name in _INFO_FILES:
            src = common / "info" / name
            dst = self.admin / "info" / name
            if src.is_file():
                shutil.copyfile(src, dst)
            elif dst.exists():
                dst.unlink()

    def git(self, *args: str) -> str:
        """The git CLI on the admin dir with the workspace as work tree: hooks, fsmonitor, maintenance off."""
        return self.git_bytes(*args).decode(errors="replace").strip()

    def git_bytes(self, *args: str) -> bytes:
        """`git` with its output as bytes (file names are bytes to git)."""
        argv = ["git", *_OWN_CONFIG, f"--git-dir={self.admin}", f"--work-tree={self.root}", *args]
        try:
            out = subprocess.run(
                argv,
                cwd=self.root,
                env=repos.git_env(self.root),
                capture_output=True,
                stdin=subprocess.DEVNULL,
                timeout=GIT_TIMEOUT,
            )
        except subprocess.TimeoutExpired:
            raise WorkspaceError(f"`git {' '.join(args)}` in {self.root} took over {GIT_TIMEOUT:.0f} s") from None
        if out.returncode != 0:
            err = out.stderr.decode(errors="replace").strip()
            raise WorkspaceError(f"`git {' '.join(args)}` in {self.root} failed: {err}")
        return out.stdout


def _blob(repo: pygit2.Repository, root: beneath.Root, path: str, max_file: int) -> pygit2.IndexEntry | None:
    """The index entry (blob written) for the file or link at `path`, read without following any link; None
    when it is not a regular file or link any more (or a link on the way makes it not the workspace's)."""
    names = tuple(path.split("/"))
    try:
        parent = root.open(names[:-1], os.O_RDONLY | os.O_DIRECTORY) if len(names) > 1 else os.dup(root.fd)
    except (beneath.Escape, OSError):
        return None
    try:
        st = os.stat(names[-1], dir_fd=parent, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            target = os.fsencode(os.readlink(names[-1], dir_fd=parent))
            return pygit2.IndexEntry(path, repo.create_blob(target), pygit2.enums.FileMode.LINK)
        if not stat.S_ISREG(st.st_mode):
            return None
        _fits(path, st.st_size, max_file)
        try:
            fd = os.open(names[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOENT):
                return None  # swapped for a link, or gone, since the stat
            raise
        with os.fdopen(fd, "rb") as f:
            fst = os.fstat(fd)
            if not stat.S_ISREG(fst.st_mode):
                return None
            data = f.read(max_file + 1)
        _fits(path, len(data), max_file)
    except FileNotFoundError:
        return None
    finally:
        os.close(parent)
    filters = repo.load_filter_list(path, pygit2.enums.FilterMode.CLEAN)
    if filters is not None:  # what `git add` applies: text=auto / eol normalisation, ident (never a command)
        data = filters.apply_to_buffer(data)
    mode = pygit2.enums.FileMode.BLOB_EXECUTABLE if fst.st_mode & stat.S_IXUSR else pygit2.enums.FileMode.BLOB
    return pygit2.IndexEntry(path, repo.create_blob(data), mode)


def _fits(path: str, size: int, max_file: int) -> None:
    if size > max_file:
        raise ResultRefused(
            Code.TOO_BIG,
            f"{shown_name(path)} is {size / 2**20:.0f} MiB, over the {max_file / 2**20:.0f} MiB a job may commit: make "
            "it smaller, or keep it out of the repository (.gitignore)",
        )


_PROBE_OID = pygit2.Oid(hex="0" * 39 + "1")
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F)} | {0x0A: "\\n", 0x09: "\\t", 0x0D: "\\r"}


def shown_name(path: str) -> str:
    """A file name for a message, quoted: bytes that are not UTF-8 as `\\xNN`, control characters escaped, so a
    name can neither break a line nor hide in one."""
    text = os.fsencode(path).decode("utf-8", "backslashreplace")
    return "'" + text.translate(_CONTROL) + "'"


def _git_spelled(root: Path, repo: pygit2.Repository) -> list[str]:
    """Directories (not ignored) named `.git` in another case (`.GIT`, `sub/.Git`): git skips them without a word,
    so a job's files there would be dropped silently. Walked beneath the workspace (no link followed), ignored
    directories not entered."""
    found: list[str] = []
    with beneath.Root(root) as top:
        todo: list[tuple[str, ...]] = [()]
        while todo:
            names = todo.pop()
            try:
                fd = top.opendir(names) if names else os.dup(top.fd)
            except (beneath.Escape, OSError):
                continue  # gone, or a link now: git does not enter it either
            try:
                with os.scandir(fd) as entries:
                    dirs = [e.name for e in entries if e.is_dir(follow_symlinks=False) and e.name != ".git"]
            finally:
                os.close(fd)
            for name in dirs:
                path = "/".join((*names, name))
                if _ignored(repo, path + "/"):
                    continue
                if name.lower() == ".git":
                    found.append(path + "/")
                else:
                    todo.append((*names, name))
    return found


def _ignored(repo: pygit2.Repository, path: str) -> bool:
    try:
        return bool(repo.path_is_ignored(path))
    except (pygit2.GitError, UnicodeError):
        return False


def _within(root: Path, paths: list[str], max_total: int) -> None:
    """ResultRefused (TooBig) when the files at `paths` (sizes as they are now, links as their targets) add up to
    more than `max_total` bytes: checked before anything is written."""
    total = 0
    with beneath.Root(root) as top:
        for path in paths:
            names = tuple(path.split("/"))
            try:
                parent = top.open(names[:-1], os.O_RDONLY | os.O_DIRECTORY) if len(names) > 1 else os.dup(top.fd)
            except (beneath.Escape, OSError):
                continue
            try:
                total += os.stat(names[-1], dir_fd=parent, follow_symlinks=False).st_size
            except OSError:
                pass
            finally:
                os.close(parent)
    if total > max_total:
        raise ResultRefused(
            Code.TOO_BIG,
            f"its result is {total / 2**20:.0f} MiB in {len(paths)} files, over the {max_total / 2**20:.0f} MiB a job "
            "may add (jobs.max_result_bytes): nothing was written to your repository; keep generated files out of "
            "it (.gitignore) or raise the limit",
        )


def _storable(paths: Iterable[str]) -> None:
    """ResultRefused (BadNames) naming every path git would not store (its own checks: `.git` in any case or
    spelling a file system folds to it, `git~1`, `.`/`..` segments) or that is not UTF-8 (git would store those
    bytes, but they break checkouts and tools elsewhere: a name a job made by accident or on purpose)."""
    probe = pygit2.Index()  # in memory: libgit2 checks each name as it would on `git add`
    bad: list[str] = []
    for path in paths:
        why = ""
        try:
            path.encode()
        except UnicodeEncodeError:
            why = " (not UTF-8)"
        else:
            try:
                probe.add(pygit2.IndexEntry(path, _PROBE_OID, pygit2.enums.FileMode.BLOB))
            except (pygit2.GitError, ValueError):
                why = " (a name git refuses)"
        if why:
            bad.append(shown_name(path) + why)
    if bad:
        shown = ", ".join(sorted(bad)[:10]) + (f" and {len(bad) - 10} more" if len(bad) > 10 else "")
        raise ResultRefused(
            Code.BAD_NAMES,
            f"it left files whose names cannot be committed: {shown}; rename or delete them (or ignore them in "
            ".gitignore)",
        )


def remove_tree(path: Path) -> None:
    """Delete `path` and everything under it without following a link; a link itself is just unlinked.

    By directory handle, never entering a symlinked directory, at any depth (`_rmtree`); a top-level link or
    file is unlinked. Missing is fine.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        _writable(path)
        _rmtree(path)
    else:
        path.unlink()


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _rmtree(path: Path | str) -> None:
    """Delete the directory `path` and everything under it, however deep (a job's `mkdir d; cd d` in a loop goes
    past any recursion): one directory handle at a time, down by name never following a link (a link is unlinked),
    back up through `..` checked to be the directory it came from; a directory the job made read-only or unreadable
    is made the daemon's to delete first. Neither the stack nor the open files grow with the depth."""
    fd = os.open(path, _DIR_FLAGS)
    above: list[tuple[int, int, list[str]]] = []  # each directory above `fd`: device, inode, subdirs left to remove
    try:
        todo = _clear(fd)
        while True:
            if todo:
                st = os.fstat(fd)
                sub = _open_child(fd, todo[-1])
                above.append((st.st_dev, st.st_ino, todo))
                os.close(fd)
                fd = sub
                todo = _clear(fd)
                continue
            if not above:
                break
            up = os.open("..", _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = up
            dev, ino, todo = above.pop()
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != (dev, ino):
                raise OSError(errno.EXDEV, f"a directory under {path} moved while it was deleted; not deleted")
            os.rmdir(todo.pop(), dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(path)


def _open_child(fd: int, name: str) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=fd)
    except PermissionError:  # a directory the job made unreadable (it is a directory: `_clear` saw it, no link)
        os.chmod(name, stat.S_IRWXU, dir_fd=fd)
        return os.open(name, _DIR_FLAGS, dir_fd=fd)


def _clear(fd: int) -> list[str]:
    """Unlink every entry of the directory `fd` that is no directory (links included, never followed); the names of
    the directories in it."""
    dirs: list[str] = []
    with contextlib.suppress(PermissionError):  # not ours to change: then unlinking below says why it cannot
        os.fchmod(fd, stat.S_IRWXU)  # a directory the job made read-only: its entries are deleted all the same
    with os.scandir(fd) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                dirs.append(entry.name)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.name, dir_fd=fd)
    return dirs


def _writable(path: Path) -> None:
    try:
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode):
            os.chmod(path, stat.S_IMODE(st.st_mode) | stat.S_IRWXU)
    except OSError:
        pass  # rmtree reports what it still cannot delete


def _prune_untracked(root: Path, tracked: set[str]) -> None:
    """Remove every entry under `root` that is neither a tracked path nor a directory leading to one.

    By directory file descriptor, never following a link: a symlink where a directory was is unlinked, not
    entered. Tracked entries of the wrong type were already replaced by `reset --hard`. Entry types come
    from the directory listing itself (no stat per file: 10k files take a few ms more than the listing).
    """
    dirs: set[str] = set()
    for p in tracked:
        cut = p.rfind("/")
        while cut > 0 and p[:cut] not in dirs:
            dirs.add(p[:cut])
            cut = p.rfind("/", 0, cut)

    def walk(fd: int, prefix: str) -> None:
        with os.scandir(fd) as entries:
            for entry in entries:
                rel = prefix + entry.name
                if entry.is_dir(follow_symlinks=False):
                    if rel in dirs:
                        sub = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                        try:
                            walk(sub, rel + "/")
                        finally:
                            os.close(sub)
                    elif not (prefix == "" and entry.name == ".git"):  # the job's git dir: rewritten after
                        remove_tree(root / rel)
                elif rel not in tracked or not (entry.is_file(follow_symlinks=False) or entry.is_symlink()):
                    os.unlink(entry.name, dir_fd=fd)

    top = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        walk(top, "")
    finally:
        os.close(top)


def _private_config(common: Path) -> str:
    """The job's git config: a plain repository, with the user's identity from the repository's config so
    that commits the job makes in its own git dir say who it works for."""
    text = "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n\tlogallrefupdates = true\n"
    try:
        config = pygit2.Repository(str(common), pygit2.enums.RepositoryOpenFlag.NO_SEARCH).config
        who = {k: str(config[f"user.{k}"]) for k in ("name", "email") if f"user.{k}" in config}
    except (pygit2.GitError, KeyError, ValueError):
        who = {}
    if who:
        text += "[user]\n" + "".join(f"\t{k} = {_quoted(v)}\n" for k, v in who.items())
    return text


def _quoted(value: str) -> str:
    """A git config value in double quotes, with what git escapes there escaped (no newline survives)."""
    clean = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")
    return f'"{clean}"'


def _mkdir(path: Path) -> None:
    private_dir(path)  # 0700 whatever the umask, parents too


def _write(path: Path, text: str) -> None:
    with os.fdopen(open_private(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW), "w") as f:
        f.write(text)
