"""Tickets from commit messages and ticket files, and the spool's file handling."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from orchestrator.service import spool, tickets
from orchestrator.service.tickets import Ticket


def test_only_the_users_own_commits_queue() -> None:
    """A cherry-pick, or a commit another person authored, is not the user's own; case of the email aside."""
    assert tickets.not_own("me@example.com", "Me@Example.com", picked=False) is None
    assert "cherry-pick" in (tickets.not_own("me@example.com", "me@example.com", picked=True) or "")
    assert "authored by them@example.org" in (tickets.not_own("them@example.org", "me@example.com", False) or "")


def test_trailers_make_tickets_with_their_options() -> None:
    """`Orchestrator:` starts a ticket; -Paths/-Runner/-Priority/-Id after it belong to it."""
    msg = (
        "Add login\n\nBody text.\n\n"
        "Orchestrator: write tests for login\n"
        "Orchestrator-Paths: tests/test_login.py, tests/conftest.py\n"
        "Orchestrator-Runner: claude\n"
        "Orchestrator: update the docs\n"
        "Orchestrator-Id: docs\n"
        "Orchestrator-Priority: 3\n"
        "Signed-off-by: A <a@example.com>\n"
    )
    found = tickets.from_message(msg)
    assert found == [
        Ticket("write tests for login", ("tests/test_login.py", "tests/conftest.py"), "claude"),
        Ticket("update the docs", (), None, 3, "docs"),
    ]


def test_no_trailer_paragraph_no_ticket_and_own_commits_ignored() -> None:
    """A subject alone, a body that is not all trailers, or the daemon's own commit name no ticket."""
    assert tickets.from_message("Orchestrator: not a trailer, it is the subject") == []
    assert tickets.from_message("Fix\n\nOrchestrator: x\nthis line is prose\n") == []
    assert tickets.from_message("job 3\n\nOrchestrator: again\nOrchestrator-Job: 3\n") == []
    assert tickets.is_own_commit("job 3\n\nOrchestrator-Job: 3\n")


def test_ticket_file_front_matter() -> None:
    """Front matter gives id, paths (inline or list), runner and priority; the file name is the default id."""
    text = "---\nid: login\npaths:\n  - src/login.py\n  - tests/\nrunner: claude\npriority: 5\n---\nDo it.\n"
    t = tickets.from_file(".orchestrator/tickets/x.md", text)
    assert (t.id, t.paths, t.runner, t.priority, t.text) == ("login", ("src/login.py", "tests/"), "claude", 5, "Do it.")
    t2 = tickets.from_file(".orchestrator/tickets/fix-bug.md", "---\npaths: [a.py, b.py]\n---\nFix.")
    assert (t2.id, t2.paths) == ("fix-bug", ("a.py", "b.py"))
    assert tickets.from_file("t/plain.md", "Just text").text == "Just text"
    with pytest.raises(tickets.TicketError, match="no text"):
        tickets.from_file("t/empty.md", "---\nid: x\n---\n")
    with pytest.raises(tickets.TicketError, match="priority"):
        tickets.from_file("t/p.md", "---\npriority: high\n---\nx")
    assert tickets.is_ticket_file(".orchestrator/tickets/a.md")
    assert not tickets.is_ticket_file("docs/a.md") and not tickets.is_ticket_file(".orchestrator/tickets/a.txt")


def test_keys_are_stable_and_rewrites_find_only_new_tickets() -> None:
    """The key depends on what is asked and the branch; a rewritten commit's old tickets are not new."""
    a = Ticket("do a").keyed("main")
    assert a.key == Ticket("do a").keyed("main").key
    assert a.key != Ticket("do a").keyed("dev").key != Ticket("do b").keyed("main").key
    old = [Ticket("do a"), Ticket("do b")]
    assert tickets.new_since(old, [Ticket("do a"), Ticket("do b")]) == []
    assert tickets.new_since(old, [Ticket("do a"), Ticket("do c")]) == [Ticket("do c")]


def test_spool_write_is_private_and_atomic(tmp_path: Path) -> None:
    """A spooled request is 0600 in a 0700 folder whatever the umask, and no temp file is left."""
    old = os.umask(0)
    try:
        path = spool.write(tmp_path / "spool", {"repo": "/r", "tickets": []})
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert [p.name for p in path.parent.iterdir()] == [path.name]
    assert spool.pending(path.parent) == [path]


async def test_spool_drain_keeps_what_it_cannot_take(tmp_path: Path) -> None:
    """Taken requests are deleted; unreadable or refused ones move to rejected/; a failing submit keeps the file."""
    folder = tmp_path / "spool"
    good = spool.write(folder, {"tickets": [{"key": "k1"}]})
    refused = spool.write(folder, {"tickets": [{"key": "k2"}]})
    broken = spool.write(folder, {"tickets": []})
    broken.write_text("{not json")
    calls: list[dict[str, Any]] = []

    async def submit(req: dict[str, Any]) -> list[dict[str, Any]]:
        calls.append(req)
        key = req["tickets"][0]["key"]
        return [{"key": key, "status": "queued" if key == "k1" else "rejected", "error": "unknown runner"}]

    assert await spool.Spool(folder, submit).drain() == 3
    assert not good.exists() and not refused.exists() and not broken.exists()
    rejected = sorted(p.name for p in (folder / "rejected").iterdir())
    assert rejected == sorted([refused.name, broken.name])
    assert json.loads((folder / "rejected" / refused.name).read_text())["results"][0]["error"] == "unknown runner"

    kept = spool.write(folder, {"tickets": [{"key": "k3"}]})

    async def down(req: dict[str, Any]) -> list[dict[str, Any]]:
        raise OSError("store unavailable")

    assert await spool.Spool(folder, down).drain() == 0
    assert kept.exists()
    await asyncio.sleep(0)
