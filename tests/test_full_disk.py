"""A full disk under a job's log: the output pump keeps draining, the timeout and a cancel still end the job."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from orchestrator.proc import process
from tests.smallfs import fill

NOISY = "head -c 3000000 /dev/zero | tr '\\0' x; echo; echo $$ > {pid}; echo marker; exec sleep 60"


async def test_a_full_log_disk_still_times_the_command_out(small_fs, tmp_path: Path) -> None:
    """Its log file cannot grow: the command's output is read anyway (it never blocks on a full pipe), its
    timeout ends it and its group, and its output's tail is kept."""
    fs = small_fs("1m")
    fill(fs, leave=64 * 1024)
    pid = tmp_path / "pid"
    started = time.monotonic()
    result = await process.run(
        NOISY.format(pid=pid), cwd=tmp_path, env=process.environment(), timeout=3, log_path=fs / "job.log", grace=0.5
    )
    assert result.timed_out and time.monotonic() - started < 30
    assert result.output_tail.endswith("marker\n")
    assert not process.alive(int(pid.read_text()))


async def test_a_full_log_disk_still_lets_a_cancel_end_the_command(small_fs, tmp_path: Path) -> None:
    """Cancelled while its log cannot grow: the command and its group are ended, nothing left running."""
    fs = small_fs("1m")
    fill(fs, leave=64 * 1024)
    pid = tmp_path / "pid"
    task = asyncio.create_task(
        process.run(NOISY.format(pid=pid), cwd=tmp_path, env=process.environment(), timeout=60, log_path=fs / "j.log")
    )
    deadline = time.monotonic() + 30
    while not pid.exists() or not pid.read_text().strip():
        assert time.monotonic() < deadline, "the command never got past its output"
        await asyncio.sleep(0.05)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert not process.alive(int(pid.read_text()))
    assert (fs / "j.log").stat().st_size < 1024 * 1024
