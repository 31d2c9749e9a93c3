"""The composite planner and the table planners are picked from by name.

Sources strongest first: declared paths (`--path`, or `Paths:` front matter) answer at once; otherwise a
model (when one is configured) plans with local evidence beside it, and local evidence alone stands in
when the model is down, slow or makes no sense. The scheduler only ever calls `build(cfg, store)`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from orchestrator import logging as olog
from orchestrator.config import Config
from orchestrator.core.job import Job
from orchestrator.core.models import Claim, ClaimSource
from orchestrator.llm.shared import SharedClaude
from orchestrator.plan import coined
from orchestrator.plan import declared as declared_mod
from orchestrator.plan.accuracy import Settled
from orchestrator.plan.base import Evidence, Kind, Note, Plan, Planner, merge_evidence
from orchestrator.plan.focus import CONVENTION_TEST
from orchestrator.plan.local import Histories, LocalPlanner, Records
from orchestrator.plan.text import front_matter
from orchestrator.store import Store


class ModelUnusable(Exception):
    """A model planner could not give a claim; `code` says why (a `Note`), the message in words."""

    def __init__(self, code: Note, message: str) -> None:
        super().__init__(message)
        self.code = code


def declared_plan(job: Job) -> Plan | None:
    """The declared claim (`--path`, or `Paths:` front matter in the text), or None when nothing is declared."""
    paths = list(job.declared) or list(front_matter(job.text)[0])
    if not paths:
        return None
    claim = declared_mod.claim(paths)
    why = "declared with --path" if job.declared else "declared in the ticket's Paths: front matter"
    return Plan(claim, tuple(Evidence(p, Kind.DECLARED, why) for p in sorted(claim.paths)), "", str(Kind.DECLARED))


def combine(model: Plan, local: Plan) -> Plan:
    """A model's claim widened by what local evidence names explicitly (its tests included): more recall."""
    extra = [e for e in local.evidence if e.kind in (Kind.NAMED, Kind.TRACEBACK, Kind.SYMBOL, Kind.TEST)]
    extra += _tests_of(model.claim.paths, local)
    paths = model.claim.paths | frozenset(e.path for e in extra)
    claim = Claim(paths, model.claim.confidence, ClaimSource.MODEL)
    evidence = merge_evidence(model.evidence, extra)
    return Plan(claim, evidence, model.text, str(Kind.MODEL), model.notes + local.notes, ranking=local.ranking)


def _tests_of(paths: frozenset[str], local: Plan) -> list[Evidence]:
    """The convention tests local evidence ranked for files of `paths` (the tests that go with them)."""
    out = []
    for r in local.ranking:
        for p in paths:
            why = CONVENTION_TEST.format(p)
            if f"{Kind.TEST}: {why}" in r.get("why", ()):
                out.append(Evidence(str(r["path"]), Kind.TEST, why))
    return out


class Composite:
    """Declared → model (with local evidence beside) → local evidence."""

    def __init__(self, local: Planner, model: Planner | None, deadline: float) -> None:
        self.local = local
        self.model = model
        self.deadline = deadline
        self.name = f"{model.name}+local" if model else local.name

    def observe(self, by_repo: Mapping[str, Sequence[Settled]]) -> None:
        """The pairs the daemon ran side by side that have settled: local evidence's risk is refit on them."""
        observe = getattr(self.local, "observe", None)
        if observe is not None:
            observe(by_repo)

    async def close(self) -> None:
        """Close the model's client, if it holds one."""
        close = getattr(self.model, "close", None)
        if close is not None:
            await close()

    async def plan(self, job: Job, base: str) -> Plan:
        early = declared_plan(job)
        if early is not None:
            return early
        planned = await self._planned(job, base)
        histories = getattr(self.local, "histories", None)  # the local planner's, mined already for this plan
        history = await histories.at(job.repo, base) if isinstance(histories, Histories) else None
        return await coined.plan_with(job, base, planned, history)

    async def _planned(self, job: Job, base: str) -> Plan:
        local = await self.local.plan(job, base)
        if self.model is None:
            return local
        log = olog.get(job_id=job.id, repo=job.repo)
        try:
            model = await asyncio.wait_for(self.model.plan(job, base, local), self.deadline)  # type: ignore[call-arg]
        except TimeoutError:
            code, reason = Note.DEADLINE, f"the model did not answer within {self.deadline:g}s"
        except ModelUnusable as e:
            code, reason = e.code, str(e)
        except Exception as e:
            log.warning(olog.Event.PLAN_NOTE, code=str(Note.FAILED), reason=f"{type(e).__name__}: {e}", exc_info=True)
            code, reason = Note.FAILED, f"{type(e).__name__}: {e}"
        else:
            return combine(model, local)
        log.warning(olog.Event.PLAN_NOTE, code=str(code), reason=reason, fallback="local evidence")
        return Plan(local.claim, local.evidence, "", local.basis, ((code, reason), *local.notes), ranking=local.ranking)


ModelFactory = Callable[
    [Config, Store | None, Callable[[str], dict[str, int]], dict[str, Any], "SharedClaude | None"], Planner | None
]
"""Builds a model planner from the config (and a repo's file change counts, to rank the file list it shows
the model; the daemon's model gates by host, so a planner shares the chat plane's gate; and the daemon's one
Claude client, so planning and agents share one bound), or None when that backend is not configured. A model
planner's `plan` also takes the local plan."""

MODELS: dict[str, ModelFactory] = {}
"""Model planners by name ("claude", "ollama"): registered by their modules, imported by `build` only when wanted."""


_MODULES = {"claude": "orchestrator.plan.model", "ollama": "orchestrator.plan.ollama_model"}
_MODULES["cli"] = "orchestrator.plan.cli_model"  # an agent CLI's read-only plan mode (`plan.cli`)


def _wanted(cfg: Config) -> tuple[str, ...]:
    """The model backends to try, in order: the one the config names, or for `auto` the configured ones."""
    if cfg.plan.planner == "local":
        return ()
    if cfg.plan.planner != "auto":
        return (cfg.plan.planner,)
    # `auto` takes Claude only when a key or a server is configured, and never waits on a local server it
    # has not been told to use; the SDK is imported only then (it costs seconds of start-up).
    return ("claude",) if cfg.anthropic.api_key or cfg.anthropic.base_url else ()


def build(
    cfg: Config, store: Store | None, gates: dict[str, Any] | None = None, claude: SharedClaude | None = None
) -> Composite:
    """The planner the config names (`plan.planner`): auto picks Claude when it is configured."""
    import importlib

    histories = Histories(store)
    local = LocalPlanner(histories, Records(cfg.jobs.mergeable, store=store))
    model: Planner | None = None
    for name in _wanted(cfg):
        try:
            importlib.import_module(_MODULES[name])
        except ImportError as e:  # a backend whose client is missing: local evidence still plans
            olog.get().warning(olog.Event.PLAN_NOTE, code=str(Note.NO_MODEL), reason=f"{name}: {e}")
            continue
        factory = MODELS.get(name)
        model = factory(cfg, store, histories.counts, {} if gates is None else gates, claude) if factory else None
        if model is not None:
            break
    return Composite(local, model, cfg.plan.deadline)


__all__ = ["Composite", "ModelUnusable", "build", "declared_plan"]
