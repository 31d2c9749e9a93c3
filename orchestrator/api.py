"""One API: JSON over HTTP on a UNIX socket only its owner can open. No TCP listener, ever.

Every request is validated; a malformed one gets 400 with a message that says what to do, never a crash.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from orchestrator import __version__
from orchestrator import logging as olog
from orchestrator.core import claims
from orchestrator.core.explain import explain
from orchestrator.core.job import Job
from orchestrator.core.models import ALL_REPOS, JobState
from orchestrator.git import repos
from orchestrator.jobs.scheduler import JobError, Scheduler
from orchestrator.plan import accuracy, declared
from orchestrator.runners import Runner
from orchestrator.runners.command import transcript_path

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class BadRequest(ValueError):
    """The request is malformed; the message says what to send instead."""


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
    except web.HTTPException:
        raise
    except Exception as e:  # noqa: BLE001 - report it, keep serving
        olog.get().error(olog.Event.API_ERROR, path=request.path, error=str(e), exc_info=True)
        return _error(500, f"internal error: {type(e).__name__}: {e} (the daemon log has the details)")


# What SQLite stores in an INTEGER column: anything bigger is a request error, not a server error.
_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1


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


def _field(
    data: dict[str, Any], name: str, typ: type | tuple[type, ...], default: Any = None, required: bool = False
) -> Any:
    if name not in data or data[name] is None:
        if required:
            raise BadRequest(f"missing field {name!r}")
        return default
    value = data[name]
    if isinstance(value, bool) and typ is not bool:
        raise BadRequest(f"field {name!r} has the wrong type")
    if not isinstance(value, typ):
        raise BadRequest(f"field {name!r} has the wrong type: expected {getattr(typ, '__name__', typ)}")
    if isinstance(value, int) and not _INT_MIN <= value <= _INT_MAX:
        raise BadRequest(f"field {name!r} is out of range: use a number between {_INT_MIN} and {_INT_MAX}")
    return value


def _str_list(data: dict[str, Any], name: str) -> list[str]:
    value = _field(data, name, list, default=[])
    if not all(isinstance(v, str) for v in value):
        raise BadRequest(f"field {name!r} must be a list of strings")
    return list(value)


def _int_list(data: dict[str, Any], name: str) -> list[int]:
    value = _field(data, name, list, default=[])
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= _INT_MAX for v in value):
        raise BadRequest(f"field {name!r} must be a list of job ids")
    return list(value)


def _job_id(request: web.Request) -> int:
    raw = request.match_info["id"]
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"job id must be a number, got {raw!r}") from None
    if not 0 <= value <= _INT_MAX:
        raise BadRequest(f"job id {raw} is out of range") from None
    return value


def _read_from(path: Path, pos: int, size: int = 1 << 20) -> bytes:
    try:
        with path.open("rb") as f:
            f.seek(pos)
            return f.read(size)
    except FileNotFoundError:
        return b""


class Api:
    def __init__(
        self,
        scheduler: Scheduler,
        runners: dict[str, Runner],
        stop: Callable[[], None],
        *,
        config_stamp: list[int] | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.config_stamp = config_stamp
        self.store = scheduler.board.store
        self.runners = runners
        self.stop = stop

    def app(self) -> web.Application:
        app = web.Application(middlewares=[errors], client_max_size=4 * 1024 * 1024)
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
                "runners": sorted(self.runners),
            }
        )

    async def _resolve(self, data: dict[str, Any]) -> tuple[Path, str, str]:
        """The request's repository, target branch and that branch's head, or a RepoError saying what to fix."""
        repo_raw = _field(data, "repo", str, required=True)
        repo = await asyncio.to_thread(repos.canonical, Path(repo_raw))
        branch = _field(data, "branch", str) or await asyncio.to_thread(repos.default_branch, repo)
        head = await asyncio.to_thread(repos.branch_head, repo, branch)
        return repo, branch, head

    async def enqueue(self, request: web.Request) -> web.Response:
        job = await self.submit(await _body(request))
        return web.json_response(job.to_json(), status=201)

    async def submit(self, data: dict[str, Any], ticket: tuple[str, str | None] | None = None) -> Job:
        """Validate one enqueue request and queue it (the API, the hook's tickets and the spool share it).

        `ticket` is (idempotency key, ticket id), stored with the job in one transaction.
        """
        argv = _str_list(data, "argv") or None
        text = shlex.join(argv) if argv else _field(data, "text", str, required=True)
        if not text.strip():
            raise BadRequest("the job text is empty: say what the job should do (for the shell runner, a command)")
        repo, branch, _ = await self._resolve(data)
        paths = _str_list(data, "paths")
        claim = declared.claim(paths)
        runner = _field(data, "runner", str) or self.scheduler.cfg.jobs.default_runner
        if runner not in self.runners:
            raise BadRequest(f"unknown runner {runner!r}: use one of {', '.join(sorted(self.runners))}")
        land = _field(data, "land", str) or self.scheduler.cfg.land_mode(str(repo))
        if land not in ("auto", "review"):
            raise BadRequest(f"--land {land!r}: use auto (land when finished) or review (wait for `orchestrator land`)")
        priority = _field(data, "priority", int, default=0)
        after = _int_list(data, "after")
        for dep in after:
            if await self.store.get(dep) is None:
                raise BadRequest(f"--after {dep}: no such job (`orchestrator status` lists the jobs)")
        job = await self.store.add_job(
            repo=str(repo),
            branch=branch,
            text=text,
            runner=runner,
            priority=priority,
            after=after,
            declared=sorted(claim.paths),
            claim=claim,
            argv=argv,
            land=land,
            ticket=ticket,
        )
        olog.get(job_id=job.id, repo=job.repo).info(
            olog.Event.JOB_ENQUEUED,
            branch=branch,
            runner=runner,
            declared=sorted(claim.paths),
            priority=priority,
            after=after,
        )
        self.scheduler.wake()
        return job

    async def tickets(self, request: web.Request) -> web.Response:
        """The git hook's request: a commit's tickets, each queued once (see `service.intake`)."""
        from orchestrator.service import intake

        return web.json_response({"results": await intake.submit(self, await _body(request))})

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
        for job_id, state, body, live in await self.store.jobs_json(wanted):
            if state == JobState.PLANNED:
                live = self.scheduler.live_json(job_id) or live
            parts.append(f"{body[:-1]},{live[1:]}")
        return web.Response(text='{"jobs":[' + ",".join(parts) + "]}", content_type="application/json")

    async def show(self, request: web.Request) -> web.Response:
        job = await self.scheduler.get(_job_id(request))
        body = job.to_json()
        body["events"] = await self.store.events(job.id)
        return web.json_response(body)

    async def why(self, request: web.Request) -> web.Response:
        job = await self.scheduler.get(_job_id(request))
        landing_now = job.state is JobState.LANDING and self.scheduler.lander.landing_now(job.id)
        return web.json_response(explain(job, landing_now))

    async def cancel(self, request: web.Request) -> web.Response:
        job = await self.scheduler.cancel(_job_id(request))
        return web.json_response(job.to_json())

    async def land(self, request: web.Request) -> web.Response:
        job = await self.scheduler.land(_job_id(request))
        return web.json_response(job.to_json())

    async def reject(self, request: web.Request) -> web.Response:
        job = await self.scheduler.reject(_job_id(request))
        return web.json_response(job.to_json())

    async def diff(self, request: web.Request) -> web.Response:
        against = request.query.get("against", "base")
        if against not in ("base", "head"):
            raise BadRequest(f"against={against!r}: use base or head")
        return web.json_response(await self.scheduler.diff(_job_id(request), against == "head"))

    async def retry(self, request: web.Request) -> web.Response:
        job = await self.scheduler.retry(_job_id(request))
        return web.json_response(job.to_json())

    async def clean(self, request: web.Request) -> web.Response:
        job_id = _job_id(request)
        dropped = await self.scheduler.clean(job_id)
        return web.json_response({"id": job_id, "branches": dropped})

    async def wait(self, request: web.Request) -> web.Response:
        data = await _body(request)
        ids = _int_list(data, "ids")
        timeout = _field(data, "timeout", (int, float))
        if timeout is not None and not 0 <= timeout < 1e9:  # also NaN and Infinity, which json.loads accepts
            raise BadRequest("field 'timeout' must be a number of seconds, 0 or more")
        if not ids:
            ids = [j.id for j in await self.store.jobs() if not j.state.terminal]
        for i in ids:
            await self.scheduler.get(i)
        jobs = await self.scheduler.wait(ids, timeout)
        return web.json_response({"jobs": [j.to_json() for j in jobs], "done": all(j.state.terminal for j in jobs)})

    async def plan(self, request: web.Request) -> web.Response:
        """The claim the daemon's planner makes for a text, with the evidence for each path; nothing is queued."""
        data = await _body(request)
        text = _field(data, "text", str, default="")
        repo, branch, head = await self._resolve(data)
        base = _field(data, "base", str)
        base = await asyncio.to_thread(repos.resolve_rev, repo, base) if base else head
        paths = sorted(declared.claim(_str_list(data, "paths")).paths)
        probe = Job(0, str(repo), branch, text, "", JobState.QUEUED, declared=tuple(paths))
        plan = await self.scheduler.planning.planner.plan(probe, base)
        return web.json_response({"repo": str(repo), "branch": branch, "base": base, **plan.to_json()})

    async def stats_predict(self, request: web.Request) -> web.Response:
        """Calibration: per repo and per basis, how well the claims predicted what jobs really touched."""
        planning = self.scheduler.planning
        records = await planning.records()
        repo = request.query.get("repo")
        if repo:
            key = str(await asyncio.to_thread(repos.canonical, Path(repo)))
            records = [r for r in records if r.repo == key]
        report = accuracy.report(records, self.scheduler.cfg.policy())
        return web.json_response({"repos": report, "raised": dict(planning.raised)})

    async def log(self, request: web.Request) -> web.StreamResponse:
        job = await self.scheduler.get(_job_id(request))
        follow = request.query.get("follow") in ("1", "true")
        path = self.scheduler.paths.job_log(job.id)
        if request.query.get("transcript") in ("1", "true"):  # an agent CLI's transcript, kept beside the log
            path, follow = transcript_path(path), False
            if not path.exists():
                return _error(404, f"job {job.id} has no transcript (runners with `output = \"claude-json\"` keep one)")
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
                current = await self.store.get(job.id)
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
        return {
            scope: {"paused": paused, "slots": slots} for scope, (paused, slots) in self.scheduler.controls.items()
        }

    async def _scope(self, data: dict[str, Any]) -> str:
        repo = _field(data, "repo", str)
        if repo is None:
            return ALL_REPOS
        return str(await asyncio.to_thread(repos.canonical, Path(repo)))

    async def get_controls(self, request: web.Request) -> web.Response:
        return web.json_response({"controls": self._controls_json()})

    async def pause(self, request: web.Request) -> web.Response:
        scope = await self._scope(await _body(request))
        await self.scheduler.control(scope, paused=True)
        return web.json_response({"scope": scope, "controls": self._controls_json()})

    async def resume(self, request: web.Request) -> web.Response:
        scope = await self._scope(await _body(request))
        await self.scheduler.control(scope, paused=False)
        return web.json_response({"scope": scope, "controls": self._controls_json()})

    async def limit(self, request: web.Request) -> web.Response:
        data = await _body(request)
        if _field(data, "repo", str) is None:
            raise BadRequest("name the repository: `orchestrator limit --repo PATH N` (the global limit is config)")
        scope = await self._scope(data)
        slots = _field(data, "slots", int)
        if slots is not None and slots < 0:
            raise BadRequest("slots must be 0 or more (0 holds every new job of the repo back)")
        await self.scheduler.control(scope, slots=slots)
        return web.json_response({"scope": scope, "controls": self._controls_json()})

    # -- the event stream ------------------------------------------------------------------------

    def _state_json(self) -> dict[str, Any]:
        return {
            "type": "state",
            "controls": self._controls_json(),
            "landing": sorted([repo, branch] for repo, branch in self.scheduler.lander.inflight),
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
            jobs = await self.store.jobs()
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
