"""Fitting job lines to a terminal: pure text helpers for `status` and `watch`."""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from orchestrator.core import models

WAITING = models.WAITING
SUMMARY_ORDER = (
    "running", "waiting", "landing", "ready", "interrupted", "landed", "unchanged", "failed", "conflicted", "cancelled",
)  # fmt: skip
"""The order of a summary's counts: what runs or waits first, then what ended."""
ELLIPSIS = "…"


def cut_middle(text: str, width: int) -> str:
    """`text` in at most `width` characters, cut from the middle so its end (what to do) stays.

    A third of the room goes to the start (what it is about), the rest to the end.
    """
    text = " ".join(text.split())
    if width <= 0:
        return ""
    if len(text) <= width:
        return text
    if width == 1:
        return ELLIPSIS
    head = (width - 1) // 3
    tail = width - 1 - head
    return text[:head].rstrip() + ELLIPSIS + text[len(text) - tail :].lstrip()


def reason(job: dict[str, Any]) -> str:
    """A job's reason with what happens next, for a waiting job ("...; waits for job 4 to land")."""
    if job["state"] == "running":
        claim = ", ".join(job["claim"]["paths"]) or "no paths: runs alone"
        touched = f"; touched {', '.join(job['actual'])}" if job.get("actual") else ""
        return f"claims {claim}{touched}"
    nxt = (job.get("decision") or {}).get("next", "") if job["state"] in WAITING else ""
    return f"{job['reason']}; {nxt}" if nxt and nxt not in job["reason"] else job["reason"]


def cut_end(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else (text[: max(width - 1, 0)] + ELLIPSIS if width > 0 else "")


def summary(jobs: Iterable[dict[str, Any]]) -> str:
    """ "3 running, 5 waiting: 3 Overlap, 2 Concurrency, 1 landing, 1 ready, 4 landed" (waiting by code;
    `ready`: finished in review mode, waiting for a person's `land` or `reject`)."""
    jobs = list(jobs)
    by_state = Counter("waiting" if j["state"] in WAITING else j["state"] for j in jobs)
    codes = Counter(j.get("code") or j["state"] for j in jobs if j["state"] in WAITING)
    parts = []
    for state in SUMMARY_ORDER:
        n = by_state.get(state, 0)
        if not n:
            continue
        part = f"{n} {state}"
        if state == "waiting" and codes:
            part += ": " + ", ".join(f"{c} {code}" for code, c in codes.most_common())
        if state == "running" and (limited := sum(1 for j in jobs if j["state"] == state and j.get("code") == LIMITED)):
            part += f" ({limited} {LIMITED})"  # running, but waiting for its model API's rate limit to end
        parts.append(part)
    return ", ".join(parts) if parts else "no jobs"


LIMITED = str(models.Code.RATE_LIMITED)


def review_hint(ready: list[int]) -> str:
    """What to do about jobs waiting for review: "2 ready for review (7, 9): `orchestrator diff 7`, then ..."."""
    first = ready[0]
    ids = f" ({', '.join(map(str, ready))})" if len(ready) > 1 else f" (job {first})"
    return (
        f"{len(ready)} ready for review{ids}: `orchestrator diff {first}` shows it, "
        f"`orchestrator land {first}` lands it, `orchestrator revise {first} FEEDBACK` sends it back to its agent, "
        f"`orchestrator reject {first}` drops it"
    )


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw]?)$")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def since_cutoff(value: str, now: float | None = None) -> float:
    """A `--since` value (`30m`, `2h`, `1d`, or an ISO time) as a UNIX time; ValueError says what is valid."""
    now = time.time() if now is None else now
    m = _DURATION.match(value.strip())
    if m:
        return now - float(m.group(1)) * _UNIT[m.group(2)]
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        raise ValueError(f"--since {value!r}: give a duration (30m, 2h, 1d) or a time (2026-11-30T09:00)") from None


def ts(value: str | None) -> float | None:
    return None if value is None else datetime.fromisoformat(value).timestamp()


def age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"
