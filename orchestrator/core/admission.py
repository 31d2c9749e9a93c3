"""Admission: may a waiting job start now, beside the active jobs of its repo? Pure, no I/O.

`decide(job, snapshot)` evaluates every check (each becomes a `Check` for `orchestrator why`); the first
failing one, in this order, gives the reason and the outcome:

 1. DependencyFailed (fail)  a job it runs after ended without landing
 2. Dependency               a job it runs after has not landed yet
 2b. Paused                  its repo, or the whole daemon, is paused (`orchestrator pause`)
 3. BaseMoved (re-plan)      its branch moved in claimed paths (or unknown paths) since it was planned
 4. Exclusive                an active job of its repo runs alone
 5. Ambiguous / Barrier      it must run alone, and its repo has active jobs
 6. Overlap                  its claim meets what an active job of its repo claims or has touched
 6b. Risk                    its claim is disjoint, but the estimated chance that it and an active job
                             still touch a common path is above `Policy.risk` (`core.risk`)
 7. Priority                 an earlier waiting job of its repo that it conflicts with goes first
 8. Landing                  a landing into its target branch is in flight (transient, so reported
                             only when nothing more durable holds the job back)
 9. Concurrency              the global or per-repo limit of active jobs is reached

A job "runs alone" (is exclusive) when its claim is ambiguous (`claims.ambiguity`) or its claim or
actual paths reach a barrier (`claims.reaches`). Union-mergeable paths (changelogs) never count as an
overlap; those it shares with active jobs are reported in `Decision.shared`.

Priority is what keeps the order fair: a later job never overtakes an earlier waiting job it conflicts
with (overlapping claims, or a risk above `Policy.risk` among the first `RISK_SCAN` earlier jobs). Only
*ready* waiting jobs (every job they run after has landed) hold a place in that order; a job still
waiting for a dependency would otherwise block the very job it waits for.

Speed: per-job facts are cached on the (hashable, frozen) `JobView`, and per-snapshot indexes on the
snapshot object, so many `decide` calls on one snapshot are cheap; `decide_all` builds its index
incrementally as it walks the queue.
"""

from __future__ import annotations

import weakref
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from functools import lru_cache
from operator import itemgetter
from typing import TypeVar

from orchestrator.core import claims
from orchestrator.core.claims import ClaimError, PathIndex, name_of
from orchestrator.core.models import (
    ALL_REPOS,
    ROOT,
    Check,
    ClaimSource,
    Decision,
    JobView,
    Outcome,
    Policy,
    Reason,
    Snapshot,
)
from orchestrator.core.risk import Escapes, pair_risk

__all__ = ["clear_caches", "decide", "decide_all", "iter_decisions", "runs_alone"]

OrderKey = tuple[int, int]
BLOCKING_LIMIT = 20
"""At most this many earlier waiting jobs are listed as blocking a job (Priority): the first in order."""
RISK_SCAN = 64
"""Earlier waiting jobs with a risk estimate that the Priority check weighs a job's risk against (bounded, so
a long queue of such jobs costs no more per job)."""
_id = itemgetter(1)  # the job id of an order key
K = TypeVar("K")


# ---------------------------------------------------------------------------------------------- facts


def _canon(path: str) -> str:
    try:
        return claims.normalize(path)
    except ClaimError:
        # A path we cannot place may be anywhere: treat it as the root, which overlaps everything.
        return ROOT


@dataclass(frozen=True, slots=True, eq=False)
class _Facts:
    """What admission derives from one job under one policy (cached: JobView and Policy are frozen)."""

    job: JobView
    counted: frozenset[str]
    """Claim minus mergeable paths: what it asks for."""
    held: frozenset[str]
    """Claim and actual minus mergeable paths: what it holds while active."""
    claim_merge: frozenset[str]
    held_merge: frozenset[str]
    claim_index: PathIndex
    names: frozenset[str]
    """Names (`name_of`) of the counted paths."""
    under: frozenset[str]
    """Strict ancestors of `names`."""
    held_names: frozenset[str]
    held_under: frozenset[str]
    globs: tuple[str, ...]
    """Counted paths that are patterns (kept out of `names`: they meet by matching, see `claims.overlaps`)."""
    held_globs: tuple[str, ...]
    ambiguous: str | None
    barriers: tuple[str, ...]
    """Its claim or actual paths that reach a barrier pattern, sorted."""
    exclusive: bool
    """It runs alone: ambiguous, or touching a barrier."""
    escapes: Escapes | None
    """Its risk estimate, indexed (None: none, its claim stands as given); used only when `Policy.risk` > 0."""
    risk_limit: float
    """`Policy.risk`: the highest pairwise risk it may run beside."""

    @property
    def alone_reason(self) -> str:
        return self.ambiguous or f"barrier {_plist(self.barriers, 2)}"


