"""What keeps a scheduler round's cost proportional to what changed, not to the length of the queue.

- `Planned` mirrors the planned jobs (and those keeping their place) in memory and re-reads from the store only
  the jobs written since the last round (`JobTable.take_changed`), so a round does not reload and re-parse a queue
  of thousands.
- `Views` keeps each job's `JobView` between rounds while its facts are the same objects, so per-job
  admission facts stay cached and comparing two rounds' facts is mostly identity checks.
- `RepoFacts` remembers, per repository, every fact admission reads for that repository's waiting jobs;
  `narrow` drops from the snapshot the waiting jobs of repositories whose facts did not change, so they
  are not re-decided (their last decisions still hold).

Why `narrow` keeps `decide_all`'s semantics: a repository whose facts did not change admitted nothing
last round (an admission changes its active jobs), and its facts include the global count of active
jobs, so the only fact that can differ in a full pass is that count growing with this round's
admissions elsewhere, which can only turn an admission into a Concurrency wait — and it admitted nothing.
"""

from __future__ import annotations

from collections.abc import Container, Hashable, Iterable
from dataclasses import replace

from orchestrator.core.job import Job
from orchestrator.core.models import HELD, JobState, JobView, Snapshot
from orchestrator.store import Store


class Planned:
    """The planned jobs and the jobs that keep their place without being planned (interrupted ones, and retried
    or re-queued ones planning again), mirrored between rounds; a job leaves when the store says it moved on."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._jobs: dict[int, Job] | None = None
        self._held: dict[int, Job] = {}

    async def jobs(self) -> list[Job]:
        changed = self.store.jobs.take_changed()  # taken before reading: a write during the read is seen next round
        if self._jobs is None:
            # One read for both: a job planned between two reads would be in neither.
            both = await self.store.jobs.all(HELD | PLANNING | {JobState.PLANNED})
            self._jobs = {j.id: j for j in both if j.state is JobState.PLANNED}
            self._held = {j.id: j for j in both if keeps_place(j)}
        elif changed:
            for i in changed:
                self._jobs.pop(i, None)
                self._held.pop(i, None)
            for job in await self.store.jobs.many(changed):
                if not self.store.team.mine(job):
                    continue  # team mode: another node's job (it changed there)
                if job.state is JobState.PLANNED:
                    self._jobs[job.id] = job
                elif keeps_place(job):
                    self._held[job.id] = job
        return sorted(self._jobs.values(), key=lambda j: j.id)

    def held(self) -> list[Job]:
        """As of the last `jobs()`: the jobs that keep their place (and claim) without waiting for admission."""
        return sorted(self._held.values(), key=lambda j: j.id)

    def reset(self) -> None:
        """Forget the mirror: the next round reads every planned job again (after a failed round)."""
        self._jobs = None


PLANNING = frozenset({JobState.QUEUED, JobState.PLANNING})


def keeps_place(job: Job) -> bool:
    """An interrupted job, or one retried or re-queued that plans again (admission sent it back: its base moved,
    or its branch could not be read, so it has a decision already): it keeps its place and its claim."""
    return job.state in HELD or (job.state in PLANNING and (job.attempts > 0 or job.decision is not None))


class Views:
    """Each job's `JobView`, reused while its job record, actual paths and mergeable set are the same objects."""

    def __init__(self) -> None:
        self._views: dict[int, tuple[Job, frozenset[str], frozenset[str], JobView]] = {}

    def view(self, job: Job, mergeable: frozenset[str], actual: frozenset[str] | None) -> JobView:
        live = job.actual if actual is None else actual
        hit = self._views.get(job.id)
        if hit is not None and hit[0] is job and hit[1] is mergeable and hit[2] is live:
            return hit[3]
        v = job.view(mergeable)
        if actual is not None:
            v = replace(v, actual=actual)
        self._views[job.id] = (job, mergeable, live, v)
        return v

    def keep(self, ids: Iterable[int]) -> None:
        """Drop the views of jobs not in `ids` (they ended)."""
        wanted = set(ids)
        for i in [i for i in self._views if i not in wanted]:
            del self._views[i]


class RepoFacts:
    """Per repository, the facts admission read last round; `narrow` keeps only the repositories that changed."""

    def __init__(self) -> None:
        self._last: dict[str, Hashable] = {}
        self._pending: dict[str, Hashable] = {}

    def narrow(self, snapshot: Snapshot, deferred: Container[int]) -> Snapshot:
        """`snapshot` without the waiting jobs of repositories whose facts are those of the last round
        and whose waiting jobs were all deferred then (ids in `deferred`)."""
        active: dict[str, list[JobView]] = {}
        waiting: dict[str, list[JobView]] = {}
        for v in snapshot.active:
            active.setdefault(v.repo, []).append(v)
        for v in snapshot.waiting:
            waiting.setdefault(v.repo, []).append(v)
        held: dict[str, list[JobView]] = {}
        for v in snapshot.held:
            held.setdefault(v.repo, []).append(v)
        self._pending = {}
        keep: list[JobView] = []
        for repo, jobs in waiting.items():
            deps = {i for j in jobs for i in (*j.after, *j.land_after)}
            facts = (
                tuple(active.get(repo, ())),
                tuple(v for v in snapshot.elsewhere if v.repo == repo),
                tuple(jobs),
                tuple(held.get(repo, ())),
                frozenset(k for k in snapshot.landing if k[0] == repo),
                tuple((j.id, snapshot.moved[j.id]) for j in jobs if j.id in snapshot.moved),
                frozenset(deps & snapshot.landed),
                frozenset(deps & snapshot.dead),
                sum(not v.resting for v in snapshot.active),  # the slots taken (a resting job takes none)
                snapshot.paused,
                tuple(sorted(snapshot.limited.items())),
                bool(snapshot.disk_low),  # room or not (not how much: that changes every round)
                tuple(sorted(snapshot.slots.items())),
                snapshot.policy,
            )
            self._pending[repo] = facts
            if self._last.get(repo) != facts or not all(j.id in deferred for j in jobs):
                keep.extend(jobs)
        if len(keep) == len(snapshot.waiting):
            return snapshot
        return replace(snapshot, waiting=tuple(keep))

    def commit(self) -> None:
        """The round acted on every decision: its facts are the ones to compare the next round with."""
        self._last = self._pending
        self._pending = {}

    def reset(self) -> None:
        """A round failed part way: decide every repository again next time."""
        self._last = {}
        self._pending = {}
