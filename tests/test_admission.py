"""Admission decisions: every reason code, their order, and decide_all over a queue."""

from __future__ import annotations

import gc
import json
from dataclasses import replace

from orchestrator.core.admission import decide, decide_all, runs_alone
from orchestrator.core.models import (
    ROOT,
    Claim,
    ClaimSource,
    Decision,
    JobView,
    Outcome,
    Policy,
    Reason,
    Snapshot,
)

CHECK_NAMES = [
    "DependencyFailed",
    "Dependency",
    "Paused",
    "RateLimited",
    "NoSpace",
    "Exclusive",
    "Ambiguous",
    "Barrier",
    "Overlap",
    "Risk",
    "Priority",
    "BaseMoved",
    "Landing",
    "Concurrency",
]
POLICY = Policy(max_concurrent=8, per_repo=8, barriers=("pyproject.toml", ".github/workflows/*"))


def job(
    id: int,
    *paths: str,
    repo: str = "r",
    branch: str = "main",
    confidence: float = 0.9,
    actual: tuple[str, ...] = (),
    priority: int = 0,
    after: tuple[int, ...] = (),
    mergeable: frozenset[str] = frozenset(),
) -> JobView:
    claim = Claim(frozenset(paths), confidence, ClaimSource.MODEL)
    return JobView(id, repo, branch, claim, frozenset(actual), priority, after, mergeable)


def snap(
    active: tuple[JobView, ...] = (), waiting: tuple[JobView, ...] = (), policy: Policy = POLICY, **kw: object
) -> Snapshot:
    return Snapshot(active=active, waiting=waiting, policy=policy, **kw)  # type: ignore[arg-type]


def failing(d: Decision) -> list[str]:
    return [c.name for c in d.checks if not c.ok]


def test_admits_disjoint_job_and_reports_every_check() -> None:
    """A disjoint, confident job is admitted; all eleven checks are listed, in order, and pass."""
    a = job(10, "src/b.py")
    d = decide(a, snap(active=(job(1, "src/a.py"),), waiting=(a,)))
    assert (d.outcome, d.reason, d.next) == (Outcome.ADMIT, Reason.ADMITTED, "starts now")
    assert d.admitted and d.blocking == () and d.paths == ()
    assert [c.name for c in d.checks] == CHECK_NAMES
    assert all(c.ok for c in d.checks)
    assert d.message == "admitted beside 1 active job in repo, claim disjoint"
    assert json.loads(json.dumps(d.to_json()))["reason"] == "Admitted"


def test_dependency_failed() -> None:
    """A job after a dead job fails, naming the dead ids as blocking."""
    a = job(10, "src/b.py", after=(3, 2, 5))
    d = decide(a, snap(waiting=(a,), dead=frozenset({3, 5}), landed=frozenset({2})))
    assert (d.outcome, d.reason, d.blocking) == (Outcome.FAIL, Reason.DEPENDENCY_FAILED, (3, 5))
    assert d.message == "2 of 3 jobs it runs after ended without landing: 3, 5"


def test_dependency_waits_for_landing() -> None:
    """A job after jobs that have not landed waits for them, and says so."""
    a = job(10, "src/b.py", after=(7, 4, 2))
    d = decide(a, snap(waiting=(a,), landed=frozenset({2})))
    assert (d.outcome, d.reason, d.blocking) == (Outcome.DEFER, Reason.DEPENDENCY, (4, 7))
    assert d.next == "waits for jobs 4, 7 to land"
    assert failing(d) == ["Dependency"]


def test_a_job_that_lands_after_others_starts_once_they_have_ended() -> None:
    """A job stopped on a real conflict waits for the jobs it lands after to end, landed or not (a dead one no
    longer holds it back, unlike a dependency: what it met is gone), and keeps its place meanwhile."""
    from dataclasses import replace

    a = replace(job(10, "src/b.py"), land_after=(4, 3))
    d = decide(a, snap(active=(job(4, "src/a.py"),), waiting=(a,)))
    assert (d.outcome, d.reason, d.blocking) == (Outcome.DEFER, Reason.DEPENDENCY, (3, 4))
    assert d.message == (
        "lands after jobs 3, 4, whose changes its last attempt met or lacked: it starts once they have ended"
    )
    assert decide(a, snap(waiting=(a,), landed=frozenset({4}), dead=frozenset({3}))).admitted
    later = job(11, "src/b.py")
    assert decide(later, snap(active=(job(4, "src/a.py"),), waiting=(a, later))).reason is Reason.PRIORITY


