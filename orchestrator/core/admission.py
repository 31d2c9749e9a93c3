"""Admission: may a waiting job start now, beside the active jobs of its repo? Pure, no I/O.

`decide(job, snapshot)` evaluates every check (each becomes a `Check` for `orchestrator why`); the first
failing one, in this order, gives the reason and the outcome:

 1. DependencyFailed (fail)  a job it runs after ended without landing
 2. Dependency               a job it runs after has not landed yet, or one it lands after has not ended, or
                             an earlier job is making what its text names and its base lacks (`core.chains`)
 2b. Paused                  its repo, or the whole daemon, is paused (`orchestrator pause`)
 2c. RateLimited             its runner's model API is rate-limited (a job of that runner met the limit)
 2d. NoSpace                 the disk that holds the workspaces is under `jobs.min_free_bytes`
 4. Exclusive                an active job of its repo runs alone
 5. Ambiguous / Barrier      it must run alone, and its repo has active jobs
 6. Overlap                  its claim meets what an active job of its repo claims or has touched
 6b. Risk                    its claim is disjoint, but its estimated chance of a conflict the landing
                             cannot merge beside an active job is above `Policy.risk`
                             (`core.risk`)
 7. Priority                 an earlier waiting job of its repo that it conflicts with goes first (so
                             does an earlier job that keeps its place: interrupted, or planning again)
 7b. BaseMoved (re-plan)     its branch moved in claimed paths (or unknown paths, or paths named by what its
                             text names as new to its base, `core.chains`) since it was planned
 8. Landing                  a landing into its target branch is in flight (transient, so reported
                             only when nothing more durable holds the job back)
 9. Concurrency              the global or per-repo limit of active jobs is reached

A job is planned again (BaseMoved) only when nothing held by its claim keeps it waiting anyway (4-7): a claim
planned on an older head says well enough that the job must wait for the jobs it meets, and re-planning every
waiting job on every landing cost a queue of 30 jobs 29 plans a landing (most of a 2-core machine in a queue that
runs one job at a time). It is planned again before it waits for a slot (8, 9), so that it starts as soon as one
frees.

A job "runs alone" (is exclusive) when its claim is ambiguous (`claims.ambiguity`) or its claim or
actual paths reach a barrier (`claims.reaches`). Union-mergeable paths (changelogs) never count as an
overlap; those it shares with active jobs are reported in `Decision.shared`. In team mode the other nodes'
active jobs of its repo (`Snapshot.elsewhere`) are active jobs for 4-6 and take none of this node's slots (9); nor
does an active job that rests, waiting for its model API's rate limit to end (`JobView.resting`): it holds its
paths, but its slot goes to a job that can run meanwhile.

Priority is what keeps the order fair: a later job never overtakes an earlier waiting job it conflicts
with (overlapping claims, or a risk above `Policy.risk` among the first `RISK_SCAN` earlier jobs), except
that one only at risk beside it (claims disjoint) may fill a slot while an active job queued before that
earlier one holds it back anyway (`admission_index.held_back`): never while only jobs that started after
it do, so it waits at most for the jobs that started while it could not. Only
*ready* waiting jobs (every job they run after has landed) hold a place in that order; a job still
waiting for a dependency would otherwise block the very job it waits for.

Speed: per-job facts are cached on the (hashable, frozen) `JobView`, and per-snapshot indexes on the
snapshot object, so many `decide` calls on one snapshot are cheap; `decide_all` builds its index
incrementally as it walks the queue.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from orchestrator.core import chains, claims
from orchestrator.core.admission_index import (
    BLOCKING_LIMIT,
    Active,
    Facts,
    State,
    canon,
    clear_caches,
    facts,
    order,
    plist,
    ready,
    risk,
    state_of,
)
from orchestrator.core.models import (
    ALL_REPOS,
    Check,
    ClaimSource,
    Decision,
    JobView,
    Outcome,
    Policy,
    Reason,
    Snapshot,
)
from orchestrator.core.risk import PairRisk

__all__ = ["BLOCKING_LIMIT", "clear_caches", "decide", "decide_all", "iter_decisions", "runs_alone"]


def runs_alone(job: JobView, policy: Policy) -> str | None:
    """Why `job` must run alone in its repo (ambiguous claim, barrier path), or None if it need not."""
    f = facts(job, policy)
    return f.alone_reason if f.exclusive else None


# --------------------------------------------------------------------------------------- decisions


def decide(job: JobView, snapshot: Snapshot) -> Decision:
    """Decide one waiting job against `snapshot` (its active jobs, and its waiting jobs ahead of `job`)."""
    return _decide(facts(job, snapshot.policy), snapshot, state_of(snapshot))


def decide_all(snapshot: Snapshot) -> list[Decision]:
    """Decide every waiting job in `order_key` order; each admitted job counts as active for the next."""
    return list(iter_decisions(snapshot))


def iter_decisions(snapshot: Snapshot) -> Iterator[Decision]:
    """`decide_all`, one decision at a time: a caller can act on an admission before the queue's tail is decided."""
    state = State(snapshot)
    held = {j.id for j in snapshot.held}
    for job in sorted((*snapshot.waiting, *snapshot.held), key=order):
        f = facts(job, snapshot.policy)
        if job.id in held:
            if ready(job, snapshot):
                state.add_waiting(f)  # keeps its place: later jobs it overlaps wait for it
            continue
        d = _decide(f, snapshot, state)
        yield d
        if d.admitted:
            state.add_active(f)
        elif ready(job, snapshot):
            state.add_waiting(f)


