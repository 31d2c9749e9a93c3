"""Real conflicts seen while jobs run: the job that would land second stops at once and runs again behind the other.

In-process job plane (real store, real git, real scheduler, shell jobs); the one end-to-end test through the real
daemon is in `test_e2e_jobs.py`.
"""

from __future__ import annotations

from dataclasses import replace

from orchestrator.core import admission
from orchestrator.core.conflict import second
from orchestrator.core.job import Job, fresh_attempt
from orchestrator.core.models import Claim, ClaimSource, JobState, Reason, Snapshot
from orchestrator.store.sqlite import SqliteStore
from tests.conftest import git
from tests.jobstates import put
from tests.plane import plane

RUNNING = JobState.RUNNING


def _job(id: int, state: JobState = RUNNING, started: float = 0.0, land_after: tuple[int, ...] = ()) -> Job:
    return Job(id, "r", "main", "t", "shell", state, started_at=started, land_after=land_after)


def test_the_job_that_lands_second_is_the_one_stopped():
    """An order already set stands; a job whose run ended lands first; else the later start lands second."""
    a, b = _job(1, started=10.0), _job(2, started=20.0)
    assert second(a, b) is b and second(b, a) is b
    assert second(replace(a, land_after=(2,)), b).id == 1, "it lands after the other: it is stopped"
    assert second(a, replace(b, state=JobState.LANDING)) is a, "the other finished its run: it lands first"
    assert second(replace(a, state=JobState.LANDED), replace(b, state=JobState.LANDING)) is None
    assert second(_job(3, started=5.0), _job(1, started=5.0)).id == 3, "a tie goes by id"


def _wait(path, limit: int = 600) -> str:
    return f"n=0; while [ ! -e {path} ] && [ $n -lt {limit} ]; do sleep 0.05; n=$((n+1)); done"


async def test_two_jobs_editing_other_lines_of_one_file_both_run_and_land(make_repo, tmp_path):
    """A common file changed at distant lines merges clean: the watch merges them, stops nobody, both land."""
    repo = make_repo(files={"f.txt": "".join(f"line {n}\n" for n in range(1, 21))})
    a_up, b_up, go = tmp_path / "a.up", tmp_path / "b.up", tmp_path / "go"
    async with plane(tmp_path, max_concurrent=2, per_repo=2) as p:
        a = await p.enqueue(repo, f"sed -i 's/^line 1$/line one/' f.txt; touch {a_up}; {_wait(go)}", "a.txt")
        b = await p.enqueue(repo, f"{_wait(a_up)}; sed -i 's/^line 20$/line twenty/' f.txt; touch {b_up}; {_wait(go)}",
                            "b.txt")  # fmt: skip

        async def checked():
            both = await p.store.events.of_job(a) + await p.store.events.of_job(b)
            return [e for e in both if e["kind"] == "overlap_checked"]

        seen = await p.until("the two jobs merged in memory", checked)
        assert seen[0]["conflicts"] == []
        go.touch()
        for job in (a, b):
            done = await p.reach(job, JobState.LANDED, JobState.FAILED, JobState.CONFLICTED, timeout=60)
            assert done.state is JobState.LANDED and done.attempts == 0, done.reason
    text = git(repo, "show", "main:f.txt")
    assert text.startswith("line one\n") and text.endswith("line twenty")


