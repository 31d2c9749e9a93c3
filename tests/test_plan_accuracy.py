"""Calibration: predicted vs actual per repo and basis; a repo whose confident claims keep missing gets a
higher threshold, and admission reads it (ambiguous ⇒ serial)."""

from __future__ import annotations

from dataclasses import replace

from orchestrator.core.admission import decide
from orchestrator.core.job import Job
from orchestrator.core.models import Claim, ClaimSource, JobState, JobView, Policy, Reason, Snapshot
from orchestrator.plan import accuracy


def ended(i: int, repo: str, claim: set[str], actual: set[str], conf: float = 0.8) -> Job:
    c = Claim(frozenset(claim), conf, ClaimSource.EVIDENCE)
    ev = ({"path": sorted(claim)[0], "kind": "named", "why": ""},)
    return Job(i, repo, "main", "t", "shell", JobState.LANDED, claim=c, actual=frozenset(actual), evidence=ev)


def test_report_and_raised_threshold() -> None:
    """Misses in one repo raise only that repo's threshold; changelogs never count as a miss."""
    jobs = [ended(i, "/a", {"src/x.py"}, {"src/x.py", "src/y.py"}) for i in range(1, 7)]
    jobs += [ended(i, "/b", {"src/x.py"}, {"src/x.py", "CHANGES.rst"}) for i in range(7, 13)]
    policy = Policy()
    records = accuracy.records(jobs, set(), policy)
    report = accuracy.report(records, policy)
    assert report["/a"]["all"]["recall"] == 0.5 and report["/a"]["all"]["confident_miss_rate"] == 1.0
    assert report["/b"]["all"]["recall"] == 1.0 and report["/b"]["by_basis"]["named"]["precision"] == 1.0
    raised = accuracy.thresholds(records, policy)
    assert raised == (("/a", 0.85),)
    assert report["/a"]["raised"] and not report["/b"]["raised"]


def test_admission_reads_the_raised_threshold() -> None:
    """A 0.8 claim runs beside others in a calibrated repo, and alone in one whose threshold was raised."""
    job = JobView(2, "/a", "main", Claim(frozenset({"src/z.py"}), 0.8, ClaimSource.EVIDENCE))
    other = JobView(1, "/a", "main", Claim(frozenset({"src/q.py"}), 1.0, ClaimSource.DECLARED))
    policy = Policy(max_concurrent=4)
    assert decide(job, Snapshot(active=(other,), policy=policy)).admitted
    raised = replace(policy, raised=(("/a", 0.85),))
    d = decide(job, Snapshot(active=(other,), policy=raised))
    assert d.reason in (Reason.AMBIGUOUS, Reason.EXCLUSIVE) and "raised" in d.message + str(d.checks)


def test_collisions_count_only_paths_outside_the_claim() -> None:
    """An overlap event marks the job that escaped its claim, not the one whose claim held the path."""
    a = ended(1, "/a", {"src/x.py"}, {"src/x.py", "src/y.py"})
    b = ended(2, "/a", {"src/y.py"}, {"src/y.py"})
    assert accuracy.collisions([a, b], [(1, {"paths": ["src/y.py"]}), (2, {"paths": ["src/y.py"]})]) == {1}


def test_raised_threshold_is_the_lowest_that_holds_and_comes_back_down() -> None:
    """The threshold is the lowest whose would-be-confident claims held (0.6 claims missing does not
    silence 0.8 claims that mostly hit); claims that ran alone under it still judge it, so once the 0.6
    claims stop missing the repo's threshold returns to the default."""
    policy = Policy()
    jobs = [ended(i, "/a", {"src/x.py"}, {"src/x.py", "src/y.py"}, conf=0.6) for i in range(1, 7)]
    jobs.append(ended(7, "/a", {"src/z.py"}, {"src/z.py", "src/y.py"}))
    jobs += [ended(i, "/a", {"src/z.py"}, {"src/z.py"}) for i in range(8, 13)]
    assert accuracy.thresholds(accuracy.records(jobs, set(), policy), policy) == (("/a", 0.65),)
    for i in range(13, 40):
        jobs.append(ended(i, "/a", {"src/x.py"}, {"src/x.py"}, conf=0.6))
        raised = accuracy.thresholds(accuracy.records(jobs, set(), policy), policy)
        if not raised:
            break
    assert not raised and i == 23  # the last 20 claims confident at 0.5 hold 4 misses (20%) from then on


def test_an_addition_claim_is_matched_by_the_new_file_it_foresaw() -> None:
    """A claim of `src/x.py` and a new file in news/ (`news/+`): a job that touched both has recall and precision 1
    (the fragment foreseen, the addition matched); one that added no file there leaves the addition unmatched."""
    policy = Policy()
    both = ended(1, "/a", {"src/x.py", "news/+"}, {"src/x.py", "news/12.feature.rst"})
    alone = ended(2, "/b", {"src/x.py", "news/+"}, {"src/x.py"})
    report = accuracy.report(accuracy.records([both, alone], set(), policy), policy)
    assert report["/a"]["all"]["recall"] == 1.0 and report["/a"]["all"]["precision"] == 1.0, report["/a"]
    assert report["/a"]["all"]["confident_miss_rate"] == 0.0
    assert report["/b"]["all"]["recall"] == 1.0 and report["/b"]["all"]["precision"] == 0.5, report["/b"]
    assert accuracy.foreseen({"news/+", "src/"}, {"news/1.rst", "src/a.py", "docs/x.md"}) == {"news/1.rst", "src/a.py"}
    assert accuracy.matched({"news/+", "docs/+", "src/a.py"}, {"news/1.rst", "src/a.py"}) == {"news/+", "src/a.py"}
