"""A CLI a job cannot see (under /tmp, which bubblewrap empties; or with its interpreter there) is named, with the
fix, by `orchestrator runners`, by `doctor`, and by the job that would have run it, instead of bwrap's execvp."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator import config, paths
from orchestrator.commands import runners as runners_cmd
from orchestrator.config import RunnerTemplate
from orchestrator.core.job import Job
from orchestrator.core.models import Code, JobState
from orchestrator.proc import sandbox, visible
from orchestrator.runners import mcp
from orchestrator.runners.base import RunContext
from orchestrator.runners.command import CommandRunner
from orchestrator.service import doctor
from tests.harness import until
from tests.test_sandbox import needs_bwrap

FAKE_CLI = "#!/bin/sh\necho \"$@\" > from-the-cli.txt\n"


@pytest.fixture
def outside_tmp() -> Iterator[Path]:
    """A dir a job's sandbox shows (read-only): under /var/tmp, which bubblewrap leaves as it is."""
    where = Path(tempfile.mkdtemp(prefix="orchestrator-test-", dir="/var/tmp"))
    yield where
    shutil.rmtree(where)


def _cli(folder: Path, name: str, text: str = FAKE_CLI) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)
    (folder / name).chmod(0o755)
    return folder / name


def _box() -> sandbox.Sandbox:
    return sandbox.detect("bwrap")


@needs_bwrap
def test_a_cli_under_tmp_is_out_of_a_jobs_sight(tmp_path, outside_tmp) -> None:
    """Under /tmp (found by the same PATH outside): the problem names its path, /tmp, and both fixes."""
    _cli(tmp_path / "bin", "fakecli")
    path = f"{tmp_path / 'bin'}:/usr/bin:/bin"
    assert visible.look(sandbox.Sandbox(), "fakecli", path).ok, "unconfined, the same PATH finds it"
    seen = visible.look(_box(), "fakecli", path)
    assert seen.inside is None and seen.outside == str(tmp_path / "bin" / "fakecli")
    assert seen.problem is not None
    assert str(tmp_path / "bin" / "fakecli") in seen.problem and "/tmp is empty inside a job's sandbox" in seen.problem
    assert "Install it outside /tmp" in seen.problem and 'jobs.sandbox = "none"' in seen.problem
    # A link outside /tmp to it is no better: what it points at is out of sight.
    (outside_tmp / "bin").mkdir()
    (outside_tmp / "bin" / "fakecli").symlink_to(tmp_path / "bin" / "fakecli")
    seen = visible.look(_box(), "fakecli", f"{outside_tmp / 'bin'}:/usr/bin:/bin")
    assert seen.problem is not None and "/tmp is empty" in seen.problem, seen


@needs_bwrap
def test_a_script_whose_interpreter_is_under_tmp_is_out_of_sight(tmp_path, outside_tmp) -> None:
    """A script outside /tmp whose `#!` interpreter (by path, or by name through env) lives under /tmp."""
    interp = _cli(tmp_path / "venv" / "bin", "python9", "#!/bin/sh\nexec /bin/sh \"$@\"\n")
    _cli(outside_tmp, "bypath", f"#!{interp}\necho hi\n")
    _cli(outside_tmp, "byname", "#!/usr/bin/env -S python9 -u\necho hi\n")
    path = f"{outside_tmp}:{interp.parent}:/usr/bin:/bin"
    for name in ("bypath", "byname"):
        seen = visible.look(_box(), name, path)
        assert seen.inside == str(outside_tmp / name), seen
        assert seen.problem is not None and f"whose interpreter {interp} a job cannot see" in seen.problem, seen
        assert visible.look(sandbox.Sandbox(), name, path).ok


@needs_bwrap
def test_a_cli_a_job_can_see_is_found_where_it_runs(outside_tmp) -> None:
    """Outside the emptied dirs, with an interpreter a job sees: ok, at the path a job's shell finds."""
    _cli(outside_tmp, "fakecli")
    seen = visible.look(_box(), "fakecli", f"{outside_tmp}:/usr/bin:/bin")
    assert seen.ok and seen.inside == str(outside_tmp / "fakecli")
    missing = visible.look(_box(), "no-such-cli", "/usr/bin:/bin")
    assert missing.problem is not None and "not on a job's PATH" in missing.problem


