"""Editing the waiting queue like pueue: a job's text, paths and priority (`edit`), and its place (`switch`,
`move --before`, `enqueue --before`), through guarded writes: an edit never races a start, a reordered queue is
admitted in its new order, and a job planned again keeps its place."""

from __future__ import annotations

import shutil

import pytest

from orchestrator import testhook
from orchestrator.core import queue
from orchestrator.core.job import Job
from orchestrator.core.models import Code, JobEvent, JobState
from orchestrator.jobs.service import JobError
from orchestrator.requests import Edit, Enqueue
from orchestrator.store import Write
from tests.conftest import git
from tests.plane import plane
from tests.test_guarded_races import Pause


def gated(gate, text: str) -> str:
    return f"while [ ! -e {gate} ]; do sleep 0.05; done; {text}"


async def _kinds(p, job_id: int) -> list[str]:
    return [e["kind"] for e in await p.store.events.of_job(job_id)]


async def _admitted_at(p, job_id: int) -> float:
    return next(e["at"] for e in await p.store.events.of_job(job_id) if e["kind"] == "admitted")


async def test_an_edit_between_admission_and_the_start_wins_and_the_old_text_never_runs(make_repo, tmp_path):
    """Admission decided to start the job; before its move to `running` is written, a person edits its text: the
    edit is written first, so the start finds the job no longer planned and backs off; the job is planned again
    and only the new text ever runs."""
    repo = make_repo()
    old, new = tmp_path / "old-ran", tmp_path / "new-ran"
    async with plane(tmp_path) as p:
        pause = Pause()
        testhook.install("admit", pause)
        job = await p.enqueue(repo, f"touch {old}; echo old > out.txt", "out.txt")
        await pause.wait()  # admitted: the start's write is next
        edited = await p.jobs.edit(job, Edit(text=f"touch {new}; echo new > out.txt"))
        assert edited.state is JobState.QUEUED and edited.code == Code.EDITED
        pause.go.set()
        await p.reach(job, JobState.LANDED, timeout=60)
        assert new.exists() and not old.exists(), "the old text never ran"
        assert git(repo, "show", "main:out.txt") == "new"
        assert (await _kinds(p, job)).count("admitted") == 1


async def test_a_started_job_is_not_edited_and_nothing_of_it_changes(make_repo, tmp_path):
    """Once it runs, an edit is refused with where the job is; its text and priority stay as they were."""
    repo = make_repo()
    gate = tmp_path / "gate"
    async with plane(tmp_path) as p:
        job = await p.enqueue(repo, gated(gate, "echo a > a.txt"), "a.txt")
        await p.reach(job, JobState.RUNNING)
        with pytest.raises(JobError, match="is running; only a waiting job"):
            await p.jobs.edit(job, Edit(text="echo b > a.txt", priority=5))
        now = await p.store.jobs.get(job)
        assert now is not None and now.priority == 0 and "gate" in now.text
        assert "edited" not in await _kinds(p, job)
        gate.touch()
        await p.reach(job, JobState.LANDED)


async def test_a_planned_job_edited_plans_again_with_its_new_paths_and_keeps_its_place(make_repo, tmp_path):
    """A waits behind H (Overlap); B, queued after A, overlaps A. A's paths are edited: while A is planned again,
    B does not overtake it (Priority), and A plans its new paths."""
    repo = make_repo()
    gate = tmp_path / "gate"
    async with plane(tmp_path, max_concurrent=4) as p:
        h = await p.enqueue(repo, gated(gate, "echo h > src/a.py"), "src/a.py")
        await p.reach(h, JobState.RUNNING)
        a = await p.enqueue(repo, "echo a > src/a.py", "src/a.py")
        await p.until("A waits on H", lambda: _code(p, a, "Overlap"))
        planning = Pause(a)
        testhook.install("plan", planning)
        await p.jobs.edit(a, Edit(paths=("src/a.py", "src/b.py")))
        await planning.wait()  # A is being planned again
        b = await p.enqueue(repo, "echo b > src/b.py", "src/b.py")
        await p.until("B waits for A", lambda: _code(p, b, "Priority"))
        job = await p.store.jobs.get(b)
        assert job is not None and job.decision is not None and job.decision["blocking"] == [a]
        planning.go.set()
        planned = await p.reach(a, JobState.PLANNED)
        assert planned.claim.paths == {"src/a.py", "src/b.py"} and planned.declared == ("src/a.py", "src/b.py")
        gate.touch()
        for j in (h, a, b):
            await p.reach(j, JobState.LANDED, timeout=60)
        assert await _admitted_at(p, a) < await _admitted_at(p, b)