def _facts(job: JobView, policy: Policy) -> _Facts:
    try:
        return _cached_facts(job, policy)
    except TypeError:  # a field given as a list or set: unhashable, so derive without the cache
        return _derive_facts(job, policy)


def _derive_facts(job: JobView, policy: Policy) -> _Facts:
    claim_paths = frozenset(_canon(p) for p in job.claim.paths)
    touched = claim_paths | frozenset(_canon(p) for p in job.actual)
    counted, claim_merge = claims.split_mergeable(claim_paths, policy.mergeable, job.mergeable)
    held, held_merge = claims.split_mergeable(touched, policy.mergeable, job.mergeable)
    names = frozenset(name_of(p) for p in counted if not claims.is_glob(p))
    held_names = frozenset(name_of(p) for p in held if not claims.is_glob(p))
    ambiguous = claims.ambiguity(replace(job.claim, paths=claim_paths), policy, job.repo)
    barriers = tuple(sorted(p for p in touched if claims.reaches(p, policy.barriers))) if policy.barriers else ()
    return _Facts(
        job=job,
        counted=counted,
        held=held,
        claim_merge=claim_merge,
        held_merge=held_merge,
        claim_index=PathIndex(counted),
        names=names,
        under=frozenset(a for n in names for a in claims.ancestors(n)),
        held_names=held_names,
        held_under=frozenset(a for n in held_names for a in claims.ancestors(n)),
        globs=tuple(sorted(p for p in counted if claims.is_glob(p))),
        held_globs=tuple(sorted(p for p in held if claims.is_glob(p))),
        ambiguous=ambiguous,
        barriers=barriers,
        exclusive=ambiguous is not None or bool(barriers),
        escapes=Escapes.of(job.claim.risk) if policy.risk > 0 else None,
        risk_limit=policy.risk,
    )


_cached_facts = lru_cache(maxsize=16384)(_derive_facts)


def runs_alone(job: JobView, policy: Policy) -> str | None:
    """Why `job` must run alone in its repo (ambiguous claim, barrier path), or None if it need not."""
    f = _facts(job, policy)
    return f.alone_reason if f.exclusive else None


def clear_caches() -> None:
    """Forget cached per-job facts and per-snapshot indexes (for benchmarks that measure cold calls)."""
    _cached_facts.cache_clear()
    _STATES.clear()


# ------------------------------------------------------------------------------------------ indexes