@dataclass(frozen=True, slots=True)
class _Verdict:
    reason: Reason
    outcome: Outcome
    message: str
    next: str
    blocking: tuple[int, ...]
    paths: tuple[str, ...]


class _Checks:
    """Collects every check; the first failing one gives the verdict."""

    __slots__ = ("checks", "verdict")

    def __init__(self) -> None:
        self.checks: list[Check] = []
        self.verdict: _Verdict | None = None

    def ok(self, name: str, detail: str) -> None:
        self.checks.append(Check(name, True, detail))

    def fail(
        self,
        reason: Reason,
        message: str,
        next: str,
        blocking: Iterable[int] = (),
        paths: Iterable[str] = (),
        outcome: Outcome = Outcome.DEFER,
    ) -> None:
        self.checks.append(Check(str(reason), False, message))
        if self.verdict is None:
            self.verdict = _Verdict(reason, outcome, message, next, tuple(blocking), tuple(paths))


@dataclass(slots=True)
class _Ask:
    """One waiting job's question to one snapshot, with what every check reads of its repo."""

    f: Facts
    snap: Snapshot
    st: State
    active: Active | None
    repo_active: list[Facts]
    repo_ids: list[int]
    in_repo: str
    shared: frozenset[str] = frozenset()
    """Union-mergeable paths it shares with active jobs (found by the overlap check)."""
    owners: frozenset[int] = frozenset()
    """Active jobs whose held paths its claim meets (found by the overlap check)."""
    beside: tuple[PairRisk, Facts] | None = None
    """The highest estimated risk beside an active job, with that job (found by the risk check)."""
    risks: tuple[tuple[int, float, float, float, float], ...] = ()
    """The risk beside each active job weighed (found by the risk check): see `Decision.risks`."""

    @property
    def job(self) -> JobView:
        return self.f.job


