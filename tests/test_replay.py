"""The `replay` runner: a recorded change (a commit of the repo, or a patch file) applied with real git."""

from __future__ import annotations

import itertools
from pathlib import Path

import pygit2
import pytest

from orchestrator.core.models import Code, JobState
from orchestrator.git import union
from orchestrator.runners import replay
from tests.conftest import git, workspace, write


def test_spec_reads_key_value_lines_with_a_free_subject_line():
    """`key: value` lines name the change; other lines (the subject) are free text."""
    spec = replay.parse("Fix the typo\ncommit: abc123  # from upstream\nafter: 2.5\n")
    assert spec == replay.ReplaySpec(commit="abc123", after=2.5)
    assert replay.parse("commit: abc123\nafter: 1\nhold: 3").hold == 3, "it runs on 3 s with its change applied"
    assert replay.parse('{"patch": "/tmp/x.patch"}') == replay.ReplaySpec(patch="/tmp/x.patch")


def test_the_task_is_the_text_around_the_spec():
    """What a planner reads of a replay job: its free text, not the spec's commit, wait and conflict lines."""
    runner = replay.ReplayRunner()
    assert runner.task("Fix the typo\n\nIn the tutorial.\ncommit: abc123\nafter: 2.5\nconflict: theirs") == (
        "Fix the typo\n\nIn the tutorial."
    )
    assert runner.task('{"commit": "abc123", "after": 1}') == ""
    assert runner.task("Commit: abc\n> after: a line of the message") == "> after: a line of the message"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("just some words", "exactly one change"),
        ("commit: a\npatch: /x", "exactly one change"),
        ("commit: a\nafter: soon", "after: expected seconds"),
        ("commit: a\nafter: -1", ">= 0"),
        ("commit: a\nhold: later", "hold: expected seconds"),
        ('{"commit": "a", "delay": 1}', "unknown replay keys"),
        ("{not json", "not valid JSON"),
        ("commit: a\nconflict: ours", "expected fail or theirs"),
    ],
)
def test_bad_specs_say_what_to_write(text, says):
    """A malformed spec is a ReplayError whose message says how to write one."""
    with pytest.raises(replay.ReplayError, match=says):
        replay.parse(text)


def _side_commit(repo: Path, files: dict[str, str], branch: str = "side") -> str:
    git(repo, "checkout", "-q", "-b", branch)
    write(repo, files)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "recorded change")
    sha = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    return sha


def test_a_commit_recorded_on_an_older_base_applies_three_way(make_repo, tmp_path):
    """The commit's own change lands on a moved base; the base's other changes stay."""
    repo = make_repo(files={"a.txt": "1\n2\n3\n4\n5\n6\n", "b.txt": "b\n"})
    sha = _side_commit(repo, {"a.txt": "1\n2\n3\n4\n5\nsix\n", "new.txt": "new\n"})
    write(repo, {"a.txt": "one\n2\n3\n4\n5\n6\n"})
    git(repo, "commit", "-qam", "main moved")
    ws = workspace(repo, tmp_path / "ws", git(repo, "rev-parse", "main"), "orchestrator/1")
    assert replay.apply_commit(ws, sha) == ["a.txt", "new.txt"]
    assert (ws / "a.txt").read_text() == "one\n2\n3\n4\n5\nsix\n"
    assert (ws / "new.txt").read_text() == "new\n"
    assert git(ws, "rev-parse", "HEAD") == git(repo, "rev-parse", "main"), "HEAD stays; the daemon commits"


def test_a_conflicting_commit_fails_with_its_paths_and_changes_nothing(make_repo, tmp_path):
    """A real conflict is a ReplayError naming the path; the workspace is left as it was."""
    repo = make_repo(files={"a.txt": "a\n"})
    sha = _side_commit(repo, {"a.txt": "theirs\n"})
    write(repo, {"a.txt": "ours\n"})
    git(repo, "commit", "-qam", "main moved")
    ws = workspace(repo, tmp_path / "ws", git(repo, "rev-parse", "main"), "orchestrator/1")
    with pytest.raises(replay.ReplayError, match=r"conflict in a\.txt"):
        replay.apply_commit(ws, sha)
    assert (ws / "a.txt").read_text() == "ours\n"
    assert git(ws, "status", "--porcelain") == ""