def test_landing_in_flight() -> None:
    """A landing into the job's target branch defers it; one into another branch does not."""
    a = job(10, "src/b.py")
    d = decide(a, snap(waiting=(a,), landing=frozenset({("r", "main")})))
    assert (d.reason, d.outcome) == (Reason.LANDING, Outcome.DEFER)
    assert decide(a, snap(waiting=(a,), landing=frozenset({("r", "dev"), ("other", "main")}))).admitted


def test_base_moved_in_claimed_paths_replans() -> None:
    """A branch that moved in claimed paths (prefix-aware) re-plans, naming the moved paths."""
    a = job(10, "src/", "README.md")
    d = decide(a, snap(waiting=(a,), moved={10: frozenset({"src/x/y.py", "docs/z.md", "README.md"})}))
    assert (d.outcome, d.reason, d.paths) == (Outcome.REPLAN, Reason.BASE_MOVED, ("README.md", "src/x/y.py"))
    assert d.next == "re-plans on the new head"


def test_base_moved_replans_only_a_job_nothing_else_holds() -> None:
    """A job whose claim meets an active job waits for it (Overlap) without being planned again on each landing; once
    nothing holds it, a base that moved in its claimed paths plans it again before it starts, and before it waits for a
    slot (so that it starts on the first one free)."""
    a = job(10, "src/a.py", "README.md")
    moved = {10: frozenset({"README.md"})}
    d = decide(a, snap(active=(job(4, "src/a.py"),), waiting=(a,), moved=moved))
    assert (d.outcome, d.reason) == (Outcome.DEFER, Reason.OVERLAP)
    earlier = job(9, "src/a.py")
    d = decide(a, snap(waiting=(earlier, a), moved=moved))
    assert (d.outcome, d.reason) == (Outcome.DEFER, Reason.PRIORITY)
    d = decide(a, snap(waiting=(a,), moved=moved))
    assert (d.outcome, d.reason) == (Outcome.REPLAN, Reason.BASE_MOVED)
    full = Policy(max_concurrent=1, per_repo=1)
    d = decide(a, snap(active=(job(4, "docs/x.md"),), waiting=(a,), moved=moved, policy=full))
    assert (d.outcome, d.reason) == (Outcome.REPLAN, Reason.BASE_MOVED)


def test_base_moved_unknown_replans() -> None:
    """A moved branch whose changed paths are unknown (None) re-plans."""
    a = job(10, "src/a.py")
    d = decide(a, snap(waiting=(a,), moved={10: None}))
    assert (d.outcome, d.reason) == (Outcome.REPLAN, Reason.BASE_MOVED)


def test_base_moved_elsewhere_or_in_mergeable_paths_is_fine() -> None:
    """Moves in unclaimed or union-mergeable paths, an empty move, or a missing key do not re-plan."""
    a = job(10, "src/a.py", "CHANGES.rst")
    moves: list[dict[int, frozenset[str] | None]] = [
        {10: frozenset({"docs/x.md", "CHANGES.rst"})},
        {10: frozenset()},
        {11: None},
    ]
    for moved in moves:
        assert decide(a, snap(waiting=(a,), moved=moved)).admitted


def test_declared_job_never_replans() -> None:
    """A declared claim would come back the same from a re-plan: a moved base admits it on the current head."""
    a = job(10, "src/a.py")
    a = replace(a, claim=replace(a.claim, source=ClaimSource.DECLARED))
    assert decide(a, snap(waiting=(a,), moved={10: frozenset({"src/a.py"})})).admitted
    assert decide(a, snap(waiting=(a,), moved={10: None})).admitted


def test_exclusive_job_never_replans() -> None:
    """A job that runs alone starts on the current head, so a moved base is no reason to re-plan."""
    a = job(10, ROOT)
    d = decide(a, snap(waiting=(a,), moved={10: None}))
    assert d.admitted
    assert d.message == "admitted to run alone (root-wide claim)"


