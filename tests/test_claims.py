"""Claim paths: normalisation, prefix-aware overlap, mergeable and barrier matching, ambiguity."""

from __future__ import annotations

import itertools

import pytest

from orchestrator import config
from orchestrator.core.claims import (
    ROOT,
    ClaimError,
    PathIndex,
    added_in,
    ambiguity,
    describe,
    foresees,
    matches,
    normalize,
    normalize_all,
    overlapping,
    overlaps,
    reaches,
    split_mergeable,
)
from orchestrator.core.models import CHANGELOGS, Claim, ClaimSource, Policy


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("src/a.py", "src/a.py"),
        ("./src/a.py", "src/a.py"),
        ("src//a.py", "src/a.py"),
        ("src/./a.py", "src/a.py"),
        ("././src", "src"),
        ("src/", "src/"),
        ("src//", "src/"),
        ("src/.", "src/"),
        ("", ROOT),
        (".", ROOT),
        ("./", ROOT),
        (".//.", ROOT),
        (".github/workflows/ci.yaml", ".github/workflows/ci.yaml"),
        (".gitignore", ".gitignore"),
        ("docs/.gitkeep", "docs/.gitkeep"),
    ],
)
def test_normalize(raw: str, expected: str) -> None:
    """Paths become repo-relative POSIX strings; a trailing slash marks a directory; `.` is the root."""
    assert normalize(raw) == expected


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ("/etc/passwd", "absolute"),
        ("C:\\x", "absolute"),
        ("c:/x", "absolute"),
        ("../x", "'..'"),
        ("src/../x", "'..'"),
        ("src/..", "'..'"),
        ("a\0b", "NUL"),
        (".git", "git internals"),
        (".git/config", "git internals"),
        ("./.git/", "git internals"),
        ("vendor/lib/.git/HEAD", "git internals"),
        (".GIT/config", "git internals"),
        ("src\\a.py", "backslash"),
    ],
)
def test_normalize_rejects(raw: str, words: str) -> None:
    """Absolute paths, `..`, NUL, git internals and backslashes raise ClaimError saying what to do."""
    with pytest.raises(ClaimError, match=words):
        normalize(raw)


def test_claim_error_is_value_error() -> None:
    """ClaimError is a ValueError, so callers validating input catch it with the usual exception."""
    assert issubclass(ClaimError, ValueError)


def test_normalize_all() -> None:
    """normalize_all normalises every path into a frozenset, merging spellings of one path."""
    assert normalize_all(["./a", "a", "b//c/"]) == frozenset({"a", "b/c/"})


OVERLAP_TABLE = [
    ("src/a.py", "src/a.py", True),
    ("src/", "src/a.py", True),
    ("src", "src/a.py", True),
    ("src", "src/", True),
    ("src/", "src/sub/deep/x.py", True),
    (ROOT, "anything/at/all.py", True),
    (ROOT, ROOT, True),
    (ROOT, "src/", True),
    ("src/a.py", "src/a.py/x", True),  # a name that might be a directory: ambiguity resolves to overlap
    ("src/a.py", "src/ab.py", False),
    ("src/a", "src/ab", False),
    ("src/a/", "src/ab/", False),
    ("src/", "srcx/a.py", False),
    ("src", "srcx", False),
    ("docs/x.md", "src/x.md", False),
    ("a/b/c", "a/b/d", False),
    # an addition (a new file in a directory) meets what holds its directory, never a file nor another addition
    ("news/+", "news/", True),
    ("news/+", "news", True),
    ("news/+", ROOT, True),
    ("news/+", "news/+", False),
    ("news/+", "news/1.bugfix.rst", False),
    ("news/+", "news/sub/", False),
    ("news/+", "src/+", False),
]


