"""Is a model API telling a job's runner it is rate- or usage-limited, and for how long? Pure, no I/O.

Agent CLIs report a limit in their own words: Claude Code's JSON result (`"api_error_status": 429`, or its
subscription's "usage limit reached|<reset time>"), aider's `litellm.RateLimitError: ...` lines (it would retry
on its own for a minute and more), codex's "429 Too Many Requests" (in the retry warning it prints before it
would wait out the API's retry-after, up to an hour per retry, by itself) or "You've hit your usage limit". `detect`
reads a run's output for those; the time to wait is what the message names (a reset time, "try again in 20s",
"retry-after: 30"), else None and the daemon's own backoff decides (`wait`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

SIGNS = (
    re.compile(r'"api_error_status"\s*:\s*429\b'),  # Claude Code's JSON result
    re.compile(r'"type"\s*:\s*"rate_limit_error"'),  # an Anthropic error body, as a CLI may print it
    re.compile(r"^\s*litellm\.RateLimitError\b", re.MULTILINE),  # aider (through litellm)
    re.compile(r"\busage limit reached\b", re.IGNORECASE),  # Claude Code and codex subscriptions
    re.compile(r"\byou've hit your (?:usage )?limit\b", re.IGNORECASE),
    re.compile(r"\b429\b[^\n]{0,40}\b(?:too many requests|rate[ _-]?limit)", re.IGNORECASE),
)
"""What a CLI prints when its model API refuses it for a rate or usage limit."""

_RESET = re.compile(r"limit reached\|(\d{10})\b", re.IGNORECASE)
_IN = re.compile(
    r"\b(?:try again|retry|resets?) in (\d+(?:\.\d+)?)\s*"
    r"(ms|milliseconds?|s|secs?|seconds?|m|mins?|minutes?|h|hours?)\b",
    re.IGNORECASE,
)
_AFTER = re.compile(r"\bretry[-_ ]after\W{0,3}(\d+(?:\.\d+)?)", re.IGNORECASE)
_RETRYING = re.compile(r"\bretrying\b[^\n]*?\(\d+/\d+ in (\d+(?:\.\d+)?)s\)")
"""codex (its `codex_core::responses_retry` warning): "retrying sampling request (1/5 in 3599.9s)..."."""


def _unit(name: str) -> float:
    name = name.lower()
    if name == "ms" or name.startswith("milli"):
        return 0.001
    if name.startswith("h"):
        return 3600.0
    if name.startswith("m"):
        return 60.0
    return 1.0


@dataclass(frozen=True, slots=True)
class Limit:
    """A rate or usage limit a runner met."""

    message: str
    """The line that said so (cut to one line)."""
    retry_after: float | None = None
    """Seconds until it lifts, when the message says; None: unknown."""


def detect(text: str, now: float) -> Limit | None:
    """The limit `text` (a run's output) reports, or None. `now` (a UNIX time) turns a reset time into a wait."""
    for sign in SIGNS:
        m = sign.search(text)
        if m is not None:
            line = text[text.rfind("\n", 0, m.start()) + 1 : _eol(text, m.end())].strip()
            return Limit(_said(line)[:300], _retry_after(text, now))
    return None


def _said(line: str) -> str:
    """The message of a JSON result line (Claude Code's `result`), else the line."""
    if line.startswith("{"):
        try:
            data = json.loads(line)
        except ValueError:
            return line
        if isinstance(data, dict) and isinstance(data.get("result"), str):
            return data["result"]
    return line


def _eol(text: str, at: int) -> int:
    end = text.find("\n", at)
    return len(text) if end < 0 else end


def _retry_after(text: str, now: float) -> float | None:
    if m := _RESET.search(text):
        return max(0.0, float(m.group(1)) - now)
    if m := _IN.search(text):
        return float(m.group(1)) * _unit(m.group(2))
    if m := _AFTER.search(text):
        return float(m.group(1))
    if m := _RETRYING.search(text):
        return float(m.group(1))
    return None


def wait(retry_after: float | None, waits: int, first: float, cap: float) -> float:
    """Seconds to wait before the `waits`+1-th run: what the API named, else `first` doubled per earlier wait;
    never more than `cap`, never less than a second."""
    asked = retry_after if retry_after is not None else first * 2**waits
    return max(1.0, min(cap, asked))


class Watch:
    """Fed a running command's output chunk by chunk (`process.run(stop_when=...)`): True once it shows a limit.

    Reads whole lines only (a message cut between two chunks is read once complete), holding at most one
    partial line of `MAX_LINE` bytes."""

    MAX_LINE = 64 * 1024

    def __init__(self) -> None:
        self._rest = b""
        self.seen: str = ""
        """The output that showed the limit (its last lines), once seen."""

    def __call__(self, chunk: bytes) -> bool:
        data = self._rest + chunk
        cut = data.rfind(b"\n")
        if cut < 0:
            self._rest = data[-self.MAX_LINE :]
            return False
        lines, self._rest = data[: cut + 1], data[cut + 1 :][-self.MAX_LINE :]
        text = lines.decode(errors="replace")
        if any(sign.search(text) for sign in SIGNS):
            self.seen = text[-4000:]
            return True
        return False


def extends(known: Mapping[str, float], runner: str, until: float) -> bool:
    """A limit of `runner` until `until` says more than what is known of it: it lasts longer (an earlier end known
    already stands, whichever job met the limit first)."""
    return until > known.get(runner, 0.0)


def standing(limits: Mapping[str, float], now: float) -> dict[str, float]:
    """The limits still in force at `now` (a UNIX time): runner → the time its limit ends."""
    return {runner: until for runner, until in limits.items() if until > now}