def test_active_exclusive_job_blocks_its_repo() -> None:
    """An active job that runs alone defers every job of its repo, even a disjoint one."""
    a = job(10, "src/b.py")
    d = decide(a, snap(active=(job(3, "docs/", confidence=0.1),), waiting=(a,)))
    assert (d.reason, d.blocking) == (Reason.EXCLUSIVE, (3,))
    assert d.message == "job 3 runs alone in repo (confidence 0.10 below 0.50)"
    assert d.next == "waits for job 3 to land"


def test_active_job_touching_barrier_becomes_exclusive() -> None:
    """An active job whose actual paths reach a barrier runs alone from then on."""
    a = job(10, "src/b.py")
    d = decide(a, snap(active=(job(3, "docs/", actual=("pyproject.toml",)),), waiting=(a,)))
    assert (d.reason, d.blocking) == (Reason.EXCLUSIVE, (3,))
    assert "barrier pyproject.toml" in d.message


def test_ambiguous_job_waits_to_run_alone() -> None:
    """An ambiguous job waits while its repo has active jobs; other repos do not count."""
    a = job(10)
    d = decide(a, snap(active=(job(4, "x"), job(2, "y"), job(9, "z", repo="other")), waiting=(a,)))
    assert (d.reason, d.blocking) == (Reason.AMBIGUOUS, (2, 4))
    assert d.message == "claim is ambiguous (empty claim): runs alone, 2 active jobs in repo"
    assert d.next == "waits to run alone: 2 active jobs in repo"
    assert decide(a, snap(active=(job(9, "z", repo="other"),), waiting=(a,))).admitted


def test_barrier_job_waits_to_run_alone() -> None:
    """A job claiming a barrier path (here under a claimed directory) waits to run alone, naming it."""
    a = job(10, ".github/", "src/a.py")
    d = decide(a, snap(active=(job(4, "docs/"),), waiting=(a,)))
    assert (d.reason, d.blocking, d.paths) == (Reason.BARRIER, (4,), (".github/",))
    assert runs_alone(a, POLICY) == "barrier .github/"
    assert runs_alone(job(11, "src/a.py"), POLICY) is None


def test_overlap_names_jobs_and_paths() -> None:
    """Overlap lists the blocking jobs with the paths they hold, and the job's own meeting paths."""
    a = job(10, "src/a.py", "src/c.py", "README.md")
    active = (job(7, "src/"), job(4, "src/a.py", "lib/"), job(5, "docs/"))
    d = decide(a, snap(active=active, waiting=(a,)))
    assert (d.outcome, d.reason) == (Outcome.DEFER, Reason.OVERLAP)
    assert d.message == "claim meets 2 of 3 active jobs in repo: job 4 (src/a.py), job 7 (src/)"
    assert (d.blocking, d.paths) == ((4, 7), ("src/a.py", "src/c.py"))
    assert d.next == "waits for jobs 4, 7 to land"


def test_overlap_with_actual_paths() -> None:
    """What an active job really touched counts, even outside its claim."""
    a = job(10, "src/b.py")
    d = decide(a, snap(active=(job(4, "src/a.py", actual=("src/a.py", "src/b.py")),), waiting=(a,)))
    assert (d.reason, d.blocking, d.paths) == (Reason.OVERLAP, (4,), ("src/b.py",))


def test_unplaceable_actual_path_overlaps_everything() -> None:
    """An actual path that cannot be normalised is treated as the root: it meets every claim and barrier."""
    a = job(10, "src/b.py")
    active = (job(4, "docs/", actual=("/tmp/escaped",)),)
    assert decide(a, snap(active=active, waiting=(a,), policy=Policy())).reason is Reason.OVERLAP
    assert decide(a, snap(active=active, waiting=(a,))).reason is Reason.EXCLUSIVE


def test_same_paths_in_other_repo_do_not_overlap() -> None:
    """Claims only meet claims of the same repository."""
    a = job(10, "src/a.py")
    assert decide(a, snap(active=(job(4, "src/a.py", repo="other"),), waiting=(a,))).admitted


