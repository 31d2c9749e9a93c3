"""Glob claims: a pattern is matched against paths, never taken as a literal file name."""

from __future__ import annotations

import pytest

from orchestrator.core.admission import decide, decide_all
from orchestrator.core.claims import ClaimError, PathIndex, glob_prefix, normalize, overlaps, reaches
from orchestrator.core.models import Claim, ClaimSource, JobView, Policy, Reason, Snapshot

POLICY = Policy(max_concurrent=8, per_repo=8)


def job(id: int, *paths: str, actual: tuple[str, ...] = ()) -> JobView:
    return JobView(id, "r", "main", Claim(frozenset(paths), 0.9, ClaimSource.DECLARED), frozenset(actual))


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("src/*.py", "src/api.py", True),
        ("src/*.py", "src/x.md", False),
        ("src/*.py", "src/sub/x.py", False),  # `*` stays inside one segment
        ("src/**/x.py", "src/a/b/x.py", True),
        ("src/**", "src/a/b/c.txt", True),
        ("src/*.py", "src/", True),  # the directory may hold a match
        ("src/*.py", "src", True),
        ("src/*.py", "docs/a.py", False),
        ("*.py", "setup.py", True),
        ("src/*/", "src/pkg/mod.py", True),  # a directory pattern holds what is under it
        ("src/*.py", "src/*.md", True),  # two patterns: conservatively, by their literal directories
        ("src/*.py", "docs/*.md", False),
        ("src/[ab].py", "src/a.py", True),
        ("src/[ab].py", "src/c.py", False),
    ],
)
def test_glob_overlap(a: str, b: str, expected: bool) -> None:
    """A pattern overlaps what it matches or may hold a match, symmetrically."""
    assert overlaps(a, b) is expected
    assert overlaps(b, a) is expected


def test_glob_prefix_and_index() -> None:
    """The index meets a file through a held pattern, and a queried pattern through a held file."""
    assert glob_prefix("src/*.py") == "src/"
    assert glob_prefix("*.py") == ""
    assert PathIndex(["src/*.py"]).meets("src/api.py")
    assert not PathIndex(["src/*.py"]).meets("src/api.md")
    assert PathIndex(["src/api.py"]).meets("src/*.py")
    assert not PathIndex(["docs/a.md"]).meets("src/*.py")


def test_malformed_patterns_are_refused() -> None:
    """A half pattern gets a clear error instead of a literal file claim."""
    with pytest.raises(ClaimError, match=r"'\*\*' must be a whole segment"):
        normalize("src/**.py")
    with pytest.raises(ClaimError, match="unclosed"):
        normalize("src/[ab.py")


def test_glob_claim_conflicts_with_a_file_it_matches() -> None:
    """A job claiming `src/*.py` never runs beside one claiming (or touching) `src/api.py`."""
    d = decide(job(2, "src/api.py"), Snapshot(active=(job(1, "src/*.py"),), policy=POLICY))
    assert d.reason is Reason.OVERLAP and d.blocking == (1,)
    d = decide(job(2, "src/*.py"), Snapshot(active=(job(1, "docs/x.md", actual=("src/api.py",)),), policy=POLICY))
    assert d.reason is Reason.OVERLAP and d.blocking == (1,)
    d = decide(job(2, "src/*.py"), Snapshot(active=(job(1, "src/notes.md"),), policy=POLICY))
    assert d.admitted


def test_glob_claims_keep_waiting_order() -> None:
    """A later job does not overtake an earlier waiting job whose pattern it meets."""
    decisions = decide_all(
        Snapshot(active=(job(1, "src/a.py"),), waiting=(job(2, "src/*.py"), job(3, "src/b.py")), policy=POLICY)
    )
    by_id = {d.job_id: d for d in decisions}
    assert by_id[2].reason is Reason.OVERLAP
    assert by_id[3].reason is Reason.PRIORITY and by_id[3].blocking == (2,)


def test_glob_claim_reaches_barrier_conservatively() -> None:
    """A pattern whose directory may hold a barrier file reaches the barrier."""
    assert reaches(".github/*", (".github/workflows/*",))
    assert not reaches("src/*.py", (".github/workflows/*",))
