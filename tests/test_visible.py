"""A CLI a job cannot see (under /tmp, which bubblewrap empties; or with its interpreter there) is named, with the
fix, by `orchestrator runners`, by `doctor`, and by the job that would have run it, instead of bwrap's execvp."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.proc import sandbox, visible
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
