"""Open paths beneath a directory handle, race-free, never following a link.

Used by the agent's file tools (inside its worktree) and by the daemon reading a job's files (`git.workspace`).

A path the model names is first checked as text (`parts`: relative, no `..`, no `.git`), then opened
relative to an open directory handle of the worktree (`Root`) without ever following a symbolic link:
`openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)` where the kernel has it (5.6+),
else one `openat(O_NOFOLLOW | O_DIRECTORY)` per component, each relative to the one before. There is no
gap between a check and the use: the open is the check. A process the job left that swaps a directory
for a symlink to outside (even with `renameat2(RENAME_EXCHANGE)`) makes the open fail, never lead out.
Directories are made the same way (`mkdirat` then a no-follow open of what was made), and files are read
and written only through the descriptor that was opened this way, after `fstat` says it is a regular
file (a FIFO or device is refused unread and unwritten: opened with O_NONBLOCK, so the open never hangs).

A refused path is an `Escape` with a message the model can act on. `.git` (the worktree's link to the
repository) is refused in every component, as git itself refuses it: the agent changes files, the daemon
makes the commits.

What this does not cover: a directory the job moves elsewhere while the daemon holds it open is followed
there (the handle names the directory, not its path). Inside the sandbox a job cannot move one out of its
worktree (a rename across mounts fails); without a sandbox the job runs as you and could write there
itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path

RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
SYS_OPENAT2 = 437
"""The same number on every Linux architecture (the unified syscall table since 5.1)."""

NOT_A_NAME = frozenset({"", "."})


class Escape(ValueError):
    """The path leads outside the worktree, through a symlink or into `.git`; the message says so in the
    model's terms."""


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_openat2_state: bool | None = None
"""Whether this kernel has openat2 (None: not probed yet). Tests set it False to exercise the walk."""

pause: Callable[[], None] | None = None
"""A test seam: called between the steps of a resolution (after each directory is opened, before the
last open), where a racing process would act."""


def _openat2(dirfd: int, name: bytes, flags: int, mode: int) -> int:
    takes_mode = bool(flags & os.O_CREAT) or flags & os.O_TMPFILE == os.O_TMPFILE  # else mode must be 0
    how = _OpenHow(flags, mode if takes_mode else 0, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
    fd = int(_libc.syscall(ctypes.c_long(SYS_OPENAT2), ctypes.c_int(dirfd), ctypes.c_char_p(name),
                           ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how))))  # fmt: skip
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), name.decode(errors="surrogateescape"))
    return fd


