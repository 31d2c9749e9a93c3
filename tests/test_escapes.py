"""Noticing writes into the user's checkout without a sandbox: landings of other jobs are never taken for one."""

from __future__ import annotations

import subprocess
import sys
import time

from orchestrator.jobs import escapes
from tests.conftest import git


def test_a_file_left_at_a_commit_between_the_heads_is_a_landing_not_an_escape(make_repo):
    """Head moved h1 → h2 → h3 (two landings) while the checkout's file still holds h2's content (the second
    landing's checkout update under way): not counted. A file matching no state of the branch is."""
    repo = make_repo(files={"a.txt": "one\n", "b.txt": "b\n"})
    before = escapes.snapshot(repo)
    for text in ("two\n", "three\n"):
        (repo / "a.txt").write_text(text)
        git(repo, "commit", "-qam", f"land {text.strip()}")
    (repo / "a.txt").write_text("two\n")  # the checkout update to h3 has not reached this file yet
    (repo / "b.txt").write_text("written by the job\n")
    after = escapes.snapshot(repo)
    assert escapes.written(repo, before, after) == ["b.txt"]


def test_no_move_and_no_change_is_nothing(make_repo):
    """Two snapshots of an untouched checkout: nothing written."""
    repo = make_repo()
    before = escapes.snapshot(repo)
    assert escapes.written(repo, before, escapes.snapshot(repo)) == []


def test_a_snapshot_taken_while_a_landing_rewrites_the_checkout_does_not_fail(make_repo, tmp_path):
    """Another job's landing rewrites the checkout's files while this job's snapshot reads them: git finds a file
    shorter than its stat said ("error reading file for hashing") and the snapshot, hence the job, failed (a release
    and a lint pass on two benchmark replays). A separate process rewrites every file again and again, as landing
    after landing would; each snapshot still comes back."""
    line = "x" * 98 + "\n"
    repo = make_repo(files={f"f{i}.txt": line * 3000 for i in range(30)})
    stop = tmp_path / "stop"
    churn = (
        "import pathlib, itertools, time\n"
        f"root, stop = pathlib.Path({str(repo)!r}), pathlib.Path({str(stop)!r})\n"
        "for n in itertools.count():\n"
        "    if stop.exists(): break\n"
        "    for i in range(30): (root / f'f{i}.txt').write_text((f'y{n % 10}' + 'x' * 97 + '\\n') * 3000)\n"
        "    time.sleep(0.02)\n"
    )
    writer = subprocess.Popen([sys.executable, "-c", churn])
    try:
        deadline = time.monotonic() + 3.0
        taken = 0
        while time.monotonic() < deadline:
            assert escapes.snapshot(repo).head is not None
            taken += 1
        assert writer.poll() is None, "the writer ran throughout"
    finally:
        stop.touch()
        writer.wait(10)
    assert taken > 20