def test_a_change_the_base_has_already_is_nothing_to_change_and_one_it_cannot_take_is_a_conflict(make_repo, tmp_path):
    """The recorded change (100 back to 99) on a base that says 99 already applies cleanly and changes nothing (the
    job ends unchanged, and runs again if an earlier job's change was missing); on a base that says 98 it does not
    apply: a conflict (its job runs again on another base), never an empty result."""
    repo = make_repo(files={"Makefile": "fail-under=100\n", "a.txt": "a\n"})
    sha = _side_commit(repo, {"Makefile": "fail-under=99\n"})
    for line, then in (("99", []), ("98", None)):
        write(repo, {"Makefile": f"fail-under={line}\n"})
        git(repo, "commit", "-qam", f"main says {line}")
        ws = workspace(repo, tmp_path / f"ws{line}", git(repo, "rev-parse", "main"), f"orchestrator/{line}")
        if then is None:
            with pytest.raises(replay.NotApplied, match="conflict in Makefile"):
                replay.apply_commit(ws, sha)
        else:
            assert replay.apply_commit(ws, sha) == then
        assert git(ws, "status", "--porcelain") == ""


def test_a_change_deleting_a_file_the_base_lacks_does_not_apply(make_repo, tmp_path):
    """A release that folds a news fragment (deletes it) replayed on a base the fragment has not reached yet: a
    three-way merge calls "deleted on both sides" clean, but the change needs the one that adds the fragment, so it
    does not apply (its job runs again behind it), with `conflict: theirs` too (no landing would see it later)."""
    repo = make_repo(files={"CHANGES": "old\n"})
    base = git(repo, "rev-parse", "main")
    git(repo, "checkout", "-qb", "side")
    write(repo, {"news/1.rst": "fixed\n"})
    git(repo, "add", "news/1.rst")
    git(repo, "commit", "-qm", "a fix and its fragment")
    git(repo, "rm", "-q", "news/1.rst")
    write(repo, {"CHANGES": "fixed\nold\n"})
    git(repo, "commit", "-qam", "release")
    sha = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    ws = workspace(repo, tmp_path / "ws", base, "orchestrator/1")
    with pytest.raises(replay.NotApplied, match=r"deletes news/1\.rst"):
        replay.apply_commit(ws, sha)
    assert git(ws, "status", "--porcelain") == ""
    with pytest.raises(replay.NotApplied, match=r"deletes news/1\.rst"):
        replay.apply_commit(ws, sha, theirs=True)
    git(repo, "merge", "-q", "--ff-only", "side~1")  # the fragment landed
    ws = workspace(repo, tmp_path / "ws2", git(repo, "rev-parse", "main"), "orchestrator/2")
    assert replay.apply_commit(ws, sha) == ["CHANGES", "news/1.rst"]


def test_a_change_deleting_a_file_something_landed_deleted_already_applies(make_repo, tmp_path):
    """Two branches remove one file (replayed without their merges): the second one's base lacks the file because
    the first one's landing deleted it, not because it was never added. It applies (its other edits land) instead of
    refusing on every attempt; a file the shared history never had still does not."""
    repo = make_repo(files={"old.py": "old\n", "a.txt": "a\n"})
    git(repo, "checkout", "-qb", "first")
    git(repo, "rm", "-q", "old.py")
    git(repo, "commit", "-qm", "drop old.py")
    git(repo, "checkout", "-q", "main")
    git(repo, "checkout", "-qb", "second")
    git(repo, "rm", "-q", "old.py")
    write(repo, {"a.txt": "a\nsecond\n"})
    git(repo, "commit", "-qam", "drop old.py and extend a")
    sha = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    git(repo, "merge", "-q", "--ff-only", "first")  # the first removal landed
    for n, theirs in enumerate((False, True)):
        ws = workspace(repo, tmp_path / f"ws{n}", git(repo, "rev-parse", "main"), f"orchestrator/{n}")
        assert replay.apply_commit(ws, sha, theirs=theirs) == ["a.txt"]
        assert (ws / "a.txt").read_text() == "a\nsecond\n" and not (ws / "old.py").exists()