def test_mergeable_paths_are_shared_not_overlapping() -> None:
    """Changelogs and the repo's union-merge paths never overlap; shared ones are named in `shared`."""
    a = job(10, "src/b.py", "CHANGES.rst", "data/words.txt", mergeable=frozenset({"data/words.txt"}))
    active = (job(4, "src/a.py", "CHANGES.rst", actual=("data/words.txt",), mergeable=frozenset({"data/words.txt"})),)
    d = decide(a, snap(active=active, waiting=(a,)))
    assert d.admitted
    assert d.shared == ("CHANGES.rst", "data/words.txt")
    assert "shares CHANGES.rst, data/words.txt (union-merged)" in d.message


def test_a_release_folding_news_fragments_waits_for_the_jobs_adding_one_and_adders_run_together() -> None:
    """A job that adds a news fragment claims a new file in its directory (`news/+`): a release claiming that
    directory (it folds the fragments) does not start beside it, nor does a later adder overtake a waiting
    release; once the release runs, an adder may start beside it; two adders (two new files) run side by side."""
    adder, other, release = job(3, "src/a.py", "news/+"), job(4, "src/b.py", "news/+"), job(6, "news/")
    late = job(8, "src/c.py", "news/+")
    assert decide(other, snap(active=(adder,), waiting=(other,))).admitted
    d = decide(release, snap(active=(adder, other), waiting=(release,)))
    assert (d.reason, d.blocking, d.paths) == (Reason.OVERLAP, (3, 4), ("news/",))
    assert "job 3 (a new file in news/)" in d.message, "an addition reads as the new file it is"
    d = decide(late, snap(active=(adder,), waiting=(release, late)))
    assert (d.reason, d.blocking, d.paths) == (Reason.PRIORITY, (6,), ("news/+",))
    # a release already running folds what its base has: a new fragment beside it is the next release's
    assert decide(adder, snap(active=(release,), waiting=(adder,))).admitted
    assert decide(adder, snap(active=(job(9, "news/1.bugfix.rst"),), waiting=(adder,))).admitted


def test_priority_earlier_overlapping_waiting_job_goes_first() -> None:
    """A later job that overlaps an earlier waiting job waits for it; a disjoint later job does not."""
    first = job(5, "src/")  # blocked by an active job
    later = job(9, "src/a.py")
    free = job(11, "docs/x.md")
    s = snap(active=(job(1, "src/z.py"),), waiting=(later, free, first))
    assert decide(first, s).reason is Reason.OVERLAP
    d = decide(later, s)
    assert (d.reason, d.blocking, d.paths) == (Reason.PRIORITY, (5,), ("src/a.py",))
    assert d.message == "1 earlier waiting job in repo goes first: job 5 (over src/a.py)"
    assert d.next == "waits for job 5 to start"
    assert decide(free, s).admitted


def test_priority_is_prefix_aware_both_ways() -> None:
    """A later directory claim waits for an earlier waiting job claiming a file under it, and vice versa."""
    s = snap(active=(job(1, "lib/x.py"),), waiting=(job(5, "src/b.py", "lib/x.py"), job(9, "src/"), job(12, "src")))
    assert [(d.reason, d.blocking) for d in decide_all(s)][1:] == [(Reason.PRIORITY, (5,)), (Reason.PRIORITY, (5, 9))]


def test_priority_follows_priority_then_id() -> None:
    """A higher-priority job is earlier even with a larger id."""
    low = job(2, "src/a.py")
    high = job(8, "src/a.py", priority=1)
    s = snap(waiting=(low, high))
    assert decide(high, s).admitted
    assert (decide(low, s).reason, decide(low, s).blocking) == (Reason.PRIORITY, (8,))


def test_priority_exclusive_either_side() -> None:
    """An earlier exclusive job blocks every later job of its repo; an exclusive job waits for all earlier ones."""
    alone = job(3, ROOT)
    s = snap(waiting=(job(1, "a"), job(2, "b", repo="other"), alone, job(4, "c")))
    assert (decide(job(4, "c"), s).reason, decide(job(4, "c"), s).blocking) == (Reason.PRIORITY, (3,))
    d = decide(alone, s)
    assert (d.reason, d.blocking) == (Reason.PRIORITY, (1,))
    assert d.message == "runs alone after 1 earlier waiting job in repo: job 1"


def test_job_waiting_for_a_dependency_holds_no_place() -> None:
    """An earlier job still waiting for a dependency does not block later jobs (it might be one of them)."""
    dependant = job(2, "src/a.py", priority=5, after=(7,))
    dependency = job(7, "src/a.py")
    s = snap(waiting=(dependant, dependency))
    assert decide(dependant, s).reason is Reason.DEPENDENCY
    assert decide(dependency, s).admitted


