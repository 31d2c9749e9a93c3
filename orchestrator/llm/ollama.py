"""The Ollama client: the official `ollama` package's `AsyncClient`, every call through the host's gate.

Who calls it and how (the gate decides when the call reaches the server):

    backend = ollama.from_config(cfg.ollama, gates)       # the daemon builds one gate per host
    # a background user (the pre-plan pass, memory extraction): one lease for this one call,
    # preemptible by a waiting chat turn (the call is then re-queued and restarted, transparently)
    result = await backend.chat(messages, priority=Priority.BACKGROUND, format="json")
    data = json.loads(result.text)
    # an interactive turn: hold one lease for classification + reply, stream tokens to the user
    async with backend.gate.lease(Priority.INTERACTIVE, session="s1") as lease:
        intent = await backend.chat(classify_msgs, lease=lease, format="json", max_tokens=16)
        reply = await backend.chat(reply_msgs, lease=lease, on_token=send)

Failure is explicit, never a hang: connect, first-token and total timeouts; a 503 ("server busy") or a
connection error is retried with backoff only while no token has reached the user; a server that stays
down is `OllamaError(ServerDown)` naming the host; a missing model is `OllamaError(ModelMissing)` naming
the `ollama pull` to run. Every call sends the same `options`, so the server never reloads the model;
`max_tokens` caps a call: it is sent as `num_predict` (a per-request option, not one of the runner
options that make Ollama reload), so the server ends the call itself and its slot is free the moment the
last line arrives — a capped call closed only by the client keeps the slot busy until the server notices,
and the turn's next call then lands on another slot and reads the whole history again. The client closes
the stream at the cap too, for a server that ignores the option.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from orchestrator import logging as olog
from orchestrator.config import OllamaConfig
from orchestrator.llm.gate import Gate, GatePolicy, Lease, Priority, is_preemption

if TYPE_CHECKING:
    import ollama

Message = Mapping[str, str]
OnToken = Callable[[str], Awaitable[None]]


class OllamaCode(StrEnum):
    """Closed reason codes of a failed Ollama call."""

    ServerDown = "ServerDown"
    ModelMissing = "ModelMissing"
    Timeout = "Timeout"
    ServerError = "ServerError"


class OllamaError(RuntimeError):
    """An Ollama call failed for good; `code` is an `OllamaCode`, the message says what to do."""

    def __init__(self, code: OllamaCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Timeouts:
    connect: float = 5.0
    first_token: float = 120.0
    """From sending the call (after the gate granted a slot) to its first token: covers a model load."""
    total: float = 600.0


@dataclass
class ChatResult:
    text: str
    tokens: int
    attempts: int
    first_token_s: float | None
    total_s: float
    stats: dict[str, int] = field(default_factory=dict)
    """Ollama's own figures from the last line: `*_duration` (ns) and `*_count`."""

    @property
    def server_queue_s(self) -> float:
        """Time the server held the call without working on it: total − load − prompt_eval − eval."""
        s = self.stats
        busy = s.get("load_duration", 0) + s.get("prompt_eval_duration", 0) + s.get("eval_duration", 0)
        return max(0.0, (s.get("total_duration", 0) - busy) / 1e9)


_STAT_KEYS = (
    "total_duration",
    "load_duration",
    "prompt_eval_count",
    "prompt_eval_duration",
    "eval_count",
    "eval_duration",
)
DEFAULT_OPTIONS: Mapping[str, Any] = {"num_ctx": 4096, "temperature": 0.7, "seed": 42}


