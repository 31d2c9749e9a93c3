"""The model planners' one prompt: the tool schema, the system text, the user message, and the answer's check.

The user message holds the ticket, the relevant snippets (the lines around each identifier the ticket
names, in the files local evidence found at the base revision; a file's head where it names none), and
the repository's file list ranked (local evidence first, then files that change often, then the rest),
all cut to a token budget. Both backends (Claude through a tool schema, Ollama through a JSON `format`)
send it and read the same plan object back.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from typing import Any

import pygit2

from orchestrator.core import claims
from orchestrator.core.job import Job
from orchestrator.core.models import Claim, ClaimSource
from orchestrator.git import repos
from orchestrator.plan.base import Evidence, Kind, Note, Plan
from orchestrator.plan.composite import ModelUnusable
from orchestrator.plan.evidence import definition_pattern, tree_files
from orchestrator.plan.text import mentions

MAX_CONFIDENCE = 0.9
"""A model's own confidence is capped: only a person's declaration is certain."""
CHARS_PER_TOKEN = 4
SNIPPET_SHARE = 3
"""Snippets take at most 1/SNIPPET_SHARE of the budget; the file list the rest."""
HEAD_LINES = 30
"""Lines shown of a found file in which the ticket names no identifier."""
BEFORE, AFTER = 3, 12
"""Lines shown around a line that defines a named identifier (fewer, `USE_CONTEXT`, around a use)."""
USE_CONTEXT = 2
MAX_HITS = 6
"""Most places shown per file."""
MAX_READ = 2_000_000
"""Bytes of a file searched for the named identifiers (a generated giant is read no further)."""

TOOL: dict[str, Any] = {
    "name": "submit_plan",
    "description": "Submit the files this job will create, modify or delete, and a short plan.",
    "input_schema": {
        "type": "object",
        "properties": {
            "paths": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Repo-relative paths the job will touch (files; a directory ends with '/'). "
                "Include the tests to change or add.",
            },
            "confidence": {
                "type": "number",
                "minimum": 0,
                "maximum": 1,
                "description": "Probability that the job touches no file outside `paths`.",
            },
            "plan": {"type": "string", "description": "The plan in a few numbered steps."},
        },
        "required": ["paths", "confidence", "plan"],
    },
}

SYSTEM = (
    "You plan coding jobs for a scheduler that runs jobs side by side when the files they touch are disjoint. "
    "Read the ticket and the repository's file list, then call submit_plan once: every file the job will "
    "create, modify or delete (tests included), an honest confidence, and a short plan a coding agent can "
    "follow. Prefer naming files to directories; name a directory only when the job really spans it."
)


def _ranked(files: list[str], first: list[str], count: dict[str, int], budget_chars: int) -> tuple[list[str], int]:
    """The file list ranked (local evidence, then often-changed files, then the rest) and cut to the budget."""
    order = list(dict.fromkeys([*first, *sorted(files, key=lambda f: (-count.get(f, 0), f))]))
    out, used = [], 0
    for f in order:
        if used + len(f) + 1 > budget_chars:
            break
        out.append(f)
        used += len(f) + 1
    return out, len(order) - len(out)


def names_in(text: str) -> list[str]:
    """The identifiers a ticket names, dotted ones split (`Session.get` → `Session`, `get`), longest first."""
    out: list[str] = []
    for ident in mentions(text).identifiers:
        out += [p for p in ident.split(".") if len(p) > 2]
    return sorted(dict.fromkeys(out), key=len, reverse=True)


def _lines_of(repo: pygit2.Repository, tree: pygit2.Tree, path: str) -> list[str] | None:
    try:
        obj = tree[path]
    except KeyError:
        return None
    data = repo[obj.id].read_raw() if obj.type_str == "blob" else b""
    if not data or b"\0" in data[:8000]:
        return None
    return data[:MAX_READ].decode("utf-8", "replace").splitlines()


def snippet(lines: Sequence[str], names: Sequence[str], budget: int) -> str:
    """The lines around each place `names` occur (definitions first), numbered, within `budget` characters;
    the file's head when none occurs. Pure."""
    windows: list[tuple[int, int]] = []
    if names:
        alt = "|".join(re.escape(n) for n in names)
        defines, named = re.compile(definition_pattern(names)), re.compile(rf"\b({alt})\b")
        hits = [(0 if defines.search(line) else 1, i) for i, line in enumerate(lines) if named.search(line)]
        for rank, i in sorted(hits)[:MAX_HITS]:
            before, after = (BEFORE, AFTER) if rank == 0 else (USE_CONTEXT, USE_CONTEXT)
            windows.append((max(0, i - before), min(len(lines), i + after + 1)))
    if not windows:
        windows = [(0, min(len(lines), HEAD_LINES))]
    merged: list[list[int]] = []
    for a, b in sorted(windows):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    out: list[str] = []
    used = 0
    for a, b in merged:
        for i in range(a, b):
            line = f"{i + 1:>5}  {lines[i]}"
            if used + len(line) + 1 > budget:
                return "\n".join(out)
            out.append(line)
            used += len(line) + 1
        out.append("  ...")
    return "\n".join(out[:-1])


