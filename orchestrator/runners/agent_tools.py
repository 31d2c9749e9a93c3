"""The built-in agent's tools: their definitions (JSON schemas the model reads) and what each one does.

Every path goes through `beneath` first: checked as text, then opened beneath a handle on the worktree
without following a symlink, and read or written only through that descriptor (a process the job left
cannot redirect a write by swapping a directory for a link). A refused path is a tool error the model
can read (and a logged event), never an exception that ends the job. Reads and searches are bounded
(`READ_LIMIT`, `SEARCH_*`), so a huge or sparse file costs the daemon no more than the limit. `run`
executes a command in the worktree through the one process helper (owned group, timeout, capped output),
sandboxed when the machine can.
"""

from __future__ import annotations

import asyncio
import errno
import os
import stat
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import regex

from orchestrator.beneath import Escape, Root, open_beneath, parts, regular, shown
from orchestrator.runners.base import Held

SEARCH_LIMIT = 200
"""Most matching lines `search` returns."""
READ_LIMIT = 1024 * 1024
"""Most bytes `read_file` reads of one file (the model sees `output_cap` characters of them)."""
EDIT_LIMIT = 8 * 1024 * 1024
"""Largest file `edit_file` rewrites (it reads the whole file)."""
SEARCH_FILE_LIMIT = 2 * 1024 * 1024
"""Files larger than this are skipped by `search` (and named as skipped)."""
SEARCH_BYTES = 64 * 1024 * 1024
"""Most bytes one `search` reads in all; past it the search stops and says so."""
SEARCH_ENTRIES = 50_000
"""Most directory entries one `search` looks at."""
SEARCH_DEPTH = 64
"""Deepest directory `search` enters."""
SEARCH_SECONDS = 10.0
"""Longest a `search` matches for: a pattern that backtracks without end is stopped, and never holds the GIL
(the `regex` engine releases it while it matches), so the daemon's loop goes on meanwhile."""
LIST_LIMIT = 5_000
"""Most entries `list_dir` shows."""

_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY
"""O_NONBLOCK: opening a FIFO never waits for a writer (the type check refuses it once opened)."""

