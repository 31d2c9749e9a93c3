"""The daemon's life: serve → startup → main loop → shutdown (the uvicorn split).

`startup` takes the state dir, recovers what a killed daemon left (running jobs become `interrupted`, queued
ones stay queued, landings resume), wires the job plane's parts (`JobPlane.load`) and the chat plane, and
starts the API; each part's stop is registered as it starts. `main_loop` runs the scheduler until a signal
(or, in burst mode, until nothing is left to do). Shutdown is leaving that stack, in `finally`: the parts stop
in reverse (the API and the spool first, then running jobs are interrupted, landings drain within
`daemon.shutdown_timeout`, `on_end` commands finish, the store closes, the lock goes last).

One daemon per home: a lock file held with flock refuses a second. SIGTERM and SIGINT stop it
gracefully with a bounded wait; a second SIGINT forces exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gc
import os
import pwd
import signal
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from aiohttp import web

from orchestrator import __version__, hardening, socketguard
from orchestrator import logging as olog
from orchestrator.api import Api
from orchestrator.chat.api import ChatApi
from orchestrator.chat.pipeline import ChatPlane
from orchestrator.config import EX_CONFIG, Config
from orchestrator.core.models import ACTIVE, OPEN, JobState
from orchestrator.git.worktrees import WorktreePool
from orchestrator.jobs import landing_check
from orchestrator.jobs.board import Board
from orchestrator.jobs.door import Doors
from orchestrator.jobs.execution import Executor
from orchestrator.jobs.facts import GitFacts
from orchestrator.jobs.landing import Lander
from orchestrator.jobs.notify import Notifier as OnEnd
from orchestrator.jobs.planning import Planning
from orchestrator.jobs.privatedirs import PrivateDirs
from orchestrator.jobs.recovery import CLEANUP_ERRORS, StoreOwner, end_survivors, settle_landings
from orchestrator.jobs.scheduler import Scheduler
from orchestrator.jobs.service import JobError, Jobs
from orchestrator.jobs.watch import OverlapWatch
from orchestrator.llm import ollama
from orchestrator.llm.gate import Gate
from orchestrator.llm.shared import SharedClaude
from orchestrator.paths import PathError, Paths
from orchestrator.plan import composite
from orchestrator.plan.base import Planner
from orchestrator.proc import cgroups, jobpath, process
from orchestrator.proc import sandbox as sandboxes
from orchestrator.proc.sandbox import Sandbox
from orchestrator.runners import Runner, registry
from orchestrator.runners import task as runners_task
from orchestrator.service import intake, unit
from orchestrator.service.systemd import Notifier, status_line
from orchestrator.socketguard import Guard
from orchestrator.store import EX_STATE, EX_TEMPFAIL, Store, StoreUnreachable, StoreUnusable
from orchestrator.team import engine, reach

ROUND_GRACE = 10.0
"""Seconds the scheduler may take to finish the round under way at shutdown before it is cancelled."""
API_SHUTDOWN = 2.0
"""Seconds the API gives requests in flight at shutdown (a `wait` or an event stream is cut, and reconnects)."""


class AlreadyRunning(RuntimeError):
    """Another daemon holds this home's lock."""