def snippets(repo: str, base: str, text: str, paths: Sequence[str], budget: int) -> list[str]:
    """Relevant snippets of `paths` at `base` (read from the object store, no checkout), within `budget`."""
    if not paths or budget <= 0:
        return []
    r = repos.open_repo(repo)
    tree = r[base].peel(pygit2.Commit).tree
    names = names_in(text)
    out, used = [], 0
    share = max(400, budget // len(paths))
    for path in paths:
        lines = _lines_of(r, tree, path)
        if not lines:
            continue
        body = snippet(lines, names, min(share, budget - used))
        if body:
            out.append(f"--- {path}\n{body}")
            used += len(out[-1]) + 1
        if used >= budget:
            break
    return out


def prompt(job: Job, base: str, local: Plan | None, budget_tokens: int, count: dict[str, int]) -> str:
    """The user message: ticket, relevant snippets, ranked file list (blocking: run it in a thread)."""
    files = sorted(tree_files(job.repo, base).paths)
    present = set(files)
    found = list(dict.fromkeys(e.path for e in (local.evidence if local else ()) if e.path in present))
    budget = budget_tokens * CHARS_PER_TOKEN
    shown = snippets(job.repo, base, job.text, found, budget // SNIPPET_SHARE)
    used = sum(len(s) + 1 for s in shown)
    listed, left = _ranked(files, found, count, budget - used - len(job.text))
    parts = [f"Ticket:\n{job.text}\n", f"Files in the repository ({len(files)}):", *listed]
    if left:
        parts.append(f"... and {left} more files not listed")
    if found:
        parts.append("\nLocal evidence (text mentions, definitions, tests, co-change): " + ", ".join(found))
    if shown:
        parts += ["\nRelevant snippets (line numbers at the base revision):", *shown]
    return "\n".join(parts)


async def user_message(
    job: Job, base: str, local: Plan | None, budget_tokens: int, counts: Callable[[str], dict[str, int]] | None
) -> str:
    """`prompt`, off the event loop, with the repo's change counts to rank the file list."""
    count = counts(job.repo) if counts else {}
    return await asyncio.to_thread(prompt, job, base, local, budget_tokens, count)


def parse_input(data: dict[str, Any]) -> tuple[frozenset[str], float, str]:
    """The claim paths, confidence and plan text of a plan object (`TOOL`'s input schema), or `ModelUnusable`."""
    if not isinstance(data, dict):
        raise ModelUnusable(Note.MODEL_MALFORMED, "the plan is not a JSON object")
    raw, confidence, text = data.get("paths"), data.get("confidence"), data.get("plan", "")
    if not isinstance(raw, list) or not raw or not all(isinstance(p, str) for p in raw):
        raise ModelUnusable(Note.MODEL_MALFORMED, "submit_plan without a list of paths")
    if isinstance(confidence, bool) or not isinstance(confidence, int | float) or not 0 <= confidence <= 1:
        raise ModelUnusable(Note.MODEL_MALFORMED, f"submit_plan with confidence {confidence!r} (not in 0..1)")
    paths = set()
    for p in raw:
        try:
            paths.add(claims.normalize(p.strip()))
        except claims.ClaimError as e:
            raise ModelUnusable(Note.MODEL_MALFORMED, f"submit_plan named an unusable path: {e}") from None
    return frozenset(paths), min(float(confidence), MAX_CONFIDENCE), text if isinstance(text, str) else ""


def model_plan(answer: tuple[frozenset[str], float, str], model: str) -> Plan:
    """The plan a model's checked answer (`parse_input`) makes, each path's evidence naming the model."""
    paths, confidence, text = answer
    evidence = tuple(Evidence(p, Kind.MODEL, f"{model}'s pre-plan names it") for p in sorted(paths))
    return Plan(Claim(paths, confidence, ClaimSource.MODEL), evidence, text, str(Kind.MODEL))
