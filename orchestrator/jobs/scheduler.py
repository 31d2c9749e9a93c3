"""The scheduler: gathers facts into a snapshot, asks `admission.iter_decisions`, carries the decisions out.

Event-driven: enqueue, plan done, change seen, job finished, landing done and branch moved all call
`wake()`. Each round plans queued jobs, builds the snapshot (active jobs with their live actual paths,
waiting jobs, the jobs that keep their place without running, how each target branch moved since each
job's base, landings in flight) and acts on every decision. A decision is logged once per change of its reason.

Every write a round makes expects what the round read: a deferral is stored only while the job is still
`planned`, and an admitted job starts (moves to `running`, on the head admission checked) only if nothing
moved it meanwhile. The job's task is registered before that write, so a cancel always finds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from orchestrator import logging as olog
from orchestrator import testhook
from orchestrator.config import Config
from orchestrator.core import admission
from orchestrator.core.job import Job
from orchestrator.core.models import (
    ACTIVE,
    ALL_REPOS,
    DEAD,
    DONE,
    HELD,
    OPEN,
    Code,
    Decision,
    JobEvent,
    JobState,
    JobView,
    Outcome,
    Reason,
    Snapshot,
    risk_json,
)
from orchestrator.jobs import quota, rounds
from orchestrator.jobs.board import Board
from orchestrator.jobs.execution import Executor, Stop
from orchestrator.jobs.facts import GitFacts
from orchestrator.jobs.landing import Lander
from orchestrator.jobs.planning import Planning
from orchestrator.jobs.watch import OverlapWatch
from orchestrator.store import StoreFull, Write

ROUND_SLICE = 50
"""Decisions made between two yields to the event loop in one round (a wake-up cuts a full pass short there)."""
EXPLAIN_EVERY = 2.0
"""Seconds between full passes over a queue whose tail cannot start (every slot taken, or a landing in flight)."""
FULL_RETRY = 5.0
"""Seconds before a round that found the database's disk full is tried again."""
EXPLAIN_PER_JOB = 0.005
"""...and more for a long queue (5 s at 1,000 waiting), so these passes stay a small share of the daemon's time."""
PLANNED = frozenset({JobState.PLANNED})


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
        planning: Planning,
        lander: Lander,
        executor: Executor,
        watch: OverlapWatch,
        facts: GitFacts,
        *,
        burst: bool = False,
        grace: float = 2.0,
    ) -> None:
        self.board = board
        self.cfg = cfg
        self.planning = planning
        self.lander = lander
        self.executor = executor
        self.watch = watch
        self.facts = facts
        self.burst = burst
        self.grace = grace
        self._last_wake = 0.0
        self.heartbeat = time.monotonic()
        """Stamped each round and each idle wait: the service watchdog pings only while it is fresh."""
        self.tick: float | None = None
        """Longest idle wait (set under a watchdog), so a healthy idle loop still stamps its heartbeat."""
        self._wakeup = asyncio.Event()
        self._stopping = False
        self.running: dict[int, asyncio.Task[Job]] = {}
        """Each admitted job's task, registered before the job is moved to `running` (a cancel finds it)."""
        self._seen = _Seen()
        self._planned = rounds.Planned(board.store)
        self._views = rounds.Views()
        self._repo_facts = rounds.RepoFacts()
        self._explained = 0.0
        self._explain_every = EXPLAIN_EVERY
        self._cut = 0.0
        self.controls: dict[str, tuple[bool, int | None]] = {}
        """Run-time controls by scope (a repo, or ALL_REPOS): (paused, slot limit). Mirrors the store."""
        board.on_change(self.wake)
        executor.limits.on_over = self.wake  # a rate limit ran out: the jobs it held back may start

    def wake(self) -> None:
        self._last_wake = time.monotonic()
        self._wakeup.set()

    # -- the loop ---------------------------------------------------------------------------------

    async def load(self) -> None:
        """What a stopped daemon left in force, read before anyone asks (the API answers from these): the run-time
        controls, and the rate limits its jobs met."""
        self.controls = await self.board.store.limits.controls()
        await self.executor.limits.load()

    async def run(self) -> None:
        """Decide, act, sleep until woken (`load` first). In burst mode, return once nothing is open."""
        self._last_wake = time.monotonic()
        for job in await self.board.store.jobs.all([JobState.LANDING]):
            self.lander.submit(job)  # landings a previous daemon left in flight resume
        while not self._stopping:
            self._wakeup.clear()
            self.heartbeat = time.monotonic()
            try:
                await self._round()
            except StoreFull as e:  # nothing can be stored: decide again once there may be room, quietly
                olog.get().warning(olog.Event.SCHEDULER_ERROR, error=str(e), retry_in=FULL_RETRY)
                await asyncio.sleep(FULL_RETRY)
                self.wake()
            except Exception as e:  # noqa: BLE001 - a bad round must not take running jobs down with it
                olog.get().error(olog.Event.SCHEDULER_ERROR, error=f"{type(e).__name__}: {e}", exc_info=True)
                await asyncio.sleep(1.0)
                self.wake()
            # Every fact that can change a decision wakes us; the timeout is only a safety net.
            # A cut-short tail is explained soon.
            timeout = 30.0 if self._explained >= self._cut else self._explain_every
            if self.burst and await self._idle():
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

    async def _idle(self) -> bool:
        """Nothing happens any more without a person: no open job, or only waiting ones held back by
        jobs that keep their place until someone retries or cancels them."""
        if not await self.board.store.jobs.count(OPEN):
            return True
        if self.running or await self.board.store.jobs.count(OPEN - PLANNED):
            return False
        held = {j.id for j in await self.board.store.jobs.all(HELD)}
        waiting = await self.board.store.jobs.all(PLANNED)
        return bool(held) and all(
            (d := self._seen.live.get(j.id)) is not None and set(d.blocking) <= held and d.blocking for j in waiting
        )

    def halt(self) -> None:
        """Ask `run` to return after the round under way (it starts nothing more)."""
        self._stopping = True
        self.wake()

    async def stop(self) -> list[int]:
        """Stop admitting; interrupt running jobs (their tasks end). Returns the jobs cut."""
        self.halt()
        cut = []
        for job_id, task in list(self.running.items()):
            self.executor.stops.setdefault(
                job_id,
                Stop(
                    JobState.INTERRUPTED,
                    "the daemon stopped while this job ran; it keeps its place: `orchestrator retry` runs it again",
                    Code.INTERRUPTED,
                ),
            )
            task.cancel()
            cut.append(job_id)
        await asyncio.gather(*self.running.values(), return_exceptions=True)
        return sorted(cut)

    async def settled(self, job_id: int) -> None:
        """Until the task of `job_id`, if it has one, has ended. A round that read the job planned just before it
        was cancelled may still start a task for it: the task's move to `running` fails while the job stays
        cancelled, but it would start the job's next attempt, admitted on nothing, were that planned first."""
        task = self.running.get(job_id)
        if task is not None:
            await asyncio.wait({task})

    async def stop_job(self, job_id: int, stop: Stop) -> bool:
        """End a job's runner task with `stop` (it writes the stop's state itself); False if it has none."""
        task = self.running.get(job_id)
        if task is None:
            return False
        self.executor.stops[job_id] = stop
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return True

    async def _round(self) -> None:
        try:
            await self._decide_round()
        except BaseException:
            self._planned.reset()
            self._repo_facts.reset()
            raise

    async def _decide_round(self) -> None:
        store = self.board.store
        await self.board.claim()  # team mode: this node's share of the team's queue (one machine: every job is its own)
        for job in await store.jobs.all([JobState.QUEUED]):
            await self.planning.submit(job)
        # A job whose task is starting (admitted, its move to `running` not stored yet) is active already: it is
        # no longer waiting, and no later round may admit an overlapping job beside it.
        planned: list[Job] = []
        starting: list[Job] = []
        for j in await self._planned.jobs():
            (starting if j.id in self.running else planned).append(j)
        by_id = {j.id: j for j in planned}
        for job_id in self._seen.live.keys() - by_id.keys():
            self._seen.forget(job_id)
        if not planned:
            self._repo_facts.reset()
            return
        active = [*await store.jobs.all(ACTIVE), *starting]
        # When nothing can start (every slot taken, or a landing in flight on every waiting job's branch), the
        # queue can only be deferred: its reasons are refreshed by a full pass every `_explain_every` seconds
        # (one a woken round may cut short), not by every round.
        self._explain_every = max(EXPLAIN_EVERY, EXPLAIN_PER_JOB * len(planned))
        explain = time.monotonic() - self._explained >= self._explain_every
        taken = _slots_taken(active)
        blocked = self._nothing_can_start(planned, taken)
        if blocked and not explain:
            # No snapshot of the whole queue on every job's start, finish and landing: a re-plan or a dead
            # dependency waits for that pass, or for the slot or the landing that lets a job start.
            self._cut = time.monotonic()
            return
        # Team mode: the other nodes' jobs of these repositories (active: they hold paths; planned: their place).
        others = await store.team.elsewhere()
        elsewhere = [j for j in others if j.state in ACTIVE]
        held = [*self._planned.held(), *(j for j in others if j.state is JobState.PLANNED)]
        self._views.keep((*by_id, *(j.id for j in (*active, *held, *elsewhere))))
        snapshot, heads = await self._snapshot(planned, active, held, elsewhere)
        # Repositories whose facts did not change since the last round are not decided again.
        snapshot = self._repo_facts.narrow(snapshot, self._seen.live)
        writes: list[Write] = []
        busy, cap = taken, snapshot.policy.max_concurrent
        complete = True
        for n, decision in enumerate(admission.iter_decisions(snapshot), start=1):
            job = by_id[decision.job_id]
            head = heads.get((job.repo, job.branch))
            if decision.outcome is Outcome.DEFER:
                self._defer(job, decision, writes)
                if head:
                    self._seen.checked[job.id] = head  # BaseMoved passed up to here
            else:
                busy += decision.admitted
                self._seen.forget(job.id)
                beside = frozenset(v.id for v in snapshot.elsewhere if (v.repo, v.branch) == (job.repo, job.branch))
                await self._act(job, decision, head, beside)
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
                    and not self._nothing_can_start(planned, _slots_taken(await store.jobs.all(ACTIVE)) + len(starting))
                ):
                    complete = False
                    break
        if writes:
            await testhook.reach("round.deferrals", writes[0].job_id)
            # One transaction for the round's changed reasons, each only while its job is still planned (a
            # cancel or a supersede meanwhile keeps its own reason). Not marked changed: the planned mirror's
            # reason, code and decision of a waiting job are never read (`live` serves the latest decision).
            await self.board.note_reasons(writes, lambda job_id: self.live(by_id[job_id]))
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

    async def _snapshot(
        self, planned: list[Job], active: list[Job], held: list[Job], elsewhere: list[Job]
    ) -> tuple[Snapshot, dict[tuple[str, str], str | None]]:
        heads = await self.facts.heads((j.repo, j.branch) for j in (*planned, *active))
        # Only what moved since each job was last checked (earlier moves were checked already); one diff
        # per distinct (since, head), however many jobs share it, and no await per job.
        pending: dict[int, tuple[str, str, str]] = {}
        moved: dict[int, frozenset[str] | None] = {}
        for job in planned:
            head = heads[(job.repo, job.branch)]
            if head is None:
                moved[job.id] = None
            elif job.base and not job.feedback:  # a revision goes on from its own base (`_base_moved`)
                since = self._seen.checked.get(job.id, job.base)
                if head != since:
                    pending[job.id] = (job.repo, since, head)
        diffs = {key: await self.facts.moved(*key) for key in set(pending.values())}
        for job_id, key in pending.items():
            moved[job_id] = diffs[key]
        mergeable = {repo: await self.facts.mergeable(repo, head) for (repo, _), head in heads.items()}
        deps = {dep for job in (*planned, *held) for dep in (*job.after, *job.land_after)}
        states = await self.board.store.jobs.states(deps)

        def view(job: Job) -> JobView:
            return self._views.view(job, mergeable.get(job.repo, frozenset()), self.watch.actual.get(job.id))

        snapshot = Snapshot(
            active=tuple(view(j) for j in active),
            elsewhere=tuple(view(j) for j in elsewhere),
            waiting=tuple(view(j) for j in planned),
            held=tuple(view(j) for j in held),
            moved=moved,
            landing=frozenset(self.lander.inflight),
            landed=frozenset(i for i, st in states.items() if st in DONE),
            dead=frozenset(i for i, st in states.items() if st in DEAD),
            paused=frozenset(scope for scope, (paused, _) in self.controls.items() if paused),
            limited=self.executor.limits.active(),
            disk_low=await self._disk_low(),
            slots={scope: n for scope, (_, n) in self.controls.items() if n is not None and scope != ALL_REPOS},
            policy=replace(self.cfg.policy(), raised=self.planning.raised),
        )
        return snapshot, heads

    async def _disk_low(self) -> str:
        """Why nothing may start for lack of disk (`Snapshot.disk_low`): the workspaces' disk under its floor."""
        floor = self.cfg.jobs.min_free_bytes
        if not floor:
            return ""
        where = self.executor.paths.state_dir
        room = await asyncio.to_thread(quota.free, where)
        if room is None or room >= floor:
            return ""
        return (
            f"the disk that holds {where} has {quota.size(room)} free, less than jobs.min_free_bytes "
            f"({quota.size(floor)})"
        )

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
                JobEvent.DEFERRED,
                {"reason": str(decision.reason), "code": str(decision.reason)},
                expect=PLANNED,
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

    async def _act(self, job: Job, decision: Decision, head: str | None, beside: frozenset[int]) -> None:
        log = olog.get(job_id=job.id, repo=job.repo)
        fields = _decision_fields(decision)
        outcome = decision.outcome
        if outcome is Outcome.ADMIT and head is None:
            # Its branch could not be read this round: planning again says why (or finds it back).
            outcome, fields["message"] = Outcome.REPLAN, f"{job.branch} could not be read; plans again"
        if outcome is Outcome.ADMIT:
            assert head is not None
            self._start(job, decision, head, beside)
        elif outcome is Outcome.REPLAN:
            log.info(olog.Event.ADMISSION_REPLAN, **fields)
            await self.board.transition(
                job.id,
                PLANNED,
                JobState.QUEUED,
                JobEvent.REPLAN,
                decision=decision.to_json(),
                reason=fields["message"],
                code=decision.reason,
            )
        elif outcome is Outcome.FAIL:
            log.warning(olog.Event.ADMISSION_FAILED, **fields)
            await self.board.transition(
                job.id,
                PLANNED,
                JobState.FAILED,
                JobEvent.FAILED,
                finished_at=time.time(),
                decision=decision.to_json(),
                reason=decision.message,
                code=decision.reason,
                data={"code": str(decision.reason)},
            )

    def _start(self, job: Job, decision: Decision, head: str, beside: frozenset[int]) -> None:
        """The job's task, registered at once: it moves the job to `running` on `head` (the head admission
        checked) if the job is still planned and (team mode) no other node started a job `beside` it, then runs
        it."""
        self.running[job.id] = asyncio.create_task(self._execute(job, decision, head, beside), name=f"job-{job.id}")

    async def _execute(self, job: Job, decision: Decision, head: str, beside: frozenset[int]) -> Job:
        log = olog.get(job_id=job.id, repo=job.repo)
        try:
            await testhook.reach("admit", job.id)
            # A revision goes on in the worktree it kept, on the base it was made from (its landing merges from
            # there); a job stopped on a real conflict goes on in its kept worktree from the head (the executor
            # merges what moved); any other job starts on the head admission checked.
            fresh: dict[str, Any] = {} if job.feedback else {"started_at": time.time(), "base": head}
            if job.moved_from:
                fresh = {"base": head}
            try:
                started = await self.board.transition(
                    job.id,
                    PLANNED,
                    JobState.RUNNING,
                    JobEvent.ADMITTED,
                    beside=beside,
                    data={"risks": [risk_json(*r) for r in decision.risks]} if decision.risks else None,
                    **fresh,
                    decision=decision.to_json(),
                    reason=decision.message,
                    code=decision.reason,
                )
            except asyncio.CancelledError:
                await asyncio.shield(self.executor.stopped(job.id))  # if the move went through, undo it
                raise
        except BaseException:
            self._ran(job.id)
            raise
        if started is None:
            log.info(olog.Event.ADMISSION_STALE, reason="it left `planned`, or another node started beside it")
            self._ran(job.id)
            return job
        log.info(olog.Event.ADMISSION_ADMITTED, **_decision_fields(decision))
        return await self._carry(started)

    def resume(self, job: Job) -> None:
        """Run a ready job that was moved to `running` again (`revise`) in its kept worktree, told its `feedback`:
        its task, registered at once (a cancel finds it), carries it to ready, landing or an end."""
        self.running[job.id] = asyncio.create_task(self._carry(job), name=f"job-{job.id}")

    async def _carry(self, job: Job) -> Job:
        """Run a `running` job (told its feedback, if any) to ready, landing or an end; a landing goes to the lander."""
        try:
            job = await self.executor.run(job, resume=job.feedback)
        finally:
            self._ran(job.id)
        if job.state is JobState.LANDING:
            self.lander.submit(job)
        return job

    def _ran(self, job_id: int) -> None:
        """A job's task is over: forget it, and decide again."""
        self.running.pop(job_id, None)
        self.executor.stops.pop(job_id, None)
        self.watch.forget(job_id)
        self.wake()


def _decision_fields(d: Decision) -> dict[str, Any]:
    return {
        "reason": str(d.reason),
        "code": str(d.reason),
        "message": d.message,
        "blocking": list(d.blocking),
        "paths": list(d.paths),
        "shared": list(d.shared),
        "next": d.next,
        **({"risks": [risk_json(*r) for r in d.risks]} if d.risks else {}),
    }


def _slots_taken(active: Iterable[Job]) -> int:
    """Slots the active jobs take: a job resting on a rate limit holds its paths, not its slot."""
    return sum(not j.resting for j in active)
