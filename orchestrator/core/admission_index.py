"""What admission derives from a queue, kept so that deciding many jobs on one snapshot is cheap. Pure, no I/O.

- `facts(job, policy)`: one job's counted and held paths, their indexes, whether it runs alone; cached per
  (frozen) `JobView` and `Policy`.
- `State`: a snapshot's active jobs by repo (`Active`, for the Overlap check) and its ready waiting jobs by repo
  (`Waiting`, for the Priority check), built once per snapshot object (`state_of`) or incrementally as
  `admission.iter_decisions` walks the queue.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import lru_cache
from operator import itemgetter
from typing import TypeVar

from orchestrator.core import claims
from orchestrator.core.claims import ClaimError, PathIndex, name_of
from orchestrator.core.models import ROOT, JobView, Policy, Snapshot
from orchestrator.core.risk import NONE, Escapes, PairRisk, pair_risk
from orchestrator.core.snapcache import PerSnapshot

OrderKey = tuple[int, float, int]
BLOCKING_LIMIT = 20
"""At most this many earlier waiting jobs are listed as blocking a job (Priority): the first in order."""
RISK_SCAN = 64
"""Earlier waiting jobs with a risk estimate that the Priority check weighs a job's risk against (bounded, so
a long queue of such jobs costs no more per job)."""
_id = itemgetter(2)  # the job id of an order key
K = TypeVar("K")


# ---------------------------------------------------------------------------------------------- facts


def canon(path: str) -> str:
    try:
        return claims.normalize(path)
    except ClaimError:
        # A path we cannot place may be anywhere: treat it as the root, which overlaps everything.
        return ROOT


@dataclass(frozen=True, slots=True, eq=False)
class Facts:
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
    """Names (`name_of`) of the counted paths (not its additions: another's new file never meets them)."""
    under: frozenset[str]
    """Strict ancestors of `names` and of its additions (a directory claim meets a new file in it)."""
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
        return self.ambiguous or f"barrier {plist(self.barriers, 2)}"


def facts(job: JobView, policy: Policy) -> Facts:
    try:
        return _cached_facts(job, policy)
    except TypeError:  # a field given as a list or set: unhashable, so derive without the cache
        return derive_facts(job, policy)


def derive_facts(job: JobView, policy: Policy) -> Facts:
    claim_paths = frozenset(canon(p) for p in job.claim.paths)
    touched = claim_paths | frozenset(canon(p) for p in job.actual)
    counted, claim_merge = claims.split_mergeable(claim_paths, policy.mergeable, job.mergeable)
    held, held_merge = claims.split_mergeable(touched, policy.mergeable, job.mergeable)
    names = frozenset(name_of(p) for p in counted if not claims.is_glob(p) and not claims.is_addition(p))
    held_names = frozenset(name_of(p) for p in held if not claims.is_glob(p) and not claims.is_addition(p))
    added = frozenset(name_of(p) for p in counted if claims.is_addition(p))
    held_added = frozenset(name_of(p) for p in held if claims.is_addition(p))
    ambiguous = claims.ambiguity(replace(job.claim, paths=claim_paths), policy, job.repo)
    barriers = tuple(sorted(p for p in touched if claims.reaches(p, policy.barriers))) if policy.barriers else ()
    return Facts(
        job=job,
        counted=counted,
        held=held,
        claim_merge=claim_merge,
        held_merge=held_merge,
        claim_index=PathIndex(counted),
        names=names,
        under=frozenset(a for n in names | added for a in claims.ancestors(n)),
        held_names=held_names,
        held_under=frozenset(a for n in held_names | held_added for a in claims.ancestors(n)),
        globs=tuple(sorted(p for p in counted if claims.is_glob(p))),
        held_globs=tuple(sorted(p for p in held if claims.is_glob(p))),
        ambiguous=ambiguous,
        barriers=barriers,
        exclusive=ambiguous is not None or bool(barriers),
        escapes=Escapes.of(job.claim.risk) if policy.risk > 0 else None,
        risk_limit=policy.risk,
    )


_cached_facts = lru_cache(maxsize=16384)(derive_facts)


def clear_caches() -> None:
    """Forget cached per-job facts and per-snapshot indexes (for benchmarks that measure cold calls)."""
    _cached_facts.cache_clear()
    _STATES.clear()


# ------------------------------------------------------------------------------------------ indexes


class Waiting:
    """Ready waiting jobs of one repo, indexed for the Priority check. Jobs are added in `order_key` order."""

    __slots__ = ("behind", "exclusive", "globs", "keys", "names", "risky", "under")

    def __init__(self) -> None:
        self.keys: list[OrderKey] = []
        self.risky: list[Facts] = []
        """Non-exclusive jobs with a risk estimate, in order (the Priority check weighs risk against them)."""
        self.exclusive: list[OrderKey] = []
        self.globs: list[tuple[str, OrderKey]] = []
        """Claimed patterns with their job's key: rare, so tested one by one."""
        self.names: dict[str, list[OrderKey]] = {}
        """name → keys of jobs that claim it."""
        self.under: dict[str, list[OrderKey]] = {}
        """name → keys of jobs that claim a path strictly under it."""
        self.behind: dict[int, set[OrderKey]] = {}
        """job id → keys of the jobs that land after it (`JobView.land_after`): they never hold it back, or each
        would wait for the other."""

    def add(self, f: Facts) -> None:
        key = f.job.order_key
        self.keys.append(key)
        for i in f.job.land_after:
            self.behind.setdefault(i, set()).add(key)
        if f.exclusive:
            self.exclusive.append(key)
        for n in f.names:
            self.names.setdefault(n, []).append(key)
        for a in f.under:
            self.under.setdefault(a, []).append(key)
        self.globs.extend((g, key) for g in f.globs)
        if f.escapes is not None and not f.exclusive:
            self.risky.append(f)

    def earlier(self, f: Facts, active: Active | None = None) -> tuple[list[int], list[str], bool, list[int]]:
        """The earlier jobs that block `f`: the first `BLOCKING_LIMIT` ids (sorted), the paths of `f` that
        meet them, whether more block it than are listed, and the ids of the earlier jobs it may start
        before although at risk beside them. Bounded, so a long queue costs no more per job.

        An earlier job `f` is only at risk beside (claims disjoint) does not block it while an earlier
        job of the repo among `active` holds that one back anyway (`held_back`): `f` fills a slot that
        would idle. Never while only jobs that started after it hold it back, so it waits at most for the
        jobs that started while it could not.
        """
        key = f.job.order_key
        waiting_for_f = self.behind.get(f.job.id, set())
        if f.exclusive:
            cut = bisect_left(self.keys, key)
            first = [k for k in self.keys[:cut] if k not in waiting_for_f]
            return sorted(map(_id, first[:BLOCKING_LIMIT])), [], len(first) > BLOCKING_LIMIT, []
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
        passed: list[int] = []
        if f.escapes is not None or self.risky:
            for w in _risky_earlier(f, self.risky, key):
                if held_back(w, active):
                    passed.append(w.job.id)
                else:
                    found.add(w.job.order_key)
        first = sorted(found - waiting_for_f)
        if len(first) > BLOCKING_LIMIT:
            first, more = first[:BLOCKING_LIMIT], True
        return sorted(map(_id, first)), hit_paths, more, passed


def _risky_earlier(f: Facts, risky: list[Facts], key: OrderKey) -> list[Facts]:
    """The earlier waiting jobs (the first RISK_SCAN with an estimate) whose risk beside `f` is above the
    policy's (their claims only: they have touched nothing yet)."""
    out = []
    for w in risky[:RISK_SCAN]:
        if w.job.order_key >= key:
            break
        if risk(f, w, w.counted).risk > f.risk_limit:
            out.append(w)
    return out


def held_back(w: Facts, active: Active | None) -> bool:
    """Whether an active job queued before waiting job `w` keeps it from starting now: one of them runs
    alone, holds a path `w` claims, or is at risk beside it above the policy's."""
    earlier = [a for a in active.jobs if a.job.order_key < w.job.order_key] if active is not None else []
    if not earlier:
        return False
    if w.exclusive or any(a.exclusive for a in earlier):
        return True
    assert active is not None
    owners, _ = active.meeting(w)
    return any(
        a.job.id in owners
        or ((a.escapes is not None or w.escapes is not None) and risk(w, a, a.held).risk > w.risk_limit)
        for a in earlier
    )


def risk(f: Facts, other: Facts, held: frozenset[str]) -> PairRisk:
    """The risk that `f` and `other` (holding `held`) make a conflict the landing cannot merge (`core.risk`)."""
    if f.escapes is None and other.escapes is None:
        return NONE
    return pair_risk(f.escapes, f.counted, other.escapes, held)


class Active:
    """Active jobs of one repo, with what they hold indexed by name for the Overlap check."""

    __slots__ = ("globs", "jobs", "merged", "names", "under")

    def __init__(self) -> None:
        self.jobs: list[Facts] = []
        self.globs: list[tuple[str, int]] = []
        """Held patterns with their job's id."""
        self.names: dict[str, list[int]] = {}
        """name → ids of jobs that hold it."""
        self.under: dict[str, list[int]] = {}
        """name → ids of jobs that hold a path strictly under it."""
        self.merged = PathIndex()
        """Mergeable paths any of them claims or touched."""

    def add(self, f: Facts) -> None:
        self.jobs.append(f)
        self.jobs.sort(key=lambda a: a.job.id)
        for n in f.held_names:
            self.names.setdefault(n, []).append(f.job.id)
        for a in f.held_under:
            self.under.setdefault(a, []).append(f.job.id)
        for p in f.held_merge:
            self.merged.add(p)
        self.globs.extend((g, f.job.id) for g in f.held_globs)

    def meeting(self, f: Facts) -> tuple[set[int], set[str]]:
        """Ids of the jobs whose held paths meet the counted claim of `f`, and the paths of `f` that meet them.

        A new file `f` adds (`claims.addition`) meets no active job's directory: that job (a release folding the
        directory) started first, so it folds what its base has, and the new file is the next one's to fold. The
        other way round holds: a release waits for the active jobs adding files to what it folds, and a later job
        adding one waits for a release still waiting (Priority), so it never overtakes it."""
        owners: set[int] = set()
        met: set[str] = set()
        names, under = self.names, self.under
        for p in f.counted:
            buckets = _glob_buckets(p, names, self.globs)
            if not claims.is_glob(p) and not claims.is_addition(p):
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


class State:
    """Active jobs by repo and ready waiting jobs by repo. Holds no reference to the snapshot."""

    __slots__ = ("active", "count", "elsewhere", "held", "waiting")

    def __init__(self, snapshot: Snapshot) -> None:
        self.active: dict[str, Active] = {}
        self.waiting: dict[str, Waiting] = {}
        self.held = frozenset(j.id for j in snapshot.held)
        self.elsewhere = frozenset(j.id for j in snapshot.elsewhere)
        """Other nodes' active jobs: in `active` (they hold paths), not in `count` (they take no slot here)."""
        self.count = 0
        """Active jobs that take one of this node's slots (not the other nodes' jobs, nor resting ones)."""
        for job in snapshot.active:
            self.add_active(facts(job, snapshot.policy), slot=not job.resting)
        for job in snapshot.elsewhere:
            self.add_active(facts(job, snapshot.policy), slot=False)

    def add_active(self, f: Facts, *, slot: bool = True) -> None:
        a = self.active.get(f.job.repo)
        if a is None:
            a = self.active[f.job.repo] = Active()
        a.add(f)
        self.count += slot

    def add_waiting(self, f: Facts) -> None:
        w = self.waiting.get(f.job.repo)
        if w is None:
            w = self.waiting[f.job.repo] = Waiting()
        w.add(f)

    def active_ids(self) -> list[int]:
        """The jobs that take this node's slots."""
        return sorted(a.job.id for r in self.active.values() for a in r.jobs if self.takes_slot(a.job))

    def takes_slot(self, job: JobView) -> bool:
        return job.id not in self.elsewhere and not job.resting


def _state(snapshot: Snapshot) -> State:
    state = State(snapshot)
    for job in sorted((*snapshot.waiting, *snapshot.held), key=order):
        if ready(job, snapshot):
            state.add_waiting(facts(job, snapshot.policy))
    return state


_STATES: PerSnapshot[State] = PerSnapshot(_state)


def state_of(snapshot: Snapshot) -> State:
    """The full index of `snapshot` (all its ready waiting jobs), built once per snapshot object."""
    return _STATES(snapshot)


def order(job: JobView) -> OrderKey:
    return job.order_key


def ready(job: JobView, snapshot: Snapshot) -> bool:
    return all(i in snapshot.landed for i in job.after)


def plist(paths: Iterable[str], limit: int = 3) -> str:
    """`a.py, src/ and 3 more`: paths for a message (the root shown as `/`, an addition as the new file it is)."""
    shown_paths = [claims.describe(p) if p else "/" for p in paths]
    shown = ", ".join(shown_paths[:limit])
    return shown + (f" and {len(shown_paths) - limit} more" if len(shown_paths) > limit else "")