def test_conflict_theirs_keeps_the_recorded_side(make_repo, tmp_path):
    """`conflict: theirs` applies a conflicting commit with its own side of each conflicting hunk."""
    assert replay.parse("commit: a\nconflict: theirs").theirs
    repo = make_repo(files={"a.txt": "a\n", "b.txt": "b\n"})
    sha = _side_commit(repo, {"a.txt": "theirs\n"})
    write(repo, {"a.txt": "ours\n", "b.txt": "b moved\n"})
    git(repo, "commit", "-qam", "main moved")
    ws = workspace(repo, tmp_path / "ws", git(repo, "rev-parse", "main"), "orchestrator/1")
    assert replay.apply_commit(ws, sha, theirs=True) == ["a.txt"]
    assert (ws / "a.txt").read_text() == "theirs\n" and (ws / "b.txt").read_text() == "b moved\n"


def test_a_change_editing_a_file_the_base_lacks_does_not_apply(make_repo, tmp_path):
    """A recorded edit of a file its replay base does not have yet (it came with a change that has not landed: a
    move, or the file's first version) does not apply, with `conflict: theirs` too: settling the modify/delete
    conflict with the recorded side would write the whole file ahead of the change that makes it, whose landing
    then writes beside or over it (a broken landing). Its job runs again behind that change instead."""
    repo = make_repo(files={"a.txt": "a\n"})
    git(repo, "checkout", "-qb", "side")
    write(repo, {"new.txt": "one\n"})
    git(repo, "add", "new.txt")
    git(repo, "commit", "-qm", "add new")
    write(repo, {"new.txt": "one\ntwo\n", "a.txt": "a\nb\n"})
    git(repo, "commit", "-qam", "extend new")
    sha = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    ws = workspace(repo, tmp_path / "ws", git(repo, "rev-parse", "main"), "orchestrator/1")
    for theirs in (False, True):
        with pytest.raises(replay.NotApplied, match=r"edits new\.txt, which this base does not have yet"):
            replay.apply_commit(ws, sha, theirs=theirs)
    assert not (ws / "new.txt").exists() and git(ws, "status", "--porcelain") == ""
    git(repo, "merge", "-q", "--ff-only", "side~1")  # the change that adds it landed
    ws = workspace(repo, tmp_path / "ws2", git(repo, "rev-parse", "main"), "orchestrator/2")
    assert replay.apply_commit(ws, sha, theirs=True) == ["a.txt", "new.txt"]
    assert (ws / "new.txt").read_text() == "one\ntwo\n"


def test_conflict_theirs_deletes_a_file_the_base_modified(make_repo, tmp_path):
    """A recorded deletion of a file its replay base has modified since (modify/delete) applies with `conflict:
    theirs`: the file is gone, the rest of the base stays; without it the conflict names the file."""
    repo = make_repo(files={"tests/old.py": "1\n", "keep.txt": "k\n"})
    git(repo, "checkout", "-qb", "side")
    git(repo, "rm", "-q", "tests/old.py")
    git(repo, "commit", "-qm", "drop old")
    sha = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    write(repo, {"tests/old.py": "1\n2\n", "keep.txt": "k moved\n"})
    git(repo, "commit", "-qam", "main edits old")
    ws = workspace(repo, tmp_path / "ws", git(repo, "rev-parse", "main"), "orchestrator/1")
    with pytest.raises(replay.ReplayError, match=r"conflict in tests/old\.py"):
        replay.apply_commit(ws, sha)
    assert replay.apply_commit(ws, sha, theirs=True) == ["tests/old.py"]
    assert not (ws / "tests/old.py").exists() and (ws / "keep.txt").read_text() == "k moved\n"


def test_conflict_theirs_moves_files_the_base_lacks(make_repo, tmp_path):
    """A recorded move of files its replay base does not have yet (they came with a change that has not
    landed: rename/delete) merges with `conflict: theirs` into the files at their new place, none at the old (as
    the benchmark's serial check applies it); the runner does not apply it: the move needs the change that adds
    them (landed later, it would bring them back at the old place)."""
    repo = make_repo(files={"a.txt": "a\n"})
    git(repo, "checkout", "-qb", "side")
    write(repo, {f"tests/two/t{n}.py": f"test {n}\n" * 5 for n in range(3)})
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "add tests")
    git(repo, "mv", "tests/two", "tests/one")
    git(repo, "commit", "-qm", "move tests")
    sha = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    ws = workspace(repo, tmp_path / "ws", git(repo, "rev-parse", "main"), "orchestrator/1")
    repository = pygit2.Repository(str(repo))
    commit = repository.revparse_single(sha).peel(pygit2.Commit)
    main = repository.revparse_single("main").peel(pygit2.Commit).tree
    tree = replay.replayed_tree(repository, commit, main, theirs=True)
    assert sorted(e.name for e in tree / "tests" / "one") == ["t0.py", "t1.py", "t2.py"]
    assert "tests/two" not in tree
    with pytest.raises(replay.NotApplied, match=r"tests/two/t0\.py"):
        replay.apply_commit(ws, sha, theirs=True)


