"""The scheduler: gathers facts into a snapshot, asks `admission.decide_all`, carries the decisions out.

Event-driven: enqueue, plan done, change seen, job finished, landing done and branch moved all call
`wake()`. Each round plans queued jobs, builds the snapshot (active jobs with their live actual paths,
waiting jobs, how each target branch moved since each job's base, landings in flight) and acts on every
decision. A decision is logged once per change of its reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pygit2

from orchestrator import logging as olog
from orchestrator.config import Config
from orchestrator.core import admission, claims
from orchestrator.core.job import Job
from orchestrator.core.models import (
    ACTIVE_STATES,
    ALL_REPOS,
    DONE_STATES,
    Code,
    Decision,
    JobState,
    JobView,
    Outcome,
    Reason,
    Snapshot,
)
from orchestrator.git import merging, repos
from orchestrator.git.worktrees import WorktreePool
from orchestrator.jobs import retire, review, rounds
from orchestrator.jobs.board import Board
from orchestrator.jobs.execution import Executor, Stop
from orchestrator.jobs.landing import Lander
from orchestrator.jobs.notify import Notifier
from orchestrator.jobs.planning import Planning
from orchestrator.jobs.privatedirs import PrivateDirs
from orchestrator.jobs.recovery import StoreOwner
from orchestrator.jobs.retire import AttemptKept, fresh_attempt, retire_attempt
from orchestrator.llm.shared import SharedClaude
from orchestrator.paths import Paths
from orchestrator.plan import composite
from orchestrator.plan.base import Planner
from orchestrator.runners import Runner
from orchestrator.runners.sandbox import Sandbox
from orchestrator.store import Write

OPEN_STATES = (
    JobState.QUEUED, JobState.PLANNING, JobState.PLANNED, JobState.RUNNING, JobState.LANDING, JobState.READY
)  # fmt: skip
DEAD_STATES = (JobState.FAILED, JobState.CANCELLED, JobState.CONFLICTED, JobState.INTERRUPTED)
ROUND_SLICE = 50
"""Decisions made between two yields to the event loop in one round (a wake-up cuts a full pass short there)."""
EXPLAIN_EVERY = 2.0
"""Seconds between full passes over a queue whose tail cannot start (every slot taken, or a landing in flight)."""
EXPLAIN_PER_JOB = 0.005
"""...and more for a long queue (5 s at 1,000 waiting), so these passes stay a small share of the daemon's time."""


class JobError(Exception):
    """A request about a job cannot be done; the message says why and what to do."""

    def __init__(self, message: str, status: int = 409) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class _Seen:
    """What is known of each waiting job between rounds, so a round writes only what changed.

    `live` is its latest decision (served by `why` and `status`, never written every round); `written` the
    reason code last stored and logged for it; `checked` the head of its branch it was last checked
    against for BaseMoved, so the next round only looks at what moved since.
    """

    live: dict[int, Decision] = field(default_factory=dict)
    written: dict[int, Reason] = field(default_factory=dict)
    checked: dict[int, str] = field(default_factory=dict)
    rendered: dict[int, tuple[Decision, str]] = field(default_factory=dict)
    """`live` as the JSON of a job's reason, code and decision, kept while the decision is the same object."""

    def forget(self, job_id: int) -> None:
        self.live.pop(job_id, None)
        self.rendered.pop(job_id, None)
        self.written.pop(job_id, None)
        self.checked.pop(job_id, None)