def _lock(paths: Paths) -> IO[str]:
    f = os.fdopen(os.open(paths.lock, os.O_RDWR | os.O_CREAT, 0o600), "r+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        pid = f.read().strip() or "?"
        f.close()
        raise AlreadyRunning(
            f"another orchestrator daemon (pid {pid}) owns {paths.state_dir}: stop it first "
            "(`systemctl --user stop orchestrator`), or set ORCHESTRATOR_HOME to run a second instance elsewhere"
        ) from None
    f.seek(0)
    f.truncate()
    f.write(str(os.getpid()))
    f.flush()
    return f


@dataclass
class JobPlane:
    """The job plane's parts, wired once (`JobPlane.load`); the daemon starts and stops them."""

    board: Board
    planning: Planning
    lander: Lander
    watch: OverlapWatch
    notifier: OnEnd
    private_dirs: PrivateDirs
    scheduler: Scheduler
    jobs: Jobs

    @classmethod
    def load(
        cls,
        cfg: Config,
        paths: Paths,
        board: Board,
        pool: WorktreePool,
        runners: dict[str, Runner],
        *,
        burst: bool = False,
        grace: float = 2.0,
        gates: dict[str, Any] | None = None,
        claude: SharedClaude | None = None,
        planner: Planner | None = None,
        sandbox: Sandbox | None = None,
    ) -> JobPlane:
        store = board.store
        facts: GitFacts
        if engine.is_team(store):  # the heads and landings of the team's shared remote
            from orchestrator.team.facts import Fetches, TeamFacts
            from orchestrator.team.landing import TeamLander

            fetches = Fetches()
            facts = TeamFacts(cfg, fetches)
            lander: Lander = TeamLander(board, cfg, paths, pool, sandbox, fetches=fetches)
        else:
            facts = GitFacts(cfg)
            lander = Lander(board, cfg, paths, pool, sandbox)
        watch = OverlapWatch(board, cfg, facts)
        executor = Executor(
            board, cfg, paths, pool, runners, watch.changed, lander.top_up, held=watch.held, doors=Doors(watch)
        )
        watch.conflicts.interrupt = executor.interrupt  # a real conflict stops the job that would land second
        scheduler: Scheduler | None = None

        def wake() -> None:
            if scheduler is not None:
                scheduler.wake()

        planning = Planning(
            board,
            planner or composite.build(cfg, store, gates, claude),
            cfg.plan.concurrency,
            cfg.plan.deadline,
            wake,
            cfg.policy,
            cfg.plan.calibrate_after,
            lambda job: runners_task(runners, job.runner, job.text),
        )
        scheduler = Scheduler(board, cfg, planning, lander, executor, watch, facts, burst=burst, grace=grace)
        notifier = OnEnd(cfg.jobs.on_end, StoreOwner(store))
        board.on_end(notifier.job_ended)
        private_dirs = PrivateDirs(paths)
        board.on_end(private_dirs.job_ended)
        jobs = Jobs(board, cfg, paths, pool, runners, scheduler, planning, lander, private_dirs)
        return cls(board, planning, lander, watch, notifier, private_dirs, scheduler, jobs)


class Daemon:
    def __init__(
        self,
        cfg: Config,
        paths: Paths,
        *,
        burst: bool = False,
        grace: float = 2.0,
        config_stamp: list[int] | None = None,
    ) -> None:
        self.cfg = cfg
        self.config_stamp = config_stamp
        """The config file's version (`config.stamp`) when it was read: `config show` tells a changed one."""
        self.paths = paths
        self.burst = burst
        self.grace = grace
        self._stop = asyncio.Event()
        self.gates: dict[str, Gate] = {}
        """One bounded gate per Ollama host (`llm.gate`)."""
        self._sigints = 0
        self._cut: list[int] = []

    def request_stop(self) -> None:
        self._stop.set()

    def _on_sigint(self) -> None:
        self._sigints += 1
        if self._sigints > 1:
            olog.get().warning(olog.Event.DAEMON_STOPPED, forced=True)
            os._exit(130)
        self._stop.set()

    async def serve(self) -> int:
        """startup → main loop → shutdown; shutdown always runs (in `finally`), stopping what started in reverse."""
        async with contextlib.AsyncExitStack() as parts:
            plane, notifier = await self.startup(parts)
            reason = "error"
            try:
                reason = await self.main_loop(plane.scheduler)
            finally:
                olog.get().info(olog.Event.DAEMON_STOPPING, reason=reason)
                notifier.stopping()
            # Leaving the stack is the shutdown: each part stopped, the last started first.
        if self._cut:
            olog.get().warning(olog.Event.DAEMON_CANCELLED, jobs=sorted(set(self._cut)))
        olog.get().info(olog.Event.DAEMON_STOPPED)
        return 0

    async def startup(self, parts: contextlib.AsyncExitStack) -> tuple[JobPlane, Notifier]:
        """Take the state dir, recover what a dead daemon left, build and start every part; register each part's
        stop on `parts` as it starts (so shutdown runs in the reverse order): the steps below, in order."""
        self._take_state_dir(parts)
        notifier = Notifier()
        store, board, recovered = await self._recover(parts, notifier)
        plane = await self._job_plane(parts, store, board)
        await self._serve(parts, plane, store)
        if any(recovered.values()):
            olog.get().info(olog.Event.DAEMON_RECOVERED, **recovered)
        await self._ready(parts, plane, notifier, store)
        return plane, notifier

    def _take_state_dir(self, parts: contextlib.AsyncExitStack) -> None:
        """One daemon per state dir (its lock); SIGTERM and SIGINT stop it."""
        self.paths.ensure()
        lock = _lock(self.paths)
        parts.callback(lock.close)
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self._stop.set)
        loop.add_signal_handler(signal.SIGINT, self._on_sigint)

    async def _recover(
        self, parts: contextlib.AsyncExitStack, notifier: Notifier
    ) -> tuple[Store, Board, dict[str, list[int]]]:
        """The store opened, what a dead daemon left running ended, its jobs' states recovered."""
        store = await engine.open_store(self.cfg, self.paths, self._stop, status=notifier.status)
        parts.push_async_callback(store.close)
        parts.push_async_callback(notifier.close)
        # Where the daemon may make a cgroup per command, nothing a job starts can outlive it.
        limits = cgroups.Limits.of(self.cfg.jobs.pids_max, self.cfg.jobs.memory_max)
        used, why = await asyncio.to_thread(process.use_cgroups, limits)
        shown = process.CGROUPS.shown() if process.CGROUPS is not None else None
        olog.get().info(olog.Event.PROCESS_CGROUPS, used=used, limits=shown, reason=why or None)
        # Survivors of a dead daemon first: no worktree is recovered or handed out while they run.
        await end_survivors(store, grace=self.cfg.jobs.kill_grace)
        board = Board(store)
        return store, board, await board.recover()

    async def _job_plane(self, parts: contextlib.AsyncExitStack, store: Store, board: Board) -> JobPlane:
        """The job plane built on the recovered store: runners, the worktree pool (its workspaces recovered),
        interrupted landings settled, the scheduler's state loaded; team mode joins the team."""
        # One Claude client for the daemon: every agent (and planner) call shares its bound and retries.
        claude = SharedClaude(self.cfg.anthropic)
        parts.push_async_callback(claude.close)
        mode = sandboxes.mode_for(self.cfg.jobs.sandbox, team=bool(self.cfg.store.url))
        sandbox = await asyncio.to_thread(sandboxes.resolve, mode, self._hidden())
        await asyncio.to_thread(jobpath.warm)  # the login PATH jobs get, asked of the user's shell once
        runners = registry(self.cfg, claude, sandbox)
        pool = WorktreePool(self.paths.worktrees, warm=warm_size(self.cfg))
        workspaces = await self._recover_workspaces(store, pool)
        # Interrupted landings next: the user's checkouts are level before anything lands again.
        await settle_landings(board, pool)
        plane = JobPlane.load(
            self.cfg, self.paths, board, pool, runners, burst=self.burst, grace=self.grace, gates=self.gates,
            claude=claude, sandbox=sandbox,
        )  # fmt: skip
        await plane.scheduler.load()  # before the API answers: `limit` and `status` tell what is in force
        timeout = self.cfg.daemon.shutdown_timeout
        parts.push_async_callback(plane.private_dirs.close)
        parts.push_async_callback(plane.notifier.drain, min(timeout, 5.0))
        parts.push_async_callback(self._drain_landings, plane.lander, timeout)
        parts.push_async_callback(plane.planning.stop)
        parts.push_async_callback(plane.watch.stop)
        parts.push_async_callback(self._stop_jobs, plane.scheduler)
        if self.cfg.jobs.requeue_interrupted:
            await requeue_interrupted(plane.jobs, runners)
        if engine.is_team(store):
            await self._join_team(parts, plane, workspaces, pool)
        return plane

    async def _recover_workspaces(self, store: Store, pool: WorktreePool) -> dict[str, frozenset[int]]:
        """Each repository's job workspaces a dead daemon left, recovered (stale landing-check ones removed first);
        in team mode this node's clones too (jobs it ran may all have been taken over while it was down)."""
        workspaces: dict[str, frozenset[int]] = {}
        for repo in sorted({j.repo for j in await store.jobs.all()} | set(store.team.clone_paths())):
            # Half-made worktrees first: they make every `git worktree list` in the repo fail.
            with olog.best_effort("remove stale landing-check worktrees", *CLEANUP_ERRORS, repo=repo):
                await asyncio.to_thread(
                    landing_check.remove_stale_scratch, Path(repo), self.paths.scratch, self.paths.state_dir
                )
            with olog.best_effort("recover worktrees", *CLEANUP_ERRORS, repo=repo):
                workspaces[repo] = await pool.recover(Path(repo))
        return workspaces

    async def _serve(self, parts: contextlib.AsyncExitStack, plane: JobPlane, store: Store) -> None:
        """The chat plane and the API on the socket."""
        # One gate per Ollama host, built here: the chat plane (and any planner using Ollama) shares it.
        chat = ChatPlane(
            store.chat,
            ollama.from_config(self.cfg.ollama, self.gates, naive=self.cfg.chat.policy == "naive"),
            self.cfg.chat,
        )
        parts.push_async_callback(chat.close)
        parts.callback(self._unlink_socket)
        api = Api(plane.jobs, self.request_stop, config_stamp=self.config_stamp)
        await self._start_api(parts, api, ChatApi(chat).routes())
        olog.get().info(
            olog.Event.DAEMON_STARTED,
            pid=os.getpid(),
            version=__version__,
            socket=str(self.paths.socket),
            burst=self.burst,
            max_concurrent=self.cfg.jobs.max_concurrent,
            per_repo=self.cfg.jobs.per_repo,
        )

    async def _ready(self, parts: contextlib.AsyncExitStack, plane: JobPlane, notifier: Notifier, store: Store) -> None:
        """What the git hook spooled is queued, then the service manager is told the daemon is ready."""

        async def open_jobs() -> list[dict[str, Any]]:
            return [{"state": str(j.state), "decision": j.decision} for j in await store.jobs.all(OPEN)]

        # What the git hook spooled while no daemon answered is queued before we say we are ready.
        spool = intake.spool(plane.jobs, self.paths.spool)
        parts.push_async_callback(spool.close)
        await spool.drain()
        # Under systemd: ready only now (socket listening, recovery done); status on change; watchdog.
        plane.scheduler.tick = notifier.tick
        plane.board.on_change(notifier.changed)
        notifier.ready(status_line(await open_jobs()))
        # Start-up's objects live as long as the daemon: keep them out of the collector's full passes
        # (a gen-2 pass over them paused the loop for 60-90 ms, the chat acknowledgement with it).
        gc.freeze()
        notifier.start(open_jobs, lambda: plane.scheduler.heartbeat)
        spool.start()

    def _hidden(self) -> tuple[str, ...]:
        """What no confined job may see: the daemon's dirs, its env file and, in team mode, the store's sockets and
        password files (`team.reach`)."""
        homes = (Path(os.environ.get("HOME") or Path.home()), Path(pwd.getpwuid(os.getuid()).pw_dir))
        # The service's env file, and the default place of one (a key kept there with ORCHESTRATOR_HOME set too).
        env_files = (unit.env_file(), unit.env_file({k: v for k, v in os.environ.items() if k != "ORCHESTRATOR_HOME"}))
        own = (self.paths.state_dir, self.paths.config_dir, self.paths.runtime_dir, *dict.fromkeys(env_files))
        return (*map(str, own), *reach.hidden(self.cfg.store.url, os.environ, homes))

    async def _join_team(
        self,
        parts: contextlib.AsyncExitStack,
        plane: JobPlane,
        workspaces: dict[str, frozenset[int]],
        pool: WorktreePool,
    ) -> None:
        """Team mode: this node's workspaces of jobs it no longer holds are retired (their work kept on a branch),
        so it can claim them afresh; then its lease loop starts (stopped first at shutdown, after the API)."""
        from orchestrator.jobs.retire import retire_attempt
        from orchestrator.store.postgres import PgStore
        from orchestrator.team.node import TeamNode

        store = plane.board.store
        assert isinstance(store, PgStore)
        mine = {j.id for j in await store.jobs.all(ACTIVE)}
        for repo, ids in workspaces.items():
            for job in await store.jobs.many(ids - mine):
                if job.state in OPEN:
                    with olog.best_effort("retire a workspace of a job taken over", *CLEANUP_ERRORS, job_id=job.id):
                        await retire_attempt(pool, replace(job, repo=repo))
        node = TeamNode(store, plane.board, plane.scheduler, self.cfg.team.git_timeout)
        await node.start()
        parts.push_async_callback(node.stop)

    async def main_loop(self, scheduler: Scheduler) -> str:
        """The scheduler until it returns (burst: idle) or a signal asks to stop; why it ended."""
        main = asyncio.create_task(scheduler.run(), name="scheduler")
        stop = asyncio.create_task(self._stop.wait(), name="stop")
        burst_done = False
        try:
            await asyncio.wait({main, stop}, return_when=asyncio.FIRST_COMPLETED)
            burst_done = main.done()
        finally:
            # Asked to return, not cancelled: a cancel that meets a wake-up inside `wait_for` is lost on 3.11.
            scheduler.halt()
            stop.cancel()
            _, late = await asyncio.wait({main, stop}, timeout=ROUND_GRACE)
            for t in late:
                t.cancel()
            await asyncio.gather(main, stop, return_exceptions=True)
        if main.done() and not main.cancelled() and main.exception() is not None:
            raise main.exception()  # type: ignore[misc]
        return "burst done" if burst_done else "signal"

    async def _stop_jobs(self, scheduler: Scheduler) -> None:
        self._cut += await scheduler.stop()

    async def _drain_landings(self, lander: Lander, timeout: float) -> None:
        self._cut += await lander.drain(timeout)

    def _unlink_socket(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.paths.socket.unlink()

    async def _start_api(self, parts: contextlib.AsyncExitStack, api: Api, extra: list[web.RouteDef]) -> None:
        """The API on its socket (0600), every connection guarded (`socketguard`); stopped with `parts`."""
        sock = self.paths.socket
        with contextlib.suppress(FileNotFoundError):
            sock.unlink()  # stale: we hold the lock, so no live daemon owns it
        guard = Guard(self.cfg.daemon.header_timeout, self.cfg.daemon.max_connections)
        app = api.app(guard.middleware)
        app.add_routes(extra)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=API_SHUTDOWN)
        await runner.setup()
        parts.push_async_callback(runner.cleanup)
        old = os.umask(0o177)
        try:
            server = await socketguard.serve(runner, sock, guard)
        finally:
            os.umask(old)
        os.chmod(sock, 0o600)
        parts.callback(server.close)  # first: no new connection while the runner closes the open ones


