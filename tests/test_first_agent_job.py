"""The README's first agent job, exactly as the README shows it: the stand-in of the Claude API, the daemon in the
background, the real Claude Code under the default sandbox, a landed job."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests import clis
from tests.conftest import git

ROOT = Path(__file__).resolve().parent.parent


def _stand_in_block() -> str:
    """The README's code block that runs the stand-in."""
    blocks = re.findall(r"```sh\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    (block,) = [b for b in blocks if "orchestrator stand-in" in b]
    return block


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(300)
def test_the_readmes_stand_in_commands_reach_a_landed_job(make_repo, tmp_path) -> None:
    """The README's lines, run by sh as written (the repository and the port aside): the job lands hello.txt."""
    clis.need("claude")
    repo = make_repo("app")
    port = _free_port()
    block = _stand_in_block().replace("~/src/app", str(repo)).replace("8765", str(port))
    home = tmp_path / "orch"
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("ORCHESTRATOR_SANDBOX", "ANTHROPIC_API_KEY")},
        "ORCHESTRATOR_HOME": str(home),
        "HOME": str(tmp_path / "userhome"),
        "PATH": f"{Path(sys.executable).parent}:{clis.bin_dir('claude')}:{os.environ['PATH']}",
    }
    (tmp_path / "userhome").mkdir()
    said, errs = tmp_path / "stdout", tmp_path / "stderr"
    with said.open("w") as out, errs.open("w") as err:
        # A session of its own: the stand-in it starts in the background is ended with it, whatever happens.
        sh = subprocess.Popen(["sh", "-ec", block], env=env, cwd=tmp_path, stdout=out, stderr=err,
                              start_new_session=True)  # fmt: skip
    daemon = None
    try:
        code = sh.wait(timeout=280)
        daemon = re.search(r"daemon (\d+) answers", errs.read_text())
        assert code == 0, (said.read_text(), errs.read_text()[-3000:])
        assert said.read_text().strip().splitlines()[-1] == "Write hello.txt saying hello", said.read_text()
        assert git(repo, "log", "-1", "--format=%s", "main") == "Write hello.txt saying hello"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(sh.pid, signal.SIGTERM)  # the stand-in (and sh, if it still runs)
        daemon = daemon or re.search(r"daemon (\d+) answers", errs.read_text())
        if daemon:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(daemon.group(1)), signal.SIGTERM)


@pytest.mark.parametrize(
    ("task", "written"),
    [
        ("Write hello.txt saying hello", "hello.txt"),
        ("Fix src/a.py, then docs/x.md", "src/a.py"),
        ("See /etc/hosts.allow and make it better", "STAND-IN.md"),
        ("Make the login form remember the user", "STAND-IN.md"),
    ],
)
def test_the_stand_in_writes_the_first_relative_path_a_task_names(task: str, written: str) -> None:
    """The stand-in's model writes the task's first relative path, else STAND-IN.md (never an absolute path)."""
    from orchestrator.lab.doubles.standin import target

    assert target(task) == written


def test_the_stand_in_plans_a_job_as_the_daemon_asks() -> None:
    """Asked for the daemon's pre-plan (`submit_plan` offered), the stand-in answers a plan the planner accepts,
    naming the file it would write; not a `Write` call, which the planner took as a malformed answer."""
    from orchestrator.lab.doubles.standin import script
    from orchestrator.plan.prompt import TOOL, parse_input

    body = {
        "tools": [TOOL],
        "messages": [{"role": "user", "content": "Ticket:\nWrite notes.txt saying notes\n\nFiles in the "
                      "repository (1):\nREADME.md"}],
    }  # fmt: skip
    reply = script()(body)
    assert reply.body is not None
    call = next(c for c in reply.body["content"] if c["type"] == "tool_use")
    assert call["name"] == "submit_plan"
    paths, confidence, _ = parse_input(call["input"])
    assert paths == frozenset({"notes.txt"}) and 0 < confidence <= 1
