"""Scripted agent conversations for the model API doubles: which tool calls or edits the "model" makes.

An agent CLI (Claude Code, aider, ...) talks to a model in turns: it sends the conversation so far, the
model answers with tool calls (or edits), the CLI carries them out and sends the results back. A
`Conversations` script answers each request from the turn it is at: the number of assistant messages in
the request is the index of the step to answer with. Requests are routed to a conversation by its prompt
(a phrase the job's first user message contains), so several jobs can share one double, and a resumed
session (`claude --resume`, a second round with feedback) simply goes on with the next steps.

A step is a reply, or a function of the `Turn` (the request, its prompt, the working directory the CLI
reported) returning one, so a step can name absolute paths inside a worktree the test does not know in
advance. Requests that belong to no scripted conversation (a CLI's side calls: titles, summaries,
probes) get the `side` reply. Pure bookkeeping, no I/O: the doubles call it from their handlers.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

R = TypeVar("R")

_WORKDIR = re.compile(r"(?:Primary working directory|Working directory|cwd)\s*:\s*(\S+)", re.IGNORECASE)


@dataclass(frozen=True)
class Turn:
    """One request to a scripted conversation, as a step sees it."""

    body: dict[str, Any]
    prompt: str
    """The text of the conversation's first user message (every text block joined)."""
    step: int
    """How many assistant messages the conversation already has: the index of the step answering it."""
    workdir: str
    """The working directory the CLI put in its prompt ("Primary working directory: ..."), or ""."""
    last_user: str
    """The text of the latest user message (a tool result, or a person's feedback on a resumed session)."""

    def path(self, rel: str) -> str:
        """`rel` inside the CLI's working directory (Claude Code's file tools take absolute paths)."""
        return f"{self.workdir.rstrip('/')}/{rel}" if self.workdir else rel


Step = Any
"""A reply of the double's own kind, or `Callable[[Turn], reply]`."""


def text_of(content: Any) -> str:
    """The text of a message's content: a string, or a list of blocks (text and tool results)."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content or []:
        if not isinstance(block, Mapping):
            continue
        if isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif block.get("type") == "tool_result":
            parts.append(text_of(block.get("content")))
    return "\n".join(parts)


def messages_of(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [m for m in body.get("messages") or [] if isinstance(m, Mapping)]


def system_text(body: Mapping[str, Any]) -> str:
    """The system prompt: Anthropic's `system` field (a string or blocks) and any `system` role messages."""
    out = [text_of(body.get("system"))]
    out += [text_of(m.get("content")) for m in messages_of(body) if m.get("role") == "system"]
    return "\n".join(out)


@dataclass
class Conversations(Generic[R]):
    """`Conversations({"phrase of the prompt": [step, step, ...]}, side=reply)`: a script for a double.

    Call it with a request body; it returns the reply. Every request is recorded with the conversation
    and step it was routed to (`log`), so a test can see what each CLI asked.
    """

    scripts: Mapping[str, Sequence[Step]]
    side: Step
    """The answer to a request of no scripted conversation (or past a conversation's last step)."""
    tools_only: bool = False
    """Only a request offering tools is a turn of a conversation (Claude Code: its side calls offer none)."""
    log: list[tuple[str | None, int, dict[str, Any]]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def route(self, body: dict[str, Any]) -> tuple[str | None, Turn]:
        """The conversation a request belongs to (None: a side call), and the turn it is at.

        The conversation starts at the first user message naming a scripted phrase (Claude Code: the first
        message; aider: after its few-shot examples and file contents), and the step is the number of
        assistant messages since then."""
        msgs = messages_of(body)
        texts = [(m.get("role"), text_of(m.get("content"))) for m in msgs]
        users = [t for role, t in texts if role == "user"]
        name, start = None, 0
        for i, (role, text) in enumerate(texts):
            if role == "user" and (name := next((k for k in self.scripts if k and k in text), None)):
                start = i
                break
        if self.tools_only and not body.get("tools"):
            name = None
        prompt = texts[start][1] if name else (users[0] if users else "")
        step = sum(1 for role, _ in texts[start:] if role == "assistant") if name else 0
        match = _WORKDIR.search(system_text(body) + "\n" + prompt)
        return name, Turn(body, prompt, step, match.group(1) if match else "", users[-1] if users else "")

    def __call__(self, body: dict[str, Any]) -> R:
        name, turn = self.route(body)
        with self._lock:
            self.log.append((name, turn.step, body))
        steps = self.scripts.get(name, ()) if name is not None else ()
        chosen = steps[turn.step] if turn.step < len(steps) else self.side
        return chosen(turn) if callable(chosen) else chosen

    def requests(self, name: str) -> list[dict[str, Any]]:
        """The request bodies routed to conversation `name`, in arrival order."""
        with self._lock:
            return [body for n, _, body in self.log if n == name]
