"""The daemon's life: serve → startup → main loop → shutdown (the uvicorn split).

One daemon per home: a lock file held with flock refuses a second. SIGTERM and SIGINT stop it
gracefully with a bounded wait; a second SIGINT forces exit. On start it recovers what a killed daemon
left: running jobs become `interrupted`, queued ones stay queued, landings resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gc
import os
import signal
import sys
from pathlib import Path
from typing import IO, Any

from aiohttp import web

from orchestrator import __version__, hardening
from orchestrator import logging as olog
from orchestrator.api import Api
from orchestrator.chat.api import ChatApi
from orchestrator.chat.pipeline import ChatPlane
from orchestrator.config import EX_CONFIG, Config
from orchestrator.core.models import JobState
from orchestrator.git import landing as git_landing
from orchestrator.git.worktrees import WorktreePool
from orchestrator.jobs.board import Board
from orchestrator.jobs.recovery import CLEANUP_ERRORS, end_survivors, settle_landings
from orchestrator.jobs.scheduler import OPEN_STATES, JobError, Scheduler
from orchestrator.llm import ollama
from orchestrator.llm.gate import Gate
from orchestrator.llm.shared import SharedClaude
from orchestrator.paths import PathError, Paths
from orchestrator.runners import Runner, jobpath, process, registry
from orchestrator.runners import sandbox as sandboxes
from orchestrator.service import intake
from orchestrator.service.spool import Spool
from orchestrator.service.systemd import Notifier, status_line
from orchestrator.store import EX_STATE, Store, StoreUnusable


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

    def request_stop(self) -> None:
        self._stop.set()

    def _on_sigint(self) -> None:
        self._sigints += 1
        if self._sigints > 1:
            olog.get().warning(olog.Event.DAEMON_STOPPED, forced=True)
            os._exit(130)
        self._stop.set()

    async def serve(self) -> int:
        self.paths.ensure()
        lock = _lock(self.paths)
        log = olog.get()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self._stop.set)
        loop.add_signal_handler(signal.SIGINT, self._on_sigint)
        store = await Store.open(self.paths.db)
        notifier = Notifier()
        spool: Spool | None = None
        try:
            # Where the daemon may make a cgroup per command, nothing a job starts can outlive it.
            no_cgroups = await asyncio.to_thread(process.use_cgroups)
            log.info(olog.Event.PROCESS_CGROUPS, used=not no_cgroups, reason=no_cgroups or None)
            # Survivors of a dead daemon first: no worktree is recovered or handed out while they run.
            await end_survivors(store, grace=self.cfg.jobs.kill_grace)
            recovered = await store.recover()
            # One Claude client for the daemon: every agent (and planner) call shares its bound and retries.
            claude = SharedClaude(self.cfg.anthropic)
            sandbox = await asyncio.to_thread(
                sandboxes.resolve,
                self.cfg.jobs.sandbox,
                (self.paths.state_dir, self.paths.config_dir, self.paths.runtime_dir),
            )
            await asyncio.to_thread(jobpath.warm)  # the login PATH jobs get, asked of the user's shell once
            runners = registry(self.cfg, claude, sandbox)
            pool = WorktreePool(self.paths.worktrees, warm=warm_size(self.cfg))
            for repo in sorted({j.repo for j in await store.jobs()}):
                # Half-made worktrees first: they make every `git worktree list` in the repo fail.
                with olog.best_effort("remove stale landing-check worktrees", *CLEANUP_ERRORS, repo=repo):
                    await asyncio.to_thread(
                        git_landing.remove_stale_scratch, Path(repo), self.paths.scratch, self.paths.state_dir
                    )
                with olog.best_effort("recover worktrees", *CLEANUP_ERRORS, repo=repo):
                    await pool.recover(Path(repo))
            board = Board(store)
            # Interrupted landings next: the user's checkouts are level before anything lands again.
            await settle_landings(board, pool)
            scheduler = Scheduler(
                board,
                self.cfg,
                self.paths,
                pool,
                runners,
                burst=self.burst,
                grace=self.grace,
                gates=self.gates,
                claude=claude,
                sandbox=sandbox,
            )
            if self.cfg.jobs.requeue_interrupted:
                await requeue_interrupted(scheduler, runners)
            # One gate per Ollama host, built here: the chat plane (and any planner using Ollama) shares it.
            chat = ChatPlane(
                store,
                ollama.from_config(self.cfg.ollama, self.gates, naive=self.cfg.chat.policy == "naive"),
                self.cfg.chat,
            )
            api = Api(scheduler, runners, self.request_stop, config_stamp=self.config_stamp)
            runner = await self._start_api(api, ChatApi(chat).routes())
            log.info(
                olog.Event.DAEMON_STARTED,
                pid=os.getpid(),
                version=__version__,
                socket=str(self.paths.socket),
                burst=self.burst,
                max_concurrent=self.cfg.jobs.max_concurrent,
                per_repo=self.cfg.jobs.per_repo,
            )
            if any(recovered.values()):
                log.info(olog.Event.DAEMON_RECOVERED, **recovered)

            async def open_jobs() -> list[dict[str, Any]]:
                return [{"state": str(j.state), "decision": j.decision} for j in await store.jobs(OPEN_STATES)]

            # What the git hook spooled while no daemon answered is queued before we say we are ready.
            spool = intake.spool(api, self.paths.spool)
            await spool.drain()
            # Under systemd: ready only now (socket listening, recovery done); status on change; watchdog.
            scheduler.tick = notifier.tick
            board.on_change(notifier.changed)
            notifier.ready(status_line(await open_jobs()))
            # Start-up's objects live as long as the daemon: keep them out of the collector's full passes
            # (a gen-2 pass over them paused the loop for 60-90 ms, the chat acknowledgement with it).
            gc.freeze()
            notifier.start(open_jobs, lambda: scheduler.heartbeat)
            spool.start()
            main = asyncio.create_task(scheduler.run(), name="scheduler")
            stop = asyncio.create_task(self._stop.wait(), name="stop")
            await asyncio.wait({main, stop}, return_when=asyncio.FIRST_COMPLETED)
            log.info(olog.Event.DAEMON_STOPPING, reason="burst done" if main.done() else "signal")
            notifier.stopping()
            if main.done() and main.exception():
                raise main.exception()  # type: ignore[misc]
            cut = await scheduler.stop(self.cfg.daemon.shutdown_timeout)
            for t in (main, stop):
                t.cancel()
            await asyncio.gather(main, stop, return_exceptions=True)
            if cut:
                log.warning(olog.Event.DAEMON_CANCELLED, jobs=cut)
            await chat.close()
            await runner.cleanup()
            await claude.close()
        finally:
            if spool is not None:
                await spool.close()
            await notifier.close()
            await store.close()
            with contextlib.suppress(FileNotFoundError):
                self.paths.socket.unlink()
            lock.close()
        log.info(olog.Event.DAEMON_STOPPED)
        return 0

    async def _start_api(self, api: Api, extra: list[web.RouteDef]) -> web.AppRunner:
        sock = self.paths.socket
        with contextlib.suppress(FileNotFoundError):
            sock.unlink()  # stale: we hold the lock, so no live daemon owns it
        app = api.app()
        app.add_routes(extra)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        old = os.umask(0o177)
        try:
            site = web.UnixSite(runner, str(sock))
            await site.start()
        finally:
            os.umask(old)
        os.chmod(sock, 0o600)
        return runner

async def requeue_interrupted(scheduler: Scheduler, runners: dict[str, Runner]) -> list[int]:
    """`jobs.requeue_interrupted`: put interrupted jobs back in the queue on start, for runners that declare
    themselves safe to re-run (`rerun_safe = True`); the interrupted attempt is kept on its own branch."""
    requeued = []
    for job in await scheduler.board.store.jobs([JobState.INTERRUPTED]):
        runner = runners.get(job.runner)
        if not getattr(runner, "rerun_safe", False):
            continue
        try:
            await scheduler.retry(job.id)
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
    except PathError as e:
        print(f"orchestrator: {e}", file=sys.stderr)
        return EX_CONFIG