async def test_a_running_job_whose_branch_moved_under_it_in_conflict_stops_and_runs_on_the_new_head(
    make_repo, tmp_path
):
    """The branch moves (a person's commit, or a landing) in a file a running job changed, conflicting with it: at
    its next write the job is stopped (its landing would conflict), runs again on the new head, and lands on top;
    what moved the branch stays."""
    repo = make_repo(files={"f.txt": "one\n", "g.txt": "g\n"})
    b_wrote, moved, once = tmp_path / "b.wrote", tmp_path / "moved", tmp_path / "once"
    async with plane(tmp_path, max_concurrent=2, per_repo=2) as p:
        b = await p.enqueue(
            repo,
            f"if [ -e {once} ]; then echo B >> f.txt; exit 0; fi; touch {once}; echo B > f.txt; touch {b_wrote}; "
            f"{_wait(moved)}; echo more > other.txt; sleep 120",
            "f.txt",
        )
        await p.until("b wrote", lambda: _exists(b_wrote))
        (repo / "f.txt").write_text("person\n")
        git(repo, "commit", "-qam", "a person's own change")
        moved.touch()

        async def stopped():
            job = await p.store.jobs.get(b)
            return job if job.attempts else None

        await p.until("b stopped and re-queued", stopped, timeout=20)
        (event,) = [e for e in await p.store.events.of_job(b) if e["kind"] == "requeued"]
        assert event["conflicts"] == ["f.txt"] and event["behind"] == [], event
        assert event["why"] == "a real conflict with main, which moved since it started, in f.txt"
        done = await p.reach(b, JobState.LANDED, JobState.FAILED, JobState.CONFLICTED, timeout=60)
        assert done.state is JobState.LANDED, done.reason
    assert git(repo, "show", "main:f.txt") == "person\nB"


async def _exists(path) -> bool:
    return path.exists()


async def test_an_agent_cli_that_resumes_goes_on_from_the_new_head_told_what_moved(make_repo, tmp_path):
    """A job of an agent CLI that resumes its session, stopped on a real conflict, keeps its worktree and waits for
    the other job to land; then what landed is merged into its files (its conflicting file as landed, its own
    version handed back beside), and its CLI goes on with its session, told what moved; its other work stays."""
    from orchestrator.config import RunnerTemplate

    repo = make_repo(files={"f.txt": "one\n", "g.txt": "g\n"})
    a_wrote, note, go = tmp_path / "a.wrote", tmp_path / "note", tmp_path / "go"
    first = f"{_wait(a_wrote)}; echo B > f.txt; echo b > b.txt; sleep 120"
    # Going on: it writes down what it was told and what it finds, then makes its change again on the landed file.
    again = f'printf "%s" "$1" > {note}; cat f.txt b.txt >> {note}.files; echo "$(cat f.txt), then B" > f.txt'
    resumer = RunnerTemplate(argv=("sh", "-c", first), resume_argv=("sh", "-c", again, "resumer", "{feedback}"))
    async with plane(tmp_path, runners={"resumer": resumer}, max_concurrent=2, per_repo=2) as p:
        a = await p.enqueue(repo, f"echo A > f.txt; echo more >> g.txt; touch {a_wrote}; {_wait(go)}", "a.txt")
        b = await p.enqueue(repo, "Change f for B", "b.txt", runner="resumer")

        async def held():
            job = await p.store.jobs.get(b)
            return job if job.attempts else None

        waiting = await p.until("b stopped to go on later", held, timeout=20)
        assert waiting.state in (JobState.PLANNED, JobState.RUNNING) and waiting.land_after == (a,)
        assert waiting.moved_from and waiting.worktree, "its worktree kept, and the base it was made at"
        (event,) = [e for e in await p.store.events.of_job(b) if e["kind"] == "requeued"]
        assert event["resume"] is True and event["conflicts"] == ["f.txt"] and event["behind"] == [a]
        go.touch()
        done = await p.reach(b, JobState.LANDED, JobState.FAILED, JobState.CONFLICTED, timeout=60)
        assert done.state is JobState.LANDED, done.reason
        assert (await p.store.jobs.get(a)).state is JobState.LANDED
        yours = p.home / "state" / "private" / str(b) / "yours" / "f.txt"
    told = note.read_text()
    assert "You were stopped while you worked: a real conflict with job" in told
    assert "Your edits to f.txt conflicted with it" in told and str(yours.parent) in told, told
    assert (tmp_path / "note.files").read_text() == "A\nb\n", "the landed f.txt, and its own b.txt kept"
    assert git(repo, "show", "main:f.txt") == "A, then B" and git(repo, "show", "main:b.txt") == "b"
    assert git(repo, "show", "main:g.txt") == "g\nmore", "the earlier job's work is all there"


