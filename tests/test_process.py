"""The one process helper: owned groups, gate, timeout with grace, capped log, allow-listed environment."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator.proc import process
from orchestrator.proc.process import CallbackOwner, Group


async def test_owner_records_the_group_before_the_command_runs(tmp_path: Path) -> None:
    """The command does nothing until the owner has recorded its group; it ends disowned and empty."""
    marker = tmp_path / "ran"
    seen: list[str] = []

    async def own(group: Group) -> None:
        await asyncio.sleep(0.3)  # a slow store write: the command must still be waiting
        seen.append(f"own ran={marker.exists()} pgid_ok={os.getpgid(group.pgid) == group.pgid}")

    async def disown(group: Group) -> None:
        seen.append(f"disown alive={process.group_alive(group.pgid)}")

    result = await process.run(
        f"touch {marker}; sleep 30 & echo done",
        cwd=tmp_path,
        env=process.environment(),
        timeout=30,
        owner=CallbackOwner(own, disown),
    )
    assert result.ok and result.output_tail == "done\n" and marker.exists()
    assert seen == ["own ran=False pgid_ok=True", "disown alive=False"], "background children die with the job"


async def test_command_never_runs_when_the_owner_fails(tmp_path: Path) -> None:
    """If the group cannot be recorded, the gate never opens: the command does not run at all."""
    marker = tmp_path / "ran"

    async def own(group: Group) -> None:
        raise OSError("disk full")

    async def disown(group: Group) -> None:
        raise AssertionError("never recorded, never disowned")

    with pytest.raises(OSError, match="disk full"):
        await process.run(
            f"touch {marker}", cwd=tmp_path, env={}, timeout=30, owner=CallbackOwner(own, disown)
        )
    await asyncio.sleep(0.2)
    assert not marker.exists()


def test_gate_without_a_daemon_never_runs_the_command(tmp_path: Path) -> None:
    """A gate whose daemon died before opening it (EOF on its pipe) exits 125 without running anything."""
    marker = tmp_path / "ran"
    done = subprocess.run(
        ["/bin/sh", "-c", process._GATE, "gate", "/bin/sh", "-c", f"touch {marker}"],
        stdin=subprocess.DEVNULL,
        timeout=10,
    )
    assert done.returncode == 125 and not marker.exists()


async def test_timeout_sends_sigterm_then_sigkill_after_the_grace(tmp_path: Path) -> None:
    """On timeout the group gets SIGTERM; one that ignores it is killed after the grace period."""
    log = tmp_path / "job.log"
    start = time.monotonic()
    result = await process.run(
        "trap 'echo got-term' TERM; echo ready; while :; do sleep 0.05; done",
        cwd=tmp_path,
        env={},
        timeout=0.5,
        grace=1.0,
        log_path=log,
    )
    took = time.monotonic() - start
    assert result.timed_out and not result.ok and result.returncode == -signal.SIGKILL
    assert "got-term" in result.output_tail
    assert 1.4 <= took < 15
    assert "[timed out after 0.5s" in log.read_text()


async def test_cancel_gives_the_command_its_grace(tmp_path: Path) -> None:
    """Cancellation (a graceful stop) sends SIGTERM first: a command that traps it can finish its line."""
    out = tmp_path / "out"
    task = asyncio.create_task(
        process.run(
            f"trap 'echo cleaned >> {out}; exit 0' TERM; echo started >> {out}; while :; do sleep 0.05; done",
            cwd=tmp_path,
            env={},
            timeout=60,
            grace=5.0,
        )
    )
    async with asyncio.timeout(10):
        while not out.exists():  # noqa: ASYNC110 -- another process writes it
            await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert out.read_text().splitlines() == ["started", "cleaned"]


async def test_log_is_capped_and_says_so(tmp_path: Path) -> None:
    """Output past the cap is not written to the log (which says it was capped); the tail is still kept."""
    log = tmp_path / "job.log"
    result = await process.run(
        "i=0; while [ $i -lt 3000 ]; do echo line-$i-xxxxxxxxxxxxxxxxxxxxxxxx; i=$((i+1)); done",
        cwd=tmp_path,
        env={},
        timeout=30,
        log_path=log,
        log_cap=8192,
    )
    text = log.read_text()
    assert result.ok and result.capped
    assert len(text) < 8192 + 300 and "log capped at 8192 bytes" in text
    assert "line-2999-" in result.output_tail and "line-2999-" not in text
    assert os.stat(log).st_mode & 0o777 == 0o600


async def test_a_one_megabyte_script_runs(tmp_path: Path) -> None:
    """A 1 MB shell text runs (through a private file, not argv) and the file is gone afterwards."""
    text = "x=1\n" + ": " + "y" * 1_000_000 + "\n" + "echo big-ok > out.txt\n"
    scripts = tmp_path / "private"
    result = await process.run(text, cwd=tmp_path, env={}, timeout=60, script_dir=scripts)
    assert result.ok, result.output_tail
    assert (tmp_path / "out.txt").read_text() == "big-ok\n"
    assert list(scripts.iterdir()) == []


def test_environment_is_an_allow_list() -> None:
    """Only base variables and the runner's named ones pass; secrets and git location variables never by default."""
    environ = {
        "PATH": "/bin",
        "HOME": "/h",
        "LC_ALL": "C",
        "ANTHROPIC_API_KEY": "sk-ant-xxxxxxxxxxxx",
        "GIT_DIR": "/elsewhere/.git",
        "VIRTUAL_ENV": "/venv",
        "AWS_SECRET": "s",
    }
    env = process.environment(environ=environ)
    assert env == {"PATH": "/bin", "HOME": "/h", "LC_ALL": "C"}
    env = process.environment(["VIRTUAL_ENV", "ANTHROPIC_*", "GIT_DIR"], {"X": "1"}, environ=environ)
    assert env == {
        "PATH": "/bin",
        "HOME": "/h",
        "LC_ALL": "C",
        "VIRTUAL_ENV": "/venv",
        "ANTHROPIC_API_KEY": "sk-ant-xxxxxxxxxxxx",
        "X": "1",
    }


