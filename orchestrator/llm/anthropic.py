"""The one Claude client of the daemon: every Claude call (pre-plan and coding agents) goes through it.

One bound for the whole daemon (`anthropic.concurrency` calls in flight), and one retry policy: a
transient failure (429 with its `retry-after`, 529 overloaded, other 5xx, a reset connection, a timeout)
is retried with capped exponential backoff, without holding a slot while it waits, so a rate limit never
fails a job by itself. When the budget is spent, or the failure is not transient (a bad key, a malformed
request), the call raises `ModelUnavailable` with a reason a person can act on; callers fall back (the
planner to local evidence) or fail the job with that reason.

The official SDK (`anthropic.AsyncAnthropic`) does the HTTP; its own retries are off because its
`retry-after` handling has no upper bound. `ANTHROPIC_BASE_URL` (or `anthropic.base_url`) points it at
another server speaking the same Messages API, such as the protocol double in `orchestrator.lab.doubles`.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any

import anthropic
from anthropic.types import Message

from orchestrator import logging as olog
from orchestrator.config import AnthropicConfig

__all__ = ["Claude", "ClaudeStats", "ModelUnavailable"]

BACKOFF_FIRST = 0.5
"""Seconds before the first retry when the server gives no `retry-after`; doubles on each retry."""
OVERLOADED = 529


class ModelUnavailable(RuntimeError):
    """No Claude answer can be had for this call; the message says why and what to do."""

    def __init__(self, message: str, *, transient: bool, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.transient = transient
        """True when waiting longer might have helped (rate limits, overload, outages)."""
        self.retry_after = retry_after
        """Rate-limited (429): the seconds the server asked to wait (0.0 when it named none); else None."""

    @property
    def rate_limited(self) -> bool:
        return self.retry_after is not None


@dataclass
class ClaudeStats:
    """Counters for `show`, logs and tests: what the bound and the retries did."""

    calls: int = 0
    retries: int = 0
    failures: int = 0
    in_flight: int = 0
    peak_in_flight: int = 0
    waiting: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0


class Claude:
    """A bounded, retrying front for `AsyncAnthropic.messages.create`, shared by the whole daemon."""

    def __init__(self, cfg: AnthropicConfig, *, client: anthropic.AsyncAnthropic | None = None) -> None:
        self.cfg = cfg
        self._slots = asyncio.Semaphore(cfg.concurrency)
        self.stats = ClaudeStats()
        self._client = client

    @property
    def available(self) -> bool:
        """A key is set, or a base URL names a server of our own (a proxy or a protocol double)."""
        return bool(self.cfg.api_key or self.cfg.base_url)

    def _sdk(self) -> anthropic.AsyncAnthropic:
        if self._client is None:
            self._client = anthropic.AsyncAnthropic(
                # A local server needs no key, but the SDK insists on one being set.
                api_key=str(self.cfg.api_key) or "unset",
                base_url=self.cfg.base_url or None,
                timeout=self.cfg.timeout,
                max_retries=0,  # ours below: capped waits, no slot held while waiting
            )
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def create(self, **params: Any) -> Message:
        """`messages.create(**params)` within the daemon's bound, retried while the failure is transient."""
        if not self.available:
            raise ModelUnavailable(
                "no Claude API key: set ANTHROPIC_API_KEY in the daemon's environment "
                "(or ANTHROPIC_BASE_URL for a compatible server)",
                transient=False,
            )
        log = olog.get()
        attempt = 0
        while True:
            try:
                message = await self._once(params)
            except (anthropic.APIError, ValueError) as e:
                # ValueError: a body that is not JSON (the SDK lets json's error through as it is).
                transient, wait, why = _classify(e, attempt, self.cfg.max_retry_wait)
                limited = _rate_limited(e)
                # A limit the server says lasts longer than one of our waits is not ridden out here: the job
                # waits for it (code RateLimited) without holding a model slot or a retry loop.
                long_limit = limited is not None and limited > self.cfg.max_retry_wait
                if not transient or attempt >= self.cfg.max_retries or long_limit:
                    self.stats.failures += 1
                    tail = f" after {attempt + 1} attempts" if transient and not long_limit else ""
                    raise ModelUnavailable(f"Claude API {why}{tail}", transient=transient, retry_after=limited) from e
                attempt += 1
                self.stats.retries += 1
                log.warning(olog.Event.CLAUDE_RETRY, reason=why, attempt=attempt, wait_s=round(wait, 3))
                await asyncio.sleep(wait)
                continue
            self._count(message)
            return message

    async def _once(self, params: dict[str, Any]) -> Message:
        self.stats.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.stats.waiting -= 1
        self.stats.in_flight += 1
        self.stats.peak_in_flight = max(self.stats.peak_in_flight, self.stats.in_flight)
        self.stats.calls += 1
        started = time.monotonic()
        try:
            return await self._sdk().messages.create(**params)
        finally:
            self.stats.in_flight -= 1
            self._slots.release()
            olog.get().debug(olog.Event.CLAUDE_CALL, seconds=round(time.monotonic() - started, 3))

    def _count(self, message: Message) -> None:
        usage = message.usage
        self.stats.input_tokens += usage.input_tokens
        self.stats.output_tokens += usage.output_tokens
        self.stats.cache_read_tokens += usage.cache_read_input_tokens or 0
        self.stats.cache_write_tokens += usage.cache_creation_input_tokens or 0


def _classify(e: Exception, attempt: int, cap: float) -> tuple[bool, float, str]:
    """(transient?, seconds to wait, what happened) for one failed attempt. Pure apart from jitter."""
    backoff = min(cap, BACKOFF_FIRST * 2**attempt) * (1 - 0.25 * random.random())
    if isinstance(e, anthropic.APITimeoutError):
        return True, backoff, "timed out"
    if isinstance(e, anthropic.APIConnectionError):
        return True, backoff, f"unreachable ({e.__cause__ or e})"
    if isinstance(e, anthropic.APIStatusError):
        status = e.status_code
        detail = _detail(e)
        if status == 429 or status == OVERLOADED or status >= 500 or status in (408, 409):
            wait = _retry_after(e)
            what = {429: "rate-limited (429)", OVERLOADED: "overloaded (529)"}.get(status, f"error {status}")
            return True, min(cap, wait) if wait is not None else backoff, f"{what}: {detail}"
        hint = {
            401: "check ANTHROPIC_API_KEY",
            403: "the key may not use this model",
            404: "check the model name in [anthropic]",
        }.get(status, "the request was refused")
        return False, 0.0, f"refused the request ({status}: {detail}); {hint}"
    # A reply the SDK could not read (malformed JSON, wrong shape): another try may get a good one.
    return True, backoff, f"sent a reply that could not be read ({type(e).__name__}: {e})"


def _rate_limited(e: Exception) -> float | None:
    """For a 429: the seconds its `retry-after` asks for (0.0 when it names none); None for anything else."""
    if isinstance(e, anthropic.APIStatusError) and e.status_code == 429:
        wait = _retry_after(e)
        return 0.0 if wait is None else wait
    return None


def _retry_after(e: anthropic.APIStatusError) -> float | None:
    headers = e.response.headers
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            return max(0.0, float(raw) * scale)
        except ValueError:
            continue  # an HTTP date: fall back to our own backoff
    return None


def _detail(e: anthropic.APIStatusError) -> str:
    body = e.body
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])[:200]
    return str(e.message)[:200]
