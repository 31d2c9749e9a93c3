"""The jobs benchmark: its ideal schedule, its replay repository and scripts, and one small real run."""

from __future__ import annotations

import json
import subprocess

from orchestrator.git.commits import commit_worktree
from orchestrator.lab.bench import history as hist
from orchestrator.lab.bench import jobs as jobs_bench
from orchestrator.lab.bench import replayrepo
from orchestrator.lab.bench import schedule as sched
from orchestrator.runners import replay
from tests.conftest import git, workspace

MERGEABLE = ("CHANGES*",)


def test_the_list_schedule_never_overtakes_an_overlapping_earlier_job():
    """List scheduling: disjoint jobs fill the slots; a later job waits behind an earlier one it overlaps or is
    kept apart from on risk; each `--risk` value is a `local` row of its own."""
    a, b = frozenset({"a.py"}), frozenset({"b.py"})
    assert sched.list_makespan([2, 2, 2], [a, b, frozenset({"c.py"})], slots=2) == 4
    # Job 2 (b) must not start before job 1 (a, then b) although a slot is free: job 1 waits on job 0.
    assert sched.list_makespan([3, 1, 1], [a, a | b, b], slots=4) == 5
    assert sched.list_makespan([1, 1, 1], [a, None, b], slots=4) == 3, "a job that runs alone runs alone"
    assert sched.list_makespan([2, 2], [a, b], slots=2, apart=[(0, 1)]) == 4, "kept apart on risk"
    assert sched.over_serialized_pairs([a, b], [a, b], apart=[(0, 1)]) == 1
    rows = jobs_bench._rows(["one-per-repo", "claims"], ["declared", "local"], [jobs_bench.RISK, 0.1])
    assert [r.name for r in rows] == ["one-per-repo", "claims/declared", "claims/local", "claims/local@0.1"]


def test_the_ideal_is_a_bound_no_schedule_beats():
    """The ideal is at most any schedule's makespan: the work over every slot, the longest job, and only for claims
    fixed before the queue runs (declared) the chain of overlapping jobs, which run in queue order; claims that a
    re-plan changes (local evidence) bound nothing, though the list schedule of the final claims runs them apart."""
    a, b = frozenset({"a.py"}), frozenset({"b.py"})
    assert sched.lower_bound([2, 2, 2], slots=2) == 3
    assert sched.lower_bound([5, 1], slots=4) == 5
    assert sched.lower_bound([3, 1, 1], slots=4, fixed=[a, a | b, b]) == 5, "a, then a+b, then b: one chain"
    assert sched.lower_bound([1, 1, 1], slots=1) == 3
    # Jobs admitted side by side on their claims at admission, re-planned to overlap by the end: the list schedule
    # of the final claims (2 + 2) is longer than what the daemon ran (2): it is no bound, the ideal is.
    ran_side_by_side = 2.0
    assert sched.list_makespan([2, 2], [a, a], slots=2) > ran_side_by_side
    assert sched.lower_bound([2, 2], slots=2) <= ran_side_by_side
    local = jobs_bench.Row("claims", "local")
    assert not jobs_bench._fixed(local) and jobs_bench._fixed(jobs_bench.Row("oracle", "oracle"))


def test_over_serialised_pairs_count_claims_that_overlap_where_real_files_do_not():
    """A directory claim keeps apart two jobs whose real files differ: one over-serialised pair."""
    real = [frozenset({"src/a.py"}), frozenset({"src/b.py"}), frozenset({"src/a.py"})]
    coarse = [frozenset({"src/"})] * 3
    assert sched.over_serialized_pairs(coarse, real) == 2
    assert sched.over_serialized_pairs(real, real) == 0
    assert sched.max_concurrency([sched.Interval(0, 2), sched.Interval(1, 3), sched.Interval(2, 4)]) == 2