def test_conflict_theirs_keeps_both_entries_of_a_changelog(make_repo, tmp_path):
    """An entry recorded beside another one (changes made in parallel, merged later) replays onto a base that has
    the other: a union-mergeable file keeps both entries, as its landing would; other files take the recorded
    side of a conflicting hunk."""
    repo = make_repo(files={"CHANGES.md": "# changes\n\n- older\n", "a.py": "a\n"})
    git(repo, "checkout", "-qb", "side")
    write(repo, {"CHANGES.md": "# changes\n\n- older\n- recorded entry\n", "a.py": "recorded\n"})
    git(repo, "commit", "-qam", "recorded")
    sha = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    write(repo, {"CHANGES.md": "# changes\n\n- older\n- landed entry\n", "a.py": "landed\n"})
    git(repo, "commit", "-qam", "landed first")
    ws = workspace(repo, tmp_path / "ws", git(repo, "rev-parse", "main"), "orchestrator/1")
    replay.apply_commit(ws, sha, theirs=True, mergeable=lambda p: p.startswith("CHANGES"))
    assert (ws / "CHANGES.md").read_text() == "# changes\n\n- older\n- landed entry\n- recorded entry\n"
    assert (ws / "a.py").read_text() == "recorded\n"


def test_a_changelog_rewording_overtaken_by_the_change_recorded_on_it_still_lands(make_repo, tmp_path):
    """A release rewording the changelog's heading, and the next change (recorded on top of it) adding a new heading
    above, replayed the other way round: the later one lands first, then the release still has its rewording to
    make (the old heading does not come back beside the new ones), and the end is the recorded end."""
    head = "# Changes\n\n\n## Unreleased (25.5.0...HEAD)\n\n- an entry\n"
    repo = make_repo(files={"CHANGELOG.md": head})
    git(repo, "checkout", "-qb", "side")
    released = head.replace("## Unreleased (25.5.0...HEAD)", "## 26.1.0 (25.5.0...26.1.0)")
    write(repo, {"CHANGELOG.md": released})
    git(repo, "commit", "-qam", "Prepare 26.1.0")
    release = git(repo, "rev-parse", "HEAD")
    write(repo, {"CHANGELOG.md": released.replace("## 26.1.0", "## Unreleased (26.1.0...HEAD)\n\n\n## 26.1.0")})
    git(repo, "commit", "-qam", "Start new development cycle")
    cycle, recorded = git(repo, "rev-parse", "HEAD"), (repo / "CHANGELOG.md").read_text()
    git(repo, "checkout", "-q", "main")
    repository = pygit2.Repository(str(repo))
    tree = repository.revparse_single("main").peel(pygit2.Tree)
    for sha in (cycle, release):
        before = tree.id
        commit = repository.revparse_single(sha).peel(pygit2.Commit)
        tree = replay.replayed_tree(repository, commit, tree, theirs=True, mergeable=lambda p: p == "CHANGELOG.md")
        assert tree.id != before, f"{commit.message.strip()} has a change to make"
    assert repository[tree["CHANGELOG.md"].id].data.decode() == recorded


