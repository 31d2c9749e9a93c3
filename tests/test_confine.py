"""The built-in agent's tools stay inside the worktree: `..`, absolute paths, `.git` and every symlink are
refused, a racing process cannot redirect a read or write, and reads and searches are bounded."""

from __future__ import annotations

import asyncio
import ctypes
import os
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator import beneath as confine
from orchestrator.runners import agent_tools
from orchestrator.runners.agent_tools import Tools

RENAME_EXCHANGE = 2


@pytest.fixture(params=["openat2", "walk"])
def resolver(request, monkeypatch) -> Iterator[str]:
    """Each test runs with the kernel's openat2 and with the per-component O_NOFOLLOW walk."""
    if request.param == "openat2" and not confine.have_openat2():
        pytest.skip("this kernel has no openat2 (Linux 5.6+): the walk is what runs here")
    monkeypatch.setattr(confine, "_openat2_state", request.param == "openat2")
    yield request.param


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


def _tools(wt: Path, refused: list[tuple[str, str, str]] | None = None) -> Tools:
    async def no_run(command: str, timeout: float) -> tuple[int | None, str]:
        raise AssertionError("not called")

    return Tools(wt, run_command=no_run, on_refused=lambda *a: (refused if refused is not None else []).append(a))


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("../outside/secret.txt", "'..' is refused"),
        ("src/../../outside/x", "'..' is refused"),
        ("/etc/passwd", "absolute paths are refused"),
        ("~/.bashrc", "absolute paths are refused"),
        (".git/config", ".git is off limits"),
        ("src/.GIT/hooks/pre-commit", ".git is off limits"),
        ("", "relative to the repository root"),
        ("a\0b", "cannot contain NUL"),
    ],
)
def test_path_texts_leading_out_are_refused(path, says):
    """Each way out that the text alone shows is an Escape whose message tells the model what to do."""
    with pytest.raises(confine.Escape, match=says):
        confine.parts(path)


@pytest.mark.parametrize(
    ("path", "link"),
    [("link/secret.txt", "link"), ("link/new.txt", "link"), ("src/s.txt", "src/s.txt"), ("src/inner.py", "src/inner.py")],  # noqa: E501
)
def test_no_symlink_is_followed_and_the_message_names_it(tree, resolver, path, link):
    """A symlink anywhere on the path is refused, whether it leads out or stays inside, naming the link."""
    wt, _ = tree
    with confine.Root(wt) as root, pytest.raises(confine.Escape, match=f"{link} is a symbolic link"):
        os.close(root.open(confine.parts(path), os.O_RDONLY))


async def test_tools_refuse_and_log_and_change_nothing_outside(tree, resolver):
    """read, write, edit, list and search through any way out are tool errors, logged, and touch nothing."""
    wt, outside = tree
    refused: list[tuple[str, str, str]] = []
    tools = _tools(wt, refused)
    before = _snapshot(outside)
    calls = [
        ("read_file", {"path": "../outside/secret.txt"}),
        ("read_file", {"path": "/etc/passwd"}),
        ("read_file", {"path": "src/s.txt"}),
        ("write_file", {"path": "link/evil.txt", "content": "x"}),
        ("write_file", {"path": "link/deeper/evil.txt", "content": "x"}),
        ("write_file", {"path": "src/s.txt", "content": "x"}),
        ("write_file", {"path": str(outside / "evil.txt"), "content": "x"}),
        ("edit_file", {"path": "src/s.txt", "old": "secret", "new": "owned"}),
        ("list_dir", {"path": "link"}),
        ("search", {"pattern": "secret", "path": "../outside"}),
        ("search", {"pattern": "secret", "path": "link"}),
    ]
    for name, args in calls:
        outcome = await tools.call(name, args)
        assert outcome.error, (name, args, outcome.text)
    assert [r[0] for r in refused] == [c[0] for c in calls]
    assert _snapshot(outside) == before and sorted(os.listdir(outside)) == ["secret.txt"]
    # A search of the whole tree does not follow the links out either; the listing shows them as links.
    assert (await tools.call("search", {"pattern": "secret"})).text == "no matches"
    listing = (await tools.call("list_dir", {"path": "src"})).text
    assert "s.txt -> " in listing and "not followed" in listing and "a.py" in listing


async def test_write_makes_parents_and_keeps_the_exec_bit(tree, resolver):
    """write_file creates missing parent dirs inside and rewrites a file in place (its mode kept)."""
    wt, _ = tree
    tools = _tools(wt)
    (wt / "run.sh").write_text("old\n")
    os.chmod(wt / "run.sh", 0o755)
    assert not (await tools.call("write_file", {"path": "src/new/deep/b.py", "content": "b = 2\n"})).error
    assert not (await tools.call("write_file", {"path": "run.sh", "content": "echo hi\n"})).error
    assert (wt / "src/new/deep/b.py").read_text() == "b = 2\n" and (wt / "run.sh").read_text() == "echo hi\n"
    assert os.stat(wt / "run.sh").st_mode & 0o777 == 0o755
    bad = await tools.call("write_file", {"path": "src/a.py/x", "content": ""})
    assert bad.error and "a file is in the way" in bad.text