def _decide(f: Facts, snap: Snapshot, st: State) -> Decision:
    active = st.active.get(f.job.repo)
    repo_active = active.jobs if active is not None else []
    ask = _Ask(
        f,
        snap,
        st,
        active,
        repo_active,
        [a.job.id for a in repo_active],
        f"{_n(len(repo_active), 'active job')} in repo",
    )
    c = _Checks()
    for check in CHECKS:
        check(ask, c)
    job, shared, checks = f.job, tuple(sorted(ask.shared)), tuple(c.checks)
    if (v := c.verdict) is not None:
        return Decision(job.id, v.outcome, v.reason, v.message, v.blocking, v.paths, shared, v.next, checks, ask.risks)
    if f.exclusive:
        msg = f"admitted to run alone ({f.alone_reason})"
    elif repo_active:
        msg = f"admitted beside {ask.in_repo}, claim disjoint{_shared_note(ask.shared)}"
        if ask.beside is not None:
            msg += "; " + _within_limit(*ask.beside, f.risk_limit)
    else:
        msg = f"admitted: no active job in repo{_shared_note(ask.shared)}"
    return Decision(job.id, Outcome.ADMIT, Reason.ADMITTED, msg, (), (), shared, "starts now", checks, ask.risks)


def _dependencies(ask: _Ask, c: _Checks) -> None:
    """1-2. DependencyFailed, Dependency."""
    snap = ask.snap
    after = sorted(set(ask.job.after))
    dead = [i for i in after if i in snap.dead]
    pending = [i for i in after if i not in snap.landed and i not in snap.dead]
    if dead:
        msg = f"{_of(len(dead), len(after), 'job')} it runs after ended without landing: {_jobs(dead, bare=True)}"
        c.fail(Reason.DEPENDENCY_FAILED, msg, "fails: it can never run", dead, outcome=Outcome.FAIL)
    else:
        c.ok(
            "DependencyFailed",
            f"none of {_n(len(after), 'job')} it runs after failed" if after else "runs after no job",
        )
    behind = sorted(i for i in set(ask.job.land_after) if i not in snap.landed and i not in snap.dead)
    if pending:
        msg = f"waits for {_of(len(pending), len(after), 'job')} it runs after: {_jobs(pending, bare=True)}"
        c.fail(Reason.DEPENDENCY, msg, f"waits for {_jobs(pending)} to land", pending)
    elif behind:
        # Their changes met its own (a real conflict stopped its last attempt), or its last attempt lacked them (it went
        # ahead of them and changed nothing, `core.overtake`): it starts on a base that has them.
        msg = (
            f"lands after {_jobs(behind)}, whose changes its last attempt met or lacked: it starts once "
            f"{_they(behind)} ended"
        )
        c.fail(Reason.DEPENDENCY, msg, f"waits for {_jobs(behind)} to land", behind)
    elif (link := chains.of(snap).get(ask.job.id)) is not None:
        c.fail(Reason.DEPENDENCY, link.message(), f"starts once {_jobs(link.needs)} ended", link.needs)
    else:
        c.ok("Dependency", f"{_n(len(after), 'job')} it runs after landed or ended" if after else "runs after no job")


def _paused(ask: _Ask, c: _Checks) -> None:
    """2b. Paused: nothing new starts in a paused repo (running jobs go on)."""
    paused = ask.snap.paused
    if ask.job.repo in paused or ALL_REPOS in paused:
        scope = "the daemon" if ALL_REPOS in paused else "its repo"
        how = "`orchestrator resume" + ("`" if ALL_REPOS in paused else f" --repo {ask.job.repo}`")
        c.fail(Reason.PAUSED, f"{scope} is paused: nothing new starts", f"waits for {how}")
    else:
        c.ok("Paused", "not paused")


def _rate_limited(ask: _Ask, c: _Checks) -> None:
    """2c. RateLimited: a job of its runner met a rate limit of their model API; it starts when the limit ends."""
    runner = ask.job.runner
    until = ask.snap.limited.get(runner) if runner else None
    if until is None:
        c.ok("RateLimited", f"{runner or 'its runner'}'s model API is not known to be rate-limited")
        return
    at = time.strftime("%H:%M:%S", time.localtime(until))
    msg = f"{runner}'s model API is rate-limited until {at} (a job of {runner} met the limit)"
    c.fail(Reason.RATE_LIMITED, msg, f"starts by itself after {at}")