class _Waiting:
    """Ready waiting jobs of one repo, indexed for the Priority check. Jobs are added in `order_key` order."""

    __slots__ = ("exclusive", "globs", "keys", "names", "risky", "under")

    def __init__(self) -> None:
        self.keys: list[OrderKey] = []
        self.risky: list[_Facts] = []
        """Non-exclusive jobs with a risk estimate, in order (the Priority check weighs risk against them)."""
        self.exclusive: list[OrderKey] = []
        self.globs: list[tuple[str, OrderKey]] = []
        """Claimed patterns with their job's key: rare, so tested one by one."""
        self.names: dict[str, list[OrderKey]] = {}
        """name → keys of jobs that claim it."""
        self.under: dict[str, list[OrderKey]] = {}
        """name → keys of jobs that claim a path strictly under it."""

    def add(self, f: _Facts) -> None:
        key = f.job.order_key
        self.keys.append(key)
        if f.exclusive:
            self.exclusive.append(key)
        for n in f.names:
            self.names.setdefault(n, []).append(key)
        for a in f.under:
            self.under.setdefault(a, []).append(key)
        self.globs.extend((g, key) for g in f.globs)
        if f.escapes is not None and not f.exclusive:
            self.risky.append(f)

    def earlier(self, f: _Facts) -> tuple[list[int], list[str], bool]:
        """The earlier jobs that block `f`: the first `BLOCKING_LIMIT` ids (sorted), the paths of `f` that
        meet them, and whether more block it than are listed. Bounded, so a long queue costs no more per job.
        """
        key = f.job.order_key
        if f.exclusive:
            cut = bisect_left(self.keys, key)
            return sorted(map(_id, self.keys[: min(cut, BLOCKING_LIMIT)])), [], cut > BLOCKING_LIMIT
        cut = bisect_left(self.exclusive, key)
        found = set(self.exclusive[: min(cut, BLOCKING_LIMIT)])
        more = cut > BLOCKING_LIMIT
        hit_paths = []
        for p in sorted(f.counted):
            buckets = _glob_buckets(p, self.names, self.globs)
            if not claims.is_glob(p):
                n = name_of(p)
                buckets += [self.names.get(n), self.under.get(n)]
                buckets.extend(self.names.get(a) for a in claims.ancestors(n))
            hit = False
            for bucket in buckets:
                if bucket:
                    cut = bisect_left(bucket, key)
                    if cut:
                        # The first BLOCKING_LIMIT of each bucket hold the first BLOCKING_LIMIT of their union.
                        found.update(bucket[: min(cut, BLOCKING_LIMIT)])
                        more = more or cut > BLOCKING_LIMIT
                        hit = True
            if hit:
                hit_paths.append(p)
        if f.escapes is not None or self.risky:
            found.update(_risky_earlier(f, self.risky, key))
        first = sorted(found)
        if len(first) > BLOCKING_LIMIT:
            first, more = first[:BLOCKING_LIMIT], True
        return sorted(map(_id, first)), hit_paths, more


def _risky_earlier(f: _Facts, risky: list[_Facts], key: OrderKey) -> list[OrderKey]:
    """Keys of the earlier waiting jobs (the first RISK_SCAN with an estimate) whose risk beside `f` is above
    the policy's (their claims only: they have touched nothing yet)."""
    out = []
    for w in risky[:RISK_SCAN]:
        if w.job.order_key >= key:
            break
        if _risk(f, w, w.counted) > f.risk_limit:
            out.append(w.job.order_key)
    return out


def _risk(f: _Facts, other: _Facts, held: frozenset[str]) -> float:
    """The chance that `f` and `other` (holding `held`) touch a common path (`core.risk`)."""
    if f.escapes is None and other.escapes is None:
        return 0.0
    return pair_risk(f.escapes, f.counted, other.escapes, held)


class _Active:
    """Active jobs of one repo, with what they hold indexed by name for the Overlap check."""

    __slots__ = ("globs", "jobs", "merged", "names", "under")

    def __init__(self) -> None:
        self.jobs: list[_Facts] = []
        self.globs: list[tuple[str, int]] = []
        """Held patterns with their job's id."""
        self.names: dict[str, list[int]] = {}
        """name → ids of jobs that hold it."""
        self.under: dict[str, list[int]] = {}
        """name → ids of jobs that hold a path strictly under it."""
        self.merged = PathIndex()
        """Mergeable paths any of them claims or touched."""

    def add(self, f: _Facts) -> None:
        self.jobs.append(f)
        self.jobs.sort(key=lambda a: a.job.id)
        for n in f.held_names:
            self.names.setdefault(n, []).append(f.job.id)
        for a in f.held_under:
            self.under.setdefault(a, []).append(f.job.id)
        for p in f.held_merge:
            self.merged.add(p)
        self.globs.extend((g, f.job.id) for g in f.held_globs)

    def meeting(self, f: _Facts) -> tuple[set[int], set[str]]:
        """Ids of the jobs whose held paths meet the counted claim of `f`, and the paths of `f` that meet them."""
        owners: set[int] = set()
        met: set[str] = set()
        names, under = self.names, self.under
        for p in f.counted:
            buckets = _glob_buckets(p, names, self.globs)
            if not claims.is_glob(p):
                n = name_of(p)
                buckets += [names.get(n), under.get(n), *(names.get(a) for a in claims.ancestors(n))]
            hit = False
            for ids in buckets:
                if ids:
                    owners.update(ids)
                    hit = True
            if hit:
                met.add(p)
        return owners, met