class _Retry(Exception):
    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class OllamaBackend:
    """One model on one host, behind that host's gate."""

    def __init__(
        self,
        host: str,
        model: str,
        gate: Gate,
        *,
        timeouts: Timeouts | None = None,
        options: Mapping[str, Any] | None = None,
        attempts: int = 4,
        backoff_s: float = 0.25,
        keep_alive: str = "30m",
    ) -> None:
        self.host = host
        self.model = model
        self.gate = gate
        self.timeouts = timeouts or Timeouts()
        self.options = dict(DEFAULT_OPTIONS if options is None else options)
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.keep_alive = keep_alive
        self._client: ollama.AsyncClient | None = None
        self._log = olog.get(ollama=host, model=model)

    @property
    def client(self) -> ollama.AsyncClient:
        """The official client, made on first use (building its HTTP client costs ~50 ms, importing the package
        ~0.3 s of every daemon's start)."""
        if self._client is None:
            import httpx
            import ollama

            t = self.timeouts
            self._client = ollama.AsyncClient(
                host=self.host,
                timeout=httpx.Timeout(connect=t.connect, read=t.first_token, write=30.0, pool=t.total),
            )
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def chat(
        self,
        messages: Sequence[Message],
        *,
        priority: Priority = Priority.BACKGROUND,
        session: str | None = None,
        lease: Lease | None = None,
        format: str | dict[str, Any] | None = None,
        max_tokens: int | None = None,
        on_token: OnToken | None = None,
        queue_timeout: float | None = 300.0,
    ) -> ChatResult:
        """One `/api/chat` call, streamed. With `lease`, it runs in that held slot; else it takes its own."""
        if lease is not None:
            return await self._call(messages, lease, format, max_tokens, on_token)
        arrived, preemptions = self.gate.clock(), 0
        while True:
            own = await self.gate.acquire(
                priority, session=session, timeout=queue_timeout, arrived=arrived, preemptions=preemptions
            )
            try:
                return await self._call(messages, own, format, max_tokens, on_token)
            except asyncio.CancelledError as e:
                if not is_preemption(own, e):
                    raise
                task = asyncio.current_task()
                assert task is not None
                task.uncancel()
                preemptions = own.preemptions + 1
                self._log.info(olog.Event.OLLAMA_CALL_PREEMPTED, preemptions=preemptions)
            finally:
                self.gate.release(own)

    async def _call(
        self,
        messages: Sequence[Message],
        lease: Lease,
        format: str | dict[str, Any] | None,
        max_tokens: int | None,
        on_token: OnToken | None,
    ) -> ChatResult:
        delivered = False
        attempt = 0
        started = time.monotonic()
        deadline = started + self.timeouts.total

        async def deliver(token: str) -> None:
            nonlocal delivered
            delivered = True
            if on_token is not None:
                await on_token(token)

        while True:
            attempt += 1
            try:
                result = await self._once(messages, format, max_tokens, deliver, deadline)
            except _Retry as r:
                # Retrying after a token reached the user would repeat words they already read.
                if delivered:
                    raise OllamaError(
                        OllamaCode.ServerError, f"Ollama at {self.host} failed mid-reply: {r.why}"
                    ) from None
                pause = min(self.backoff_s * 2 ** (attempt - 1), 4.0) * (0.5 + random.random() / 2)
                if attempt >= self.attempts or time.monotonic() + pause > deadline:
                    raise self._gave_up(r.why, attempt) from None
                self._log.info(olog.Event.OLLAMA_CALL_RETRY, attempt=attempt, why=r.why, pause_s=round(pause, 3))
                await asyncio.sleep(pause)
                continue
            result.attempts = attempt
            result.total_s = time.monotonic() - started
            self.gate.record_server(result.server_queue_s)
            return result

    def _gave_up(self, why: str, attempts: int) -> OllamaError:
        if why.startswith("connect"):
            return OllamaError(
                OllamaCode.ServerDown,
                f"Ollama at {self.host} is unreachable after {attempts} attempts ({why}): start it "
                "(`ollama serve`) or point OLLAMA_HOST / [ollama] host at the right server",
            )
        return OllamaError(
            OllamaCode.ServerError, f"Ollama at {self.host} stayed busy after {attempts} attempts ({why})"
        )

    async def _once(
        self,
        messages: Sequence[Message],
        format: str | dict[str, Any] | None,
        max_tokens: int | None,
        deliver: OnToken,
        deadline: float,
    ) -> ChatResult:
        import httpx
        import ollama

        sent = time.monotonic()
        parts: list[str] = []
        tokens = 0
        first: float | None = None
        stats: dict[str, int] = {}
        stream: Any = None
        try:
            async with asyncio.timeout(max(0.0, min(self.timeouts.first_token, deadline - sent))) as cm:
                stream = await self.client.chat(  # type: ignore[call-overload]
                    model=self.model,
                    messages=list(messages),
                    stream=True,
                    format=format,
                    options=self.options if max_tokens is None else {**self.options, "num_predict": max_tokens},
                    keep_alive=self.keep_alive,
                )
                async for part in stream:
                    content = part.message.content or ""
                    if first is None:
                        first = time.monotonic() - sent
                        cm.reschedule(asyncio.get_running_loop().time() + max(0.0, deadline - time.monotonic()))
                    if content:
                        if max_tokens is not None and tokens >= max_tokens:
                            break  # a server that ignored num_predict: closing the stream below frees its slot
                        tokens += 1
                        parts.append(content)
                        await deliver(content)
                    if part.done:
                        stats = {k: int(getattr(part, k) or 0) for k in _STAT_KEYS}
                        break
        except TimeoutError:
            which = "first token" if first is None else "whole reply"
            limit = self.timeouts.first_token if first is None else self.timeouts.total
            raise OllamaError(
                OllamaCode.Timeout, f"Ollama at {self.host} gave no {which} within {limit:.0f} s (model {self.model})"
            ) from None
        except ollama.ResponseError as e:
            raise self._response_error(e) from None
        except (ConnectionError, httpx.TransportError) as e:
            raise _Retry(f"connect: {type(e).__name__}: {e}") from None
        finally:
            if stream is not None:
                await stream.aclose()
        return ChatResult(text="".join(parts), tokens=tokens, attempts=1, first_token_s=first, total_s=0.0, stats=stats)

    def _response_error(self, e: ollama.ResponseError) -> Exception:
        if e.status_code == 503:
            return _Retry(f"503 server busy: {e.error}")
        if e.status_code == 404 and "not found" in str(e.error):
            return OllamaError(
                OllamaCode.ModelMissing,
                f"model {self.model!r} is not on the Ollama server at {self.host}: run `ollama pull {self.model}` "
                "(or set [ollama] model to one that `ollama list` shows)",
            )
        return OllamaError(
            OllamaCode.ServerError, f"Ollama at {self.host} answered: {e.error} (status {e.status_code})"
        )


def gate_policy(cfg: OllamaConfig, *, naive: bool = False) -> GatePolicy:
    return GatePolicy(slots=cfg.parallel, max_queue=cfg.max_queue, unbounded=naive, turn_slots=cfg.turn_slots)


def from_config(cfg: OllamaConfig, gates: dict[str, Gate], *, naive: bool = False, **kwargs: Any) -> OllamaBackend:
    """The backend for `cfg`'s model, sharing one gate per host (so two models on one server share its slots)."""
    gate = gates.get(cfg.host)
    if gate is None:
        gate = gates[cfg.host] = Gate(cfg.host, gate_policy(cfg, naive=naive))
    kwargs.setdefault("timeouts", Timeouts(first_token=cfg.first_token_timeout, total=cfg.total_timeout))
    return OllamaBackend(cfg.host, cfg.model, gate, **kwargs)


def parse_json(result: ChatResult) -> Any:
    """The reply of a `format="json"` call, or None if the model wrote something else (it may, when capped)."""
    try:
        return json.loads(result.text)
    except json.JSONDecodeError:
        return None