def _disk(ask: _Ask, c: _Checks) -> None:
    """2d. NoSpace: a job started on a disk with no room would only be stopped again (and fill it further)."""
    if ask.snap.disk_low:
        c.fail(Reason.NO_SPACE, ask.snap.disk_low, "starts once there is room (`orchestrator clean ID` frees some)")
    else:
        c.ok("NoSpace", "the workspaces' disk has room")


def _base_moved(ask: _Ask, c: _Checks) -> None:
    """7b. Base moved. A job that runs alone starts on the current head anyway."""
    job, f, policy = ask.job, ask.f, ask.snap.policy
    moved = ask.snap.moved.get(job.id, frozenset())
    if job.kept:
        # Its work is in the worktree it kept, made from its base: it goes on there, and its landing merges.
        c.ok("BaseMoved", "a revision: goes on in its kept worktree from its own base; its landing merges")
    elif f.exclusive:
        c.ok("BaseMoved", "runs alone: starts on the current head")
    elif job.claim.source is ClaimSource.DECLARED:
        # A re-plan gives the same declared paths again, and leaving the queue to re-plan would let a later
        # job over the same paths overtake it: a declared job starts on the current head instead.
        c.ok("BaseMoved", "declared claim: starts on the current head (a re-plan would not change it)")
    elif moved is None:
        msg = f"{job.branch} moved since planning; the changed paths are unknown"
        c.fail(Reason.BASE_MOVED, msg, "re-plans on the new head", outcome=Outcome.REPLAN)
    elif not moved:
        c.ok("BaseMoved", f"{job.branch} has not moved since planning")
    else:
        changed, _ = claims.split_mergeable((canon(p) for p in moved), policy.mergeable, job.mergeable)
        hits = sorted(p for p in changed if f.claim_index.meets(p))
        named = chains.named(job, changed)
        if hits:
            msg = f"{job.branch} moved in {_n(len(hits), 'claimed path')} since planning: {plist(hits)}"
            c.fail(Reason.BASE_MOVED, msg, "re-plans on the new head", paths=hits, outcome=Outcome.REPLAN)
        elif named:
            msg = f"{job.branch} moved in {_n(len(named), 'path')} its text names as new since planning: {plist(named)}"
            c.fail(Reason.BASE_MOVED, msg, "re-plans on the new head", paths=named, outcome=Outcome.REPLAN)
        else:
            c.ok("BaseMoved", f"{job.branch} moved in {_n(len(moved), 'path')} since planning, none claimed")


def _exclusive(ask: _Ask, c: _Checks) -> None:
    """4. An active job of the repo runs alone."""
    alone = [a for a in ask.repo_active if a.exclusive]
    if alone:
        ids = [a.job.id for a in alone]
        if len(alone) == 1:
            msg = f"job {ids[0]} runs alone in repo ({alone[0].alone_reason})"
        else:
            msg = f"{len(alone)} active jobs run alone in repo: {_jobs(ids, bare=True)}"
        c.fail(Reason.EXCLUSIVE, msg, f"waits for {_jobs(ids)} to land", ids)
    else:
        c.ok("Exclusive", "no active job in repo runs alone")


def _runs_alone(ask: _Ask, c: _Checks) -> None:
    """5. It must run alone: Ambiguous, Barrier."""
    f, job, policy = ask.f, ask.job, ask.snap.policy
    wait_alone = f"waits to run alone: {ask.in_repo}"
    if f.ambiguous is None:
        c.ok(
            "Ambiguous", f"claim is specific: {_n(len(job.claim.paths), 'path')}, confidence {job.claim.confidence:.2f}"
        )
    elif ask.repo_active:
        msg = f"claim is ambiguous ({f.ambiguous}): runs alone, {ask.in_repo}"
        c.fail(Reason.AMBIGUOUS, msg, wait_alone, ask.repo_ids)
    else:
        c.ok("Ambiguous", f"claim is ambiguous ({f.ambiguous}): runs alone, no active job in repo")
    if not f.barriers:
        c.ok("Barrier", "touches no barrier path" if policy.barriers else "no barrier paths configured")
    elif ask.repo_active:
        msg = f"touches barrier {plist(f.barriers)}: runs alone, {ask.in_repo}"
        c.fail(Reason.BARRIER, msg, wait_alone, ask.repo_ids, f.barriers)
    else:
        c.ok("Barrier", f"touches barrier {plist(f.barriers)}: runs alone, no active job in repo")