def _glob_buckets(path: str, names: dict[str, list[K]], globs: list[tuple[str, K]]) -> list[list[K] | None]:
    """Entries a path meets by pattern: held patterns that meet it, and (for a pattern) held names it meets."""
    out: list[list[K] | None] = [[k] for g, k in globs if claims.overlaps(path, g)]
    if claims.is_glob(path):
        out += [keys for n, keys in names.items() if claims.overlaps(n, path)]
    return out


class _State:
    """Active jobs by repo and ready waiting jobs by repo. Holds no reference to the snapshot."""

    __slots__ = ("active", "count", "waiting")

    def __init__(self, snapshot: Snapshot) -> None:
        self.active: dict[str, _Active] = {}
        self.waiting: dict[str, _Waiting] = {}
        self.count = 0
        for job in snapshot.active:
            self.add_active(_facts(job, snapshot.policy))

    def add_active(self, f: _Facts) -> None:
        a = self.active.get(f.job.repo)
        if a is None:
            a = self.active[f.job.repo] = _Active()
        a.add(f)
        self.count += 1

    def add_waiting(self, f: _Facts) -> None:
        w = self.waiting.get(f.job.repo)
        if w is None:
            w = self.waiting[f.job.repo] = _Waiting()
        w.add(f)

    def active_ids(self) -> list[int]:
        return sorted(a.job.id for r in self.active.values() for a in r.jobs)


_STATES: dict[int, tuple[weakref.ref[Snapshot], _State]] = {}


def _state(snapshot: Snapshot) -> _State:
    """The full index of `snapshot` (all its ready waiting jobs), built once per snapshot object."""
    key = id(snapshot)
    hit = _STATES.get(key)
    if hit is not None and hit[0]() is snapshot:
        return hit[1]
    state = _State(snapshot)
    for job in sorted(snapshot.waiting, key=_order):
        if _ready(job, snapshot):
            state.add_waiting(_facts(job, snapshot.policy))

    def forget(ref: weakref.ref[Snapshot], key: int = key) -> None:
        entry = _STATES.get(key)
        if entry is not None and entry[0] is ref:
            del _STATES[key]

    _STATES[key] = (weakref.ref(snapshot, forget), state)
    return state


def _order(job: JobView) -> OrderKey:
    return job.order_key


def _ready(job: JobView, snapshot: Snapshot) -> bool:
    return all(i in snapshot.landed for i in job.after)


# --------------------------------------------------------------------------------------- decisions


def decide(job: JobView, snapshot: Snapshot) -> Decision:
    """Decide one waiting job against `snapshot` (its active jobs, and its waiting jobs ahead of `job`)."""
    return _decide(_facts(job, snapshot.policy), snapshot, _state(snapshot))


def decide_all(snapshot: Snapshot) -> list[Decision]:
    """Decide every waiting job in `order_key` order; each admitted job counts as active for the next."""
    return list(iter_decisions(snapshot))


def iter_decisions(snapshot: Snapshot) -> Iterator[Decision]:
    """`decide_all`, one decision at a time: a caller can act on an admission before the queue's tail is decided."""
    state = _State(snapshot)
    for job in sorted(snapshot.waiting, key=_order):
        f = _facts(job, snapshot.policy)
        d = _decide(f, snapshot, state)
        yield d
        if d.admitted:
            state.add_active(f)
        elif _ready(job, snapshot):
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