def test_the_tables_fit_an_80_column_terminal_with_every_figure_whole():
    """On a terminal 80 columns wide every row's name and every figure is printed whole (no cell cut to "…")."""
    import io

    from rich.console import Console

    from orchestrator.lab.bench.report.table import GROUPS, OVERHEAD, print_table

    row = {"policy": "claims", "predictor": "local@0.1", "makespan_s": 123.45, "ideal_s": 101.5, "ratio_ideal": 1.216}
    row |= {k: 88 for _, cols in GROUPS for k, _ in cols if k not in row} | {"ratio_one_per_repo": 0.743}
    row |= {f"{k}_{q}_s": 0.123 for k, _ in OVERHEAD for q in ("p50", "p95")}
    info = {"changes": 30, "history": "/x", "machine": {"cores": 2, "ram_mb": 24000, "python": "3.11", "load_1m": 1.0}}
    for width in (80, 120):
        out = io.StringIO()
        rows = [row, {**row, "policy": "one-per-repo", "predictor": "oracle"}]
        print_table(rows, info, Console(file=out, width=width))
        text = out.getvalue()
        assert "…" not in text and max(len(line) for line in text.splitlines()) <= width, text
        assert "claims/local@0.1" in text and "one-per-repo/oracle" in text
        assert all(v in text for v in ("123.45", "101.50", "1.22", "0.74", "88", "0.12")), text


def test_runs_come_from_the_events_and_work_thrown_away_is_every_run_that_did_not_land():
    """Each run is an admission to what ended it (a landing's conflict after `finished` ends nothing more); the work
    thrown away is every run but a landed job's last one, in job-seconds."""
    events = [
        {"kind": "admitted", "at": 0.0},
        {"kind": "requeued", "at": 2.0, "ran_s": 2.0},  # stopped on a conflict while it ran
        {"kind": "admitted", "at": 5.0},
        {"kind": "finished", "at": 9.0},
        {"kind": "requeued", "at": 9.5},  # its landing conflicted
        {"kind": "admitted", "at": 10.0},
        {"kind": "recheck", "at": 11.0},  # changed nothing on a base without an earlier job's change: runs again
        {"kind": "admitted", "at": 12.0},
        {"kind": "finished", "at": 13.0},
    ]
    runs = sched.runs_of(events)
    assert runs == [sched.Interval(0, 2), sched.Interval(5, 9), sched.Interval(10, 11), sched.Interval(12, 13)]
    assert sched.thrown_away([runs, [sched.Interval(0, 1)]], [True, False]) == 2 + 4 + 1 + 1
    assert jobs_bench._saved([{"events": events}], [5.0]) == 3.0, "stopped after 2 s of a 5 s job: 3 s saved"


def test_met_side_by_side_counts_pairs_that_ran_at_once_and_touched_a_common_file():
    """Only a pair whose runs overlapped in time and whose real files meet counts (a directory meets the files
    under it); a retried job counts by any of its attempts; a job with nothing counted never meets."""
    iv = sched.Interval
    real = [frozenset({"src/a.py"}), frozenset({"src/"}), frozenset({"src/b.py"}), frozenset({"doc.md"}), frozenset()]
    runs = [[iv(0, 2)], [iv(1, 3)], [iv(3, 4), iv(5, 6)], [iv(0, 9)], [iv(0, 9)]]
    assert sched.met_side_by_side(runs, real) == 1  # a and src/ at once; src/ and b only touch at t=3
    runs[2] = [iv(3, 4), iv(2.5, 6)]
    assert sched.met_side_by_side(runs, real) == 2, "a retry that overlaps counts"
    assert sched.met_side_by_side([[iv(0, 1)], [iv(1, 2)]], [real[0], real[0]]) == 0, "one after the other"


