"""What the chat benchmarks' sessions say: a day's conversation each, then one measured turn.

Sessions are alike in shape and different in content, as real users' are:
- Each session already holds a short conversation (`EXCHANGES` earlier exchanges of its own, already
  extracted) and a few memories, as an afternoon's use leaves it. So each prompt carries a few hundred
  tokens that belong to that session alone, and where a call lands matters: on the slot that holds the
  session's prefix it reads only the new tokens, on another session's slot it reads the whole history
  again.
- Sessions that all sent the very same text would share every prefix, so a server's cache would serve one
  session's prompt from another session's slot: a coincidence of a benchmark, never of real users.

The measured turn is the seed's kind of message: a first-person fact worth remembering and a question,
with the same number of words in every session.
"""

from __future__ import annotations

from typing import Any, Protocol

EXCHANGES = 3
"""Earlier exchanges (a user message and the assistant's answer) each session holds before the run."""

_PLACES = (
    "Lisbon", "Porto", "Seville", "Naples", "Krakow", "Ghent", "Bergen", "Split", "Lyon", "Turin", "Cork", "Gdansk",
)  # fmt: skip
_WHO = ("sister", "brother", "mother", "father", "cousin", "partner", "friend", "uncle", "aunt", "daughter", "son")
_NAMES = ("Ana", "Ben", "Chloe", "Dev", "Emil", "Farah", "Goran", "Hana", "Ivo", "Jonas", "Kira", "Luis", "Mei")
_PROJECTS = ("billing", "search", "payments", "reports", "mobile", "ledger", "gateway", "inventory", "auth")

_USER = (
    "I'm {name}, I work on the {project} service and my tests keep failing on the invoice rounding step "
    "since this morning.",
    "My manager wants the {project} release before Friday; can you help me order the remaining work?",
    "I prefer short answers with code, and I use vim and pytest every day on the {project} repository.",
)
_ASSISTANT = (
    "Start with the failing rounding test in {project}: set the decimal context once, round only when you "
    "format an amount, then run the suite again. Keep the retry change in its own commit so the release "
    "stays small and easy to review before Friday."
)


def _pick(seq: tuple[str, ...], i: int, salt: int) -> str:
    return seq[(i * (salt + 1) + salt) % len(seq)]


def prompt(i: int) -> str:
    """Session `i`'s measured message (session 0's is the seed-style Lisbon trip)."""
    place = _PLACES[i % len(_PLACES)]
    who = _WHO[(i // len(_PLACES) + i) % len(_WHO)]
    return f"I'm planning a trip to {place} with my {who} next month. What should we see first?"


def history(i: int) -> list[tuple[str, str]]:
    """Session `i`'s earlier conversation, oldest first: (role, text) pairs."""
    fill = {"name": _pick(_NAMES, i, 1), "project": _pick(_PROJECTS, i, 2)}
    out: list[tuple[str, str]] = []
    for k in range(EXCHANGES):
        out += [("user", _USER[k % len(_USER)].format(**fill)), ("assistant", _ASSISTANT.format(**fill))]
    return out


def memories(i: int) -> list[str]:
    """What earlier extractions kept of session `i`."""
    name, project = _pick(_NAMES, i, 1), _pick(_PROJECTS, i, 2)
    return [f"The user's name is {name}", f"The user works on the {project} service", "The user prefers short answers"]


class _ChatStore(Protocol):
    async def add_message(self, session: str, role: str, content: str) -> int: ...

    async def remember(self, session: str, upto: int, memories: Any) -> None: ...


async def seed(store: _ChatStore, sessions: dict[str, int]) -> None:
    """Give each session (name → index) its earlier conversation, already extracted, and its memories."""
    for name, i in sessions.items():
        last = 0
        for role, text in history(i):
            last = await store.add_message(name, role, text)
        await store.remember(name, last, memories(i))