def _decide(f: _Facts, snap: Snapshot, st: _State) -> Decision:
    job, policy, c = f.job, snap.policy, _Checks()
    active = st.active.get(job.repo)
    repo_active = active.jobs if active is not None else []
    repo_ids = [a.job.id for a in repo_active]
    in_repo = f"{_n(len(repo_active), 'active job')} in repo"

    # 1-2. Dependencies.
    after = sorted(set(job.after))
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
    if pending:
        msg = f"waits for {_of(len(pending), len(after), 'job')} it runs after: {_jobs(pending, bare=True)}"
        c.fail(Reason.DEPENDENCY, msg, f"waits for {_jobs(pending)} to land", pending)
    else:
        c.ok("Dependency", f"{_n(len(after), 'job')} it runs after landed or ended" if after else "runs after no job")

    # 2b. Paused: nothing new starts in a paused repo (running jobs go on).
    if job.repo in snap.paused or ALL_REPOS in snap.paused:
        scope = "the daemon" if ALL_REPOS in snap.paused else "its repo"
        how = "`orchestrator resume" + ("`" if ALL_REPOS in snap.paused else f" --repo {job.repo}`")
        c.fail(Reason.PAUSED, f"{scope} is paused: nothing new starts", f"waits for {how}")
    else:
        c.ok("Paused", "not paused")

    # 3. Base moved. A job that runs alone starts on the current head anyway.
    moved = snap.moved.get(job.id, frozenset())
    if f.exclusive:
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
        changed, _ = claims.split_mergeable((_canon(p) for p in moved), policy.mergeable, job.mergeable)
        hits = sorted(p for p in changed if f.claim_index.meets(p))
        if hits:
            msg = f"{job.branch} moved in {_n(len(hits), 'claimed path')} since planning: {_plist(hits)}"
            c.fail(Reason.BASE_MOVED, msg, "re-plans on the new head", paths=hits, outcome=Outcome.REPLAN)
        else:
            c.ok("BaseMoved", f"{job.branch} moved in {_n(len(moved), 'path')} since planning, none claimed")

    # 4. An active job of the repo runs alone.
    alone = [a for a in repo_active if a.exclusive]
    if alone:
        ids = [a.job.id for a in alone]
        if len(alone) == 1:
            msg = f"job {ids[0]} runs alone in repo ({alone[0].alone_reason})"
        else:
            msg = f"{len(alone)} active jobs run alone in repo: {_jobs(ids, bare=True)}"
        c.fail(Reason.EXCLUSIVE, msg, f"waits for {_jobs(ids)} to land", ids)
    else:
        c.ok("Exclusive", "no active job in repo runs alone")

    # 5. It must run alone.
    wait_alone = f"waits to run alone: {in_repo}"
    if f.ambiguous is None:
        c.ok(
            "Ambiguous", f"claim is specific: {_n(len(job.claim.paths), 'path')}, confidence {job.claim.confidence:.2f}"
        )
    elif repo_active:
        c.fail(Reason.AMBIGUOUS, f"claim is ambiguous ({f.ambiguous}): runs alone, {in_repo}", wait_alone, repo_ids)
    else:
        c.ok("Ambiguous", f"claim is ambiguous ({f.ambiguous}): runs alone, no active job in repo")
    if not f.barriers:
        c.ok("Barrier", "touches no barrier path" if policy.barriers else "no barrier paths configured")
    elif repo_active:
        msg = f"touches barrier {_plist(f.barriers)}: runs alone, {in_repo}"
        c.fail(Reason.BARRIER, msg, wait_alone, repo_ids, f.barriers)
    else:
        c.ok("Barrier", f"touches barrier {_plist(f.barriers)}: runs alone, no active job in repo")

    # 6. Overlap with what active jobs claim or have touched.
    owners, met = active.meeting(f) if active is not None else (set(), set())
    shared = active.merged.meeting(f.claim_merge) if active is not None and active.merged else frozenset()
    if owners:
        ids = sorted(owners)
        shown = ", ".join(
            f"job {a.job.id} ({_plist(_held_meeting(a, f), 2)})"
            for a in [a for a in repo_active if a.job.id in owners][:4]
        )
        more = f" and {len(ids) - 4} more" if len(ids) > 4 else ""
        msg = f"claim meets {len(ids)} of {in_repo}: {shown}{more}"
        c.fail(Reason.OVERLAP, msg, f"waits for {_jobs(ids)} to land", ids, sorted(met))
    else:
        c.ok(
            "Overlap",
            f"claim is disjoint from {in_repo}{_shared_note(shared)}" if repo_active else "no active job in repo",
        )

    # 6b. Disjoint claims that may still meet: the estimated risk beside each active job.
    beside = _beside(f, [a for a in repo_active if not a.exclusive and a.job.id not in owners])
    too_risky = [(r, a) for r, a in beside if r > f.risk_limit]
    if too_risky:
        r, a = max(too_risky, key=lambda t: t[0])
        ids = sorted(a.job.id for _, a in too_risky)
        msg = f"risk {r:.1%} > {f.risk_limit:.1%} beside job {a.job.id}" + (
            f" (and {len(ids) - 1} more)" if len(ids) > 1 else ""
        )
        c.fail(Reason.RISK, msg, f"waits for {_jobs(ids)} to land", ids)
    elif beside:
        r, a = max(beside, key=lambda t: t[0])
        c.ok("Risk", f"risk {r:.1%} \u2264 {f.risk_limit:.1%}: beside job {a.job.id}")
    else:
        c.ok("Risk", "no estimate to weigh" if f.risk_limit > 0 else "risk not weighed (plan.risk = 0)")

    # 7. Earlier waiting jobs it conflicts with go first.
    waiting = st.waiting.get(job.repo)
    early, early_paths, more = waiting.earlier(f) if waiting is not None else ([], [], False)
    if early:
        count = ("at least " if more else "") + _n(len(early), "earlier waiting job")
        if f.exclusive:
            msg = f"runs alone after {count} in repo: {_jobs(early, bare=True)}"
        else:
            over = f" (over {_plist(early_paths)})" if early_paths else ""
            msg = f"{count} in repo go{'es' if len(early) == 1 else ''} first: {_jobs(early, bare=True)}{over}"
        c.fail(Reason.PRIORITY, msg, f"waits for {_jobs(early)} to start", early, early_paths)
    else:
        c.ok("Priority", "no earlier waiting job in repo conflicts with it")

    # 8. Landing in flight: transient (a landing takes a moment), so the durable reasons above come first.
    if (job.repo, job.branch) in snap.landing:
        msg = f"a landing into {job.branch} is in flight"
        c.fail(Reason.LANDING, msg, f"waits for the landing into {job.branch} to finish")
    else:
        c.ok("Landing", f"no landing into {job.branch} in flight")

    # 9. Capacity.
    limit, per_repo = policy.max_concurrent, snap.slots.get(job.repo, policy.per_repo)
    if st.count >= limit:
        msg = (
            f"{max(limit - st.count, 0)}/{limit} slots free: {_n(st.count, 'active job')} (MAX_CONCURRENT_JOBS={limit})"
        )
        c.fail(Reason.CONCURRENCY, msg, "waits for a free slot", st.active_ids())
    elif len(repo_active) >= per_repo:
        msg = f"{max(per_repo - len(repo_active), 0)}/{per_repo} repo slots free: {in_repo} (per-repo limit {per_repo})"
        c.fail(Reason.CONCURRENCY, msg, "waits for a free slot in repo", repo_ids)
    else:
        c.ok("Concurrency", f"{limit - st.count}/{limit} slots free, {per_repo - len(repo_active)}/{per_repo} in repo")

    shared_paths = tuple(sorted(shared))
    if (v := c.verdict) is not None:
        return Decision(
            job.id, v.outcome, v.reason, v.message, v.blocking, v.paths, shared_paths, v.next, tuple(c.checks)
        )
    if f.exclusive:
        msg = f"admitted to run alone ({f.alone_reason})"
    elif repo_active:
        msg = f"admitted beside {in_repo}, claim disjoint{_shared_note(shared)}"
        if beside:
            r, a = max(beside, key=lambda t: t[0])
            msg += f"; risk {r:.1%} \u2264 {f.risk_limit:.1%}: beside job {a.job.id}"
    else:
        msg = f"admitted: no active job in repo{_shared_note(shared)}"
    return Decision(job.id, Outcome.ADMIT, Reason.ADMITTED, msg, (), (), shared_paths, "starts now", tuple(c.checks))


def _beside(f: _Facts, others: list[_Facts]) -> list[tuple[float, _Facts]]:
    """The estimated risk of `f` beside each active job that has or meets an estimate (none when
    `Policy.risk` is 0)."""
    if f.risk_limit <= 0:
        return []
    return [(_risk(f, a, a.held), a) for a in others if f.escapes is not None or a.escapes is not None]


def _held_meeting(a: _Facts, f: _Facts) -> list[str]:
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


def _plist(paths: Iterable[str], limit: int = 3) -> str:
    paths = [p or "/" for p in paths]
    shown = ", ".join(paths[:limit])
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


def _shared_note(shared: Iterable[str]) -> str:
    shared = sorted(shared)
    return f"; shares {_plist(shared)} (union-merged)" if shared else ""