def have_openat2() -> bool:
    """Whether the kernel (and any seccomp filter around us) lets openat2 through; probed once."""
    global _openat2_state
    if _openat2_state is None:
        root = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.close(_openat2(root, b".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, 0))
            _openat2_state = True
        except OSError as e:
            # ENOSYS: an older kernel; EPERM: a seccomp filter that refuses unknown calls; EINVAL: flags unknown.
            if e.errno not in (errno.ENOSYS, errno.EPERM, errno.EINVAL, errno.E2BIG):
                raise
            _openat2_state = False
        finally:
            os.close(root)
    return _openat2_state


def parts(raw: object) -> tuple[str, ...]:
    """The components of `raw`, a path relative to the worktree ("." and "" mean the root), or `Escape`."""
    if not isinstance(raw, str) or not raw.strip():
        raise Escape("give a path relative to the repository root, e.g. 'src/app.py'")
    text = raw.strip()
    if "\0" in text:
        raise Escape(f"{text!r}: a path cannot contain NUL")
    try:
        os.fsencode(text)
    except UnicodeEncodeError:
        raise Escape(f"{text!r}: not a valid file name") from None
    if text.startswith(("/", "~")):
        raise Escape(f"{text}: absolute paths are refused; use a path relative to the repository root")
    names = tuple(p for p in text.split("/") if p not in NOT_A_NAME)
    if ".." in names:
        raise Escape(f"{text}: '..' is refused; every path must stay inside the repository")
    if any(p.lower() == ".git" for p in names):
        raise Escape(f"{text}: .git is off limits; change files and the orchestrator commits them")
    return names


def shown(names: tuple[str, ...] | str) -> str:
    """A path as the model and the log see it: POSIX, and a name that is not UTF-8 with `\\xNN` escapes."""
    text = names if isinstance(names, str) else "/".join(names) or "."
    return os.fsencode(text).decode("utf-8", "backslashreplace")


def _step() -> None:
    if pause is not None:
        pause()


def _walk(dirfd: int, names: tuple[str, ...], flags: int, mode: int) -> int:
    """openat2's promise by hand: each component opened no-follow relative to the one before."""
    fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dirfd)
    try:
        for name in names[:-1]:
            nfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nfd
            _step()
        last = names[-1] if names else "."
        return os.open(last, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=fd)
    finally:
        os.close(fd)


def open_beneath(dirfd: int, names: tuple[str, ...], flags: int, mode: int = 0o666) -> int:
    """Open `names` beneath the directory `dirfd`, following no symlink on the way or at the end; an fd, or
    OSError (ELOOP or ENOTDIR where a symlink was met)."""
    flags |= os.O_NOFOLLOW | os.O_CLOEXEC
    if have_openat2():
        _step()
        return _openat2(dirfd, os.fsencode("/".join(names) or "."), flags, mode)
    return _walk(dirfd, names, flags, mode)


class Root:
    """An open handle on a worktree; every file operation of the agent goes through one."""

    def __init__(self, worktree: Path) -> None:
        self.fd = os.open(worktree, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def __enter__(self) -> Root:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def open(self, names: tuple[str, ...], flags: int, mode: int = 0o666) -> int:
        """`open_beneath` from the root, a symlink on the way an `Escape` naming it."""
        try:
            return open_beneath(self.fd, names, flags, mode)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EXDEV):
                link = self.first_link(names)
                if link is not None:
                    raise _link_refused(names, link) from None
                if e.errno == errno.ELOOP:  # a link that was there and is gone again: a race, refused all the same
                    raise Escape(f"{shown(names)}: passes through a symbolic link; refused") from None
            raise

    def opendir(self, names: tuple[str, ...]) -> int:
        return self.open(names, os.O_RDONLY | os.O_DIRECTORY)

    def makedirs(self, names: tuple[str, ...]) -> int:
        """The directory `names`, made where missing (mkdirat, then opened no-follow: what a racing process
        put there instead of the new directory is refused); an fd on it."""
        fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=self.fd)
        try:
            for i, name in enumerate(names):
                try:
                    nfd = _child_dir(fd, name, names[: i + 1])
                except FileNotFoundError:
                    with contextlib.suppress(FileExistsError):  # made meanwhile: opened no-follow like any other
                        os.mkdir(name, 0o777, dir_fd=fd)
                    _step()
                    nfd = _child_dir(fd, name, names[: i + 1])
                os.close(fd)
                fd = nfd
            return fd
        except BaseException:
            os.close(fd)
            raise

    def first_link(self, names: tuple[str, ...]) -> tuple[str, ...] | None:
        """The first prefix of `names` that is a symlink now (for the message only), or None."""
        fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=self.fd)
        try:
            for i, name in enumerate(names):
                if _is_link(fd, name):
                    return names[: i + 1]
                try:
                    nfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                except OSError:
                    return None
                os.close(fd)
                fd = nfd
            return None
        finally:
            os.close(fd)


def _link_refused(names: tuple[str, ...], link: tuple[str, ...]) -> Escape:
    return Escape(
        f"{shown(names)}: {shown(link)} is a symbolic link; file tools never follow one (it could lead outside "
        "the repository): name the path it points to"
    )


def _child_dir(fd: int, name: str, here: tuple[str, ...]) -> int:
    try:
        return open_beneath(fd, (name,), os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        if e.errno == errno.ELOOP or (e.errno == errno.ENOTDIR and _is_link(fd, name)):
            raise _link_refused(here, here) from None
        if e.errno == errno.ENOTDIR:
            raise NotADirectoryError(errno.ENOTDIR, "a file is in the way", shown(here)) from None
        raise


def _is_link(dirfd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def regular(fd: int, what: tuple[str, ...]) -> os.stat_result:
    """fstat of an opened file that must be a regular file: IsADirectoryError or OSError otherwise."""
    st = os.fstat(fd)
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory", shown(what))
    if not stat.S_ISREG(st.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "a device"
        raise OSError(errno.EINVAL, f"{shown(what)} is {kind}, not a regular file; refused")
    return st
