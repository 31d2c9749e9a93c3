"""Fitting job lines to a terminal: pure text helpers for `status` and `watch`."""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from orchestrator.commands import term
from orchestrator.core import claims, models

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


def cut_end(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else (text[: max(width - 1, 0)] + ELLIPSIS if width > 0 else "")


def fill(text: str, width: int, indent: str = "") -> list[str]:
    """`text` in lines of at most `width` columns, broken between words (the spaces inside a line kept as they
    are); a `quoted command` is never broken, and a word longer than a line is cut from its middle."""
    lines: list[str] = []
    line = ""
    for word in re.findall(r"(?:`[^`]*`\S*|\S+)\s*", text.strip()):
        if line.strip() and len(line) + len(word.rstrip()) > width:
            lines.append(line.rstrip())
            line = indent
        line += word
        if len(line.rstrip()) > width:
            line = cut_middle(line, width) + " "
    if line.strip():
        lines.append(line.rstrip())
    return lines


# -- one job a line -------------------------------------------------------------------------------------------

TEXT_MIN, TEXT_MAX = 10, 32
"""The job's text gets at least / at most this many columns; its reason takes what is left."""
REPO_MAX, NODE_MAX, CODE_MAX = 14, 9, 18
UNDER = 7
"""Where a reason too long for its job's line starts on the line under it."""
CUT_MIN = 24
"""A reason cut from its middle keeps at least this many characters on its job's line, else it goes under it."""


@dataclass(frozen=True, slots=True)
class Layout:
    """The columns of a list of job lines, chosen once for all its lines so that they line up."""

    width: int
    state: int = 11
    repo: int = 0
    """0: no repository column (every job is of one repository, or the view groups them by repository)."""
    node: int = 0
    """0: no node column (team mode shows the node that holds each job)."""
    code: int = 0
    text: int = TEXT_MAX
    wide: bool = False
    """Every field whole (the line may wrap)."""
    under: bool = True
    """A reason too long for its job's line may go on the line under it (else it is cut: one line a job, for a
    pipe)."""


def shown_code(job: dict[str, Any]) -> str:
    """The job's code when it says more than its state (`Landed` of a landed job says nothing more)."""
    code = str(job.get("code") or "")
    return "" if code.lower() == str(job["state"]).lower() else code


def layout(
    jobs: list[dict[str, Any]],
    width: int,
    *,
    wide: bool = False,
    repo: bool | None = None,
    nodes: bool | None = None,
    under: bool = True,
) -> Layout:
    """The columns for `jobs` on `width` columns. `repo` (default: when they are of several repositories) and
    `nodes` (default: when a job names a node) add those columns."""
    if repo is None:
        repo = len({j["repo"] for j in jobs}) > 1
    if nodes is None:
        nodes = any(j.get("node") for j in jobs)
    return Layout(
        width=width,
        state=max((len(j["state"]) for j in jobs), default=7),
        repo=min(max((len(Path(j["repo"]).name) for j in jobs), default=0), REPO_MAX) if repo else 0,
        node=NODE_MAX + 1 if nodes else 0,
        code=min(max((len(shown_code(j)) for j in jobs), default=0), CODE_MAX),
        text=min(max((len(one_line(j["text"])) for j in jobs), default=0), TEXT_MAX),
        wide=wide,
        under=under,
    )


def one_line(text: str) -> str:
    """A job's text (or any string from a job) on one line: runs of white space as one space, the rest visible."""
    return term.visible(" ".join(text.split()))


def reasons(job: dict[str, Any], held: list[int] | None = None) -> list[str]:
    """What to say of why a job is where it is, richest first: its reason with what happens next, then what
    happens next alone (the code is in its own column). `held`: the jobs in review that hold it back."""
    state, reason = job["state"], one_line(job.get("reason") or "")
    if state == "running":
        claim = ", ".join(map(claims.describe, job["claim"]["paths"])) or "no paths: runs alone"
        touched = f"; touched {', '.join(job['actual'])}" if job.get("actual") else ""
        return [term.visible(f"claims {claim}{touched}")]
    if state in WAITING:
        nxt = one_line((job.get("decision") or {}).get("next", ""))
        if held:
            who = f"job {held[0]}" if len(held) == 1 else f"jobs {', '.join(map(str, held))}"
            short = f"held by {who} in review"
            hint = f"{short}: `orchestrator diff {held[0]}`"
            return [f"{reason}; {hint}", hint, short]
        full = f"{reason}; {nxt}" if nxt and nxt not in reason else reason
        return [full, nxt] if nxt and nxt != full else [full]
    if state == "ready":
        return [reason, f"review it: `orchestrator diff {job['id']}`"]
    if state == "landed" and job.get("landed_sha"):
        return [reason, f"at {job['landed_sha'][:12]}"]
    return [reason]


def row(
    job: dict[str, Any], lay: Layout, *, now: float | None = None, held: list[int] | None = None
) -> list[tuple[str, str]]:
    """One job as (text, style) cells on one line of `lay.width` columns, every string from the job made visible.
    The reason takes what the fixed columns and the text leave: the richest of `reasons` that fits beside the text
    at the width common to all lines, else the shortest with the text cut down to `TEXT_MIN` as needed, cut from
    its middle (so that its end, what to do, stays) if it keeps `CUT_MIN` characters so. Else (a narrow terminal,
    long codes) the reason goes on the line under the job's (a last cell that starts with a newline), cut only if
    it is wider than the whole line."""
    now = time.time() if now is None else now
    started = ts(job.get("started_at")) or ts(job.get("created_at")) or now
    ended = ts(job.get("finished_at"))
    state = job["state"]
    cells = [(f"{job['id']:>4}", "bold"), (f"{state:<{lay.state}}", STATE_STYLE.get(state, ""))]
    if lay.node:
        cells.append((f"@{cut_end(term.visible(job.get('node') or '-'), NODE_MAX):<{NODE_MAX}}", "cyan"))
    cells.append((f"{age((ended or now) - started):>4}", "dim"))
    if lay.repo:
        name = term.visible(Path(job["repo"]).name)
        cells.append((name if lay.wide else f"{cut_end(name, lay.repo):<{lay.repo}}", "blue"))
    code = (shown_code(job) or "-") if lay.code else ""
    text = one_line(job["text"])
    says = reasons(job, held)
    if lay.wide:
        return [*cells, *([(term.visible(code), "magenta")] if code else []), (text, ""), (says[0], "")]
    if code:
        cells.append((f"{cut_end(term.visible(code), lay.code):<{lay.code}}", "magenta"))
    room = max(lay.width - sum(len(t) for t, _ in cells) - len(cells), 0)
    # The richest reason beside the text at the width common to all lines; else the text gives up room for the
    # shortest; else that is cut from the middle.
    full, least = min(len(text), lay.text), min(len(text), TEXT_MIN, lay.text)
    reason = next((r for r in says if len(r) + 1 + max(full, lay.text) <= room), None)
    if reason is None and lay.under and len(says[-1]) + 1 + least > room and room - least - 1 < CUT_MIN:
        # Too narrow for even the shortest beside the text: the reason goes on a line of its own, under the line.
        under = lay.width - UNDER
        reason = next((r for r in says if len(r) <= under), cut_middle(says[-1], under))
        cells.append((cut_end(text, room), ""))
        return [*cells, (f"\n{' ' * UNDER}{reason}", "")]
    if reason is None:
        reason = says[-1] if len(says[-1]) + 1 + least <= room else cut_middle(says[-1], max(room - least - 1, 0))
    width = max(min(lay.text, room - len(reason) - 1), least)
    cells.append((f"{cut_end(text, width):<{width}}", ""))
    return [*cells, (reason, "")]


STATE_STYLE = {
    "running": "green",
    "landing": "cyan",
    "ready": "bold magenta",
    "landed": "dim",
    "unchanged": "yellow",
    "failed": "red",
    "conflicted": "red",
    "cancelled": "yellow",
    "interrupted": "yellow",
}


def review_holds(jobs: list[dict[str, Any]]) -> dict[int, list[int]]:
    """For each waiting job held back, directly or through earlier waiting jobs (`Priority`), by jobs in
    review (`ready`): those jobs' ids. A job in review keeps its paths and its slot until a person lands or
    rejects it, so work that has nothing to do with it may wait on it without anyone being told."""
    by_id = {j["id"]: j for j in jobs}
    memo: dict[int, frozenset[int]] = {}

    def ready_behind(i: int, seen: frozenset[int]) -> frozenset[int]:
        if i in memo:
            return memo[i]
        j = by_id.get(i)
        if j is None or i in seen:
            return frozenset()
        if j["state"] == "ready":
            return frozenset({i})
        if j["state"] not in WAITING:
            return frozenset()
        found: set[int] = set()
        for b in (j.get("decision") or {}).get("blocking") or ():
            found |= ready_behind(b, seen | {i})
        memo[i] = frozenset(found)
        return memo[i]

    out = {}
    for j in jobs:
        if j["state"] in WAITING and (found := ready_behind(j["id"], frozenset())):
            out[j["id"]] = sorted(found)
    return out


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
            part += ": " + ", ".join(f"{c} {term.visible(code)}" for code, c in codes.most_common())
        if state == "running" and (limited := sum(1 for j in jobs if j["state"] == state and j.get("code") == LIMITED)):
            part += f" ({limited} {LIMITED})"  # running, but waiting for its model API's rate limit to end
        parts.append(part)
    return ", ".join(parts) if parts else "no jobs"


LIMITED = str(models.Code.RATE_LIMITED)


def review_hint(ready: list[int], holds: dict[int, list[int]] | None = None) -> str:
    """What to do about jobs waiting for review: "2 ready for review (7, 9) holding back job 8: `orchestrator diff
    7` shows it, ..." (`holds`: `review_holds`, the waiting jobs they hold back)."""
    first = ready[0]
    ids = f" ({', '.join(map(str, ready))})" if len(ready) > 1 else f" (job {first})"
    held = sorted(holds or {})
    holding = f" holding back {'job' if len(held) == 1 else 'jobs'} {', '.join(map(str, held))}" if held else ""
    return (
        f"{len(ready)} ready for review{ids}{holding}: `orchestrator diff {first}` shows it, "
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