def test_concurrency_global_limit_message() -> None:
    """The global limit reads like a scheduler's: free slots, active count and the setting."""
    a = job(10, "src/b.py")
    policy = Policy(max_concurrent=2)
    d = decide(a, snap(active=(job(1, "x", repo="p"), job(2, "y", repo="q")), waiting=(a,), policy=policy))
    assert (d.reason, d.blocking) == (Reason.CONCURRENCY, (1, 2))
    assert d.message == "0/2 slots free: 2 active jobs (MAX_CONCURRENT_JOBS=2)"


def test_concurrency_per_repo_limit() -> None:
    """The per-repo limit defers a job of a full repo, not one of another repo."""
    policy = Policy(max_concurrent=8, per_repo=1)
    s = snap(active=(job(1, "x"),), waiting=(job(10, "y"), job(11, "y", repo="p")), policy=policy)
    d = decide(job(10, "y"), s)
    assert (d.reason, d.blocking) == (Reason.CONCURRENCY, (1,))
    assert d.message == "0/1 repo slots free: 1 active job in repo (per-repo limit 1)"
    assert decide(job(11, "y", repo="p"), s).admitted


def test_first_failing_check_wins_and_all_are_evaluated() -> None:
    """Every check runs; the reason follows the fixed order (here Overlap before Priority, Landing, Concurrency)."""
    a = job(10, "src/a.py")
    s = snap(
        active=(job(1, "src/"),),
        waiting=(job(5, "src/a.py"), a),
        landing=frozenset({("r", "main")}),
        policy=Policy(max_concurrent=1),
    )
    d = decide(a, s)
    assert d.reason is Reason.OVERLAP
    assert failing(d) == ["Overlap", "Priority", "Landing", "Concurrency"]


def test_landing_in_flight_is_reported_when_nothing_durable_blocks() -> None:
    """A landing in flight defers an otherwise admissible job, with reason Landing."""
    a = job(10, "docs/")
    d = decide(a, snap(active=(job(1, "src/"),), waiting=(a,), landing=frozenset({("r", "main")})))
    assert (d.outcome, d.reason) == (Outcome.DEFER, Reason.LANDING)
    assert failing(d) == ["Landing"]


def test_decide_all_admits_disjoint_jobs_together() -> None:
    """Disjoint jobs of one repo are admitted in the same pass."""
    ds = decide_all(snap(waiting=(job(3, "docs/"), job(1, "src/a.py"), job(2, "src/b.py"))))
    assert [(d.job_id, d.reason) for d in ds] == [(1, Reason.ADMITTED), (2, Reason.ADMITTED), (3, Reason.ADMITTED)]


def test_decide_all_serialises_overlapping_jobs() -> None:
    """Of two overlapping jobs the earlier is admitted and the later waits for it as an active job."""
    ds = decide_all(snap(waiting=(job(2, "src/a.py"), job(1, "src/"))))
    assert [d.reason for d in ds] == [Reason.ADMITTED, Reason.OVERLAP]
    assert ds[1].blocking == (1,)


def test_decide_all_counts_admitted_jobs_against_limits() -> None:
    """Jobs admitted earlier in the pass fill the slots for the ones after them."""
    ds = decide_all(snap(waiting=tuple(job(i, f"f{i}") for i in range(1, 5)), policy=Policy(max_concurrent=2)))
    assert [d.reason for d in ds] == [Reason.ADMITTED, Reason.ADMITTED, Reason.CONCURRENCY, Reason.CONCURRENCY]
    assert ds[2].blocking == (1, 2)


def test_decide_all_barrier_job_runs_alone() -> None:
    """A barrier job admitted into an idle repo keeps every later job of that repo out."""
    ds = decide_all(snap(waiting=(job(1, "pyproject.toml"), job(2, "src/a.py"), job(3, "src/a.py", repo="p"))))
    assert [d.reason for d in ds] == [Reason.ADMITTED, Reason.EXCLUSIVE, Reason.ADMITTED]
    assert ds[1].blocking == (1,)