def _overlap(ask: _Ask, c: _Checks) -> None:
    """6. Overlap with what active jobs claim or have touched."""
    f, active = ask.f, ask.active
    owners, met = active.meeting(f) if active is not None else (set(), set())
    ask.shared = active.merged.meeting(f.claim_merge) if active is not None and active.merged else frozenset()
    ask.owners = frozenset(owners)
    if owners:
        ids = sorted(owners)
        shown = ", ".join(
            f"job {a.job.id} ({plist(_held_meeting(a, f), 2)})"
            for a in [a for a in ask.repo_active if a.job.id in owners][:4]
        )
        more = f" and {len(ids) - 4} more" if len(ids) > 4 else ""
        msg = f"claim meets {len(ids)} of {ask.in_repo}: {shown}{more}"
        c.fail(Reason.OVERLAP, msg, f"waits for {_jobs(ids)} to land", ids, sorted(met))
    else:
        disjoint = f"claim is disjoint from {ask.in_repo}{_shared_note(ask.shared)}"
        c.ok("Overlap", disjoint if ask.repo_active else "no active job in repo")


def _risk(ask: _Ask, c: _Checks) -> None:
    """6b. Disjoint claims that may still make a conflict the landing cannot merge: the estimated risk beside each
    active job (`core.risk`: the chance they meet times the chance such a meeting would not merge), which `plan.risk`
    bounds pair by pair."""
    f = ask.f
    if f.risk_limit <= 0:
        c.ok("Risk", "risk not weighed (plan.risk = 0)")
        return
    if f.exclusive:
        c.ok("Risk", "runs alone: no risk beside others to weigh")
        return
    others = [a for a in ask.repo_active if not a.exclusive and a.job.id not in ask.owners]
    beside = [(risk(f, a, a.held), a) for a in others if f.escapes is not None or a.escapes is not None]
    if not beside:
        c.ok("Risk", "no estimate to weigh")
        return
    ask.risks = tuple((a.job.id, r.logit, r.meet, r.nonmerge, r.raw) for r, a in beside)
    too_risky = [(r, a) for r, a in beside if r.risk > f.risk_limit]
    if too_risky:
        r, a = max(too_risky, key=lambda t: t[0].risk)
        ids = sorted(a.job.id for _, a in too_risky)
        more = f" (and {len(ids) - 1} more)" if len(ids) > 1 else ""
        c.fail(
            Reason.RISK,
            f"risk {r} > {f.risk_limit:.1%} beside job {a.job.id}{more}",
            f"waits for {_jobs(ids)} to land",
            ids,
        )
        return
    ask.beside = r, a = max(beside, key=lambda t: t[0].risk)
    c.ok("Risk", _within_limit(r, a, f.risk_limit))


def _within_limit(r: PairRisk, a: Facts, limit: float) -> str:
    return f"risk {r} \u2264 {limit:.1%}: beside job {a.job.id}"


def _priority(ask: _Ask, c: _Checks) -> None:
    """7. Earlier waiting jobs it conflicts with go first (and earlier jobs that keep their place)."""
    f = ask.f
    waiting = ask.st.waiting.get(ask.job.repo)
    early: list[int] = []
    early_paths: list[str] = []
    passed: list[int] = []
    beyond = False
    if waiting is not None:
        early, early_paths, beyond, passed = waiting.earlier(f, ask.st.active.get(ask.job.repo))
    if not early:
        if passed:
            c.ok("Priority", f"starts before {_jobs(passed)} (at risk beside it), held back by an earlier job anyway")
        else:
            c.ok("Priority", "no earlier waiting job in repo conflicts with it")
        return
    count = ("at least " if beyond else "") + _n(len(early), "earlier waiting job")
    if f.exclusive:
        msg = f"runs alone after {count} in repo: {_jobs(early, bare=True)}"
    else:
        over = f" (over {plist(early_paths)})" if early_paths else ""
        msg = f"{count} in repo go{'es' if len(early) == 1 else ''} first: {_jobs(early, bare=True)}{over}"
    kept = [i for i in early if i in ask.st.held]
    nxt = f"waits for {_jobs(early)} to start"
    if kept:
        nxt += (
            f"; {_jobs(kept)} kept {'its' if len(kept) == 1 else 'their'} place after a stop: "
            f"`orchestrator retry {kept[0]}` runs it again, `orchestrator cancel {kept[0]}` gives the place up"
        )
    c.fail(Reason.PRIORITY, msg, nxt, early, early_paths)