@pytest.mark.parametrize(("a", "b", "expected"), OVERLAP_TABLE)
def test_overlaps_truth_table(a: str, b: str, expected: bool) -> None:
    """Overlap is segment-prefix aware, symmetric, and treats a bare name as a possible directory."""
    assert overlaps(a, b) is expected
    assert overlaps(b, a) is expected


def test_path_index_agrees_with_overlaps() -> None:
    """The O(depth) index answers exactly as pairwise `overlaps` on every pair of a small universe."""
    universe = sorted({p for row in OVERLAP_TABLE for p in row[:2]} | {"src/sub/", "src/sub", "x"})
    for size in (0, 1, 2, 3):
        for others in itertools.combinations(universe, size):
            index = PathIndex(others)
            for p in universe:
                assert index.meets(p) == any(overlaps(p, o) for o in others), (p, others)


def test_overlapping_returns_meeting_paths_of_first_set() -> None:
    """overlapping returns the paths of the first set that meet the second, and nothing for an empty set."""
    mine = {"src/a.py", "src/ab.py", "docs/", "README.md"}
    assert overlapping(mine, {"src/a.py", "docs/index.md"}) == {"src/a.py", "docs/"}
    assert overlapping(mine, set()) == frozenset()
    assert overlapping(mine, {ROOT}) == mine


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("CHANGES.rst", True),
        ("docs/changelog.rst", True),
        ("docs/reference/changelog.rst", True),
        ("HISTORY.md", True),
        ("docs/history.rst", True),
        ("docs/about/release-notes.md", True),
        ("RELEASE_NOTES.md", True),
        ("Changelog.md", True),
        ("src/pkg/changes.py", False),  # a module of that name is code, never union-merged
        ("docs/_ext/changelog.py", False),
        ("changelog.d/123.feature.rst", False),  # a news fragment is a file of its own
        ("src/pkg/history.py", False),
    ],
)
def test_default_union_mergeable_files_are_changelogs_by_any_usual_name(path: str, expected: bool) -> None:
    """The default union-mergeable patterns take a changelog by the names projects give it (lower-case under docs/,
    HISTORY, release notes), never a module that happens to share the name."""
    assert matches(path, CHANGELOGS) is expected
    assert matches(path, config.Config().jobs.mergeable) is expected


@pytest.mark.parametrize(
    ("path", "patterns", "expected"),
    [
        ("CHANGES.rst", ("CHANGES*",), True),
        ("docs/CHANGES.md", ("CHANGES*",), True),
        ("docs/changes.md", ("CHANGES*",), False),  # case-sensitive, like git on Linux
        ("src/CHANGESET.py", ("CHANGES",), False),
        (".github/workflows/ci.yaml", (".github/workflows/*",), True),
        (".github/dependabot.yml", (".github/workflows/*",), False),
        ("poetry.lock", ("*.lock",), True),
        ("docs/", ("docs",), True),  # a directory matches on its own name
        ("docs/", ("*.md",), False),  # ...never on what it may contain
        (ROOT, ("*",), False),
        ("anything", (), False),
    ],
)
def test_matches(path: str, patterns: tuple[str, ...], expected: bool) -> None:
    """Globs match the whole path or its base name; directories match on their own name; ROOT never."""
    assert matches(path, patterns) is expected


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (".github/workflows/ci.yaml", True),
        (".github/workflows/", True),
        (".github/", True),
        (".github", True),
        (ROOT, True),
        ("docs/", True),  # may hold docs/conf.py
        ("docs/conf.py", True),
        ("docs/index.rst", False),
        ("src/", False),  # `pyproject.toml` has no slash: it reaches by name only
        ("pyproject.toml", True),
        ("sub/pyproject.toml", True),
        (".githubx/", False),
    ],
)
def test_reaches_barriers(path: str, expected: bool) -> None:
    """A path reaches a barrier when it matches it, or when the barrier's literal directory lies under it."""
    assert reaches(path, (".github/workflows/*", "docs/conf.py", "pyproject.toml")) is expected


