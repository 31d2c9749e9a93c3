"""Prompts and cheap local decisions of the chat plane: pure functions, no I/O.

Prompts are shaped for the server's prefix cache: the same system part for every call of every
session, then the session's history, then this turn's message, and the task instruction *last* — so a
turn's classification and its reply share everything but the last message, and the reply finds the
classification's prefix still in its slot.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from enum import StrEnum
from typing import Any

SYSTEM = (
    "You are a helpful local assistant inside a developer's orchestrator. You answer briefly and "
    "concretely, you keep track of what the user told you about themselves, and you never invent facts "
    "about the user's code or projects."
)


class Intent(StrEnum):
    """What a turn asks for; the classification call and the local rules answer with one of these."""

    chat = "chat"
    """Open conversation."""
    question = "question"
    """A question that wants an answer."""
    smalltalk = "smalltalk"
    """Greeting, thanks, acknowledgement."""
    remember = "remember"
    """The user asks to remember something."""
    command = "command"
    """A slash command."""


CLASSIFY = (
    'Classify the user\'s last message. Answer only JSON: {"intent": one of '
    + ", ".join(f'"{i.value}"' for i in Intent)
    + "}."
)
REPLY = "Reply to the user's last message in a few sentences."
_MEMORY = (
    "A memory is a short, "
    "self-contained fact in the third person that will still be true and useful in a later conversation: "
    "their name, family, pets, home town, job, projects, tools, preferences, plans with a date, and things "
    "they explicitly asked you to remember. Rules: use only what the user said, never what the assistant "
    "said; do not guess or generalise; skip small talk, questions, opinions about the weather and anything "
    "that is only true today; merge duplicates; keep each memory under fifteen words; write names exactly "
    "as the user wrote them. Examples: the user says 'my sister Ana lives in Porto and I'm visiting her in "
    "May' gives ['The user has a sister named Ana', 'Ana lives in Porto', 'The user visits Ana in May']; "
    "the user says 'thanks, that helped' gives []. "
)
ANSWER = 'Answer only JSON: {"memories": ["short fact", ...]}; an empty list when there is nothing.'
EXTRACT = "Task: extract long-term memories about the user from the conversation above. " + _MEMORY + ANSWER
"""The seed's extraction instruction, after the session's whole history window (the `naive` policy)."""
EXTRACT_NEW = "Task: extract long-term memories about the user from the new messages below. " + _MEMORY
"""The gate's extraction instruction, first: the same for every session, so the server's cache holds it."""

_SMALLTALK = re.compile(r"^\s*(hi|hello|hey|thanks|thank you|ok|okay|bye|good (morning|night|evening))\b[\s!.]*$", re.I)
_REMEMBER = re.compile(r"^\s*(please\s+)?remember\b", re.I)
_FACTS = re.compile(
    r"\b(I am|I'm|my|I like|I love|I hate|I prefer|I live|I work|I have|I use|call me|remember)\b", re.I
)
_WORD = re.compile(r"[a-z0-9]{3,}")


def rule_intent(text: str) -> Intent | None:
    """The intent when it is obvious without a model, else None (then one capped JSON call decides)."""
    if text.lstrip().startswith("/"):
        return Intent.command
    if _REMEMBER.match(text):
        return Intent.remember
    if _SMALLTALK.match(text):
        return Intent.smalltalk
    return None


def parse_intent(data: Any) -> Intent:
    """The classification call's answer, tolerant of a capped or chatty model: unknown means chat."""
    if isinstance(data, dict):
        try:
            return Intent(str(data.get("intent", "")).strip().lower())
        except ValueError:
            pass
    return Intent.chat


def worth_remembering(texts: Iterable[str]) -> bool:
    """Cheap check before an extraction call: does any user message state something about the user?"""
    return any(_FACTS.search(t) for t in texts)


def relevant(memories: Sequence[str], text: str, limit: int = 5) -> list[str]:
    """The memories that share the most words with this message (recent ones first on ties)."""
    words = set(_WORD.findall(text.lower()))
    scored = [(len(words & set(_WORD.findall(m.lower()))), -i, m) for i, m in enumerate(memories)]
    scored.sort(reverse=True)
    return [m for _, _, m in scored[:limit]]


def _base(history: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}] + [{"role": m["role"], "content": m["content"]} for m in history]


def classify_messages(history: Sequence[dict[str, Any]], text: str) -> list[dict[str, str]]:
    return [*_base(history), {"role": "user", "content": text}, {"role": "system", "content": CLASSIFY}]


def reply_messages(
    history: Sequence[dict[str, Any]], text: str, memories: Sequence[str], intent: Intent
) -> list[dict[str, str]]:
    task = REPLY
    if memories:
        task += " What you remember about the user: " + "; ".join(memories) + "."
    if intent is Intent.remember:
        task += " Confirm briefly what you will remember."
    return [*_base(history), {"role": "user", "content": text}, {"role": "system", "content": task}]


def extract_messages(history: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """The seed's extraction prompt: the session's history window (extracted or not), the instruction last."""
    return [*_base(history), {"role": "system", "content": EXTRACT}]


def extract_new_messages(new: Sequence[dict[str, Any]], known: Sequence[str]) -> list[dict[str, str]]:
    """The gate's extraction prompt: only the messages not yet extracted (what came before them was, and its
    memories are `known`), the long instruction first (a prefix shared by every session's extraction)."""
    head = [{"role": "system", "content": SYSTEM}, {"role": "system", "content": EXTRACT_NEW}]
    if known:
        head.append({"role": "system", "content": f"What you remember about the user already: {'; '.join(known)}."})
    body = [{"role": m["role"], "content": m["content"]} for m in new]
    return [*head, *body, {"role": "system", "content": ANSWER}]


def parse_memories(data: Any) -> list[str]:
    if isinstance(data, dict) and isinstance(data.get("memories"), list):
        return [str(m).strip()[:500] for m in data["memories"] if str(m).strip()][:20]
    return []
