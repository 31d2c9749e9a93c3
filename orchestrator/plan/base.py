"""The planner seam: one small interface, `async plan(job, base) -> Plan`, and the plain data it returns.

A `Plan` holds the `Claim` admission reads, the evidence for each path (why it is there), the model's
plan text when a model planned (handed to the runner so the work is not thought out twice), and notes:
what a source could not do and why (a model that was down, a text that named nothing).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from orchestrator.core.job import Job
from orchestrator.core.models import Claim


class Kind(StrEnum):
    """What kind of evidence put a path in a claim, strongest first."""

    DECLARED = "declared"
    """Named with `--path` or in the ticket's `Paths:` front matter."""
    MODEL = "model"
    """A model's pre-plan named it."""
    NAMED = "named"
    """The text names the path, its file name, or its module."""
    TRACEBACK = "traceback"
    """A traceback in the text runs through this file."""
    SYMBOL = "symbol"
    """The text names an identifier this file defines."""
    TEST = "test"
    """The test file that goes with a claimed source file (naming convention or import)."""
    COCHANGE = "cochange"
    """It changed together with a claimed file in most of the repo's past commits that touched that file."""
    SPILL = "spill"
    """One of the busiest files of a directory the job likely works in: a chance of being touched there, not a
    pointer to where the work is (no ticket claims a file for it alone)."""
    HISTORY = "history"
    """Past changes described in the same words touched it."""
    CONTENT = "content"
    """Its contents use the text's words more than other files do (BM25 retrieval over the tree)."""


@dataclass(frozen=True, slots=True)
class Evidence:
    """Why one path is in a claim."""

    path: str
    kind: Kind
    why: str

    def to_json(self) -> dict[str, str]:
        return {"path": self.path, "kind": str(self.kind), "why": self.why}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Evidence:
        return cls(str(data["path"]), Kind(str(data["kind"])), str(data.get("why", "")))


class Note(StrEnum):
    """Closed codes for what a planning source could not do (logged with a human reason)."""

    NAMES_NOTHING = "NamesNothing"
    """The text names no path, file, module or identifier of the repo: the claim is ambiguous."""
    MODEL_UNAVAILABLE = "ModelUnavailable"
    """The model was down, rate-limited, overloaded or timed out: local evidence stands in."""
    MODEL_MALFORMED = "ModelMalformed"
    """The model answered without a usable claim: local evidence stands in."""
    DEADLINE = "Deadline"
    """The plan took longer than its deadline: the job goes on with what local evidence gave."""
    WIDE = "Wide"
    """Past changes to the named files often reached beyond the claim: it is not confident."""
    NO_RECORD = "NoRecord"
    """The repository's record is too short to estimate how often such claims miss: the job runs alone."""
    UNCALIBRATED = "Uncalibrated"
    """The repository's record has too few pairs of past changes to check its risk against what happened there:
    the job runs alone."""
    GUESSED = "Guessed"
    """A ticket's most likely file is found by its words alone (nothing it names points there): its claim is a
    guess, held as wide as its alternatives (`plan.focus.NEAR_CLAIM`), and it runs beside others on that claim."""
    APART = "Apart"
    """A short text reports what is wrong (an issue's title) instead of saying what to change, and names no file (by
    its path or its name), no traceback frame, no `Class.member`: where its work is cannot be told, so its claim is
    the whole repository and it runs apart from the repository's other jobs (`plan.focus.APART_BELOW`)."""
    NO_MODEL = "NoModel"
    """No model backend is configured or reachable: local evidence only."""
    FAILED = "Failed"
    """A source failed unexpectedly (logged in full); the others carry on."""


@dataclass(frozen=True, slots=True)
class Plan:
    """A planner's answer: the claim, its evidence, the model's plan text, and notes."""

    claim: Claim = field(default_factory=Claim)
    evidence: tuple[Evidence, ...] = ()
    text: str = ""
    """The model's plan in prose ("" without a model)."""
    basis: str = "none"
    """The strongest kind of evidence the confidence rests on (a `Kind` value, or "none")."""
    notes: tuple[tuple[Note, str], ...] = ()
    ranking: tuple[Mapping[str, Any], ...] = ()
    """Local evidence's most likely files, each with its probability and why (`plan --json`)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "claim": self.claim.to_json(),
            "basis": self.basis,
            "evidence": [e.to_json() for e in self.evidence],
            "ranking": [dict(r) for r in self.ranking],
            "plan_text": self.text,
            "notes": [{"code": str(c), "reason": r} for c, r in self.notes],
        }


class Planner(Protocol):
    """Predicts the paths a job will touch at `base` (a commit sha). Never raises for a bad text."""

    name: str

    async def plan(self, job: Job, base: str) -> Plan: ...


def merge_evidence(*groups: Sequence[Evidence]) -> tuple[Evidence, ...]:
    """Evidence of several sources, one entry per (path, kind), first reason kept, in order."""
    seen: set[tuple[str, Kind]] = set()
    out = []
    for group in groups:
        for e in group:
            if (e.path, e.kind) not in seen:
                seen.add((e.path, e.kind))
                out.append(e)
    return tuple(out)
