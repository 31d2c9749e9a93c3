"""Is a model API telling a job's runner it is rate- or usage-limited, and for how long? Pure, no I/O.

A runner's output is the job's output: an agent prints what its tools printed and what its prompt asked for,
so words alone ("429 Too Many Requests", "usage limit reached") prove nothing. Each runner profile names
the `SIGNS` of its own CLI (`RunnerTemplate.rate_limits`), each read where that CLI itself prints it, as
narrowly as its real output allows; a runner with none (the `shell` runner, a command template of one's own
that names none) is never rate-limited by what it prints.

- `claude-code`: the top-level fields of its one `--output-format json` result object (`api_error_status`
  429, `api_error_type` `rate_limit_error`, `api_error` `usage_limit_reached`, or an error result that is
  exactly a subscription's "Claude AI usage limit reached|<reset time>"). The agent's words are inside its
  `result` string, where they never count; its tools' output is not printed at all.
- `aider`: litellm's error line (`litellm.RateLimitError: ...` at the start of a line), the wait in the lines
  of its message ("try again in 20s").
- `codex`: its `codex_core::responses_retry` warning line (the profile's `RUST_LOG`) for a 429, with the wait
  it would sleep out by itself; its `ERROR: You've hit your usage limit ... try again at 8:31 AM`.

aider prints the model's reply and codex its commands' output (and its prompt) verbatim among their own lines,
so there a job can print a line no reader can tell from the CLI's: those signs are `forgeable`. Such a limit
rests the job that printed it (its own output harms only itself, and the wait is capped, `wait`), but holds
back the runner's other jobs only once another job of it meets a limit too (`corroborated`).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

K = TypeVar("K")


@dataclass(frozen=True, slots=True)
class Limit:
    """A rate or usage limit a runner met."""

    message: str
    """The line that said so (cut to one line)."""
    retry_after: float | None = None
    """Seconds until it lifts, when the message says; None: unknown."""
    forgeable: bool = False
    """Read from a sign a job could print itself (`Signs.forgeable`)."""


Reader = Callable[[str, list[str], float], Limit | None]
"""The limit one line of a CLI's output reports (given the lines after it, and the time now), or None."""


@dataclass(frozen=True, slots=True)
class Signs:
    """How one CLI says its model API limited it."""

    read: Reader
    forgeable: bool
    """The CLI prints the agent's or its tools' output verbatim among its own lines: a job can print the sign."""


_IN = re.compile(
    r"\b(?:try again|retry|resets?) in (\d+(?:\.\d+)?)\s*"
    r"(ms|milliseconds?|s|secs?|seconds?|m|mins?|minutes?|h|hours?)\b",
    re.IGNORECASE,
)
_AFTER = re.compile(r"\bretry[-_ ]after\W{0,3}(\d+(?:\.\d+)?)", re.IGNORECASE)
_AT = re.compile(r"\btry again at (\d{1,2}):(\d\d)\s*([AP]M)\b", re.IGNORECASE)


def _unit(name: str) -> float:
    name = name.lower()
    if name == "ms" or name.startswith("milli"):
        return 0.001
    if name.startswith("h"):
        return 3600.0
    if name.startswith("m"):
        return 60.0
    return 1.0


def _named_wait(text: str, now: float) -> float | None:
    """The wait a limit's message names: "try again in 20s", "retry-after: 30", "try again at 8:31 AM" (local
    time, the next such time after `now`); None when it names none."""
    if m := _IN.search(text):
        return float(m.group(1)) * _unit(m.group(2))
    if m := _AFTER.search(text):
        return float(m.group(1))
    if m := _AT.search(text):
        hour = int(m.group(1)) % 12 + (12 if m.group(3).upper() == "PM" else 0)
        t = time.localtime(now)
        at = time.mktime((t.tm_year, t.tm_mon, t.tm_mday, hour, int(m.group(2)), 0, 0, 0, -1))
        return at - now if at > now else at + 86400 - now
    return None


_CLAUDE_RESET = re.compile(r"Claude AI usage limit reached\|(\d{10})")
"""A subscription's limit as Claude Code words its error result: the whole `result`, with the reset time."""


def _claude_code(line: str, _after: list[str], now: float) -> Limit | None:
    """Claude Code's `--output-format json` result object, by its own top-level fields only."""
    if not line.startswith("{") or '"result"' not in line:
        return None
    try:
        data: Any = json.loads(line)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("type") != "result" or data.get("is_error") is not True:
        return None
    said = data["result"] if isinstance(data.get("result"), str) else ""
    if reset := _CLAUDE_RESET.fullmatch(said):
        return Limit(said, max(0.0, float(reset.group(1)) - now))
    status = data.get("api_error_status")
    if (
        (status == 429 and not isinstance(status, bool))
        or data.get("api_error_type") == "rate_limit_error"
        or (data.get("api_error") == "usage_limit_reached")
    ):
        return Limit(said or line, _named_wait(said, now))
    return None


