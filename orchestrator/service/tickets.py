"""Tickets a commit names: `Orchestrator:` trailers and ticket files with front matter. Pure, no I/O.

A commit message's trailers (its last paragraph of `Key: value` lines):

    Orchestrator: make the login form remember the user
    Orchestrator-Paths: src/login.py, tests/test_login.py
    Orchestrator-Runner: claude
    Orchestrator-Id: login-remember

`Orchestrator-Paths`, `-Runner`, `-Priority`, `-Id` and `-Branch` apply to the `Orchestrator:` ticket
before them (or the first one, when they come first). A commit with an `Orchestrator-Job:` trailer is
the daemon's own and names no ticket.

A ticket file (default `.orchestrator/tickets/*.md`) is Markdown with optional front matter:

    ---
    id: login-remember
    paths: [src/login.py, tests/test_login.py]
    runner: claude
    priority: 5
    ---
    Make the login form remember the user.

Only the user's own commits queue work: a commit made on this machine by the person who wrote it. A
cherry-pick, or a commit whose author is not its committer (a rebased, applied or cherry-picked commit of
someone else), queues nothing unless the repository opted in (`git config orchestrator.foreignTickets
true`): a trailer is a command the daemon runs, and a colleague's commit is not yours to run.

A ticket's `key` is a hash of what it asks (text, paths, runner, priority, branch, id): the daemon queues
one job per key, so an amended, rebased or re-sent commit does not queue the same work twice.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import PurePosixPath

from orchestrator.requests import Ticket

__all__ = ["Ticket", "TicketError", "from_file", "from_message", "new_since"]

PREFIX = "Orchestrator"
JOB_TRAILER = "Orchestrator-Job"
DEFAULT_DIR = ".orchestrator/tickets"
_TRAILER = re.compile(r"^([A-Za-z0-9][A-Za-z0-9-]*)\s*:\s?(.*)$")


class TicketError(ValueError):
    """A ticket is malformed; the message says which field and what to write instead."""


def _split_paths(raw: str) -> tuple[str, ...]:
    raw = raw.strip()
    if raw.startswith("[") and raw.endswith("]"):
        raw = raw[1:-1]
    return tuple(p.strip().strip("'\"") for p in re.split(r"[,\s]+", raw) if p.strip().strip("'\""))


def _priority(raw: str, where: str) -> int:
    try:
        return int(raw.strip())
    except ValueError:
        raise TicketError(f"{where}: priority must be a whole number, got {raw.strip()!r}") from None


FOREIGN_KEY = "orchestrator.foreignTickets"


def not_own(author: str, committer: str, picked: bool) -> str | None:
    """Why a commit's tickets must not queue (None: the user made it here). Authors compare by email."""
    if picked:
        return "a cherry-pick (its tickets were the original commit's to queue)"
    if author.strip().lower() != committer.strip().lower():
        return f"authored by {author.strip() or '(no email)'}, committed by {committer.strip() or '(no email)'}"
    return None


def trailers(message: str) -> list[tuple[str, str]]:
    """The trailers of a commit message: its last paragraph, if every line there is `Key: value`."""
    paragraphs = [p for p in re.split(r"\n\s*\n", message.strip()) if p.strip()]
    if len(paragraphs) < 2:
        return []
    out: list[tuple[str, str]] = []
    for line in paragraphs[-1].splitlines():
        if line[:1] in (" ", "\t") and out:
            out[-1] = (out[-1][0], out[-1][1] + " " + line.strip())
            continue
        m = _TRAILER.match(line)
        if not m:
            return []
        out.append((m.group(1), m.group(2).strip()))
    return out


def is_own_commit(message: str) -> bool:
    """The daemon's own commits carry `Orchestrator-Job:`; they never queue work."""
    return any(k.lower() == JOB_TRAILER.lower() for k, _ in trailers(message))


def from_message(message: str) -> list[Ticket]:
    """Every `Orchestrator:` ticket in a commit message, with the options that follow it."""
    if is_own_commit(message):
        return []
    tickets: list[dict[str, object]] = []
    pending: dict[str, object] = {}
    for key, value in trailers(message):
        k = key.lower()
        if k == PREFIX.lower():
            if value:
                tickets.append({"text": value, **pending})
                pending = {}
            continue
        opt = k.removeprefix(PREFIX.lower() + "-") if k.startswith(PREFIX.lower() + "-") else None
        if opt not in ("paths", "runner", "priority", "id", "branch"):
            continue
        parsed: object = (
            _split_paths(value)
            if opt == "paths"
            else _priority(value, f"{key} trailer")
            if opt == "priority"
            else value or None
        )
        target = tickets[-1] if tickets else pending
        target[opt] = parsed
    if pending and tickets:
        tickets[0] = {**pending, **tickets[0]}
    return [Ticket(**t) for t in tickets]  # type: ignore[arg-type]


def front_matter(text: str) -> tuple[dict[str, str | list[str]], str]:
    """Split `---` front matter (`key: value`, `key: [a, b]`, or a `- item` list) from the body."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        return {}, text
    meta: dict[str, str | list[str]] = {}
    last: str | None = None
    for i, line in enumerate(lines[1:], start=1):
        if line.strip() in ("---", "..."):
            return meta, "\n".join(lines[i + 1 :])
        if line.lstrip().startswith("- ") and last is not None:
            current = meta.get(last)
            items = current if isinstance(current, list) else []
            items.append(line.strip()[2:].strip().strip("'\""))
            meta[last] = items
            continue
        key, sep, value = line.partition(":")
        if not sep or not key.strip():
            continue
        last = key.strip().lower()
        meta[last] = value.strip().strip("'\"")
    return {}, text  # no closing fence: all body


def from_file(path: str, text: str) -> Ticket:
    """A ticket file's ticket; its id defaults to the file name without `.md`."""
    meta, body = front_matter(text)
    body = body.strip()
    if not body:
        raise TicketError(f"{path}: the ticket has no text; write what the job should do below the front matter")
    raw_paths = meta.get("paths", "")
    paths = tuple(raw_paths) if isinstance(raw_paths, list) else _split_paths(raw_paths)
    raw_priority = meta.get("priority", "0")
    runner = meta.get("runner")
    ident = meta.get("id") or PurePosixPath(path).stem
    branch = meta.get("branch")
    return Ticket(
        text=body,
        paths=paths,
        runner=runner if isinstance(runner, str) and runner else None,
        priority=_priority(raw_priority if isinstance(raw_priority, str) else "x", path),
        id=str(ident),
        branch=branch if isinstance(branch, str) and branch else None,
        source=path,
    )


def is_ticket_file(path: str, folder: str = DEFAULT_DIR) -> bool:
    """A Markdown file directly or deeper under the ticket folder."""
    folder = folder.strip("/")
    return path.endswith(".md") and (path.startswith(folder + "/") if folder else True)


def new_since(old: Iterable[Ticket], new: Iterable[Ticket]) -> list[Ticket]:
    """The tickets of a rewritten commit that its original did not have (a rebase re-queues nothing else)."""
    seen = {t.identity for t in old}
    return [t for t in new if t.identity not in seen]