def test_decide_is_cached_per_snapshot_object() -> None:
    """Repeated decisions on one snapshot agree, and a new snapshot is never answered from an old index."""
    a = job(10, "src/a.py")
    s1 = snap(waiting=(job(5, "src/"), a))
    assert decide(a, s1).reason is Reason.PRIORITY
    assert decide(a, s1) == decide(a, s1)
    del s1
    gc.collect()
    for _ in range(20):  # fresh snapshots may reuse the old object's id
        assert decide(a, snap(waiting=(a,))).admitted


def test_unhashable_fields_are_tolerated() -> None:
    """A job view built with a list or set where a tuple or frozenset is expected is still decided."""
    a = JobView(10, "r", "main", Claim({"src/a.py"}, 0.9), after=[1])  # type: ignore[arg-type]
    d = decide(a, snap(active=(job(4, "src/"),), waiting=(a,), landed=frozenset({1})))
    assert (d.reason, d.blocking) == (Reason.OVERLAP, (4,))


def test_a_paused_repo_or_daemon_defers_with_paused_and_says_how_to_resume() -> None:
    """Pause is a snapshot fact: a paused repo's jobs (or every job, for `*`) defer as Paused."""
    a, other = job(1, "src/a.py"), job(2, "x", repo="s")
    d = decide_all(snap(waiting=(a, other), paused=frozenset({"r"})))
    assert [(x.reason, x.outcome) for x in d] == [(Reason.PAUSED, Outcome.DEFER), (Reason.ADMITTED, Outcome.ADMIT)]
    assert "resume --repo r" in d[0].next
    everywhere = decide_all(snap(waiting=(a, other), paused=frozenset({"*"})))
    assert {x.reason for x in everywhere} == {Reason.PAUSED}


def test_a_disk_without_room_defers_every_job_with_nospace() -> None:
    """Too little free room for the workspaces is a snapshot fact: every waiting job defers as NoSpace, saying why and
    what frees some; with room, they start."""
    a, other = job(1, "src/a.py"), job(2, "x", repo="s")
    low = decide_all(snap(waiting=(a, other), disk_low="the disk that holds /state has 3 MiB free"))
    assert {(x.reason, x.outcome) for x in low} == {(Reason.NO_SPACE, Outcome.DEFER)}
    assert "3 MiB free" in low[0].message and "orchestrator clean" in low[0].next
    assert {x.reason for x in decide_all(snap(waiting=(a, other)))} == {Reason.ADMITTED}


def test_a_run_time_slot_limit_overrides_the_per_repo_policy() -> None:
    """`slots` (from `orchestrator limit`) replaces the policy's per-repo limit for that repo only."""
    active = (job(1, "src/a.py"),)
    waiting = (job(2, "src/b.py"), job(3, "y", repo="s"))
    d = decide_all(snap(active=active, waiting=waiting, slots={"r": 1}))
    assert [x.reason for x in d] == [Reason.CONCURRENCY, Reason.ADMITTED]
    assert "per-repo limit 1" in d[0].message


def test_a_job_that_another_lands_after_is_not_held_back_by_it() -> None:
    """Job 11 was stopped on a conflict and lands after job 16 (it lacked 16's change); 16, queued later, claims
    a path 11 claims. 11 keeps its place against other later jobs, but not against 16, which it waits for:
    otherwise each waits for the other and the queue stalls (a release folding news fragments and a job
    adding one stalled a benchmark's queue for good)."""
    from dataclasses import replace

    release = replace(job(11, "docs/changelog/", "pyproject.toml"), land_after=(16,))
    adder = job(16, "docs/changelog/16.bugfix.rst", "src/a.py")
    other = job(17, "docs/changelog/17.bugfix.rst")
    d = {x.job_id: x for x in decide_all(snap(waiting=(release, adder, other)))}
    assert d[11].reason is Reason.DEPENDENCY and d[11].blocking == (16,)
    assert d[16].admitted, d[16].message
    assert d[17].reason is Reason.PRIORITY and 11 in d[17].blocking
    lone = replace(job(18, "src/b.py"), land_after=(19,))
    wide = replace(job(19, "src/a.py"), claim=Claim(frozenset({""}), 0.9, ClaimSource.MODEL))
    assert decide(wide, snap(waiting=(lone, wide))).admitted, "an exclusive job it waits for is not held back"
