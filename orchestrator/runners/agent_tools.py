"""The built-in agent's tools: their definitions (JSON schemas the model reads) and what each one does.

Every path goes through `confine.inside` first; a refused path is a tool error the model can read (and a
logged event), never an exception that ends the job. `run` executes a command in the worktree through the
one process helper (owned group, timeout, capped output), sandboxed when the machine can.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.runners.confine import Escape, inside, relative

SEARCH_LIMIT = 200
"""Most matching lines `search` returns."""

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
    ) -> None:
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
            return result
        except Escape as e:
            self.on_refused(name, str(args.get("path", "")), str(e))
            return Outcome(str(e), error=True)
        except (KeyError, TypeError) as e:
            return Outcome(f"{name}: bad arguments ({e}); see the tool's input schema", error=True)
        except OSError as e:
            return Outcome(f"{name}: {e.strerror or e}", error=True)

    def _cap(self, text: str) -> str:
        if len(text) <= self.output_cap:
            return text
        return text[: self.output_cap] + f"\n[... cut at {self.output_cap} of {len(text)} characters]"

    async def _t_read_file(self, args: dict[str, Any]) -> Outcome:
        path = inside(self.worktree, args["path"])
        data = await asyncio.to_thread(path.read_bytes)
        if b"\0" in data[:8192]:
            return Outcome(f"{args['path']}: a binary file ({len(data)} bytes)", error=True)
        return Outcome(self._cap(data.decode(errors="replace")))

    async def _t_list_dir(self, args: dict[str, Any]) -> Outcome:
        path = inside(self.worktree, args.get("path") or ".")

        def listing() -> str:
            names = []
            for entry in sorted(os.scandir(path), key=lambda e: e.name):
                if entry.name == ".git":
                    continue
                names.append(entry.name + ("/" if entry.is_dir() else ""))
            return "\n".join(names) or "(empty)"

        return Outcome(self._cap(await asyncio.to_thread(listing)))

    async def _t_search(self, args: dict[str, Any]) -> Outcome:
        pattern = str(args["pattern"])
        try:
            rx = re.compile(pattern)
        except re.error:
            rx = re.compile(re.escape(pattern))
        start = inside(self.worktree, args.get("path") or ".")
        hits = await asyncio.to_thread(_search, self.worktree, start, rx)
        if not hits:
            return Outcome("no matches")
        more = f"\n[first {SEARCH_LIMIT} matches only]" if len(hits) >= SEARCH_LIMIT else ""
        return Outcome(self._cap("\n".join(hits) + more))

    async def _t_write_file(self, args: dict[str, Any]) -> Outcome:
        path = inside(self.worktree, args["path"])
        content = str(args["content"])
        if path.is_dir():
            return Outcome(f"{args['path']} is a directory", error=True)

        def write() -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)

        await asyncio.to_thread(write)
        return Outcome(f"wrote {relative(self.worktree, path)} ({len(content)} characters)")

    async def _t_edit_file(self, args: dict[str, Any]) -> Outcome:
        path = inside(self.worktree, args["path"])
        old, new = str(args["old"]), str(args["new"])
        text = await asyncio.to_thread(path.read_text)
        count = text.count(old) if old else 0
        if count != 1:
            found = "not found" if count == 0 else f"found {count} times"
            return Outcome(f"edit_file {args['path']}: `old` {found}; it must occur exactly once", error=True)
        await asyncio.to_thread(path.write_text, text.replace(old, new, 1))
        return Outcome(f"edited {relative(self.worktree, path)}")

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


def _search(worktree: Path, start: Path, rx: re.Pattern[str]) -> list[str]:
    hits: list[str] = []
    files = [start] if start.is_file() else _walk(start)
    for f in files:
        try:
            inside(worktree, relative(worktree, f))  # a symlinked file pointing out is skipped
            data = f.read_bytes()
        except (Escape, OSError, ValueError):
            continue
        if b"\0" in data[:8192]:
            continue
        for n, line in enumerate(data.decode(errors="replace").splitlines(), 1):
            if rx.search(line):
                hits.append(f"{relative(worktree, f)}:{n}: {line[:300]}")
                if len(hits) >= SEARCH_LIMIT:
                    return hits
    return hits


def _walk(start: Path) -> list[Path]:
    out: list[Path] = []
    for root, dirs, names in os.walk(start):  # followlinks=False: a linked directory is not entered
        dirs[:] = sorted(d for d in dirs if d != ".git")
        out.extend(Path(root) / n for n in sorted(names))
    return out