async def test_edit_file_needs_exactly_one_occurrence(tree, resolver):
    """edit_file replaces one exact occurrence, and says so when there are none or several."""
    wt, _ = tree
    tools = _tools(wt)
    (wt / "src" / "b.py").write_text("x = 1\nx = 1\n")
    assert "found 2 times" in (await tools.call("edit_file", {"path": "src/b.py", "old": "x = 1", "new": "y"})).text
    assert "not found" in (await tools.call("edit_file", {"path": "src/a.py", "old": "zzz", "new": "y"})).text
    ok = await tools.call("edit_file", {"path": "src/a.py", "old": "a = 1", "new": "a = 2"})
    assert not ok.error and (wt / "src" / "a.py").read_text() == "a = 2\n"


def _exchange(a: Path, b: Path) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd = -100
    if libc.renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _race_tree(tmp_path: Path) -> tuple[Path, Path]:
    wt, outside = tmp_path / "wt", tmp_path / "outside"
    (wt / "d" / "sub").mkdir(parents=True)
    (outside / "sub").mkdir(parents=True)
    (wt / "d" / "f.txt").write_text("inside\n")
    (wt / "d" / "sub" / "f.txt").write_text("inside\n")
    (outside / "f.txt").write_text("outside\n")
    (outside / "sub" / "f.txt").write_text("outside\n")
    os.symlink(outside, wt / "l")
    return wt, outside


def _checked_then_written(wt: Path, outside: Path, swap: Callable[[], None]) -> bool:
    """The old design: check the real path is inside, then write by path, with the swap in between."""
    assert Path(os.path.realpath(wt / "d" / "f.txt")).is_relative_to(os.path.realpath(wt))
    swap()
    (wt / "d" / "f.txt").write_text("owned\n")
    lost = (outside / "f.txt").read_text() == "owned\n"
    (outside / "f.txt").write_text("outside\n")
    swap()  # back as it was
    return lost


async def test_a_swap_between_the_steps_never_redirects_a_file_operation(tmp_path, resolver, monkeypatch):
    """A directory exchanged with a symlink out at any step of a resolution: the write lands inside or is
    refused, never outside (a check-then-write resolver, run through the same swap, writes outside)."""
    wt, outside = _race_tree(tmp_path)
    before = _snapshot(outside)
    # The control: the old design (resolve and check the real path, then write by path) loses this race.
    swapped: list[int] = []

    def swap() -> None:
        _exchange(wt / "d", wt / "l")
        swapped.append(1)

    assert _checked_then_written(wt, outside, swap), "the swap must be able to redirect a path-based write"

    tools = _tools(wt)
    calls = [
        ("write_file", {"path": "d/f.txt", "content": "owned\n"}),
        ("write_file", {"path": "d/sub/f.txt", "content": "owned\n"}),
        ("write_file", {"path": "d/sub/new.txt", "content": "owned\n"}),
        ("edit_file", {"path": "d/sub/f.txt", "old": "inside", "new": "owned"}),
        ("read_file", {"path": "d/sub/f.txt"}),
    ]
    for step in range(3):  # swap at the first, second or third step of each resolution
        for name, args in calls:
            seen = [0]

            def pause(step: int = step, seen: list[int] = seen) -> None:
                if seen[0] == step:
                    swap()
                seen[0] += 1

            monkeypatch.setattr(confine, "pause", pause)
            outcome = await tools.call(name, args)
            monkeypatch.setattr(confine, "pause", None)
            if len(swapped) % 2:
                swap()  # put the tree back for the next call
            assert "outside" not in outcome.text or outcome.error, (name, step, outcome.text)
            assert _snapshot(outside) == before, (name, args, step, outcome.text)
    assert len(swapped) > 4