async def requeue_interrupted(jobs: Jobs, runners: dict[str, Runner]) -> list[int]:
    """`jobs.requeue_interrupted`: put interrupted jobs back in the queue on start, for runners that declare
    themselves safe to re-run (`rerun_safe = True`); the interrupted attempt is kept on its own branch."""
    requeued = []
    for job in await jobs.store.jobs.all([JobState.INTERRUPTED]):
        runner = runners.get(job.runner)
        if not getattr(runner, "rerun_safe", False):
            continue
        try:
            await jobs.retry(job.id)
        except JobError as e:
            olog.get(job_id=job.id, repo=job.repo).warning(olog.Event.JOB_REQUEUED, requeued=False, reason=str(e))
            continue
        requeued.append(job.id)
    if requeued:
        olog.get().info(olog.Event.JOB_REQUEUED, jobs=requeued, why="interrupted by a daemon stop")
    return requeued


def warm_size(cfg: Config) -> int:
    """Warm worktrees per repo: at least one per slot a repo can fill, so a start rarely waits for a checkout."""
    return max(cfg.jobs.warm_worktrees, min(cfg.jobs.per_repo, cfg.jobs.max_concurrent))


GC_THRESHOLDS = (700, 10, 1000)
"""CPython's collector as by default (700, 10, 10), but a full pass only after 1,000 young ones instead of 10:
a full pass walks every object, and with 5,000 jobs waiting each took 90-330 ms (one in the middle of a
landing → next admission); young garbage is still collected as often as before."""


def run(
    cfg: Config, paths: Paths, *, burst: bool = False, grace: float = 2.0, config_stamp: list[int] | None = None
) -> int:
    olog.configure(sys.stdout)
    hardening.harden()  # before the first job: no core file, no /proc/<pid>/environ holding the keys
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        return asyncio.run(Daemon(cfg, paths, burst=burst, grace=grace, config_stamp=config_stamp).serve())
    except AlreadyRunning as e:
        print(f"orchestrator: {e}", file=sys.stderr)
        return 1
    except StoreUnusable as e:
        olog.get().error(olog.Event.DAEMON_REFUSED, reason=str(e), exit_code=EX_STATE)
        print(f"orchestrator: {e}", file=sys.stderr)
        return EX_STATE
    except StoreUnreachable as e:
        olog.get().error(olog.Event.DAEMON_REFUSED, reason=str(e), exit_code=EX_TEMPFAIL)
        print(f"orchestrator: {e}", file=sys.stderr)
        return EX_TEMPFAIL
    except PathError as e:
        print(f"orchestrator: {e}", file=sys.stderr)
        return EX_CONFIG