def _landing(ask: _Ask, c: _Checks) -> None:
    """8. Landing in flight: transient (a landing takes a moment), so the durable reasons above come first."""
    job = ask.job
    if (job.repo, job.branch) in ask.snap.landing:
        msg = f"a landing into {job.branch} is in flight"
        c.fail(Reason.LANDING, msg, f"waits for the landing into {job.branch} to finish")
    else:
        c.ok("Landing", f"no landing into {job.branch} in flight")


def _capacity(ask: _Ask, c: _Checks) -> None:
    """9. Capacity: the global and the per-repo limit of active jobs."""
    policy, st = ask.snap.policy, ask.st
    taking = [a.job.id for a in ask.repo_active if st.takes_slot(a.job)]
    n_repo = len(taking)
    limit, per_repo = policy.max_concurrent, ask.snap.slots.get(ask.job.repo, policy.per_repo)
    if st.count >= limit:
        msg = (
            f"{max(limit - st.count, 0)}/{limit} slots free: {_n(st.count, 'active job')} (MAX_CONCURRENT_JOBS={limit})"
        )
        c.fail(Reason.CONCURRENCY, msg, "waits for a free slot", st.active_ids())
    elif n_repo >= per_repo:
        msg = (
            f"{max(per_repo - n_repo, 0)}/{per_repo} repo slots free: {_n(n_repo, 'active job')} in repo "
            f"(per-repo limit {per_repo})"
        )
        c.fail(Reason.CONCURRENCY, msg, "waits for a free slot in repo", taking)
    else:
        c.ok("Concurrency", f"{limit - st.count}/{limit} slots free, {per_repo - n_repo}/{per_repo} in repo")


CHECKS = (
    _dependencies,
    _paused,
    _rate_limited,
    _disk,
    _exclusive,
    _runs_alone,
    _overlap,
    _risk,
    _priority,
    _base_moved,
    _landing,
    _capacity,
)
"""The checks in order: the first that fails gives the reason (see the module docstring); all are kept for `why`."""


def _held_meeting(a: Facts, f: Facts) -> list[str]:
    """The paths active job `a` holds that meet the claim of `f` (for the message: what it holds)."""
    return sorted(p for p in a.held if f.claim_index.meets(p))


# ---------------------------------------------------------------------------------------- wording


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _of(part: int, whole: int, noun: str) -> str:
    return _n(part, noun) if part == whole else f"{part} of {_n(whole, noun)}"


def _jobs(ids: Iterable[int], *, bare: bool = False, limit: int = 5) -> str:
    """`job 4` / `jobs 4, 7` / `jobs 1, 2, 3, 4, 5 and 12 more`; bare drops the word when counted already."""
    ids = list(ids)
    shown = ", ".join(str(i) for i in ids[:limit])
    if len(ids) > limit:
        shown += f" and {len(ids) - limit} more"
    if bare and len(ids) > 1:
        return shown
    return f"{'job' if len(ids) == 1 else 'jobs'} {shown}"


def _they(ids: list[int]) -> str:
    return "it has" if len(ids) == 1 else "they have"


def _shared_note(shared: Iterable[str]) -> str:
    shared = sorted(shared)
    return f"; shares {plist(shared)} (union-merged)" if shared else ""
