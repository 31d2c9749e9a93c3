"""The daemon's side of the git hook: a commit's tickets become jobs, each exactly once.

A request is `{"repo", "branch", "commit", "tickets": [Ticket.to_json(), ...]}`, sent over the API
(`POST /tickets`) or read from the spool. Per ticket:
- its key already queued a job: nothing new (`duplicate`), so an amend, a rebase or a spooled copy of a
  request that did get through never queues the same work twice;
- otherwise it is queued like `orchestrator enqueue`, its key stored in the same transaction; if it has
  an id, older jobs of that id in the repository that have not started are cancelled (`superseded`);
- a ticket the daemon refuses (unknown runner, missing branch) is `rejected` with the reason; the others
  still go.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator import logging as olog
from orchestrator.core import claims
from orchestrator.core.models import JobState
from orchestrator.git import repos
from orchestrator.service.spool import Spool

if TYPE_CHECKING:
    from orchestrator.api import Api

NOT_STARTED = (JobState.QUEUED, JobState.PLANNING, JobState.PLANNED)


class BadTickets(ValueError):
    """The request is not a list of tickets; the message says what to send."""


def _tickets(request: dict[str, Any]) -> list[dict[str, Any]]:
    items = request.get("tickets")
    if not isinstance(items, list) or not all(isinstance(t, dict) for t in items):
        raise BadTickets("field 'tickets' must be a list of objects with 'text' and 'key'")
    for t in items:
        if not isinstance(t.get("key"), str) or not t["key"] or not isinstance(t.get("text"), str):
            raise BadTickets("each ticket needs a 'key' and a 'text' (strings)")
    return items


async def submit(api: Api, request: dict[str, Any]) -> list[dict[str, Any]]:
    """Queue a commit's tickets; one result per ticket: `queued`, `duplicate` or `rejected`."""
    from orchestrator.api import BadRequest

    try:
        items = _tickets(request)
    except BadTickets as e:
        raise BadRequest(str(e)) from None
    results = []
    for t in items:
        try:
            results.append(await _one(api, request, t))
        except (BadRequest, repos.RepoError, claims.ClaimError) as e:
            results.append({"key": t["key"], "status": "rejected", "error": str(e)})
    return results


async def _one(api: Api, request: dict[str, Any], t: dict[str, Any]) -> dict[str, Any]:
    store = api.store
    repo = str(await asyncio.to_thread(repos.canonical, Path(str(request.get("repo", "")))))
    key = f"{repo}\0{t['key']}"
    existing = await store.ticket_job(key)
    if existing is not None:
        olog.get(job_id=existing, repo=repo).info(
            olog.Event.TICKET_DUPLICATE, key=t["key"], commit=request.get("commit")
        )
        return {"key": t["key"], "status": "duplicate", "job_id": existing}
    data = {
        "repo": repo,
        "branch": t.get("branch") or request.get("branch"),
        "text": t["text"],
        "paths": list(t.get("paths") or []),
        "runner": t.get("runner"),
        "priority": t.get("priority") or 0,
    }
    ticket_id = t.get("id") if isinstance(t.get("id"), str) and t.get("id") else None
    try:
        job = await api.submit(data, ticket=(key, ticket_id))
    except sqlite3.IntegrityError:
        # The same key arrived twice at once (a spooled copy and a late answer): the first one won.
        return {"key": t["key"], "status": "duplicate", "job_id": await store.ticket_job(key)}
    superseded = await _supersede(api, repo, ticket_id, job.id, request.get("commit")) if ticket_id else []
    return {"key": t["key"], "status": "queued", "job_id": job.id, "superseded": superseded}


async def _supersede(api: Api, repo: str, ticket_id: str, newer: int, commit: Any) -> list[int]:
    """Cancel older jobs of this ticket id that have not started; started ones run on."""
    from orchestrator.jobs.scheduler import JobError

    done = []
    for job_id in await api.store.ticket_jobs(repo, ticket_id):
        if job_id == newer:
            continue
        job = await api.store.get(job_id)
        if job is None or job.state not in NOT_STARTED:
            continue
        try:
            await api.scheduler.cancel(job_id)
        except JobError as e:  # it started or ended meanwhile: it runs on, and that is fine
            olog.get(job_id=job_id, repo=repo).info(olog.Event.TICKET_SUPERSEDED, newer=newer, skipped=str(e))
            continue
        where = f", commit {str(commit)[:12]}" if commit else ""
        reason = f"superseded by job {newer} (ticket {ticket_id!r}{where})"
        await api.store.update(job_id, reason=reason, event="superseded", data={"by": newer, "ticket": ticket_id})
        olog.get(job_id=job_id, repo=repo).info(
            olog.Event.TICKET_SUPERSEDED, newer=newer, ticket=ticket_id, reason="Superseded", message=reason
        )
        done.append(job_id)
    return done


def spool(api: Api, folder: Path) -> Spool:
    """The daemon's spool: each spooled request goes through `submit`, like one sent over the API."""

    async def _submit(request: dict[str, Any]) -> list[dict[str, Any]]:
        from orchestrator.api import BadRequest

        try:
            return await submit(api, request)
        except BadRequest as e:
            return [{"key": "", "status": "rejected", "error": str(e)}]

    return Spool(folder, _submit)