def test_bundled_history_loads_and_predictors_shape_claims():
    """The packaged history reads without any file outside the package; predictors give files, top dirs, or
    nothing (`local`: the daemon's planner claims)."""
    changes = hist.from_file(hist.bundled())
    assert len(changes) > 400 and all(c.files for c in changes)
    c = hist.Change(0, "x", "s", ("src/flask/app.py", "CHANGES.rst"), 10)
    assert hist.predict(c, "oracle") == ["src/flask/app.py", "CHANGES.rst"]
    assert hist.predict(c, "declared") == ["CHANGES.rst", "src/"]
    assert hist.predict(c, "local") == []


def _apply(repo, wt, commit, branch):
    """Replay `commit` in a job workspace at main and commit the result on `branch`, as the daemon does."""
    base = git(repo, "rev-parse", "main")
    replay.apply_commit(workspace(repo, wt, base), commit, theirs=True)
    commit_worktree(wt, message=branch, job_id=0, base=base, repo_path=repo, branch=branch)


def test_replayed_changes_conflict_side_by_side_and_changelogs_merge(tmp_path):
    """Two replayed changes to one file made side by side conflict; their changelog slots merge in any
    order; made one after the other they reach the recorded end state, with nothing lost."""
    past = [hist.Change(0, "p", "older change to x", ("pkg/x.py", "CHANGES.rst"), 1)]
    changes = [
        hist.Change(0, "a", "a", ("pkg/x.py", "CHANGES.rst"), 3),
        hist.Change(1, "b", "b", ("pkg/x.py", "CHANGES.rst"), 3),
    ]
    r = replayrepo.synthesise(past, changes, tmp_path / "repo", MERGEABLE)
    assert git(r.path, "log", "--format=%s", "main").splitlines() == ["older change to x", "synthesised base"]
    _apply(r.path, tmp_path / "w0", r.commits[0], "c0")
    _apply(r.path, tmp_path / "w1", r.commits[1], "c1")
    git(r.path, "worktree", "add", "-q", str(tmp_path / "co"), "c0")
    merge = subprocess.run(["git", "merge", "-q", "c1"], cwd=tmp_path / "co", capture_output=True, text=True)
    assert merge.returncode != 0 and "pkg/x.py" in merge.stdout + merge.stderr
    conflicted = [line for line in merge.stdout.splitlines() if line.startswith("CONFLICT")]
    assert conflicted and not any("CHANGES.rst" in line for line in conflicted)
    git(tmp_path / "co", "merge", "--abort")
    assert replayrepo.lost(r, changes, [1, 2]) == ([0, 1], 0), "main has neither change's changelog line yet"
    for n in (0, 1):
        _apply(r.path, tmp_path / f"land{n}", r.commits[n], f"land{n}")
        git(r.path, "merge", "-q", "--ff-only", f"land{n}")
    assert replayrepo.lost(r, changes, [1, 2]) == ([], 0)
    assert replayrepo.lost(r, changes, [2, 1]) == ([], 1), "landed the other way round: reordered, not lost"
    assert replayrepo.lost(r, changes, [1, 0]) == ([1], 0), "not landed"
    assert (r.path / "CHANGES.rst").read_text().count("- change ") == 2