async def _code(p, job_id: int, code: str) -> bool:
    job = await p.store.jobs.get(job_id)
    live = p.parts.scheduler.live(job) if job is not None else None
    return live is not None and live.code == code


async def test_a_reordered_queue_is_admitted_in_its_new_order(make_repo, tmp_path):
    """Four jobs wait behind H on one file, queued 1, 2, 3, 4: `switch 1 2`, `move 4 --before 2` and a fifth job
    `enqueue --before 1` run in the order the queue now says: 5, 2, 4, 1, 3 (each waits for the one before it)."""
    repo = make_repo()
    gate = tmp_path / "gate"
    order = tmp_path / "order"
    async with plane(tmp_path, max_concurrent=4) as p:
        h = await p.enqueue(repo, gated(gate, "echo h > src/a.py"), "src/a.py")
        await p.reach(h, JobState.RUNNING)
        ids = [await p.enqueue(repo, f"echo {n} >> {order}; echo {n} > src/a.py", "src/a.py") for n in range(1, 5)]
        one, two, _three, four = ids
        for j in ids:
            await p.reach(j, JobState.PLANNED)
        switched = await p.jobs.switch(one, two)
        assert [j.id for j in switched] == [one, two]
        await p.jobs.move(four, one)
        text = f"echo 5 >> {order}; echo 5 > src/a.py"
        five = (await p.jobs.submit(Enqueue(repo=str(repo), text=text, paths=("src/a.py",), before=two))).id
        assert (await _kinds(p, four)).count("moved") == 1
        gate.touch()
        for j in (*ids, five):
            await p.reach(j, JobState.LANDED, timeout=90)
        assert order.read_text().split() == ["5", "2", "4", "1", "3"]


async def test_reordering_refuses_jobs_that_do_not_wait(make_repo, tmp_path):
    """A running job cannot be moved, nor a job moved before it; a job cannot switch with itself."""
    repo = make_repo()
    gate = tmp_path / "gate"
    async with plane(tmp_path) as p:
        h = await p.enqueue(repo, gated(gate, "echo h > h.txt"), "h.txt")
        await p.reach(h, JobState.RUNNING)
        w = await p.enqueue(repo, "echo w > h.txt", "h.txt")
        await p.reach(w, JobState.PLANNED)
        with pytest.raises(JobError, match=f"job {h} is running"):
            await p.jobs.move(w, h)
        with pytest.raises(JobError, match=f"job {h} is running"):
            await p.jobs.switch(h, w)
        with pytest.raises(Exception, match="itself"):
            await p.jobs.switch(w, w)
        gate.touch()
        await p.reach(w, JobState.LANDED)


async def test_a_switch_is_all_or_nothing(tmp_path):
    """Two guarded writes in one: when one job is no longer where its write expects, neither is written."""
    from orchestrator.store.sqlite import SqliteStore

    store = await SqliteStore.open(tmp_path / "db.sqlite")
    try:
        a = await store.jobs.add(repo="/r", branch="main", text="a", runner="shell")
        b = await store.jobs.add(repo="/r", branch="main", text="b", runner="shell")
        await store.jobs.transition(b.id, {JobState.QUEUED}, JobState.CANCELLED, JobEvent.CANCELLED)
        pa, pb = queue.switched(a, b)
        writes = [Write(a.id, pa.fields(), JobEvent.MOVED, None, frozenset({JobState.QUEUED})),
                  Write(b.id, pb.fields(), JobEvent.MOVED, None, frozenset({JobState.QUEUED}))]  # fmt: skip
        assert await store.jobs.update_all(writes) is None
        after = await store.jobs.get(a.id)
        assert after is not None and after.place is None and after.priority == 0
        assert [e["kind"] for e in await store.events.of_job(a.id)] == ["enqueued"]
    finally:
        await store.close()