def test_an_older_change_applied_after_a_later_one_made_on_it_does_not_undo_it(make_repo, tmp_path):
    """Type hints (recorded first) and a later change widening one of them (made on top): the later one landed first,
    so the older one replays onto a base that already has the widened hint. With `end` (the recorded end state) the
    conflicting line keeps the base's newer side, and the older change's other lines still land; without it, the
    recorded side takes the line back (the later change undone, which no check would call lost); an `end` not made
    on the older change (another branch's) decides nothing."""
    repo = make_repo(files={"routing.py": "import x\n\n\ndef route(methods: list = None):\n    pass\n"})
    git(repo, "checkout", "-qb", "side")
    write(repo, {"routing.py": "import typing\n\n\ndef route(methods: list[str] | None = None):\n    pass\n"})
    git(repo, "commit", "-qam", "improve type hints")
    hints = git(repo, "rev-parse", "HEAD")
    write(repo, {"routing.py": "import typing\n\n\ndef route(methods: Collection[str] | None = None):\n    pass\n"})
    git(repo, "commit", "-qam", "make the methods annotation more permissive")
    wider = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    write(repo, {"routing.py": "import x\n\n\ndef route(methods: Collection[str] | None = None):\n    pass\n"})
    git(repo, "commit", "-qam", "the later change landed first (as its replay writes it on this base)")
    landed = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-qb", "stable", "main~1")  # another branch's end, not made on the hints: says nothing
    write(repo, {"routing.py": "import x\n\n\ndef route(methods: Collection[str] | None = None):\n    pass\n"})
    git(repo, "commit", "-qam", "the same line on a maintenance branch")
    elsewhere = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    for n, (end, line) in enumerate(((wider, "Collection[str]"), (None, "list[str]"), (elsewhere, "list[str]"))):
        ws = workspace(repo, tmp_path / f"ws{n}", landed, f"orchestrator/{n + 2}")
        assert replay.apply_commit(ws, hints, theirs=True, end=end) == ["routing.py"]
        text = (ws / "routing.py").read_text()
        assert text.startswith("import typing\n") and f"methods: {line} | None" in text, (end, text)
    assert replay.parse(f"commit: {hints}\nconflict: theirs\nend: {wider}").end == wider


def test_an_older_change_to_a_changelog_applied_after_a_later_one_that_fixed_it_does_not_bring_its_lines_back(
    make_repo,
):
    """`Drop 3.9, add 3.15` rewords a released entry by mistake; `Fix changelog`, made on top of it, puts the released
    entry back and writes the new one under Unreleased. The fix landed first: the older change replayed after it
    (a union-merged file, never a claim, so nothing kept them in order) must not reword the released entry again.
    Without `end` it does (what a later change undid comes back, and the fix is lost)."""
    released = "# Changes\n\n## Unreleased\n\n## 25.1.0\n\n- Support for 3.13 and 3.14.\n- Faster.\n"
    repo = make_repo(files={"CHANGELOG.md": released})
    git(repo, "checkout", "-qb", "side")
    write(repo, {"CHANGELOG.md": released.replace("3.13 and 3.14", "3.13, 3.14, and 3.15")})
    git(repo, "commit", "-qam", "Drop 3.9, add 3.15")
    older = git(repo, "rev-parse", "HEAD")
    fixed = released.replace("## Unreleased\n", "## Unreleased\n\n- Support for 3.15.\n")
    write(repo, {"CHANGELOG.md": fixed})
    git(repo, "commit", "-qam", "Fix changelog")
    fix = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    repository = pygit2.Repository(str(repo))
    union_file = lambda p: p == "CHANGELOG.md"  # noqa: E731
    start = repository.revparse_single("main").peel(pygit2.Tree)
    landed = replay.replayed_tree(repository, repository[fix].peel(pygit2.Commit), start, True, union_file)
    assert repository[landed["CHANGELOG.md"].id].data.decode() == fixed, "the fix lands first, without the older"
    change = repository[older].peel(pygit2.Commit)
    kept = replay.replayed_tree(repository, change, landed, True, union_file, end=repository[fix].peel(pygit2.Commit))
    assert repository[kept["CHANGELOG.md"].id].data.decode() == fixed
    undone = replay.replayed_tree(repository, change, landed, True, union_file)
    assert "3.13, 3.14, and 3.15" in repository[undone["CHANGELOG.md"].id].data.decode()


