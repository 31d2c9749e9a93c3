"""One API: JSON over HTTP on a UNIX socket only its owner can open. No TCP listener, ever.

Every request is validated; a malformed one gets 400 with a message that says what to do, never a crash.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from orchestrator import __version__, validate
from orchestrator import logging as olog
from orchestrator import requests as rq
from orchestrator.core import claims
from orchestrator.core.explain import explain
from orchestrator.core.models import ALL_REPOS, OPEN, JobState
from orchestrator.git import repos
from orchestrator.jobs.service import JobError, Jobs, plan_for
from orchestrator.plan import accuracy
from orchestrator.runners.command import transcript_path
from orchestrator.service import intake
from orchestrator.store import StoreFull
from orchestrator.validate import BadRequest

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MAX_BODY = 4 * 1024 * 1024
"""Bytes a request body may have (a job text of a few MB; more is refused with 413 before it is read)."""


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except BadRequest as e:
        return _error(400, str(e))
    except (repos.RepoError, claims.ClaimError) as e:
        return _error(400, str(e))
    except JobError as e:
        return _error(e.status, str(e))
    except StoreFull as e:  # nothing was stored: the caller may try again once there is room
        return _error(503, str(e))
    except web.HTTPException:
        raise
    except Exception as e:  # noqa: BLE001 - report it, keep serving
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            olog.get().warning(olog.Event.API_ERROR, path=request.path, error=str(e))
            return _error(503, f"a disk is full ({e}): free space there, then try again")
        olog.get().error(olog.Event.API_ERROR, path=request.path, error=str(e), exc_info=True)
        return _error(500, f"internal error: {type(e).__name__}: {e} (the daemon log has the details)")


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        data = await request.json(loads=json.loads)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequest(f"the body is not valid JSON ({e}); send a JSON object") from None
    except (ValueError, RecursionError) as e:  # an integer of 5,000 digits; arrays nested 100,000 deep
        raise BadRequest(f"the body is not acceptable JSON ({type(e).__name__}: {e}); send a plain object") from None
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object")
    return data


def _job_id(request: web.Request) -> int:
    return validate.job_id(request.match_info["id"])


def _read_from(path: Path, pos: int, size: int = 1 << 20) -> bytes:
    try:
        with path.open("rb") as f:
            f.seek(pos)
            return f.read(size)
    except FileNotFoundError:
        return b""


class Api:
    def __init__(self, jobs: Jobs, stop: Callable[[], None], *, config_stamp: list[int] | None = None) -> None:
        self.jobs = jobs
        self.scheduler = jobs.scheduler
        self.store = jobs.store
        self.config_stamp = config_stamp
        self.stop = stop

    def app(self, *outer: Any) -> web.Application:
        """The routes, behind `outer` middlewares (the socket's guard) and the error mapping."""
        app = web.Application(middlewares=[*outer, errors], client_max_size=MAX_BODY)
        app.add_routes(
            [
                web.get("/health", self.health),
                web.post("/jobs", self.enqueue),
                web.get("/jobs", self.list_jobs),
                web.get("/jobs/{id}", self.show),
                web.get("/jobs/{id}/why", self.why),
                web.post("/jobs/{id}/cancel", self.cancel),
                web.post("/jobs/{id}/land", self.land),
                web.post("/jobs/{id}/reject", self.reject),
                web.post("/jobs/{id}/revise", self.revise),
                web.post("/jobs/{id}/edit", self.edit),
                web.post("/jobs/{id}/move", self.move),
                web.post("/jobs/{id}/switch", self.switch),
                web.get("/jobs/{id}/diff", self.diff),
                web.post("/jobs/{id}/retry", self.retry),
                web.get("/jobs/{id}/log", self.log),
                web.post("/jobs/{id}/clean", self.clean),
                web.post("/wait", self.wait),
                web.post("/plan", self.plan),
                web.get("/stats/predict", self.stats_predict),
                web.post("/tickets", self.tickets),
                web.get("/controls", self.get_controls),
                web.post("/pause", self.pause),
                web.post("/resume", self.resume),
                web.post("/limit", self.limit),
                web.get("/events", self.events),
            ]
        )
        app.on_shutdown.append(self._end_streams)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "ok": True,
                "pid": os.getpid(),
                "version": __version__,
                "burst": self.scheduler.burst,
                "config_stamp": self.config_stamp,
                "runners": sorted(self.jobs.runners),
            }
        )

    async def enqueue(self, request: web.Request) -> web.Response:
        job = await self.jobs.submit(rq.Enqueue.from_json(await _body(request)))
        return web.json_response(job.to_json(), status=201)

    async def tickets(self, request: web.Request) -> web.Response:
        """The git hook's request: a commit's tickets, each queued once (see `service.intake`)."""
        results = await intake.submit(self.jobs, rq.Tickets.from_json(await _body(request)))
        return web.json_response({"results": results})

    async def list_jobs(self, request: web.Request) -> web.Response:
        states = request.query.get("state")
        wanted = None
        if states:
            try:
                wanted = [JobState(s) for s in states.split(",")]
            except ValueError:
                raise BadRequest(f"unknown state in {states!r}: use {', '.join(s.value for s in JobState)}") from None
        # Every job's full record, rendered by SQLite: a queue of thousands costs no Python per job, except a
        # waiting job's live decision, spliced in from its cached JSON.
        parts = []
        for job_id, state, body, live in await self.store.jobs.json(wanted):
            if state == JobState.PLANNED:
                live = self.scheduler.live_json(job_id) or live
            parts.append(f"{body[:-1]},{live[1:]}")
        return web.Response(text='{"jobs":[' + ",".join(parts) + "]}", content_type="application/json")

    async def show(self, request: web.Request) -> web.Response:
        job = await self.jobs.get(_job_id(request))
        body = job.to_json()
        body["events"] = await self.store.events.of_job(job.id)
        return web.json_response(body)

    async def why(self, request: web.Request) -> web.Response:
        job = await self.jobs.get(_job_id(request))
        landing_now = job.state is JobState.LANDING and self.jobs.lander.landing_now(job.id)
        return web.json_response(explain(job, landing_now))

    async def cancel(self, request: web.Request) -> web.Response:
        job = await self.jobs.cancel(_job_id(request))
        return web.json_response(job.to_json())

    async def land(self, request: web.Request) -> web.Response:
        job = await self.jobs.land(_job_id(request))
        return web.json_response(job.to_json())

    async def reject(self, request: web.Request) -> web.Response:
        job = await self.jobs.reject(_job_id(request))
        return web.json_response(job.to_json())

    async def revise(self, request: web.Request) -> web.Response:
        job = await self.jobs.revise(_job_id(request), rq.Revise.from_json(await _body(request)).feedback)
        return web.json_response(job.to_json())

    async def edit(self, request: web.Request) -> web.Response:
        job = await self.jobs.edit(_job_id(request), rq.Edit.from_json(await _body(request)))
        return web.json_response(job.to_json())

    async def move(self, request: web.Request) -> web.Response:
        job = await self.jobs.move(_job_id(request), rq.Move.from_json(await _body(request)).before)
        return web.json_response(job.to_json())

    async def switch(self, request: web.Request) -> web.Response:
        jobs = await self.jobs.switch(_job_id(request), rq.Switch.from_json(await _body(request)).other)
        return web.json_response({"jobs": [j.to_json() for j in jobs]})

    async def diff(self, request: web.Request) -> web.Response:
        against = request.query.get("against", "base")
        if against not in ("base", "head"):
            raise BadRequest(f"against={against!r}: use base or head")
        return web.json_response(await self.jobs.diff(_job_id(request), against == "head"))

    async def retry(self, request: web.Request) -> web.Response:
        job = await self.jobs.retry(_job_id(request))
        return web.json_response(job.to_json())

    async def clean(self, request: web.Request) -> web.Response:
        job_id = _job_id(request)
        dropped = await self.jobs.clean(job_id)
        return web.json_response({"id": job_id, "branches": dropped})

    async def wait(self, request: web.Request) -> web.Response:
        asked = rq.Wait.from_json(await _body(request))
        ids = list(asked.ids) or [j.id for j in await self.store.team.everyone(OPEN)]
        jobs = await self.jobs.wait(ids, asked.timeout)
        return web.json_response({"jobs": [j.to_json() for j in jobs], "done": all(j.state.terminal for j in jobs)})

    async def plan(self, request: web.Request) -> web.Response:
        """The claim the daemon's planner makes for a text, with the evidence for each path; nothing is queued."""
        return web.json_response(await plan_for(self.jobs.planning.planner, rq.Plan.from_json(await _body(request))))

    async def stats_predict(self, request: web.Request) -> web.Response:
        """Calibration: per repo and per basis, how well the claims predicted what jobs really touched."""
        planning = self.jobs.planning
        records = await planning.records()
        repo = request.query.get("repo")
        if repo:
            key = str(await asyncio.to_thread(repos.canonical, Path(repo)))
            records = [r for r in records if r.repo == key]
        report = accuracy.report(records, self.jobs.cfg.policy())
        return web.json_response({"repos": report, "raised": dict(planning.raised)})

    async def log(self, request: web.Request) -> web.StreamResponse:
        job = await self.jobs.get(_job_id(request))
        follow = request.query.get("follow") in ("1", "true")
        path = self.jobs.paths.job_log(job.id)
        if request.query.get("transcript") in ("1", "true"):  # an agent CLI's transcript, kept beside the log
            path, follow = transcript_path(path), False
            if not path.exists():
                return _error(404, f'job {job.id} has no transcript (runners with `output = "claude-json"` keep one)')
        resp = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8"})
        await resp.prepare(request)
        pos = 0
        try:
            while True:
                # Reads go to a thread in bounded chunks: a big log never stalls the loop or fills memory.
                while chunk := await asyncio.to_thread(_read_from, path, pos):
                    pos += len(chunk)
                    await resp.write(chunk)
                if not follow:
                    break
                current = await self.store.jobs.get(job.id)
                if current is None or current.state.terminal:
                    follow = False  # one last read picks up the tail
                    continue
                await asyncio.sleep(0.2)
            await resp.write_eof()
        except ConnectionResetError:  # the client went away (`logs -f` interrupted): nothing to report
            pass
        return resp

    # -- run-time controls -----------------------------------------------------------------------

    def _controls_json(self) -> dict[str, Any]:
        return {scope: {"paused": paused, "slots": slots} for scope, (paused, slots) in self.scheduler.controls.items()}

    async def _scope(self, control: rq.Control) -> str:
        if control.repo is None:
            return ALL_REPOS
        return str(await asyncio.to_thread(repos.canonical, Path(control.repo)))

    async def get_controls(self, request: web.Request) -> web.Response:
        return web.json_response({"controls": self._controls_json()})

    async def pause(self, request: web.Request) -> web.Response:
        scope = await self._scope(rq.Control.from_json(await _body(request)))
        await self.jobs.control(scope, paused=True)
        return web.json_response({"scope": scope, "controls": self._controls_json()})

    async def resume(self, request: web.Request) -> web.Response:
        scope = await self._scope(rq.Control.from_json(await _body(request)))
        await self.jobs.control(scope, paused=False)
        return web.json_response({"scope": scope, "controls": self._controls_json()})

    async def limit(self, request: web.Request) -> web.Response:
        control = rq.Control.from_json(await _body(request))
        if control.repo is None:
            raise BadRequest("name the repository: `orchestrator limit --repo PATH N` (the global limit is config)")
        scope = await self._scope(control)
        await self.jobs.control(scope, slots=control.slots)
        return web.json_response({"scope": scope, "controls": self._controls_json()})

    # -- the event stream ------------------------------------------------------------------------

    def _state_json(self) -> dict[str, Any]:
        return {
            "type": "state",
            "controls": self._controls_json(),
            "landing": sorted([repo, branch] for repo, branch in self.jobs.lander.inflight),
        }

    async def _end_streams(self, app: web.Application) -> None:
        """The daemon stops: every event stream ends now (its client reconnects), not at its next ping."""
        self.scheduler.board.publish({"type": "closing"})

    async def events(self, request: web.Request) -> web.StreamResponse:
        """NDJSON: a snapshot of the jobs, then every job change the board announces, as it happens.

        Fed by the board's announcements (no polling); a ping every 15 s when quiet lets a client notice
        a dead daemon. A subscriber that falls too far behind is dropped: it reconnects and re-reads. A
        client that went away is noticed within a second; the daemon's stop ends every stream.
        """
        sub = self.scheduler.board.subscribe()
        try:
            resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
            await resp.prepare(request)
            jobs = await self.store.team.everyone()
            await _send(resp, {"type": "snapshot", "jobs": [self.scheduler.live(j).to_json() for j in jobs]})
            state = self._state_json()
            await _send(resp, state)
            quiet = 0
            while not sub.overflowed:
                try:
                    item = await asyncio.wait_for(sub.queue.get(), 1.0)
                except TimeoutError:
                    if request.transport is None or request.transport.is_closing():
                        return resp  # the client went away (`watch` quit)
                    quiet += 1
                    if quiet >= 15:
                        quiet = 0
                        await _send(resp, {"type": "ping"})
                    continue
                if item["type"] == "closing":
                    break
                if item["type"] == "changed":
                    now = self._state_json()
                    if now != state:
                        state = now
                        await _send(resp, state)
                    continue
                await _send(resp, item)
            if sub.overflowed:
                await _send(resp, {"type": "overflow"})
            await resp.write_eof()
            return resp
        except ConnectionResetError:  # the client went away (`watch` quit): nothing to report
            return resp
        finally:
            self.scheduler.board.unsubscribe(sub)


async def _send(resp: web.StreamResponse, item: dict[str, Any]) -> None:
    await resp.write(json.dumps(item, default=str).encode() + b"\n")