def _aider(line: str, after: list[str], now: float) -> Limit | None:
    """litellm's error line, as aider prints it; the wait is in the lines of its message (up to a blank line)."""
    if not line.startswith("litellm.RateLimitError: "):
        return None
    message = [line]
    for more in after[:8]:
        if not more.strip():
            break
        message.append(more)
    return Limit(line, _named_wait("\n".join(message), now))


_CODEX_RETRY = re.compile(
    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z +WARN codex_core::responses_retry: [^\n]*?"
    r"retrying sampling request \(\d+/\d+ in (\d+(?:\.\d+)?)s\)\.\.\. [^\n]*last status: 429 Too Many Requests"
)
"""codex's retry warning (`RUST_LOG=codex_core::responses_retry=warn`) for a 429, with the wait it would sleep
out by itself: "2026-12-02T03:13:53.616584Z  WARN codex_core::responses_retry: stream disconnected - retrying
sampling request (1/5 in 3599.9s)... turn_id=... last status: 429 Too Many Requests"."""
_CODEX_USAGE = re.compile(r"ERROR: You[’']ve hit your usage limit\b.*")
"""codex's error for a subscription's limit: "ERROR: You’ve hit your usage limit. ... or try again at 8:31 AM."."""


def _codex(line: str, _after: list[str], now: float) -> Limit | None:
    if m := _CODEX_RETRY.fullmatch(line):
        return Limit(line, float(m.group(1)))
    if _CODEX_USAGE.fullmatch(line):
        return Limit(line, _named_wait(line, now))
    return None


SIGNS: Mapping[str, Signs] = {
    "claude-code": Signs(_claude_code, forgeable=False),
    "aider": Signs(_aider, forgeable=True),  # it prints the model's reply as it comes
    "codex": Signs(_codex, forgeable=True),  # it prints its prompt and its commands' output as they come
}
"""The sign sets a runner profile can name (`RunnerTemplate.rate_limits`); "" names none."""


def detect(text: str, signs: Signs, now: float) -> Limit | None:
    """The limit `text` (a run's output) reports by `signs`, or None. `now` (a UNIX time) turns a reset time
    into a wait."""
    found = _first(text.splitlines(), signs, now)
    return None if found is None else found[1]


_DRAWN = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
"""A terminal's escape sequence (colours, cursor moves, titles): a CLI in a terminal (`proc.terminal`) draws its
lines with them."""


def plain(line: str) -> str:
    """A line of output as a terminal shows it: escape sequences left out, and only what the last carriage return
    left visible."""
    return _DRAWN.sub("", line).rstrip().rsplit("\r", 1)[-1]


def _first(lines: list[str], signs: Signs, now: float) -> tuple[int, Limit] | None:
    lines = [plain(line) for line in lines]
    for i, line in enumerate(lines):
        if (limit := signs.read(line, lines[i + 1 : i + 9], now)) is not None:
            return i, Limit(limit.message[:300], limit.retry_after, signs.forgeable)
    return None


def wait(retry_after: float | None, waits: int, first: float, cap: float) -> float:
    """Seconds to wait before the `waits`+1-th run: what the API named, else `first` doubled per earlier wait;
    never more than `cap`, never less than a second."""
    asked = retry_after if retry_after is not None else first * 2**waits
    return max(1.0, min(cap, asked))


class Watch:
    """Fed a running command's output chunk by chunk (`process.run(stop_when=...)`): True once it shows a limit
    by `signs`.

    Reads whole lines only (a message cut between two chunks is read once complete), holding at most one
    partial line of `MAX_LINE` bytes."""

    MAX_LINE = 64 * 1024

    def __init__(self, signs: Signs) -> None:
        self.signs = signs
        self._rest = b""
        self.seen: str = ""
        """The output that showed the limit (from its line on), once seen."""

    def __call__(self, chunk: bytes) -> bool:
        data = self._rest + chunk
        cut = data.rfind(b"\n")
        if cut < 0:
            self._rest = data[-self.MAX_LINE :]
            return False
        lines, self._rest = data[: cut + 1], data[cut + 1 :][-self.MAX_LINE :]
        text = lines.decode(errors="replace").splitlines()
        found = _first(text, self.signs, 0.0)
        if found is None:
            return False
        self.seen = "\n".join(text[found[0] :])[:4000]
        return True


def corroborated(sightings: Mapping[int, float], job: int, now: float) -> bool:
    """A forgeable limit seen in `job`'s output counts for its runner's other jobs only when another job's output
    showed one too that still stands (`sightings`: job → the time the limit its output named ends)."""
    return any(other != job and until > now for other, until in sightings.items())


def extends(known: Mapping[str, float], runner: str, until: float) -> bool:
    """A limit of `runner` until `until` says more than what is known of it: it lasts longer (an earlier end known
    already stands, whichever job met the limit first)."""
    return until > known.get(runner, 0.0)


def standing(limits: Mapping[K, float], now: float) -> dict[K, float]:
    """The limits still in force at `now` (a UNIX time): runner (or job) → the time its limit ends."""
    return {key: until for key, until in limits.items() if until > now}