TOOLS: list[dict[str, Any]] = [
    {
        "name": "read_file",
        "description": "Read a text file of the repository. Paths are relative to the repository root.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string", "description": "e.g. 'src/app.py'"}},
            "required": ["path"],
        },
    },
    {
        "name": "list_dir",
        "description": "List a directory of the repository (directories end with '/'). Default: the root.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
    {
        "name": "search",
        "description": "Search the repository's text files for a regular expression; returns path:line: text.",
        "input_schema": {
            "type": "object",
            "properties": {
                "pattern": {"type": "string", "description": "a Python regular expression"},
                "path": {"type": "string", "description": "a directory or file to search in (default: all)"},
            },
            "required": ["pattern"],
        },
    },
    {
        "name": "write_file",
        "description": "Create or overwrite a file with the given content (parent directories are created).",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
    },
    {
        "name": "edit_file",
        "description": "Replace one exact occurrence of `old` with `new` in a file. `old` must occur exactly once.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}},
            "required": ["path", "old", "new"],
        },
    },
    {
        "name": "run",
        "description": "Run a shell command in the repository root (tests, linters, builds); returns its exit "
        "status and the end of its output.",
        "input_schema": {
            "type": "object",
            "properties": {
                "command": {"type": "string"},
                "timeout": {"type": "number", "description": "seconds (capped by the orchestrator)"},
            },
            "required": ["command"],
        },
    },
    {
        "name": "done",
        "description": "Finish the task: the orchestrator commits the repository's changes and lands them.",
        "input_schema": {
            "type": "object",
            "properties": {"summary": {"type": "string", "description": "one line: what changed"}},
            "required": ["summary"],
        },
    },
]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a tool call gives back to the model."""

    text: str
    error: bool = False
    done: bool = False


RunCommand = Callable[[str, float], Awaitable[tuple[int | None, str]]]
"""Runs a shell command in the worktree with a timeout: (exit status or None on timeout, output tail)."""
OnRefused = Callable[[str, str, str], None]
"""Called with (tool, path, reason) when a path is refused."""


class Tools:
    def __init__(
        self,
        worktree: Path,
        *,
        run_command: RunCommand,
        on_refused: OnRefused,
        output_cap: int = 20_000,
        run_timeout: float = 300.0,
        held: Held | None = None,
    ) -> None:
        self.held = held
        """Asked before each write: another active job may hold the path (then the write is refused)."""
        self.worktree = worktree
        self.run_command = run_command
        self.on_refused = on_refused
        self.output_cap = output_cap
        self.run_timeout = run_timeout

    async def call(self, name: str, args: dict[str, Any]) -> Outcome:
        handler = getattr(self, f"_t_{name}", None)
        if handler is None:
            return Outcome(f"no tool {name!r}; use one of {', '.join(t['name'] for t in TOOLS)}", error=True)
        try:
            result: Outcome = await handler(args)
        except Escape as e:
            self.on_refused(name, str(args.get("path", "")), str(e))
            result = Outcome(str(e), error=True)
        except (KeyError, TypeError) as e:
            result = Outcome(f"{name}: bad arguments ({e}); see the tool's input schema", error=True)
        except UnicodeError as e:
            result = Outcome(f"{name}: {e}: give the text as valid UTF-8", error=True)
        except OSError as e:
            where = f" ({shown(str(e.filename))})" if e.filename else ""
            result = Outcome(f"{name}: {e.strerror or e}{where}", error=True)
        # What goes back to the model (JSON, UTF-8) and to the log must encode: a name need not be UTF-8.
        return Outcome(_encodable(result.text), error=result.error, done=result.done)

    def _cap(self, text: str) -> str:
        if len(text) <= self.output_cap:
            return text
        return text[: self.output_cap] + f"\n[... cut at {self.output_cap} of {len(text)} characters]"

    async def _t_read_file(self, args: dict[str, Any]) -> Outcome:
        names = _file(args["path"])

        def read() -> tuple[bytes, int]:
            with Root(self.worktree) as root:
                fd = root.open(names, _READ)
                try:
                    return _read_at_most(fd, READ_LIMIT), regular(fd, names).st_size
                finally:
                    os.close(fd)

        data, size = await asyncio.to_thread(read)
        if b"\0" in data[:8192]:
            return Outcome(f"{shown(names)}: a binary file ({size} bytes)", error=True)
        text = self._cap(data.decode(errors="replace"))
        if size > len(data):
            text += f"\n[read the first {len(data)} of {size} bytes only; use `run` (sed -n, head, tail) for the rest]"
        return Outcome(text)

    async def _t_list_dir(self, args: dict[str, Any]) -> Outcome:
        names = parts(args.get("path") or ".")

        def listing() -> str:
            with Root(self.worktree) as root:
                fd = root.opendir(names)
                try:
                    return _listing(fd)
                finally:
                    os.close(fd)

        return Outcome(self._cap(await asyncio.to_thread(listing)))

    async def _t_search(self, args: dict[str, Any]) -> Outcome:
        pattern = str(args["pattern"])
        try:
            rx = regex.compile(pattern)
        except regex.error:
            rx = regex.compile(regex.escape(pattern))
        names = parts(args.get("path") or ".")

        def search() -> _Search:
            with Root(self.worktree) as root:
                found = _Search(rx)
                found.run(root, names)
                return found

        found = await asyncio.to_thread(search)
        if not found.hits and not found.notes:
            return Outcome("no matches")
        more = [f"[first {SEARCH_LIMIT} matches only]"] if len(found.hits) >= SEARCH_LIMIT else []
        return Outcome(self._cap("\n".join([*found.hits, *more, *found.notes]) or "no matches"))

    async def _held(self, names: tuple[str, ...]) -> Outcome | None:
        if self.held is None:
            return None
        why = await self.held("/".join(names))
        return None if why is None else Outcome(why, error=True)

    async def _t_write_file(self, args: dict[str, Any]) -> Outcome:
        names = _file(args["path"])
        data = str(args["content"]).encode()
        if (refused := await self._held(names)) is not None:
            return refused

        def write() -> None:
            with Root(self.worktree) as root:
                parent = root.makedirs(names[:-1])
                try:
                    fd = _open_for_writing(parent, names)
                finally:
                    os.close(parent)
                try:
                    os.ftruncate(fd, 0)
                    _write_all(fd, data)
                finally:
                    os.close(fd)

        await asyncio.to_thread(write)
        return Outcome(f"wrote {shown(names)} ({len(str(args['content']))} characters)")

    async def _t_edit_file(self, args: dict[str, Any]) -> Outcome:
        names = _file(args["path"])
        old, new = str(args["old"]), str(args["new"])
        if (refused := await self._held(names)) is not None:
            return refused

        def edit() -> int:
            with Root(self.worktree) as root:
                fd = root.open(names, os.O_RDWR | os.O_NONBLOCK | os.O_NOCTTY)
                try:
                    st = _writable(fd, names)
                    if st.st_size > EDIT_LIMIT:
                        raise OSError(errno.EFBIG, f"{st.st_size} bytes, more than edit_file rewrites ({EDIT_LIMIT}); "
                                      "use `run` with sed or a script")  # fmt: skip
                    # surrogateescape: bytes that are not UTF-8 come back out exactly as they were.
                    text = _read_at_most(fd, EDIT_LIMIT).decode(errors="surrogateescape")
                    count = text.count(old) if old else 0
                    if count == 1:
                        os.ftruncate(fd, 0)
                        _write_all(fd, text.replace(old, new, 1).encode(errors="surrogateescape"), offset=0)
                    return count
                finally:
                    os.close(fd)

        count = await asyncio.to_thread(edit)
        if count != 1:
            found = "not found" if count == 0 else f"found {count} times"
            return Outcome(f"edit_file {shown(names)}: `old` {found}; it must occur exactly once", error=True)
        return Outcome(f"edited {shown(names)}")

    async def _t_run(self, args: dict[str, Any]) -> Outcome:
        command = str(args["command"])
        timeout = self.run_timeout
        if isinstance(args.get("timeout"), int | float) and args["timeout"] > 0:
            timeout = min(float(args["timeout"]), self.run_timeout)
        code, tail = await self.run_command(command, timeout)
        status = f"timed out after {timeout:g}s" if code is None else f"exit {code}"
        return Outcome(self._cap(f"{status}\n{tail}"), error=code != 0)

    async def _t_done(self, args: dict[str, Any]) -> Outcome:
        return Outcome(str(args.get("summary") or "done"), done=True)


def _encodable(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _file(raw: object) -> tuple[str, ...]:
    names = parts(raw)
    if not names:
        raise Escape("name a file, e.g. 'src/app.py', not the repository root")
    return names


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    left = limit
    while left > 0:
        chunk = os.read(fd, min(left, 1024 * 1024))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes, offset: int | None = None) -> None:
    view = memoryview(data)
    pos = 0
    while pos < len(view):
        n = os.write(fd, view[pos:]) if offset is None else os.pwrite(fd, view[pos:], offset + pos)
        pos += n


def _writable(fd: int, names: tuple[str, ...]) -> os.stat_result:
    """A regular file with one name only: a hard link may be a file outside the repository."""
    st = regular(fd, names)
    if st.st_nlink > 1:
        raise Escape(
            f"{shown(names)} has {st.st_nlink} hard links (one may be a file outside the repository): refused; "
            "remove it with `run` first, then write the file"
        )
    return st


def _open_for_writing(parent: int, names: tuple[str, ...]) -> int:
    """The last component of `names` in the directory `parent`, opened (or created) for writing without
    following a link; a FIFO, device or hard-linked file is refused before anything is written."""
    flags = os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY
    try:
        try:
            fd = open_beneath(parent, names[-1:], flags)
        except FileNotFoundError:
            fd = open_beneath(parent, names[-1:], flags | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise Escape(
                f"{shown(names)} is a symbolic link; file tools never write through one (it could lead outside "
                "the repository): write the path it points to, or remove the link with `run` first"
            ) from None
        if e.errno == errno.ENXIO:  # a FIFO nobody reads
            raise OSError(errno.EINVAL, f"{shown(names)} is a FIFO, not a regular file; refused") from None
        raise
    try:
        _writable(fd, names)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _listing(fd: int) -> str:
    lines: list[str] = []
    with os.scandir(fd) as it:
        entries = []
        for entry in it:
            if entry.name.lower() == ".git":
                continue
            entries.append(entry)
            if len(entries) >= LIST_LIMIT:
                break
    for entry in sorted(entries, key=lambda e: e.name):
        if entry.is_symlink():
            try:
                target = shown(os.readlink(entry.name, dir_fd=fd))
            except OSError:
                target = "?"
            lines.append(f"{shown(entry.name)} -> {target} (symbolic link: not followed)")
        else:
            lines.append(shown(entry.name) + ("/" if entry.is_dir(follow_symlinks=False) else ""))
    if len(entries) >= LIST_LIMIT:
        lines.append(f"[first {LIST_LIMIT} entries only]")
    return "\n".join(lines) or "(empty)"


class _Search:
    """One bounded search: every directory and file opened beneath the root, no link followed, at most
    SEARCH_ENTRIES entries, SEARCH_DEPTH levels, SEARCH_FILE_LIMIT per file and SEARCH_BYTES in all."""

    def __init__(self, rx: regex.Pattern[str]) -> None:
        self.rx = rx
        self.deadline = time.monotonic() + SEARCH_SECONDS
        self.hits: list[str] = []
        self.notes: list[str] = []
        self.skipped: list[str] = []
        self.scanned = 0
        self.entries = 0
        self.stopped = False
        self.slow = False

    def run(self, root: Root, names: tuple[str, ...]) -> None:
        fd = root.open(names, _READ)
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                self._dir(fd, names, 0)
            elif stat.S_ISREG(st.st_mode):
                self._file(fd, names, st.st_size)
        finally:
            os.close(fd)
        if self.skipped:
            more = f" and {len(self.skipped) - 5} more" if len(self.skipped) > 5 else ""
            self.notes.append(f"[not searched, over {SEARCH_FILE_LIMIT} bytes: {', '.join(self.skipped[:5])}{more}]")
        if self.slow:
            self.notes.append(f"[search stopped after {SEARCH_SECONDS:g} s: the pattern is too slow; make it simpler]")
        elif self.stopped:
            self.notes.append(
                f"[search stopped after {self.entries} entries and {self.scanned} bytes: name a directory or file]"
            )

    def _done(self) -> bool:
        return self.stopped or len(self.hits) >= SEARCH_LIMIT

    def _dir(self, fd: int, names: tuple[str, ...], depth: int) -> None:
        if depth >= SEARCH_DEPTH:
            self.stopped = True
            return
        with os.scandir(fd) as it:
            listed = []
            for entry in it:
                self.entries += 1
                if self.entries > SEARCH_ENTRIES:
                    self.stopped = True
                    break
                listed.append(entry)
        for entry in sorted(listed, key=lambda e: e.name):
            if self._done():
                return
            if entry.name.lower() == ".git":
                continue
            here = (*names, entry.name)
            try:
                if entry.is_dir(follow_symlinks=False):
                    child = open_beneath(fd, (entry.name,), os.O_RDONLY | os.O_DIRECTORY)
                    try:
                        self._dir(child, here, depth + 1)
                    finally:
                        os.close(child)
                elif entry.is_file(follow_symlinks=False):
                    size = entry.stat(follow_symlinks=False).st_size
                    if size > SEARCH_FILE_LIMIT:
                        self.skipped.append(shown(here))
                        continue
                    child = open_beneath(fd, (entry.name,), _READ)
                    try:
                        st = os.fstat(child)
                        if stat.S_ISREG(st.st_mode):  # swapped for a FIFO since the listing: skipped
                            self._file(child, here, st.st_size)
                    finally:
                        os.close(child)
            except OSError:
                continue  # gone, or swapped for a link since the listing: not followed, not searched

    def _file(self, fd: int, names: tuple[str, ...], size: int) -> None:
        if size > SEARCH_FILE_LIMIT:
            self.skipped.append(shown(names))
            return
        budget = SEARCH_BYTES - self.scanned
        if budget <= 0:
            self.stopped = True
            return
        if size > budget:
            self.stopped = True  # this file's first `budget` bytes are the search's last
        data = _read_at_most(fd, min(SEARCH_FILE_LIMIT, budget))
        self.scanned += len(data)
        if b"\0" in data[:8192]:
            return
        where = shown(names)
        for n, line in enumerate(data.decode(errors="replace").splitlines(), 1):
            try:
                hit = self.rx.search(line, timeout=max(0.0, self.deadline - time.monotonic()))
            except TimeoutError:
                self.stopped = self.slow = True
                return
            if hit:
                self.hits.append(f"{where}:{n}: {line[:300]}")
                if len(self.hits) >= SEARCH_LIMIT:
                    return
