"""What Claude tokens cost: usage totals and their price in USD, from the published per-million rates.

Rates change; an unknown model's cost is None (usage is still counted), never a guess.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# USD per million tokens: input, output, cache write (5 min), cache read.
RATES: dict[str, tuple[float, float, float, float]] = {
    "claude-opus-4-5": (5.0, 25.0, 6.25, 0.50),
    "claude-opus-4-1": (15.0, 75.0, 18.75, 1.50),
    "claude-opus-4": (15.0, 75.0, 18.75, 1.50),
    "claude-sonnet-4-5": (3.0, 15.0, 3.75, 0.30),
    "claude-sonnet-4": (3.0, 15.0, 3.75, 0.30),
    "claude-3-7-sonnet": (3.0, 15.0, 3.75, 0.30),
    "claude-haiku-4-5": (1.0, 5.0, 1.25, 0.10),
    "claude-3-5-haiku": (0.80, 4.0, 1.0, 0.08),
}


def rates(model: str) -> tuple[float, float, float, float] | None:
    """The rates of `model` (a dated name like `claude-sonnet-4-5-20250929` matches its family)."""
    for name in sorted(RATES, key=len, reverse=True):
        if model == name or model.startswith(name + "-"):
            return RATES[name]
    return None


@dataclass
class Usage:
    """Token totals of one job's Claude calls."""

    model: str = ""
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_write_tokens: int = 0
    cache_read_tokens: int = 0

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens + self.cache_write_tokens + self.cache_read_tokens

    def add(self, usage: Any) -> None:
        """Count one response's `usage` (an `anthropic.types.Usage`)."""
        self.calls += 1
        self.input_tokens += usage.input_tokens or 0
        self.output_tokens += usage.output_tokens or 0
        self.cache_write_tokens += getattr(usage, "cache_creation_input_tokens", 0) or 0
        self.cache_read_tokens += getattr(usage, "cache_read_input_tokens", 0) or 0

    @property
    def cost_usd(self) -> float | None:
        r = rates(self.model)
        if r is None:
            return None
        spent = (self.input_tokens, self.output_tokens, self.cache_write_tokens, self.cache_read_tokens)
        return round(sum(n * rate for n, rate in zip(spent, r, strict=True)) / 1e6, 6)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "tokens": self.tokens, "cost_usd": self.cost_usd}


COUNTED = ("calls", "input_tokens", "output_tokens", "cache_write_tokens", "cache_read_tokens", "tokens")


def added(before: dict[str, Any] | None, now: dict[str, Any]) -> dict[str, Any]:
    """A job's usage over its runs (a revision, a run after a rate limit): counts and cost summed; the rest
    (model, session, transcript) from the latest run. A cost either run could not price stays unknown."""
    if not before:
        return now
    out = {**before, **now}
    for key in COUNTED:
        if key in before or key in now:
            out[key] = int(before.get(key) or 0) + int(now.get(key) or 0)
    costs = (before.get("cost_usd"), now.get("cost_usd"))
    out["cost_usd"] = None if None in costs else round(float(costs[0] or 0) + float(costs[1] or 0), 6)
    out["runs"] = int(before.get("runs") or 1) + 1
    return out