def test_split_mergeable() -> None:
    """Changelogs and extra union-merge paths are mergeable; directories and ROOT always count."""
    paths = {"CHANGES.rst", "docs/CHANGES.md", "src/a.py", "CHANGES/", "data/words.txt", ROOT}
    counted, mergeable = split_mergeable(paths, ("CHANGES*",), frozenset({"data/words.txt"}))
    assert mergeable == {"CHANGES.rst", "docs/CHANGES.md", "data/words.txt"}
    assert counted == {"src/a.py", "CHANGES/", ROOT}


def test_split_mergeable_extra_globs() -> None:
    """Extra entries act as gitattributes-style globs too (`*.po` marks every catalogue mergeable)."""
    counted, mergeable = split_mergeable({"locale/fr.po", "src/a.py"}, (), frozenset({"*.po"}))
    assert (counted, mergeable) == ({"src/a.py"}, {"locale/fr.po"})


@pytest.mark.parametrize(
    ("claim", "reason"),
    [
        (Claim(frozenset(), 1.0), "empty claim"),
        (Claim(frozenset({ROOT, "src/a.py"}), 1.0), "root-wide claim"),
        (Claim(frozenset({"src/a.py"}), 0.3), "confidence 0.30 below 0.50"),
        (Claim(frozenset({"src/a.py"}), 0.5, ClaimSource.MODEL), None),
        (Claim(frozenset({"src/"}), 0.9, ClaimSource.DECLARED), None),
    ],
)
def test_ambiguity(claim: Claim, reason: str | None) -> None:
    """Empty, root-wide and low-confidence claims are ambiguous, with a short human reason."""
    assert ambiguity(claim, Policy(min_confidence=0.5)) == reason


def test_outside_is_what_a_job_touched_that_no_claimed_path_covers():
    """Files under a claimed dir or matching a claimed pattern are inside; anything else is outside."""
    from orchestrator.core.claims import outside

    touched = {"src/a.py", "src/sub/b.py", "docs/x.md", "zeta.txt", "tests/test_a.py"}
    assert outside(touched, {"src/", "tests/*.py"}) == {"docs/x.md", "zeta.txt"}
    assert outside(touched, {""}) == frozenset()  # the root holds everything


def test_an_addition_reads_as_the_new_file_it_is_and_foresees_a_file_in_its_directory() -> None:
    """`news/+` is described as "a new file in news/" (the root as the whole repository, any other path as it is);
    judged against what a job touched it foresees a file under news/ (what admission never counts as a meeting)."""
    assert describe("news/+") == "a new file in news/" and describe("+") == "a new file in the repository"
    assert describe("src/a.py") == "src/a.py" and describe(ROOT) == "/ (the whole repository)"
    assert added_in("news/+") == "news/" and added_in("+") == ROOT and added_in("news/") is None
    assert foresees("news/+", "news/1.bugfix.rst") and foresees("news/+", "news/sub/2.rst")
    assert not foresees("news/+", "newsx/1.rst") and not foresees("news/+", "src/a.py")
    assert foresees("src/", "src/a.py") and not foresees("src/a.py", "src/b.py")
    assert not overlaps("news/+", "news/1.bugfix.rst"), "admission: a new file meets no file"


def test_a_declared_new_file_is_a_claim_a_predicted_one_alone_is_not() -> None:
    """A claim of only a new file in news/ is specific when declared (a person's, or an agent's asked before it
    writes: claim growth) and empty when predicted (a fragment alone says nothing of the change)."""
    assert ambiguity(Claim(frozenset({"news/+"}), 1.0, ClaimSource.DECLARED), Policy()) is None
    assert ambiguity(Claim(frozenset({"news/+"}), 0.9, ClaimSource.EVIDENCE), Policy()) == "empty claim"
    assert ambiguity(Claim(frozenset(), 1.0, ClaimSource.DECLARED), Policy()) == "empty claim"