def test_a_place_between_two_places_is_found_until_there_is_none_then_the_queue_is_renumbered():
    """Moving a job before the same one again and again halves the gap; when no number is left between, the jobs of
    that priority get places one apart, in the same order."""
    jobs = [Job(i, "/r", "main", str(i), "shell", JobState.PLANNED) for i in (1, 2)]
    spot = queue.before(jobs[1], jobs, moving=99)
    assert spot == queue.Place(0, 1.5)
    tight = [jobs[0], Job(2, "/r", "main", "2", "shell", JobState.PLANNED, place=1.0 + 2**-52)]
    assert queue.before(tight[1], tight, moving=99) is None
    assert queue.renumbered(tight, 0) == {1: 1.0, 2: 2.0}


TMUX = shutil.which("tmux") is not None


@pytest.mark.skipif(not TMUX, reason="tmux is not installed (.ci/run installs it)")
def test_edit_in_editor_move_switch_and_enqueue_before_through_the_cli(make_repo, daemon_factory, tmp_path):
    """The CLI end to end: `edit ID` on a terminal opens $EDITOR on the job's priority, paths and text (tmux), and
    the saved change is what runs; `enqueue --before`, `move --before` and `switch` reorder the waiting jobs."""
    from tests.terminal import Terminal
    from tests.test_e2e_jobs import until

    repo = make_repo()
    d = daemon_factory().start()
    gate = tmp_path / "gate"
    order = tmp_path / "order"
    h = d.enqueue(repo, gated(gate, "echo h > src/a.py"), "--path", "src/a.py")
    until(lambda: d.cli_json("show", str(h))["state"] == "running", what="H running")
    a = d.enqueue(repo, f"echo a >> {order}; echo a > src/a.py", "--path", "src/a.py")
    b = d.enqueue(repo, f"echo b >> {order}; echo b > src/a.py", "--path", "src/a.py")
    c = d.enqueue(repo, f"echo c >> {order}; echo c > src/a.py", "--path", "src/a.py", "--before", str(a))
    assert d.cli("switch", str(a), str(b)).returncode == 0  # c, b, a
    assert d.cli("move", str(a), "--before", str(c)).returncode == 0  # a, c, b
    refused = d.cli("move", str(a), "--before", str(h))
    assert refused.returncode == 2 and f"job {h} is running" in refused.stderr

    editor = tmp_path / "editor.sh"  # what a person does in the editor: a new text for job b
    editor.write_text("#!/bin/sh\nsed -i 's/echo b >> /echo B >> /' \"$1\"\n")
    editor.chmod(0o755)
    t = Terminal(f"orch-edit-{tmp_path.name}", 80)
    try:
        t.view(d.home, "edit", str(b), env={"EDITOR": str(editor)})
        assert "echo B >>" in d.cli_json("show", str(b))["text"]
    finally:
        t.close()
    gate.touch()
    assert d.cli("wait", str(a), str(b), str(c), "--timeout", "90").returncode == 0
    assert order.read_text().split() == ["a", "c", "B"]


def test_the_edit_draft_fits_an_80_column_editor() -> None:
    """The lines `edit` puts above a job's fields fit 80 columns (bar the one naming its repository), and the draft
    reads back as the job's fields."""
    from orchestrator.commands.edit import draft, parse

    job = {"id": 7, "state": "planned", "repo": "/r", "branch": "main", "priority": 2, "declared": ["a b.py"],
           "text": "echo hi"}  # fmt: skip
    lines = draft(job).splitlines()
    assert all(len(line) < 80 for line in lines[1:]), [line for line in lines if len(line) >= 80]
    assert parse(draft(job)) == {"priority": 2, "paths": ["a b.py"], "text": "echo hi"}