def test_the_store_s_variables_never_pass_whatever_a_runner_names() -> None:
    """PGPASSWORD, PGHOST, PGPASSFILE (the daemon's way into the team's store) pass to no command, even through a
    runner's `*` pattern; a value the runner's own config writes still does."""
    environ = {"PATH": "/bin", "PGPASSWORD": "pw", "PGHOST": "/run/postgresql", "PGPASSFILE": "/h/.pgpass", "K": "v"}
    assert process.environment(["*"], {"PGDATABASE": "tests"}, environ=environ) == {
        "PATH": "/bin",
        "K": "v",
        "PGDATABASE": "tests",
    }


def test_survivors_are_ended_and_recycled_pids_are_left_alone(tmp_path: Path) -> None:
    """`end_groups` kills a recorded group that still runs, and spares a pid whose start time does not match."""
    survivor = subprocess.Popen(["sleep", "60"], start_new_session=True)
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        ours = Group(survivor.pid, process._start_time(survivor.pid), process.boot_id(), "job 1")
        recycled = Group(stranger.pid, process._start_time(stranger.pid) - 1, process.boot_id(), "job 2")
        assert process.is_ours(ours) and not process.is_ours(recycled)
        ended = asyncio.run(process.end_groups([ours, recycled], grace=2.0))
        assert ended == [ours]
        assert survivor.wait(5) == -signal.SIGTERM
        assert stranger.poll() is None, "a pid that is not the recorded group is never signalled"
    finally:
        for p in (survivor, stranger):
            p.kill()
            p.wait()


def test_a_record_without_its_boot_or_start_time_names_no_group() -> None:
    """A record that cannot be checked (start time 0, an empty boot id, another boot's) never makes the daemon
    signal the group it names, here a real `setsid` process group of the user's."""
    stranger = subprocess.Popen(["setsid", "sleep", "60"], stdin=subprocess.DEVNULL)  # not a leader: no fork
    try:
        deadline = time.monotonic() + 5
        while (process._stat(stranger.pid) or ("", 0))[1] != stranger.pid:  # until setsid made it a leader
            assert time.monotonic() < deadline
            time.sleep(0.01)
        start, boot = process._start_time(stranger.pid), process.boot_id()
        unchecked = [
            Group(stranger.pid, 0, ""),
            Group(stranger.pid, 0, boot),
            Group(stranger.pid, start, ""),
            Group(stranger.pid, start, "another-boot"),
        ]
        assert [process.is_ours(g) for g in unchecked] == [False] * 4
        assert asyncio.run(process.end_groups(unchecked, grace=0.5)) == []
        assert stranger.poll() is None
        assert process.is_ours(Group(stranger.pid, start, boot))  # what the daemon itself records is checkable
    finally:
        stranger.kill()
        stranger.wait()