def _runner_config(d, argv0: str) -> None:
    (d.home / "config").mkdir(parents=True, exist_ok=True)
    (d.home / "config" / "config.toml").write_text(f'[runners.fake]\nargv = ["{argv0}", "{{prompt}}"]\n')


@needs_bwrap
def test_runners_doctor_and_the_job_name_the_path_and_the_fix(make_repo, daemon_factory, tmp_path, outside_tmp):
    """`runners` and `doctor` say a CLI under /tmp is out of a job's sight; a job of it fails with that message
    (code RunnerError), not with bwrap's execvp; the same CLI outside /tmp runs."""
    hidden = tmp_path / "userhome" / ".local" / "bin"
    _cli(hidden, "fakecli")
    env = {"ORCHESTRATOR_SANDBOX": "bwrap", "PATH": f"{hidden}:{os.environ['PATH']}"}
    d = daemon_factory(env=env)
    _runner_config(d, "fakecli")
    out = d.cli("runners", "--json")
    assert out.returncode == 0, out.stderr
    (row,) = [r for r in json.loads(out.stdout) if r["name"] == "fake"]
    assert row["found"] is None and str(hidden / "fakecli") in row["problem"] and "/tmp is empty" in row["problem"]
    doctor = d.cli("doctor", "--json")
    (check,) = [c for c in json.loads(doctor.stdout)["checks"] if c["name"] == "runner fake"]
    assert doctor.returncode == 1 and check["level"] == "fail" and "Install it outside /tmp" in check["detail"]
    d.start()
    repo = make_repo()
    job = d.enqueue(repo, "write the file", "--runner", "fake", "--path", "from-the-cli.txt")
    shown = until("the job to fail", lambda: (j := d.cli_json("show", str(job)))["state"] == "failed" and j)
    assert shown["code"] == "RunnerError" and str(hidden / "fakecli") in shown["reason"], shown
    assert "execvp" not in shown["reason"] and "/tmp is empty" in d.cli("logs", str(job)).stdout


@needs_bwrap
def test_a_cli_outside_tmp_runs_and_lands(make_repo, daemon_factory, outside_tmp):
    """The control: the same CLI where a job sees it runs under bwrap and its change lands."""
    _cli(outside_tmp, "fakecli")
    d = daemon_factory(env={"ORCHESTRATOR_SANDBOX": "bwrap", "PATH": f"{outside_tmp}:{os.environ['PATH']}"})
    _runner_config(d, "fakecli")
    d.start()
    repo = make_repo()
    job = d.enqueue(repo, "write the file", "--runner", "fake", "--path", "from-the-cli.txt")
    assert d.cli("wait", str(job), "--timeout", "60").returncode == 0, d.cli_json("show", str(job))["reason"]


ROOT = Path(__file__).resolve().parent.parent


def _venv(where: Path, *sees: Path) -> Path:
    """A venv at `where` (no pip) whose python imports from `sees` (a .pth) and from the test's own site-packages (the
    orchestrator's dependencies): a daemon installed there. Its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, capture_output=True)
    deps = next(Path(p) for p in sys.path if p.endswith("site-packages") and Path(p).is_relative_to(sys.prefix))
    site = next((where / "lib").glob("python*/site-packages"))
    (site / "orchestrator-test.pth").write_text("".join(f"{p}\n" for p in (*sees, deps)))
    return where / "bin" / "python"


def _told_runner(cli: Path) -> CommandRunner:
    """A command runner whose CLI (`cli`, where a job sees it) is told of the job's MCP server, under bwrap."""
    template = RunnerTemplate(argv=(str(cli), "{prompt}"), scratch_home=True, mcp="claude-code", terminal="none")
    return CommandRunner("fake", template, _box())


def _ctx(repo: Path, tmp_path: Path) -> RunContext:
    job = Job(id=1, repo=str(repo), branch="main", text="write it", runner="fake", state=JobState.RUNNING)
    (tmp_path / "wt").mkdir(parents=True)
    return RunContext(
        job=job, worktree=tmp_path / "wt", log_path=tmp_path / "1.log", timeout=60, private_dir=tmp_path / "private",
        door=mcp.Door(tmp_path / "private" / "door.sock", "t0k"),
    )  # fmt: skip