class Scheduler:
    def __init__(
        self,
        board: Board,
        cfg: Config,
        paths: Paths,
        pool: WorktreePool,
        runners: dict[str, Runner],
        *,
        burst: bool = False,
        grace: float = 2.0,
        planner: Planner | None = None,
        gates: dict[str, Any] | None = None,
        claude: SharedClaude | None = None,
        sandbox: Sandbox | None = None,
    ) -> None:
        self.board = board
        self.cfg = cfg
        self.paths = paths
        self.pool = pool
        self.burst = burst
        self.grace = grace
        self._last_wake = 0.0
        self.heartbeat = time.monotonic()
        """Stamped each round and each idle wait: the service watchdog pings only while it is fresh."""
        self.tick: float | None = None
        """Longest idle wait (set under a watchdog), so a healthy idle loop still stamps its heartbeat."""
        self.lander = Lander(board, cfg, paths, pool, sandbox)
        self.executor = Executor(board, cfg, paths, pool, runners, self._on_change, self.lander.top_up)
        self._wakeup = asyncio.Event()
        self._stopping = False
        self._running: dict[int, asyncio.Task[Job]] = {}
        self._actual: dict[int, frozenset[str]] = {}
        self._overlaps: set[tuple[int, int]] = set()
        self._seen = _Seen()
        self._planned = rounds.Planned(board.store)
        self._views = rounds.Views()
        self._repo_facts = rounds.RepoFacts()
        self._explained = 0.0
        self._explain_every = EXPLAIN_EVERY
        self._cut = 0.0
        self._moved_cache: dict[tuple[str, str, str], frozenset[str] | None] = {}
        self._attr_cache: dict[tuple[str, str], frozenset[str]] = {}
        self._attr_last: dict[str, frozenset[str]] = {}
        self._side_tasks: set[asyncio.Task[Any]] = set()
        self.planning = Planning(
            board,
            planner or composite.build(cfg, board.store, gates, claude),
            cfg.plan.concurrency,
            cfg.plan.deadline,
            self.wake,
            cfg.policy,
            cfg.plan.calibrate_after,
        )
        self.controls: dict[str, tuple[bool, int | None]] = {}
        """Run-time controls by scope (a repo, or ALL_REPOS): (paused, slot limit). Mirrors the store."""
        board.on_change(self.wake)
        self.notifier = Notifier(cfg.jobs.on_end, StoreOwner(board.store))
        board.on_end(self.notifier.job_ended)
        self.private_dirs = PrivateDirs(paths)
        board.on_end(self.private_dirs.job_ended)

    def wake(self) -> None:
        self._last_wake = time.monotonic()
        self._wakeup.set()

    # -- the loop ---------------------------------------------------------------------------------

    async def run(self) -> None:
        """Decide, act, sleep until woken. In burst mode, return once nothing is open."""
        self._last_wake = time.monotonic()
        self.controls = await self.board.store.controls()
        for job in await self.board.store.jobs([JobState.LANDING]):
            self.lander.submit(job)  # landings a previous daemon left in flight resume
        while not self._stopping:
            self._wakeup.clear()
            self.heartbeat = time.monotonic()
            try:
                await self._round()
            except Exception as e:  # noqa: BLE001 - a bad round must not take running jobs down with it
                olog.get().error(olog.Event.SCHEDULER_ERROR, error=f"{type(e).__name__}: {e}", exc_info=True)
                await asyncio.sleep(1.0)
                self.wake()
            # Every fact that can change a decision wakes us; the timeout is only a safety net.
            # A cut-short tail is explained soon.
            timeout = 30.0 if self._explained >= self._cut else self._explain_every
            if self.burst and not await self.board.store.count(OPEN_STATES):
                # Burst: exit once idle, after a short grace for a client that is about to enqueue.
                quiet = time.monotonic() - self._last_wake
                if quiet >= self.grace:
                    return
                timeout = self.grace - quiet
            if self.tick is not None:
                timeout = min(timeout, self.tick)
            self.heartbeat = time.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), timeout=timeout)

    async def stop(self, timeout: float) -> list[int]:
        """Stop admitting; let landings finish within `timeout`; interrupt running jobs. Returns what was cut."""
        self._stopping = True
        self.wake()
        cut = []
        for job_id, task in list(self._running.items()):
            self.executor.stops.setdefault(
                job_id,
                Stop(
                    JobState.INTERRUPTED,
                    "the daemon stopped while this job ran; `orchestrator retry` runs it again",
                    Code.INTERRUPTED,
                ),
            )
            task.cancel()
            cut.append(job_id)
        await asyncio.gather(*self._running.values(), return_exceptions=True)
        await self.planning.stop()
        cut += await self.lander.drain(timeout)
        await self.notifier.drain(min(timeout, 5.0))
        await self.private_dirs.close()
        for t in list(self._side_tasks):
            t.cancel()
        await asyncio.gather(*self._side_tasks, return_exceptions=True)
        return sorted(cut)

    async def _round(self) -> None:
        try:
            await self._decide_round()
        except BaseException:
            self._planned.reset()
            self._repo_facts.reset()
            raise

    async def _decide_round(self) -> None:
        store = self.board.store
        for job in await store.jobs([JobState.QUEUED]):
            await self._plan(job)
        planned = await self._planned.jobs()
        by_id = {j.id: j for j in planned}
        for job_id in self._seen.live.keys() - by_id.keys():
            self._seen.forget(job_id)
        if not planned:
            self._repo_facts.reset()
            return
        active = await store.jobs(ACTIVE_STATES)
        # When nothing can start (every slot taken, or a landing in flight on every waiting job's branch), the
        # queue can only be deferred: its reasons are refreshed by a full pass every `_explain_every` seconds
        # (one a woken round may cut short), not by every round.
        self._explain_every = max(EXPLAIN_EVERY, EXPLAIN_PER_JOB * len(planned))
        explain = time.monotonic() - self._explained >= self._explain_every
        blocked = self._nothing_can_start(planned, len(active))
        if blocked and not explain:
            # No snapshot of the whole queue on every job's start, finish and landing: a re-plan or a dead
            # dependency waits for that pass, or for the slot or the landing that lets a job start.
            self._cut = time.monotonic()
            return
        self._views.keep((*by_id, *(j.id for j in active)))
        snapshot, heads = await self._snapshot(planned, active)
        # Repositories whose facts did not change since the last round are not decided again.
        snapshot = self._repo_facts.narrow(snapshot, self._seen.live)
        writes: list[Write] = []
        busy, cap = len(active), snapshot.policy.max_concurrent
        complete = True
        for n, decision in enumerate(admission.iter_decisions(snapshot), start=1):
            job = by_id[decision.job_id]
            if decision.outcome is Outcome.DEFER:
                self._defer(job, decision, writes)
                head = heads.get((job.repo, job.branch))
                if head:
                    self._seen.checked[job.id] = head  # BaseMoved passed up to here
            else:
                busy += decision.admitted
                self._seen.forget(job.id)
                await self._act(job, decision)
            if busy >= cap and not explain:
                complete = False
                break
            if n % ROUND_SLICE == 0:
                await asyncio.sleep(0)  # a long queue's tail must not stall the API and the running jobs
                # Newer facts came and a job may start now: start over on them. Not on every wake-up: a
                # busy queue wakes us on every job's progress, and a pass always cut short never completes.
                if (
                    blocked
                    and self._wakeup.is_set()
                    and not self._nothing_can_start(planned, await store.count(ACTIVE_STATES))
                ):
                    complete = False
                    break
        if writes:
            # One transaction for the round's changed reasons. Not marked changed: the planned mirror's
            # reason, code and decision of a waiting job are never read (`live` serves the latest decision).
            await store.update_many(writes, changed=False)
            for w in writes if self.board.subscribed else ():  # no wake: a deferral changes no decision
                self.board.publish({"type": "job", "job": self.live(by_id[w.job_id]).to_json()})
        if complete:
            self._explained = time.monotonic()
            self._repo_facts.commit()
        else:
            self._cut = time.monotonic()
            self._repo_facts.reset()

    def _nothing_can_start(self, planned: list[Job], active: int) -> bool:
        """Every slot is taken, or every waiting job's branch has a landing in flight (admission defers all)."""
        if active >= self.cfg.policy().max_concurrent:
            return True
        inflight = self.lander.inflight
        return bool(inflight) and all((j.repo, j.branch) in inflight for j in planned)

    async def _plan(self, job: Job) -> None:
        """Hand the job to planning: its plan runs as a task of its own and wakes us when done."""
        await self.planning.submit(job)

    async def _snapshot(
        self, planned: list[Job], active: list[Job]
    ) -> tuple[Snapshot, dict[tuple[str, str], str | None]]:
        heads: dict[tuple[str, str], str | None] = {}
        for job in (*planned, *active):
            key = (job.repo, job.branch)
            if key not in heads:
                try:
                    heads[key] = await asyncio.to_thread(repos.branch_head, Path(job.repo), job.branch)
                except repos.RepoError:
                    heads[key] = None
        # Only what moved since each job was last checked (earlier moves were checked already); one diff
        # per distinct (since, head), however many jobs share it, and no await per job.
        pending: dict[int, tuple[str, str, str]] = {}
        moved: dict[int, frozenset[str] | None] = {}
        for job in planned:
            head = heads[(job.repo, job.branch)]
            if head is None:
                moved[job.id] = None
            elif job.base:
                since = self._seen.checked.get(job.id, job.base)
                if head != since:
                    pending[job.id] = (job.repo, since, head)
        diffs = {key: await self._moved(*key) for key in set(pending.values())}
        for job_id, key in pending.items():
            moved[job_id] = diffs[key]
        mergeable = {repo: await self._mergeable(repo, head) for (repo, _), head in heads.items()}
        deps = {dep for job in planned for dep in job.after}
        states = await self.board.store.states(deps)

        def view(job: Job) -> JobView:
            return self._views.view(job, mergeable.get(job.repo, frozenset()), self._actual.get(job.id))

        snapshot = Snapshot(
            active=tuple(view(j) for j in active),
            waiting=tuple(view(j) for j in planned),
            moved=moved,
            landing=frozenset(self.lander.inflight),
            landed=frozenset(i for i, st in states.items() if st in DONE_STATES),
            dead=frozenset(i for i, st in states.items() if st in DEAD_STATES),
            paused=frozenset(scope for scope, (paused, _) in self.controls.items() if paused),
            slots={scope: n for scope, (_, n) in self.controls.items() if n is not None and scope != ALL_REPOS},
            policy=replace(self.cfg.policy(), raised=self.planning.raised),
        )
        return snapshot, heads

    async def _mergeable(self, repo: str, head: str | None) -> frozenset[str]:
        """A repo's own union-mergeable entries: its config's, and what `.gitattributes` marks merge=union."""
        key = (repo, head or "")
        if key not in self._attr_cache:
            marked: frozenset[str] = frozenset()
            if head:
                with olog.best_effort("read .gitattributes", repos.RepoError, pygit2.GitError, OSError, repo=repo):
                    marked = await asyncio.to_thread(repos.gitattributes_union, Path(repo), head)
            value = marked | frozenset(self.cfg.repo(repo).mergeable)
            # The same object while the set is the same: every waiting job's cached view stays valid when
            # a landing moves the head (a new object made 5,000 views be rebuilt after each landing).
            last = self._attr_last.get(repo)
            if value == last:
                value = last
            self._attr_last[repo] = value
            if len(self._attr_cache) > 4096:
                self._attr_cache.clear()  # bounded: one entry per head seen
            self._attr_cache[key] = value
        return self._attr_cache[key]

    async def _moved(self, repo: str, base: str, head: str) -> frozenset[str] | None:
        key = (repo, base, head)
        if len(self._moved_cache) > 4096:
            self._moved_cache.clear()  # bounded: entries are cheap to recompute
        if key not in self._moved_cache:
            try:
                self._moved_cache[key] = await asyncio.to_thread(repos.changed_paths, Path(repo), base, head)
            except Exception:  # noqa: BLE001 - an unreadable base means "unknown": the job re-plans
                self._moved_cache[key] = None
        return self._moved_cache[key]

    def _defer(self, job: Job, decision: Decision, writes: list[Write]) -> None:
        """Keep a deferred job's live decision; store and log it only when its reason code changes.

        Blocking ids and counts change on nearly every round of a long queue; writing them each time
        is what made the event log grow quadratically. The transient Landing reason is not written over
        a more durable one. `live` keeps the exact latest decision for `why` and `status`.
        """
        if self._seen.live.get(job.id) != decision:  # the same decision keeps its object: its JSON stays cached
            self._seen.live[job.id] = decision
        last = self._seen.written.get(job.id)
        if last == decision.reason or (last is not None and decision.reason is Reason.LANDING):
            return
        self._seen.written[job.id] = decision.reason
        olog.get(job_id=job.id, repo=job.repo).info(olog.Event.ADMISSION_DEFERRED, **_decision_fields(decision))
        writes.append(
            Write(
                job.id,
                {"decision": decision.to_json(), "reason": decision.message, "code": decision.reason},
                "deferred",
                {"reason": str(decision.reason), "code": str(decision.reason)},
            )
        )

    def live(self, job: Job) -> Job:
        """`job` with its latest admission decision when it waits (rounds keep it in memory, not the store)."""
        d = self._seen.live.get(job.id)
        if d is None or job.state is not JobState.PLANNED:
            return job
        return replace(job, decision=d.to_json(), reason=d.message, code=str(d.reason))

    def live_json(self, job_id: int) -> str | None:
        """What `live` overrides of a waiting job (reason, code, decision) as JSON text; None when nothing."""
        d = self._seen.live.get(job_id)
        if d is None:
            return None
        hit = self._seen.rendered.get(job_id)
        if hit is None or hit[0] is not d:
            hit = self._seen.rendered[job_id] = (
                d,
                json.dumps({"reason": d.message, "code": str(d.reason), "decision": d.to_json()}),
            )
        return hit[1]

    async def _act(self, job: Job, decision: Decision) -> None:
        log = olog.get(job_id=job.id, repo=job.repo)
        fields = _decision_fields(decision)
        if decision.outcome is Outcome.ADMIT:
            current = await self.board.store.get(job.id)
            if current is None or current.state is not JobState.PLANNED:
                return  # cancelled (or re-planned) while the round was deciding: the next round sees it
            head = await asyncio.to_thread(repos.branch_head, Path(job.repo), job.branch)
            job = await self.board.update(
                job.id,
                state=JobState.RUNNING,
                started_at=time.time(),
                base=head,
                decision=decision.to_json(),
                reason=decision.message,
                code=decision.reason,
                event="admitted",
            )
            log.info(olog.Event.ADMISSION_ADMITTED, **fields)
            self._start(job)
        elif decision.outcome is Outcome.REPLAN:
            log.info(olog.Event.ADMISSION_REPLAN, **fields)
            await self.board.update(
                job.id,
                state=JobState.QUEUED,
                decision=decision.to_json(),
                reason=decision.message,
                code=decision.reason,
                event="replan",
            )
        elif decision.outcome is Outcome.FAIL:
            log.warning(olog.Event.ADMISSION_FAILED, **fields)
            await self.board.update(
                job.id,
                state=JobState.FAILED,
                finished_at=time.time(),
                decision=decision.to_json(),
                reason=decision.message,
                code=decision.reason,
                event="failed",
                data={"code": str(decision.reason)},
            )

    def _start(self, job: Job) -> None:
        task = asyncio.create_task(self._execute(job), name=f"job-{job.id}")
        self._running[job.id] = task

    async def _execute(self, job: Job) -> Job:
        try:
            job = await self.executor.run(job)
        finally:
            self._running.pop(job.id, None)
            self._actual.pop(job.id, None)
            self.wake()
        if job.state is JobState.LANDING:
            self.lander.submit(job)
        return job

    # -- the live watch -------------------------------------------------------------------------

    async def _on_change(self, job_id: int, actual: frozenset[str]) -> None:
        """A running job's actual paths changed: store them, and flag it at once if they meet another's."""
        self._actual[job_id] = actual
        job = await self.board.store.update(job_id, actual=actual)
        olog.get(job_id=job_id, repo=job.repo).debug(olog.Event.JOB_CHANGED, actual=sorted(actual))
        shared = await self._mergeable(job.repo, job.base)
        escaped, _ = claims.split_mergeable(
            actual - claims.overlapping(actual, job.claim.paths), self.cfg.jobs.mergeable, shared
        )
        if not escaped:
            return
        for other in await self.board.store.jobs(ACTIVE_STATES):
            if other.id == job_id or other.repo != job.repo:
                continue
            theirs = other.claim.paths | self._actual.get(other.id, other.actual)
            meet = claims.overlapping(escaped, theirs)
            pair = (min(job_id, other.id), max(job_id, other.id))
            if not meet or pair in self._overlaps:
                continue
            self._overlaps.add(pair)
            await self._record_overlap(job, other, meet)

    async def _record_overlap(self, job: Job, other: Job, meet: frozenset[str]) -> None:
        later, earlier = (
            (job, other) if (job.started_at or 0, job.id) >= (other.started_at or 0, other.id) else (other, job)
        )
        log = olog.get(job_id=job.id, repo=job.repo)
        log.warning(
            olog.Event.JOB_OVERLAP,
            other=other.id,
            paths=sorted(meet),
            lands_after=earlier.id,
            later=later.id,
            message=f"job {job.id} touched {', '.join(sorted(meet))} outside its claim, "
            f"which job {other.id} holds; job {later.id} lands after job {earlier.id}",
        )
        later = await self.get(later.id)  # its current land_after, not the one when the watch began
        # A job re-run after a conflict may meet a job that already lands after it: the order stands.
        if earlier.id not in later.land_after and not await self._lands_after(earlier.id, later.id):
            await self.board.update(
                later.id,
                land_after=(*later.land_after, earlier.id),
                event="overlap",
                data={"other": earlier.id, "paths": sorted(meet)},
            )
        if job.id != later.id:
            await self.board.store.update(job.id, event="overlap", data={"other": other.id, "paths": sorted(meet)})
        task = asyncio.create_task(self._check_hunks(job, other, meet))
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    async def _lands_after(self, job_id: int, other: int) -> bool:
        """True if `job_id` already lands after `other`, directly or through open jobs between (a cycle else)."""
        seen: set[int] = set()
        todo = [job_id]
        while todo:
            i = todo.pop()
            if i in seen:
                continue
            seen.add(i)
            job = await self.board.store.get(i)
            if job is None or job.state.terminal:
                continue
            if other in job.land_after:
                return True
            todo.extend(job.land_after)
        return False

    async def _check_hunks(self, job: Job, other: Job, meet: frozenset[str]) -> None:
        """Same file, or a real conflict? An in-memory merge of both current states says."""
        if not (job.worktree and other.worktree and job.base):
            return
        try:
            ours = await asyncio.to_thread(merging.tree_of_worktree, Path(job.worktree))
            theirs = await asyncio.to_thread(merging.tree_of_worktree, Path(other.worktree))
            conflicts = await asyncio.to_thread(merging.merge_conflicts, Path(job.repo), job.base, ours, theirs)
        except Exception as e:  # noqa: BLE001 - advisory only: the landing makes the real check
            olog.get(job_id=job.id, repo=job.repo).debug(
                olog.Event.JOB_OVERLAP_CHECKED, other=other.id, hunks_error=str(e)
            )
            return
        olog.get(job_id=job.id, repo=job.repo).warning(
            olog.Event.JOB_OVERLAP_CHECKED,
            other=other.id,
            paths=sorted(meet),
            conflict=bool(conflicts),
            conflicts=list(conflicts),
            message="real conflict in " + ", ".join(conflicts)
            if conflicts
            else "same files, disjoint hunks: merges clean so far",
        )
        await self.board.store.update(
            job.id, event="overlap_checked", data={"other": other.id, "conflicts": list(conflicts)}
        )

    # -- requests from the API ------------------------------------------------------------------

    async def cancel(self, job_id: int) -> Job:
        job = await self.get(job_id)
        if job.state.terminal:
            raise JobError(f"job {job_id} already ended ({job.state}); nothing to cancel")
        if job.state is JobState.READY:
            await self.pool.release(Path(job.repo), job_id, keep=True)
        if job.state is JobState.LANDING:
            if (job.repo, job.branch) in self.lander.inflight:
                raise JobError(f"job {job_id} is landing right now; wait for it (`orchestrator wait {job_id}`)")
            landing = self.lander.tasks.get(job_id)
            if landing:
                landing.cancel()
            await self.pool.release(Path(job.repo), job_id, keep=True)
        if job.state in (JobState.QUEUED, JobState.PLANNING):
            await self.planning.cancel(job_id)
        if job.state is JobState.RUNNING and job_id in self._running:
            self.executor.stops[job_id] = Stop(JobState.CANCELLED, "cancelled by request", Code.CANCELLED)
            task = self._running[job_id]
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return await self.get(job_id)
        olog.get(job_id=job_id, repo=job.repo).warning(
            olog.Event.JOB_CANCELLED, code=Code.CANCELLED, reason="cancelled by request"
        )
        return await self.board.update(
            job_id,
            state=JobState.CANCELLED,
            finished_at=time.time(),
            reason="cancelled by request",
            code=Code.CANCELLED,
            event="cancelled",
            data={"code": Code.CANCELLED},
        )

    async def land(self, job_id: int) -> Job:
        """Review mode: land a ready job (hand it to its branch's landing queue)."""
        try:
            return await review.land(self.board, self.lander, await self.get(job_id))
        except review.ReviewError as e:
            raise JobError(str(e)) from None

    async def reject(self, job_id: int) -> Job:
        """Review mode: drop a ready job; its paths are free again, its branch is kept."""
        try:
            return await review.reject(self.board, self.pool, await self.get(job_id))
        except review.ReviewError as e:
            raise JobError(str(e)) from None

    async def diff(self, job_id: int, against_head: bool) -> dict[str, Any]:
        try:
            return await review.diff_async(await self.get(job_id), against_head)
        except review.ReviewError as e:
            raise JobError(str(e)) from None

    async def retry(self, job_id: int) -> Job:
        job = await self.get(job_id)
        if job.state not in (*DEAD_STATES, JobState.UNCHANGED):
            raise JobError(
                f"job {job_id} is {job.state}; only failed, cancelled, conflicted, interrupted or unchanged jobs "
                "can be retried"
            )
        try:
            # Always: a crash may leave a worktree or branch the job's record does not name yet.
            kept = await retire_attempt(self.pool, job)
        except AttemptKept as e:
            raise JobError(str(e)) from None
        job = await self.board.update(
            job_id,
            **fresh_attempt(job),
            reason="retried" + (f"; previous attempt kept on {kept}" if kept else ""),
            code=Code.RETRIED,
            event="retried",
            data={"kept": kept, "code": Code.RETRIED},
        )
        olog.get(job_id=job_id, repo=job.repo).info(olog.Event.JOB_RETRIED, code=Code.RETRIED, kept=kept)
        return job

    async def clean(self, job_id: int) -> list[str]:
        """Forget an ended job: its worktree, its branch, its earlier attempts' branches, its log and its record.

        Landed commits stay in git; only the bookkeeping goes.
        """
        job = await self.get(job_id)
        if not job.state.terminal:
            raise JobError(f"job {job_id} is {job.state}; cancel it first (`orchestrator cancel {job_id}`)")
        waiting = [j.id for j in await self.board.store.jobs(OPEN_STATES) if job_id in j.after]
        if waiting:
            raise JobError(f"job {job_id} is a dependency (--after) of open jobs {waiting}; clean it once they end")
        await self.pool.clean(Path(job.repo), job_id)
        dropped = await asyncio.to_thread(retire.drop_attempts, Path(job.repo), job_id)
        await self.board.store.delete_job(job_id)
        self.board.publish({"type": "removed", "id": job_id})
        await asyncio.to_thread(self.private_dirs.remove, job_id)  # its private dir, log and transcript
        olog.get(job_id=job_id, repo=job.repo).info(olog.Event.JOB_CLEANED, branches=dropped)
        await self.board.announce()
        return dropped

    async def control(self, scope: str, *, paused: bool | None = None, slots: int | bool | None = False) -> None:
        """Pause, resume or limit a repo (or every repo): stored first, then a fact of the next snapshot."""
        await self.board.store.set_control(scope, paused=paused, slots=slots)
        self.controls = await self.board.store.controls()
        olog.get(repo=scope).info(
            olog.Event.CONTROL_CHANGED,
            scope=scope,
            paused=self.controls.get(scope, (False, None))[0],
            slots=self.controls.get(scope, (False, None))[1],
        )
        await self.board.announce()

    async def get(self, job_id: int) -> Job:
        job = await self.board.store.get(job_id)
        if job is None:
            raise JobError(f"no job {job_id}: `orchestrator status` lists the jobs", status=404)
        return self.live(job)

    async def wait(self, ids: Iterable[int], timeout: float | None) -> list[Job]:
        ids = list(ids)
        await self.board.wait_ended(ids, timeout)
        found = {j.id: j for j in await self.board.store.get_many(ids)}
        return [self.live(found[i]) for i in ids if i in found]


def _decision_fields(d: Decision) -> dict[str, Any]:
    return {
        "reason": str(d.reason),
        "code": str(d.reason),
        "message": d.message,
        "blocking": list(d.blocking),
        "paths": list(d.paths),
        "shared": list(d.shared),
        "next": d.next,
    }