def test_what_a_later_change_undid_of_a_change_is_left_out_once_it_has_landed() -> None:
    """`union.undone` (pure): what a later state made on the change undid (a stretch reverted, an added line
    removed) keeps the base's lines when the later change has landed in `ours`, and stands while it has not (one job
    at a time, in order: the later change undoes it when it lands); a removal the later state did not revert stands,
    and a line it kept stays."""
    base = b"a\nb\nc\nd\n"
    change = b"a\nB\nc\nnew\n"  # b reworded, d replaced by new
    reverted = b"y\na\nb\nc\nnew\n"  # b put back, y added
    for ours in (base, reverted):
        assert union.undone(base, change, b"a\nB\nc\nnew\n", ours) == change
    assert union.undone(base, change, reverted, reverted) == b"a\nb\nc\nnew\n"  # it landed: B left out
    assert union.undone(base, change, reverted, base) == change  # not yet
    added = b"a\nb\ne\nc\nd\n"  # e added, then removed by a later change that also added x
    assert union.undone(base, added, b"x\na\nb\nc\nd\n", b"x\na\nb\nc\nd\n") == base  # it landed: e left out
    assert union.undone(base, added, b"x\na\nb\nc\nd\n", base) == added  # not yet: e stands
    assert union.undone(base, b"a\nc\nd\n", b"a\nc\nd\n", base) == b"a\nc\nd\n"
    assert union.undone(base, b"a\nb\nc\nd\ne", b"a\nb\nc\nd\ne", base) == b"a\nb\nc\nd\ne"
    assert union.undone(base, b"a\0", base, base) is None


def test_an_entry_a_later_change_moved_is_left_out_only_when_ours_has_it_where_it_moved() -> None:
    """stamina's `Fix OverflowError` adds a `Fixed` entry above `Changed`; `Update changelog`, made on it, moves the
    entry below and corrects its link. When the move has landed whole, the older change adds nothing again; when
    only part of it reached `ours` (a union merge on a base without the entry keeps just the new link line), the
    older change's entry stands: leaving it out on that evidence lost the entry's text for good."""
    base = b"## Unreleased\n\n### Changed\n\n- Timeout.\n\n## 25.2.0\n"
    change = b"## Unreleased\n\n### Fixed\n\n- Overflow.\n  [#104]\n\n### Changed\n\n- Timeout.\n\n## 25.2.0\n"
    final = b"## Unreleased\n\n### Changed\n\n- Timeout.\n\n### Fixed\n\n- Overflow.\n  [#137]\n\n## 25.2.0\n"
    assert union.undone(base, change, final, final) == base
    partly = base.replace(b"## 25.2.0\n", b"  [#137]\n## 25.2.0\n")
    assert union.undone(base, change, final, partly) == change


def test_a_changelog_entry_a_later_release_moved_under_its_heading_is_kept() -> None:
    """wheel's `Fixed an import of a removed module` opens an `Unreleased` section with its entry; the release after
    it renames that heading (`Created a new release`), the one after that rewrites the new heading's format, and a
    later change opens a new `Unreleased` above. The recorded end state holds the entry under its version's heading:
    replayed one job at a time in the recorded order, each change applies whole and the file ends as recorded (a
    stretch judged with its heading left the entry out; a heading judged by the end state alone was put back)."""
    header = b"Release Notes\n=============\n\n"
    old = b"**0.46.2**\n\n- Restored.\n"
    states = [
        header + old,
        header + b"**UNRELEASED**\n\n- Fixed ImportError.\n\n" + old,
        header + b"**0.46.3** (2026)\n\n- Fixed ImportError.\n\n" + old,
        header + b"**0.46.3 (2026)**\n\n- Fixed ImportError.\n\n" + old,
        header + b"**UNRELEASED**\n\n- Newer.\n\n**0.46.3 (2026)**\n\n- Fixed ImportError.\n\n" + old,
    ]
    text = states[0]
    for before, after in itertools.pairwise(states):
        text = union.merge(before, text, union.undone(before, after, states[-1], text) or after) or b""
        assert text == after
    landed = states[-1]  # the later ones landed first: the older change adds nothing they did not keep
    assert union.undone(states[0], states[1], states[-1], landed) == states[1]