@needs_bwrap
async def test_a_job_whose_mcp_server_a_job_cannot_start_is_not_started(make_repo, tmp_path, outside_tmp, monkeypatch):
    """The daemon's python in a venv under /tmp (empty in a job's sandbox): a job told of its MCP server does not
    run without its claim tools; it fails before its CLI starts, naming the interpreter, /tmp and what to do, in its
    result and its log; `unready`, `doctor` and `orchestrator runners` say the same. The same job with an
    interpreter a job sees runs."""
    python = await asyncio.to_thread(_venv, tmp_path / "venv", ROOT)
    imports = await asyncio.to_thread(subprocess.run, [python, "-c", "import orchestrator.runners.mcp"])
    assert imports.returncode == 0, "outside, it imports"
    cli = _cli(outside_tmp, "fakecli")
    repo = make_repo()
    runner, ctx = _told_runner(cli), _ctx(repo, tmp_path)
    real = sys.executable
    monkeypatch.setattr(sys, "executable", str(python))
    result = await runner.run(ctx)
    assert not result.ok and result.code == Code.RUNNER_ERROR, result
    assert f"{python} -m orchestrator mcp" in result.summary, result.summary
    assert "/tmp is empty inside a job's sandbox" in result.summary
    assert 'set mcp = "" in [runners.fake]' in result.summary, result.summary
    assert not (ctx.worktree / "from-the-cli.txt").exists(), "its CLI never started"
    assert "[fake was not started: the job's MCP server" in ctx.log_path.read_text()
    assert (await runner.unready()) is not None and "/tmp is empty" in str(await runner.unready())
    p = paths.resolve({"ORCHESTRATOR_HOME": str(tmp_path / "home")})
    cfg = config.Config(jobs=replace(config.JobsConfig(), sandbox="bwrap"))
    check = await asyncio.to_thread(doctor.check_mcp, cfg, p, ["claude-code"])
    assert check.level == doctor.FAIL and str(python) in check.detail and "/tmp is empty" in check.detail, check
    listed = await asyncio.to_thread(runners_cmd.sights, replace(cfg, runners={"fake": runner.template}), p)
    assert not listed["fake"].ok and "/tmp is empty" in str(listed["fake"].problem), "`orchestrator runners` too"
    if visible.hidden_in(real, _box()) is None:  # the tests' own interpreter, where a job sees it
        monkeypatch.setattr(sys, "executable", real)
        again = _ctx(repo, tmp_path / "again")
        assert (await runner.run(again)).ok and (again.worktree / "from-the-cli.txt").exists()
        assert (await asyncio.to_thread(doctor.check_mcp, cfg, p, ["claude-code"])).level == doctor.OK
        monkeypatch.setattr(sys, "executable", str(python))  # a server seen to start is not asked again; this one is
        assert not (await runner.run(_ctx(repo, tmp_path / "third"))).ok


@needs_bwrap
def test_an_orchestrator_package_under_tmp_is_named_with_the_fix(tmp_path, outside_tmp):
    """The interpreter where a job sees it, the orchestrator package it imports under /tmp: the server cannot start
    in a job, and the problem names the package's dir, /tmp and the fix (as the daemon running there would say)."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "orchestrator").symlink_to(ROOT / "orchestrator")
    python = _venv(outside_tmp / "venv", tmp_path / "src")
    ask = ("import os; from orchestrator.proc import sandbox; from orchestrator.runners import mcp_sight; "
           "print(mcp_sight.problem(sandbox.detect('bwrap'), dict(os.environ), 'codex'))")  # fmt: skip
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C"}
    out = subprocess.run([python, "-c", ask], capture_output=True, text=True, env=env, cwd=outside_tmp).stdout
    assert "No module named" in out and f"The orchestrator package is {tmp_path / 'src' / 'orchestrator'}" in out, out
    assert "/tmp is empty inside a job's sandbox. Install orchestrator (its venv) outside /tmp" in out, out
    assert 'set mcp = "" in [runners.codex]' in out
