"""The Ollama double's engine *model*: how long a model server takes, not what it says.

One mechanism, used by the double's HTTP server in real time and by the calibration simulator in
virtual time (it only sleeps on the running loop, so a loop whose clock jumps runs it in microseconds):

- `num_parallel` slots, each with its own prefix cache: a request pays prefill only for the prompt tokens
  past the longest prefix its slot holds. A free slot with the longest match is chosen, else the least
  recently used (llama.cpp's and Ollama's runners). With `share_prefix`, a free slot may also copy the
  longest prefix any slot holds (Ollama's multi-user cache "forks" a slot's KV cells).
- While every slot is busy, requests wait in the server's own FIFO queue (Ollama's per-runner semaphore).
- Continuous batching: ONE loop of batch steps for the whole server. Each step carries one token of every
  decoding sequence plus up to `batch` prompt tokens of the sequences still being prefilled, taken in
  arrival order (llama.cpp's `update_slots`, Ollama's runner). Its duration is
  `step_s + decode_s × slowdown(k) + prefill_s × prompt tokens + format_s × constrained sequences`, so a
  long prompt being processed stalls every sequence that is decoding, and k sequences decoding together
  share a step (parallel decoding pays off as far as the contention profile lets it). A sequence's first
  token comes out of the step that finishes its prompt.
- `format_s`: grammar-constrained (`format`) sampling runs on the CPU, per constrained sequence, every step.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Profile:
    name: str = "fast"
    models: tuple[str, ...] = ("hermes3",)
    num_parallel: int = 1
    max_queue: int = 512
    """Requests waiting for a slot beyond this get 503 (Ollama's `OLLAMA_MAX_QUEUE`)."""
    overhead_s: float = 0.0
    """Per request, outside the batch loop: templating, tokenising, sampler set-up."""
    step_s: float = 0.0
    """Per batch step, whatever it carries (graph build, kernel launches, sampling bookkeeping)."""
    prefill_s: float = 0.0001
    """Per uncached prompt token in a step."""
    decode_s: float = 0.002
    """Per step with one sequence decoding."""
    contention: tuple[float, ...] = (1.0, 1.3, 1.6, 1.9)
    """Decode part of a step with k sequences decoding together (index k-1), as a multiple of `decode_s`."""
    format_s: float = 0.0
    """Per grammar-constrained (`format`) sequence per step: CPU-side constrained sampling."""
    batch: int = 512
    """Prompt tokens per step (Ollama's `num_batch`)."""
    share_prefix: bool = False
    """A free slot may copy the longest cached prefix of any slot (Ollama's multi-user cache)."""
    reply_tokens: int = 24
    json_tokens: tuple[tuple[str, int], ...] = (("intent", 6), ("memories", 40))
    """Length of a JSON answer by the key the instruction asks for (an 8B model's verbosity)."""

    def slowdown(self, k: int) -> float:
        c = self.contention
        if k <= len(c):
            return c[max(k, 1) - 1]
        step = c[-1] - c[-2] if len(c) > 1 else 0.0
        return c[-1] + step * (k - len(c))


def common(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@dataclass
class Faults:
    """Test hooks of the double (not Ollama's API)."""

    status: list[int] = field(default_factory=list)
    """Answer the next calls with these HTTP statuses (503 = server busy)."""
    error_after: int | None = None
    """Send an `{"error"}` line after this many tokens, once."""


@dataclass
class Slot:
    index: int
    cached: list[str] = field(default_factory=list)
    busy: bool = False
    used: float = 0.0


@dataclass
class Seq:
    """One request inside the batch loop; its tokens come out of `out` (None ends it)."""

    slot: Slot
    prompt: list[str]
    todo: int
    reply: list[str]
    constrained: bool
    out: asyncio.Queue[str | None] = field(default_factory=asyncio.Queue)
    emitted: int = 0
    started: float = 0.0
    prefilled: float = 0.0
    uncached: int = 0


class Engine:
    """Slots, the server's FIFO queue and the batch loop. Times come from the running loop's clock."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self.slots = [Slot(i) for i in range(profile.num_parallel)]
        self.active = 0
        self.queue = 0
        self.waiters: deque[tuple[list[str], asyncio.Future[Slot]]] = deque()
        self.seqs: list[Seq] = []
        self._loop_task: asyncio.Task[None] | None = None
        self.seen: deque[dict[str, Any]] = deque(maxlen=2000)
        self.faults = Faults()
        self.counts = {"calls": 0, "busy": 0, "closed_early": 0, "max_active": 0, "steps": 0, "prompt_tokens": 0}

    @staticmethod
    def now() -> float:
        return asyncio.get_running_loop().time()

    @property
    def decoding(self) -> int:
        return sum(1 for s in self.seqs if s.todo == 0)

    # -- slots and the server's queue --------------------------------------------------------------

    async def take(self, prompt: list[str]) -> Slot:
        """A slot for `prompt`, in arrival order: the server's own FIFO queue holds a request while all are busy."""
        if not self.waiters and any(not s.busy for s in self.slots):
            return self._assign(prompt)
        fut: asyncio.Future[Slot] = asyncio.get_running_loop().create_future()
        entry = (prompt, fut)
        self.waiters.append(entry)
        self.queue += 1
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.give(fut.result())  # granted just as the client went away: hand it on
            elif entry in self.waiters:
                self.waiters.remove(entry)
            raise
        finally:
            self.queue -= 1

    def _assign(self, prompt: list[str]) -> Slot:
        # The free slot that has the longest prefix of this prompt cached, else the least recently used one.
        slot = max((s for s in self.slots if not s.busy), key=lambda s: (common(s.cached, prompt), -s.used))
        if self.profile.share_prefix:
            donor = max(self.slots, key=lambda s: common(s.cached, prompt))
            have = common(slot.cached, prompt)
            if common(donor.cached, prompt) > have:
                slot.cached = prompt[: common(donor.cached, prompt)]  # KV cells copied from the donor slot
        slot.busy = True
        self.active += 1
        self.counts["max_active"] = max(self.counts["max_active"], self.active)
        return slot

    def give(self, slot: Slot) -> None:
        slot.busy = False
        slot.used = self.now()
        self.active -= 1
        while self.waiters and any(not s.busy for s in self.slots):
            prompt, fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(self._assign(prompt))

    # -- the batch loop ----------------------------------------------------------------------------

    async def start(self, slot: Slot, prompt: list[str], reply: list[str], *, constrained: bool) -> Seq:
        """Put `prompt` into the batch loop on `slot` (after the per-request overhead); read `seq.out`."""
        hit = common(slot.cached, prompt)
        slot.cached = prompt[:hit]  # the rest of the old cache is overwritten from here on
        if self.profile.overhead_s:
            await asyncio.sleep(self.profile.overhead_s)
        todo = max(1, len(prompt) - hit)  # a full hit still evaluates the last token for its logits
        seq = Seq(slot, prompt, todo, reply or [""], constrained, started=self.now(), uncached=todo)
        self.counts["prompt_tokens"] += todo  # tokens read (not served from the slot's cache)
        self.seqs.append(seq)
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._run(), name="double-engine")
        return seq

    def stop(self, seq: Seq) -> None:
        """The request ended (or its client went away): the sequence leaves the batch."""
        if seq in self.seqs:
            self.seqs.remove(seq)

    def step_cost(self, decoding: int, prompt_tokens: int, constrained: int) -> float:
        """One batch step: `decoding` sequences, `prompt_tokens` of prefill, `constrained` grammar samplings."""
        p = self.profile
        cost = p.step_s + p.prefill_s * prompt_tokens + p.format_s * constrained
        return cost + (p.decode_s * p.slowdown(decoding) if decoding else 0.0)

    async def _run(self) -> None:
        while self.seqs:
            decoding = [s for s in self.seqs if s.todo == 0]
            budget = self.profile.batch
            fill: list[tuple[Seq, int]] = []
            for s in self.seqs:
                if s.todo > 0 and budget > 0:
                    n = min(budget, s.todo)
                    fill.append((s, n))
                    budget -= n
            sampled = decoding + [s for s, n in fill if n == s.todo]
            constrained = sum(s.constrained for s in sampled)
            await asyncio.sleep(self.step_cost(len(decoding), sum(n for _, n in fill), constrained))
            self.counts["steps"] += 1
            now = self.now()
            for s, n in fill:
                if s not in self.seqs:
                    continue
                s.todo -= n
                s.slot.cached = s.prompt[: len(s.prompt) - s.todo]
                if s.todo == 0:
                    s.prefilled = now
                    self._emit(s)
            for s in decoding:
                if s in self.seqs:
                    self._emit(s)

    def _emit(self, s: Seq) -> None:
        tok = s.reply[s.emitted]
        s.emitted += 1
        s.slot.cached.append(tok)
        s.out.put_nowait(tok)
        if s.emitted >= len(s.reply):
            s.out.put_nowait(None)
            self.seqs.remove(s)

    async def close(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)

    def stats(self, seq: Seq, received: float) -> dict[str, Any]:
        """Ollama's figures for a finished sequence (ns and counts)."""
        done = self.now()
        return {
            "total_duration": int((done - received) * 1e9),
            "load_duration": 0,
            "prompt_eval_count": seq.uncached,
            "prompt_eval_duration": int((seq.prefilled - seq.started) * 1e9),
            "eval_count": seq.emitted,
            "eval_duration": int((done - seq.prefilled) * 1e9),
        }