def test_a_kept_workspace_moves_to_a_new_base_with_its_own_change_and_nothing_of_it_lost(make_repo, tmp_path):
    """`Workspace.rebase`: what the branch changed is merged into the job's files (a file it added, one it deleted
    and one it edited apart from the landed lines stay so), the new base is its base (its diff is its own change
    only), and where its edit conflicts the file is the landed one, the job's version handed back."""
    from orchestrator.git.changes import actual_paths
    from orchestrator.git.workspace import Workspace
    from tests.conftest import workspace, write

    lines = "".join(f"{n}\n" for n in range(1, 11))
    repo = make_repo(files={"f.txt": lines, "c.txt": "c\n", "gone.txt": "x\n", "other.txt": "o\n"})
    old = git(repo, "rev-parse", "HEAD")
    ws_path = workspace(repo, tmp_path / "ws", old, "orchestrator/7")
    write(ws_path, {"f.txt": lines.replace("1\n", "one\n", 1), "c.txt": "mine\n", "new.txt": "new\n"})
    (ws_path / "gone.txt").unlink()
    write(repo, {"f.txt": lines.replace("10\n", "ten\n"), "c.txt": "landed\n", "other.txt": "moved\n"})
    git(repo, "commit", "-qam", "landed meanwhile")
    new = git(repo, "rev-parse", "HEAD")
    done = Workspace.at(ws_path).rebase(new, "orchestrator/7")
    assert (done.old, done.new) == (old, new) and done.moved == ("c.txt", "f.txt", "other.txt")
    assert done.yours == {"c.txt": b"mine\n"}
    assert (ws_path / "f.txt").read_text() == lines.replace("1\n", "one\n", 1).replace("10\n", "ten\n")
    assert (ws_path / "c.txt").read_text() == "landed\n" and (ws_path / "other.txt").read_text() == "moved\n"
    assert (ws_path / "new.txt").read_text() == "new\n" and not (ws_path / "gone.txt").exists()
    assert Workspace.at(ws_path).head() == new
    assert actual_paths(ws_path, new) == {"f.txt", "new.txt", "gone.txt"}, "its diff is its own change only"
    assert Workspace.at(ws_path).rebase(new, "orchestrator/7").moved == (), "at its base already: nothing moves"


async def test_what_a_stopped_attempt_touched_stays_held_after_it_is_planned_again(tmp_path):
    """A job stopped on a conflict goes back to the queue and is planned again from its text on the new head; a
    new plan that no longer names a file the stopped attempt wrote must not let the next job that writes there run
    beside it (it conflicted again, four times in a row, on a benchmark's replay). The store's row keeps it held."""
    store = await SqliteStore.open(tmp_path / "state.db")
    try:
        first = Claim(frozenset({"src/settings.py"}), 0.9, ClaimSource.EVIDENCE)
        a = await store.jobs.add(repo="/r", branch="main", text="fix settings", runner="shell")
        b = await store.jobs.add(repo="/r", branch="main", text="add a source", runner="shell")
        touched = frozenset({"src/settings.py", "src/sources.py"})
        job = await put(store, a.id, RUNNING, claim=first, actual=touched)
        job = await store.jobs.transition(a.id, {RUNNING}, JobState.QUEUED, "requeued", **fresh_attempt(job))
        assert job is not None and job.actual == frozenset()
        for to in (JobState.PLANNING, JobState.PLANNED):
            job = await store.jobs.transition(a.id, {job.state}, to, str(to))
            assert job is not None
        replanned = Claim(frozenset({"src/main.py"}), 0.9, ClaimSource.EVIDENCE)
        job = await store.jobs.update(a.id, {JobState.PLANNED}, event="planned", claim=replanned)
        assert job is not None and touched <= job.view().claim.paths
        later = Claim(frozenset({"src/sources.py"}), 1.0, ClaimSource.DECLARED)
        snap = Snapshot(active=(replace(job.view(), actual=frozenset()),))
        decided = admission.decide(replace((await store.jobs.get(b.id)).view(), claim=later), snap)  # type: ignore[union-attr]
        assert decided.reason is Reason.OVERLAP, decided
    finally:
        await store.close()