async def test_a_replay_that_does_not_apply_runs_again_behind_the_jobs_beside_it(make_repo, tmp_path):
    """A change recorded on top of another that has not landed yet does not apply on its base: a conflict, not a
    failure. Its job goes back to the queue behind the job beside it, runs again once that landed, and lands."""
    from tests.plane import plane

    repo = make_repo(files={"a.txt": "a\n", "b.txt": "b\n"})
    git(repo, "checkout", "-qb", "side")
    write(repo, {"a.txt": "A\n"})
    git(repo, "commit", "-qam", "first")
    first = git(repo, "rev-parse", "HEAD")
    write(repo, {"a.txt": "A, then B\n"})
    git(repo, "commit", "-qam", "second, on top of the first")
    second = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    async with plane(tmp_path, max_concurrent=2, per_repo=2) as p:
        a = await p.enqueue(repo, f"First\ncommit: {first}\nafter: 2", "a.txt", runner="replay")
        b = await p.enqueue(repo, f"Second\ncommit: {second}", "b.txt", runner="replay")

        async def stopped():
            job = await p.store.jobs.get(b)
            return job if job.attempts or job.state.terminal else None

        requeued = await p.until("job b back in the queue", stopped)
        assert requeued.state in (JobState.QUEUED, JobState.PLANNING, JobState.PLANNED), requeued.reason
        assert requeued.land_after == (a,)
        (event,) = [e for e in await p.store.events.of_job(b) if e["kind"] == "requeued"]
        assert event["code"] == Code.CONFLICT and event["behind"] == [a] and event["ran_s"] >= 0
        assert (await p.store.jobs.get(a)).state is JobState.RUNNING, "the job beside it runs on"
        done = await p.reach(b, JobState.LANDED, JobState.FAILED, JobState.CONFLICTED, timeout=60)
        assert done.state is JobState.LANDED, done.reason
        assert (await p.store.jobs.get(a)).state is JobState.LANDED
    assert git(repo, "show", "main:a.txt") == "A, then B"


def test_replay_jobs_land_through_the_daemon(make_repo, daemon_factory, tmp_path):
    """A commit replay and a patch replay run as jobs and land; a change that does not apply fails with why."""
    repo = make_repo()
    sha = _side_commit(repo, {"src/a.py": "a = 2\n"})
    patch = tmp_path / "docs.patch"
    patch.write_text(
        "diff --git a/docs/x.md b/docs/x.md\n--- a/docs/x.md\n+++ b/docs/x.md\n@@ -1 +1 @@\n-x\n+x, patched\n"
    )
    bad = tmp_path / "bad.patch"
    bad.write_text(patch.read_text().replace("-x\n", "-not there\n"))
    d = daemon_factory(env={"MAX_CONCURRENT_JOBS": "3"}).start()
    a = d.enqueue(repo, f"Bump a\ncommit: {sha}\nafter: 0.2", "--runner", "replay", "--path", "src/a.py")
    b = d.enqueue(repo, f'{{"patch": "{patch}"}}', "--runner", "replay", "--path", "docs/x.md")
    c = d.enqueue(repo, f"patch: {bad}", "--runner", "replay", "--path", "README.md")
    d.cli("wait", str(a), str(b), str(c), "--timeout", "60")
    ja, jb, jc = (d.cli_json("show", str(i)) for i in (a, b, c))
    assert ja["state"] == jb["state"] == "landed", (ja["reason"], jb["reason"])
    assert git(repo, "show", "main:src/a.py") == "a = 2"
    assert git(repo, "show", "main:docs/x.md") == "x, patched"
    assert "Bump a" in git(repo, "log", "--format=%s", "main").splitlines(), "the subject is the text's first line"
    assert jc["state"] == "conflicted" and "does not apply" in jc["reason"], jc["reason"]


def test_the_planner_reads_the_task_not_the_spec(make_repo, daemon_factory):
    """A replay job planned by local evidence: the spec's words (`commit`, `after`, `conflict`, `theirs`) are
    names of this repository's files, but they are the runner's instructions: the planner reads only the
    message, which names nothing here, so the job is claimed by nothing (it runs alone) and still lands."""
    repo = make_repo()
    write(repo, {f"src/{w}.py": f"{w} = 1\n" for w in ("commit", "after", "conflict", "theirs")})
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "modules")
    sha = _side_commit(repo, {"src/conflict.py": "conflict = 2\n"})
    d = daemon_factory().start()
    job = d.enqueue(repo, f"Fix the typo\ncommit: {sha}\nafter: 0\nconflict: theirs", "--runner", "replay")
    d.cli("wait", str(job), "--timeout", "60")
    shown = d.cli_json("show", str(job))
    assert shown["state"] == "landed", shown["reason"]
    assert shown["claim"]["paths"] == [], shown["claim"]
    assert git(repo, "show", "main:src/conflict.py") == "conflict = 2"