def test_bench_jobs_replays_through_the_real_daemon(tmp_path):
    """A tiny replay lands every change under `oracle` with the replay runner, loses none, never beats the
    ideal schedule, reports the documented JSON keys, and has a `local` predictor row beside it."""
    from tests.harness import cli  # the command in this process; the daemons it replays through are processes

    out = cli("bench", "jobs", "--last", "6", "--scale", "0.05", "--policy", "oracle,claims", "--predictor", "local",
              "--write-at", "0.5", "--json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    oracle, local = data["rows"]
    keys = "policy predictor slots jobs makespan_s max_concurrency wait_p50_s wait_p95_s overlaps met_side_by_side"
    keys += " conflicts redone lost"
    assert set(keys.split()) | {"over_serialized_pairs", "ideal_s", "ratio_ideal"} <= set(oracle)
    unlanded = [(j["job"], j["state"], j["why"]) for r in (oracle, local) for j in r["per_job"] if j["why"]]
    assert (oracle["policy"], oracle["jobs"], oracle["lost"]) == ("oracle", 6, 0), unlanded
    assert oracle["makespan_s"] >= oracle["ideal_s"] > 0
    assert (local["policy"], local["predictor"], local["jobs"], local["lost"]) == ("claims", "local", 6, 0), unlanded
    assert data["machine"]["cores"] >= 1 and data["write_at"] == 0.5


def test_real_replay_counts_a_change_main_already_holds_as_not_lost(make_repo):
    """On a real repository a change that ended unchanged (main already held its edit) is not lost; one that
    did not land and whose edit main lacks is; the serial check agrees with main applied in landing order."""
    repo = make_repo(files={"x.py": "a\nb\n", "y.py": "y\n"})
    start = git(repo, "rev-parse", "HEAD")
    (repo / "x.py").write_text("A\nb\n")
    git(repo, "commit", "-qam", "edit x")
    first = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-qb", "side", start)
    (repo / "x.py").write_text("A\nb\n")
    git(repo, "commit", "-qam", "the same edit of x, made apart")
    same = git(repo, "rev-parse", "HEAD")
    (repo / "y.py").write_text("Y\n")
    git(repo, "commit", "-qam", "edit y")
    other = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    changes = [
        hist.Change(0, first, "edit x", ("x.py",), 1),
        hist.Change(1, same, "same", ("x.py",), 1),
        hist.Change(2, other, "edit y", ("y.py",), 1),
    ]
    r = replayrepo.ReplayRepo(repo, (first, same, other), other, start)
    assert replayrepo.serial(r, changes, [1.0, 0.0, 0.0]) == ([2], [], 0)


def test_a_recorded_move_touches_both_paths(make_repo):
    """A commit that moves files is a deletion and an addition in the history: the oracle claims both paths."""
    repo = make_repo(files={"tests/two/t0.py": "a\n" * 5, "tests/two/t1.py": "b\n" * 5, "x.py": "x\n"})
    start = git(repo, "rev-parse", "HEAD")
    git(repo, "mv", "tests/two", "tests/one")
    git(repo, "commit", "-qm", "move the tests")
    (repo / "x.py").write_text("y\n")
    git(repo, "commit", "-qam", "edit x")
    moved, edited = hist.from_repo(repo, f"{start}..HEAD")
    assert sorted(moved.files) == [f"tests/{d}/t{n}.py" for d in ("one", "two") for n in (0, 1)]
    assert edited.files == ("x.py",)


def test_a_changelog_line_reworded_by_a_later_landed_change_is_not_lost(make_repo):
    """A union-merged changelog: a change whose line a later change rewords is not lost when both landed, in
    either order; it is lost when the rewording did not land and main lacks its line."""
    repo = make_repo(files={"CHANGES.md": "# changes\n\n- older\n", "x.py": "x\n"})
    start = git(repo, "rev-parse", "HEAD")
    (repo / "CHANGES.md").write_text("# changes\n\n- older\n- add a\n")
    (repo / "x.py").write_text("a\n")
    git(repo, "commit", "-qam", "add a")
    add = git(repo, "rev-parse", "HEAD")
    (repo / "CHANGES.md").write_text("# changes\n\n- older\n- add a, reworded\n")
    git(repo, "commit", "-qam", "reword a")
    reword = git(repo, "rev-parse", "HEAD")
    changes = [hist.Change(0, add, "add a", ("CHANGES.md", "x.py"), 2), hist.Change(1, reword, "r", ("CHANGES.md",), 2)]
    r = replayrepo.ReplayRepo(repo, (add, reword), reword, start)
    mergeable = ("CHANGES*",)
    assert replayrepo.serial(r, changes, [1.0, 2.0], mergeable)[0] == []
    assert replayrepo.serial(r, changes, [2.0, 1.0], mergeable)[0] == [], "landed the other way round"
    git(repo, "reset", "-q", "--hard", start)
    (repo / "x.py").write_text("a\n")
    git(repo, "commit", "-qam", "x only")
    assert replayrepo.serial(r, changes, [1.0, 0.0], mergeable)[0] == [0, 1], (
        "its line is gone, and nothing reworded it"
    )


def test_rows_are_shown_as_they_finish_and_a_failed_row_as_failed(tmp_path, monkeypatch):
    """Each row's line is printed the moment it finishes; a row that raises is reported failed with why while
    the rows after it still run; the tables show every row, the run exits 1 and keeps its repositories."""
    from click.testing import CliRunner

    done: list[str] = []

    def run_row(row, changes, make, slots, scale, work, progress, write_at):
        if row.policy == "claims":
            raise OSError("index does not contain tests/x.py at stage 0")
        done.append(row.name)
        per_job = [{"job": 1, "state": "landed", "runs": 1, "duration_s": 1.0, "wait_s": 0.0, "beside": [],
                    "met": [], "conflicts": 0, "waited_for": {"Overlap": [2]}}]  # fmt: skip
        return {"policy": row.policy, "predictor": row.label, "jobs": 1, "makespan_s": 2.0 + len(done),
                "ideal_s": 2.0, "ratio_ideal": 1.0, "list_s": 2.0, "ratio_list": 1.0, "conflicts": 0, "lost": 0,
                "broken": 0, "per_job": per_job}  # fmt: skip

    monkeypatch.setattr(jobs_bench, "run_row", run_row)
    keep = tmp_path / "keep"
    args = ["--last", "3", "--policy", "one-per-repo,claims,oracle", "--predictor", "local", "--keep", str(keep)]
    out = CliRunner().invoke(jobs_bench.main, [*args, "--per-job"])
    assert out.exit_code == 1, out.output
    assert done == ["one-per-repo", "oracle"], "the row after the failed one still ran"
    assert "one-per-repo/oracle: makespan 3.00 s" in out.stderr
    assert "claims/local: FAILED: OSError: index does not contain tests/x.py" in out.stderr
    assert "1 row(s) failed (claims/local)" in out.stderr and str(keep) in out.stderr
    assert "claims/local failed: OSError" in out.stdout and "oracle/oracle" in out.stdout
    assert "Overlap 2" in out.stdout and "alone" in out.stdout, "the per-job table"
    kept = [json.loads(line) for line in (keep / "rows.jsonl").read_text().splitlines()]
    assert [r.get("failed", "")[:7] for r in kept] == ["", "OSError", ""]


def test_the_chart_has_a_title_and_shows_each_rows_conflicts():
    """The `--plot` chart says what was replayed on what machine, and over each row's bars its conflicts (and any
    redone, lost or broken work): a row that ran fast because it conflicted does not look like a win."""
    from orchestrator.lab.bench.report import plot

    rows = [
        {"policy": "claims", "predictor": "local", "makespan_s": 50.0, "list_s": 48.0, "ideal_s": 40.0,
         "conflicts": 3, "redone": 2, "lost": 0, "broken": 0},
        {"policy": "one-per-repo", "predictor": "oracle", "makespan_s": 90.0, "list_s": 90.0, "ideal_s": 40.0,
         "conflicts": 0, "redone": 0, "lost": 0, "broken": 0},
    ]  # fmt: skip
    info = {"changes": 30, "history": "/x/flask-history.jsonl", "machine": {"cores": 2, "ram_mb": 24000}}
    fig = plot.figure(rows, info)
    ax = fig.axes[0]
    assert (
        ax.get_title() == "jobs bench: 30 changes of flask-history.jsonl replayed, makespan per policy (2 cores, "
        "24000 MB RAM)"
    )
    said = [t.get_text() for t in ax.texts]
    assert said == ["3 conflicts\n2 redone", "0 conflicts"], said


def test_a_clone_missing_an_object_the_replay_reads_is_refused_up_front_naming_the_file(make_repo):
    """A partial or damaged clone (a large file's blob left out) is refused before any row runs, naming the file
    and what to do; every row used to run its jobs and then fail on it in the lost check."""
    from click.testing import CliRunner

    repo = make_repo(files={"docs/logo.gif": "GIF89a-not-really\n", "x.py": "x\n"})
    start = git(repo, "rev-parse", "HEAD")
    for n in range(3):
        (repo / "x.py").write_text(f"x{n}\n")
        git(repo, "commit", "-qam", f"edit x {n}")
    blob = git(repo, "rev-parse", f"{start}:docs/logo.gif")
    git(repo, "gc", "-q", "--prune=now")  # packed: take the blob out by repacking without it
    loose = repo / ".git" / "objects" / blob[:2] / blob[2:]
    packs = list((repo / ".git" / "objects" / "pack").glob("*.pack"))
    kept = subprocess.run(
        ["git", "-C", str(repo), "rev-list", "--objects", "--all"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    ids = "\n".join(line.split()[0] for line in kept if not line.startswith(blob)) + "\n"
    subprocess.run(["git", "-C", str(repo), "pack-objects", "-q", ".git/objects/pack/pack"], input=ids, text=True,
                   check=True, capture_output=True)  # fmt: skip
    for p in packs:
        p.unlink()
        p.with_suffix(".idx").unlink()
        p.with_suffix(".rev").unlink(missing_ok=True)
    assert not loose.exists()
    assert subprocess.run(["git", "-C", str(repo), "cat-file", "-e", blob], capture_output=True).returncode != 0
    args = ["--repo", str(repo), "--range", f"{start}..HEAD", "--last", "2", "--policy", "one-per-repo"]
    out = CliRunner().invoke(jobs_bench.main, args)
    assert out.exit_code == 2, out.output
    assert "lacks objects the replay reads (docs/logo.gif)" in out.output and "fetch it whole" in out.output


def test_each_replayed_change_ends_at_the_newest_commit_made_on_it(make_repo):
    """A range replayed without its merges interleaves branches: a change's `end` is the last replayed commit made on
    top of it (its own line's), not the range's last one (another branch's), and none when nothing later is."""
    repo = make_repo(files={"a.txt": "a\n"})
    shas = {}
    for branch, name in (("one", "first"), ("two", "other"), ("one", "later")):
        if name == "later":
            git(repo, "checkout", "-q", branch)
        else:
            git(repo, "checkout", "-qb", branch, "main")
        (repo / f"{name}.txt").write_text(name)
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", name)
        shas[name] = git(repo, "rev-parse", "HEAD")
    commits = (shas["first"], shas["other"], shas["later"])
    ends = replayrepo.newest(replayrepo.ReplayRepo(repo, commits, commits[-1]))
    assert ends == [shas["later"], None, None]
    change = hist.Change(0, commits[0], "first", ("first.txt",), 1)
    assert replayrepo.job_text(change, commits[0], 0, end=ends[0]).endswith(f"conflict: theirs\nend: {shas['later']}")


def test_a_change_no_schedule_can_replay_is_not_counted_lost(make_repo):
    """A range cut from a history that merges another line: its last change deletes a file added on that line
    before the range, which main's start never has. One after another in recorded order it does not apply
    either, so it is unreplayable, not lost by running side by side; a change that applies is still lost."""
    repo = make_repo(files={"x.py": "x\n"})
    start = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-qb", "other", start)
    (repo / "compat.py").write_text("shim\n")
    git(repo, "add", "compat.py")
    git(repo, "commit", "-qm", "add the shim on another line")
    git(repo, "checkout", "-q", "main")
    (repo / "x.py").write_text("x1\n")
    git(repo, "commit", "-qam", "edit x")
    edit = git(repo, "rev-parse", "HEAD")
    git(repo, "merge", "-q", "--no-ff", "-m", "merge the line", "other")
    git(repo, "rm", "-q", "compat.py")
    (repo / "x.py").write_text("x2\n")
    git(repo, "commit", "-qam", "drop the shim, and its use")
    drop = git(repo, "rev-parse", "HEAD")
    git(repo, "reset", "-q", "--hard", start)
    changes = [hist.Change(0, edit, "edit x", ("x.py",), 1), hist.Change(1, drop, "drop", ("compat.py", "x.py"), 2)]
    r = replayrepo.ReplayRepo(repo, (edit, drop), drop, start)
    assert replayrepo.unreplayable(r, changes) == [1]
    assert replayrepo.serial(r, changes, [0.0, 0.0])[0] == [0, 1], "serial alone counts both"


def test_a_change_a_later_one_made_on_it_rewrote_before_it_ran_is_not_lost(make_repo):
    """A comment aligned, then the same line rewritten by the next change (made on it), which landed first: the
    older one replays to nothing (its `end` has the line as main has it) and ends unchanged; nothing of it is lost."""
    repo = make_repo(files={"r.py": "x = 1  # old\n"})
    start = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-qb", "recorded")
    shas = []
    for line in ("x = 1  # aligned\n", "x = 2  # aligned\n"):
        (repo / "r.py").write_text(line)
        git(repo, "commit", "-qam", line.strip())
        shas.append(git(repo, "rev-parse", "HEAD"))
    git(repo, "checkout", "-q", "main")
    (repo / "r.py").write_text("x = 2  # aligned\n")
    git(repo, "commit", "-qam", "the later change landed")
    r = replayrepo.ReplayRepo(repo, tuple(shas), shas[-1], start)
    changes = [hist.Change(i, sha, f"change {i}", ("r.py",), 1) for i, sha in enumerate(shas)]
    lost, broken, _ = replayrepo.serial(r, changes, [0.0, 1.0])
    assert (lost, broken) == ([], [])


def test_a_changelog_change_that_ended_unchanged_after_a_later_one_made_on_it_is_not_lost(make_repo):
    """stamina: `Start new development cycle` opens an Unreleased heading that the next release turns into its
    version's; that release landed first (with a stray line a union merge left), so the older change's heading is
    left out of the union-merged changelog (`union.undone`) and it ends unchanged. Its edit is on main as its
    replay would make it: not lost (the check applied it without the changelog's union merge and counted it lost).
    The next cycle, which did not land, is."""
    log = "# Changes\n\n## 25.2.0\n\n- b\n"
    repo = make_repo(files={"CHANGES.md": log})
    start = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-qb", "recorded")
    shas = []
    for text in (
        log.replace("## 25.2.0", "## Unreleased 25.2\n\n## 25.2.0"),
        log.replace("## 25.2.0", "## 26.1.0\n\n- c\n\n## 25.2.0"),
        log.replace("## 25.2.0", "## Unreleased 26.1\n\n## 26.1.0\n\n- c\n\n## 25.2.0"),
    ):
        (repo / "CHANGES.md").write_text(text)
        git(repo, "commit", "-qam", text.split("\n")[2])
        shas.append(git(repo, "rev-parse", "HEAD"))
    git(repo, "checkout", "-q", "main")
    (repo / "CHANGES.md").write_text(log.replace("## 25.2.0", "## 26.1.0\n  [stray]\n\n- c\n\n## 25.2.0"))
    git(repo, "commit", "-qam", "the release landed; the cycles did not")
    r = replayrepo.ReplayRepo(repo, tuple(shas), shas[-1], start)
    changes = [hist.Change(i, sha, f"change {i}", ("CHANGES.md",), 1) for i, sha in enumerate(shas)]
    assert replayrepo.serial(r, changes, [0.0, 1.0, 0.0], ("CHANGES*",))[0] == [2]
