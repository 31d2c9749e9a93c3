"""The daemon's side of the git hook: a commit's tickets become jobs, each exactly once.

A request is a `requests.Tickets` (`{"repo", "branch", "commit", "tickets": [Ticket.to_json(), ...]}`), sent
over the API (`POST /tickets`) or read from the spool; a malformed one is refused whole. Per ticket:
- its key already queued a job: nothing new (`duplicate`), so an amend, a rebase or a spooled copy of a
  request that did get through never queues the same work twice;
- otherwise it is queued like `orchestrator enqueue`, its key stored in the same transaction; if it has
  an id, older jobs of that id in the repository that have not started are cancelled (`superseded`);
- a ticket the daemon refuses (unknown runner, missing branch) is `rejected` with the reason; the others
  still go.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from orchestrator import logging as olog
from orchestrator.core import claims
from orchestrator.core.models import WAITING, Code, JobEvent
from orchestrator.git import repos
from orchestrator.jobs.service import JobError, Jobs
from orchestrator.requests import Ticket, Tickets
from orchestrator.service.spool import Spool
from orchestrator.store import DuplicateTicket
from orchestrator.validate import BadRequest


async def submit(jobs: Jobs, request: Tickets) -> list[dict[str, Any]]:
    """Queue a commit's tickets; one result per ticket: `queued`, `duplicate` or `rejected`."""
    results = []
    for t in request.tickets:
        try:
            results.append(await _one(jobs, request, t))
        except (BadRequest, repos.RepoError, claims.ClaimError) as e:
            results.append({"key": t.key, "status": "rejected", "error": str(e)})
    return results


async def _one(jobs: Jobs, request: Tickets, t: Ticket) -> dict[str, Any]:
    store = jobs.store
    repo = str(await asyncio.to_thread(repos.canonical, Path(request.repo)))
    key = f"{repo}\0{t.key}"
    existing = await store.jobs.ticket_job(key)
    if existing is not None:
        olog.get(job_id=existing, repo=repo).info(olog.Event.TICKET_DUPLICATE, key=t.key, commit=request.commit)
        return {"key": t.key, "status": "duplicate", "job_id": existing}
    try:
        job = await jobs.submit(t.enqueue(repo, request.branch, request.author), ticket=(key, t.id))
    except DuplicateTicket:
        # The same key arrived twice at once (a spooled copy and a late answer): the first one won.
        return {"key": t.key, "status": "duplicate", "job_id": await store.jobs.ticket_job(key)}
    superseded = await _supersede(jobs, repo, t.id, job.id, request.commit) if t.id else []
    return {"key": t.key, "status": "queued", "job_id": job.id, "superseded": superseded}


async def _supersede(jobs: Jobs, repo: str, ticket_id: str, newer: int, commit: Any) -> list[int]:
    """Cancel older jobs of this ticket id that have not started; started ones run on."""
    done = []
    where = f", commit {str(commit)[:12]}" if commit else ""
    reason = f"superseded by job {newer} (ticket {ticket_id!r}{where})"
    for job_id in await jobs.store.jobs.ticket_jobs(repo, ticket_id):
        if job_id == newer:
            continue
        job = await jobs.store.jobs.get(job_id)
        if job is None or job.state not in WAITING:
            continue
        try:
            # One guarded move: the job is cancelled with this reason, or it started meanwhile and runs on.
            await jobs.cancel(
                job_id, reason=reason, event=JobEvent.SUPERSEDED, data={"by": newer, "ticket": ticket_id}, only=WAITING
            )
        except JobError as e:
            olog.get(job_id=job_id, repo=repo).info(olog.Event.TICKET_SUPERSEDED, newer=newer, skipped=str(e))
            continue
        olog.get(job_id=job_id, repo=repo).info(
            olog.Event.TICKET_SUPERSEDED, newer=newer, ticket=ticket_id, code=Code.CANCELLED, message=reason
        )
        done.append(job_id)
    return done


def spool(jobs: Jobs, folder: Path) -> Spool:
    """The daemon's spool: each spooled request goes through `submit`, like one sent over the API."""

    async def _submit(request: dict[str, Any]) -> list[dict[str, Any]]:
        try:
            return await submit(jobs, Tickets.from_json(request))
        except BadRequest as e:
            return [{"key": "", "status": "rejected", "error": str(e)}]

    return Spool(folder, _submit)
