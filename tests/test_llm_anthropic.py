"""The shared Claude client against a local server speaking the real Messages API."""

from __future__ import annotations

import asyncio
import time

import pytest

from orchestrator.config import AnthropicConfig, Secret
from orchestrator.lab.doubles.anthropic import AnthropicDouble, Reply, error_reply, text_message, tool_use_message
from orchestrator.llm.anthropic import Claude, ModelUnavailable

PARAMS = {"model": "claude-haiku-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}


def _claude(url: str, **over: object) -> Claude:
    cfg = AnthropicConfig(base_url=url, api_key=Secret("sk-test"), timeout=2.0, max_retry_wait=0.2, **over)  # type: ignore[arg-type]
    return Claude(cfg)


async def test_answer_and_usage_are_read() -> None:
    """A plain answer comes back as an SDK Message, its usage counted."""
    async with AnthropicDouble([text_message("hello", usage=(12, 3))]) as double:
        claude = _claude(double.url)
        msg = await claude.create(**PARAMS)
        await claude.close()
    assert msg.content[0].type == "text" and msg.content[0].text == "hello"
    assert msg.model == "claude-haiku-4-5"
    assert (claude.stats.input_tokens, claude.stats.output_tokens) == (12, 3)
    assert double.requests[0]["messages"][0]["content"] == "hi"


async def test_tool_use_is_parsed() -> None:
    """A tool call arrives as a tool_use block with its input."""
    async with AnthropicDouble([tool_use_message("write_file", {"path": "a.txt", "content": "x"})]) as double:
        claude = _claude(double.url)
        msg = await claude.create(**PARAMS)
        await claude.close()
    assert msg.stop_reason == "tool_use"
    block = msg.content[0]
    assert block.type == "tool_use" and block.name == "write_file" and block.input == {"path": "a.txt", "content": "x"}


async def test_transient_errors_are_retried_honouring_retry_after() -> None:
    """429 (with retry-after), 529, 500, a reset connection and a malformed body are all retried."""
    script = [
        error_reply(429, retry_after=0.15),
        error_reply(529),
        error_reply(500),
        Reply(reset=True),
        Reply(raw=b"{not json"),
        text_message("ok"),
    ]
    async with AnthropicDouble(script) as double:
        claude = _claude(double.url, max_retries=6)
        started = time.monotonic()
        msg = await claude.create(**PARAMS)
        await claude.close()
    assert msg.content[0].text == "ok"  # type: ignore[union-attr]
    assert claude.stats.retries == 5
    assert time.monotonic() - started >= 0.15  # the retry-after wait was honoured


async def test_a_rate_limit_longer_than_one_wait_is_not_ridden_out_in_the_call() -> None:
    """A 429 whose retry-after (an hour) is longer than max_retry_wait raises at once with that wait: the job
    waits for the limit (code RateLimited), the call does not retry against it."""
    async with AnthropicDouble([error_reply(429, retry_after=3600), text_message("ok")]) as double:
        claude = _claude(double.url)
        with pytest.raises(ModelUnavailable, match="rate-limited") as err:
            await asyncio.wait_for(claude.create(**PARAMS), 10)
        await claude.close()
    assert err.value.rate_limited and err.value.retry_after == 3600 and len(double.requests) == 1


async def test_budget_spent_raises_model_unavailable() -> None:
    """After max_retries transient failures the call gives up with a reason, never hangs."""
    async with AnthropicDouble(lambda _: error_reply(529)) as double:
        claude = _claude(double.url, max_retries=2)
        with pytest.raises(ModelUnavailable, match="overloaded") as err:
            await claude.create(**PARAMS)
        await claude.close()
    assert err.value.transient
    assert len(double.requests) == 3


async def test_timeout_is_transient() -> None:
    """A server slower than the timeout counts as a failed attempt and is retried."""
    async with AnthropicDouble([Reply(delay=3.0), text_message("late but ok")]) as double:
        claude = Claude(AnthropicConfig(base_url=double.url, api_key=Secret("k"), timeout=0.3, max_retry_wait=0.1))
        msg = await claude.create(**PARAMS)
        await claude.close()
    assert msg.content[0].text == "late but ok"  # type: ignore[union-attr]


async def test_refusal_is_not_retried() -> None:
    """A 401 is not transient: one request, a message that says what to fix."""
    async with AnthropicDouble(lambda _: error_reply(401, "invalid x-api-key")) as double:
        claude = _claude(double.url)
        with pytest.raises(ModelUnavailable, match="ANTHROPIC_API_KEY") as err:
            await claude.create(**PARAMS)
        await claude.close()
    assert not err.value.transient
    assert len(double.requests) == 1


async def test_no_key_no_call() -> None:
    """Without a key or base URL the client says how to configure one and sends nothing."""
    claude = Claude(AnthropicConfig())
    assert not claude.available
    with pytest.raises(ModelUnavailable, match="ANTHROPIC_API_KEY"):
        await claude.create(**PARAMS)


async def test_concurrency_bound_holds_under_20_callers() -> None:
    """20 simultaneous calls never have more than `concurrency` requests in flight."""
    async with AnthropicDouble(lambda _: Reply(body=text_message("x").body, delay=0.05)) as double:
        claude = _claude(double.url, concurrency=3)
        await asyncio.gather(*(claude.create(**PARAMS) for _ in range(20)))
        await claude.close()
    assert double.peak_in_flight == 3
    assert claude.stats.peak_in_flight == 3
    assert claude.stats.calls == 20