def _start(*argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen(list(argv), stdout=subprocess.PIPE, text=True)


async def test_a_process_exchanging_dirs_in_a_tight_loop_never_gets_a_write_outside(tmp_path, resolver):
    """Another process exchanges the directory and a symlink out as fast as it can while the tools write,
    edit and read through it: nothing outside changes, and writes inside still succeed."""
    wt, outside = _race_tree(tmp_path)
    before = _snapshot(outside)
    loop = (
        "import ctypes, os, sys, time\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "a, b, end = os.fsencode(sys.argv[1]), os.fsencode(sys.argv[2]), time.monotonic() + float(sys.argv[3])\n"
        "n = 0\n"
        "while time.monotonic() < end:\n"
        "    libc.renameat2(-100, a, -100, b, 2); n += 1\n"
        "if n % 2: libc.renameat2(-100, a, -100, b, 2)\n"
        "print(n)\n"
    )
    racer = _start(sys.executable, "-c", loop, str(wt / "d"), str(wt / "l"), "0.6")
    tools = _tools(wt)
    ok = 0
    deadline = time.monotonic() + 0.6
    while time.monotonic() < deadline:
        for name, args in (
            ("write_file", {"path": "d/sub/f.txt", "content": "inside\n"}),
            ("write_file", {"path": "d/new/f.txt", "content": "x\n"}),
            ("edit_file", {"path": "d/sub/f.txt", "old": "inside", "new": "inside"}),
        ):
            ok += not (await tools.call(name, args)).error
    exchanges = int(racer.communicate(timeout=10)[0])
    assert exchanges > 100 and ok > 0
    assert _snapshot(outside) == before and sorted(os.listdir(outside)) == ["f.txt", "sub"]


async def test_fifos_devices_and_hard_links_are_never_written(tree, resolver):
    """A FIFO is refused without hanging, a hard-linked file (maybe shared with outside) and a device are
    refused unwritten."""
    wt, outside = tree
    tools = _tools(wt)
    os.mkfifo(wt / "pipe")
    os.link(outside / "secret.txt", wt / "hard.txt")
    for name, args in (
        ("write_file", {"path": "pipe", "content": "x"}),
        ("read_file", {"path": "pipe"}),
        ("edit_file", {"path": "pipe", "old": "a", "new": "b"}),
        ("write_file", {"path": "hard.txt", "content": "owned"}),
        ("edit_file", {"path": "hard.txt", "old": "secret", "new": "owned"}),
    ):
        outcome = await tools.call(name, args)
        assert outcome.error and ("FIFO" in outcome.text or "hard links" in outcome.text), (name, outcome.text)
    assert (outside / "secret.txt").read_text() == "secret\n"
    assert "no matches" in (await tools.call("search", {"pattern": "x", "path": "pipe"})).text
    if os.geteuid() == 0:
        os.mknod(wt / "null", 0o666 | 0o020000, os.makedev(1, 3))
        outcome = await tools.call("write_file", {"path": "null", "content": "x"})
        assert outcome.error and "a device" in outcome.text


def _write(path: bytes, data: bytes, size: int | None = None) -> None:
    with open(path, "wb") as f:
        f.write(data)
        if size is not None:
            f.truncate(size)  # sparse: no block written


async def test_a_huge_sparse_file_costs_the_daemon_only_the_limits(tree, resolver, monkeypatch):
    """A 1 GB sparse file: read_file reads READ_LIMIT bytes of it and says so, search skips it by name; a
    search stops at its total byte budget and says so."""
    wt, _ = tree
    _write(os.fsencode(wt / "big.txt"), b"", size=1 << 30)
    (wt / "src" / "needle.py").write_text("needle = 1\n")
    tools = _tools(wt)
    tracemalloc.start()
    try:
        read = await tools.call("read_file", {"path": "big.txt"})
        found = await tools.call("search", {"pattern": "needle"})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 1024 * 1024, peak
    assert "binary file (1073741824 bytes)" in read.text
    assert "src/needle.py:1: needle = 1" in found.text and "not searched" in found.text and "big.txt" in found.text
    (wt / "text.txt").write_text("line\n" * 300_000)
    long = (await tools.call("read_file", {"path": "text.txt"})).text
    assert f"first {agent_tools.READ_LIMIT} of 1500000 bytes" in long
    monkeypatch.setattr(agent_tools, "SEARCH_BYTES", 1000)
    assert "search stopped" in (await tools.call("search", {"pattern": "needle"})).text


async def test_names_that_are_not_utf8_never_break_a_tool(tree, resolver):
    """A file name that is not UTF-8 is listed and found with `\\xNN` escapes, in text that encodes as
    UTF-8 (for the API and the log); a file of such bytes is edited keeping them."""
    wt, _ = tree
    _write(os.fsencode(wt / "src") + b"/caf\xe9.txt", b"needle \xff\xfe here\n")
    tools = _tools(wt)
    listing = (await tools.call("list_dir", {"path": "src"})).text
    hits = (await tools.call("search", {"pattern": "needle"})).text
    for text in (listing, hits):
        text.encode("utf-8")
        assert "caf\\xe9.txt" in text
    (wt / "src" / "bytes.txt").write_bytes(b"keep \xff\xfe and a = 1\n")
    assert not (await tools.call("edit_file", {"path": "src/bytes.txt", "old": "a = 1", "new": "a = 2"})).error
    assert (wt / "src" / "bytes.txt").read_bytes() == b"keep \xff\xfe and a = 2\n"
    bad = await tools.call("read_file", {"path": "src/\udcff\ud800.txt"})
    assert bad.error and "not a valid file name" in bad.text
    bad.text.encode("utf-8")


async def test_a_pattern_that_backtracks_without_end_is_stopped_and_never_stalls_the_loop(tree, monkeypatch):
    """A search whose pattern backtracks exponentially on the job's own text stops at its time limit and
    says so, and the daemon's event loop keeps running meanwhile (the match never holds the GIL)."""
    wt, _ = tree
    (wt / "src" / "trap.txt").write_text("a" * 64 + "b\n")
    monkeypatch.setattr(agent_tools, "SEARCH_SECONDS", 1.0)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.02)
            ticks += 1

    task = asyncio.create_task(ticker())
    try:
        found = await asyncio.wait_for(_tools(wt).call("search", {"pattern": "(a|aa)+$"}), 60)
    finally:
        task.cancel()
    assert "search stopped after 1 s: the pattern is too slow" in found.text
    assert ticks >= 5, ticks  # the loop ran while the pattern was matched
