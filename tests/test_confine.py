"""The built-in agent's tools stay inside the worktree: `..`, absolute paths and symlinks out are refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.runners import confine
from orchestrator.runners.agent_tools import Tools


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    wt, outside = tmp_path / "wt", tmp_path / "outside"
    (wt / "src").mkdir(parents=True)
    outside.mkdir()
    (wt / "src" / "a.py").write_text("a = 1\n")
    (outside / "secret.txt").write_text("secret\n")
    os.symlink(outside, wt / "link")
    os.symlink(outside / "secret.txt", wt / "src" / "s.txt")
    os.symlink("a.py", wt / "src" / "inner.py")
    (wt / ".git").write_text("gitdir: /nowhere\n")
    return wt, outside


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("../outside/secret.txt", "'..' is refused"),
        ("src/../../outside/x", "'..' is refused"),
        ("/etc/passwd", "absolute paths are refused"),
        ("~/.bashrc", "absolute paths are refused"),
        ("link/secret.txt", "outside the repository"),
        ("link/new.txt", "outside the repository"),
        ("src/s.txt", "outside the repository"),
        (".git/config", ".git is off limits"),
        ("", "relative to the repository root"),
    ],
)
def test_paths_leading_out_are_refused(tree, path, says):
    """Each way out of the worktree is an Escape whose message tells the model what to do."""
    wt, _ = tree
    with pytest.raises(confine.Escape, match=says):
        confine.inside(wt, path)


def test_paths_inside_resolve_even_through_inner_symlinks(tree):
    """A plain path, a new file and a symlink that stays inside all resolve under the worktree."""
    wt, _ = tree
    real = Path(os.path.realpath(wt))
    assert confine.inside(wt, "src/a.py") == real / "src" / "a.py"
    assert confine.inside(wt, "src/new/b.py") == real / "src" / "new" / "b.py"
    assert confine.inside(wt, "src/inner.py") == real / "src" / "a.py"


async def test_tools_refuse_and_log_and_change_nothing_outside(tree):
    """read, write, edit, list and search through any way out are tool errors, logged, and touch nothing."""
    wt, outside = tree
    refused: list[tuple[str, str, str]] = []

    async def no_run(command: str, timeout: float) -> tuple[int | None, str]:
        raise AssertionError("not called")

    tools = Tools(wt, run_command=no_run, on_refused=lambda *a: refused.append(a))
    before = {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()}
    calls = [
        ("read_file", {"path": "../outside/secret.txt"}),
        ("read_file", {"path": "/etc/passwd"}),
        ("read_file", {"path": "src/s.txt"}),
        ("write_file", {"path": "link/evil.txt", "content": "x"}),
        ("write_file", {"path": str(outside / "evil.txt"), "content": "x"}),
        ("edit_file", {"path": "src/s.txt", "old": "secret", "new": "owned"}),
        ("list_dir", {"path": "link"}),
        ("search", {"pattern": "secret", "path": "../outside"}),
    ]
    for name, args in calls:
        outcome = await tools.call(name, args)
        assert outcome.error, (name, args, outcome.text)
    assert [r[0] for r in refused] == [c[0] for c in calls]
    assert {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()} == before
    # A search of the whole tree does not follow the links out either.
    hits = await tools.call("search", {"pattern": "secret"})
    assert hits.text == "no matches"


async def test_edit_file_needs_exactly_one_occurrence(tree):
    """edit_file replaces one exact occurrence, and says so when there are none or several."""
    wt, _ = tree

    async def no_run(command: str, timeout: float) -> tuple[int | None, str]:
        return 0, ""

    tools = Tools(wt, run_command=no_run, on_refused=lambda *a: None)
    (wt / "src" / "b.py").write_text("x = 1\nx = 1\n")
    assert "found 2 times" in (await tools.call("edit_file", {"path": "src/b.py", "old": "x = 1", "new": "y"})).text
    assert "not found" in (await tools.call("edit_file", {"path": "src/a.py", "old": "zzz", "new": "y"})).text
    ok = await tools.call("edit_file", {"path": "src/a.py", "old": "a = 1", "new": "a = 2"})
    assert not ok.error and (wt / "src" / "a.py").read_text() == "a = 2\n"
