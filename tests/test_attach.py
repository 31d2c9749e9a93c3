"""A running agent CLI a person can join (`attach`, claude-squad's habit) and a job's workspace they can open
(`open`): through the real daemon, a confined job, and a real terminal (tmux)."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from tests.conftest import git
from tests.terminal import Terminal
from tests.test_e2e_jobs import until

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (.ci/run installs it)")

ESC, BEL = "\x1b", "\x07"
PASSED = f"{ESC}Ptmux;{ESC}{ESC}]52;c;cm0gLXJmIH4K{BEL}{ESC}\\\\"
"""OSC 52 wrapped for tmux's passthrough: a tmux that allowed it would hand it on to the attached terminal."""


def asker(mark: str, socket: str) -> str:
    """A CLI that asks a question on its terminal and writes the answer; it first tries to reach its own tmux
    (from inside the sandbox it must not) and prints a title and clipboard escapes, one through tmux's passthrough
    (an attached terminal must obey none)."""
    return (
        f"tmux -S {socket} run-shell 'touch {mark}' 2>/dev/null; "
        "printf 'your %s? ' name; read name; "  # `your name?` only in its output, not in its command line
        f"printf '{ESC}]0;PWNED{BEL}{ESC}]52;c;cm0gLXJmIH4K{BEL}{PASSED}'; "  # while the person is attached
        "echo \"$name\" > answer.txt; echo thanks; sleep 1"
    )


def test_a_person_attaches_to_a_running_agent_cli_types_to_it_and_it_lands(make_repo, daemon_factory, tmp_path):
    """A command runner's CLI runs in the job's own tmux, its sandbox inside the pane: `attach` shows its question,
    what the person types reaches it, and the job lands what it wrote. The sandboxed CLI cannot reach its tmux
    server (it would run commands outside the sandbox), and its escapes do not reach the person's terminal."""
    repo = make_repo()
    mark = tmp_path / "escaped"
    d = daemon_factory(env={"ORCHESTRATOR_SANDBOX": "bwrap"})
    (d.home / "config").mkdir(parents=True)
    socket = d.home / "run" / "tmux" / "1" / "sock"
    argv = ["sh", "-c", asker(str(mark), str(socket))]
    (d.home / "config" / "config.toml").write_text(f"[runners.asker]\nargv = {json.dumps(argv)}\n")
    d.start()
    assert {r["name"]: r for r in d.cli_json("runners")}["asker"]["terminal"] == "tmux", "`runners` says where it runs"
    job = d.enqueue(repo, "ask me", "--runner", "asker", "--path", "answer.txt")
    assert job == 1
    until(lambda: "your name?" in d.cli("logs", str(job)).stdout, timeout=60, what="the CLI asks")

    t = Terminal(f"orch-attach-{tmp_path.name}", 100)
    try:
        title = t.title()
        # As from an xterm, which takes clipboard and title escapes: the job's tmux must pass neither on.
        home = f"ORCHESTRATOR_HOME={d.home}"
        cli = f"env -u COLUMNS -u LINES TERM=xterm-256color {home} {sys.executable} -m orchestrator attach {job}"
        t.start(cli)
        shot = t.shows("your name?", "the job's terminal, attached")
        assert f"[job {job}]" in shot, f"the status line names the job:\n{shot}"
        t.keys("Ada Lovelace", "Enter")
        until(lambda: d.cli_json("show", str(job))["state"] == "landed", timeout=60, what="the job landed")
        until(t.ended, timeout=15, what="attach ends with the job's terminal")
        assert t.title() == title and t.buffers() == "", "the CLI's escapes reached the person's terminal"
    finally:
        t.close()
    assert git(repo, "show", "main:answer.txt") == "Ada Lovelace"
    assert not mark.exists(), "the sandboxed CLI reached its tmux server"
    log = d.cli("logs", str(job)).stdout
    assert "your name?" in log and "thanks" in log, "the terminal's output is in the job's log"
    assert not (d.home / "run" / "tmux" / str(job)).exists(), "its terminal is gone with it"


def test_attach_and_open_say_why_when_there_is_nothing_to_join(make_repo, daemon_factory, tmp_path):
    """`attach` refuses a job of a built-in runner, a waiting or an ended one, naming why and what to use instead;
    `open` prints a running job's workspace and refuses one that has none; `open --shell` starts a shell there
    with git pointed at no repository (the workspace's .git is the job's)."""
    repo = make_repo()
    gate = tmp_path / "gate"
    d = daemon_factory().start()
    running = d.enqueue(repo, f"while [ ! -e {gate} ]; do sleep 0.05; done; echo r > r.txt", "--path", "r.txt")
    # Its workspace is recorded a moment after it is admitted (`running`).
    until(lambda: (j := d.cli_json("show", str(running)))["state"] == "running" and j["worktree"], what="running")
    waiting = d.enqueue(repo, "echo w > r.txt", "--path", "r.txt")
    out = d.cli("attach", str(running))
    assert out.returncode == 2 and "built-in `shell` runner" in out.stderr and f"logs -f {running}" in out.stderr
    out = d.cli("attach", str(waiting))
    assert out.returncode == 2 and "only a running job has a terminal" in out.stderr
    out = d.cli("open", str(waiting))
    assert out.returncode == 2 and "gets a workspace when it starts" in out.stderr
    where = d.cli("open", str(running)).stdout.strip()
    assert where == d.cli_json("show", str(running))["worktree"] and (tmp_path / where).is_dir()

    t = Terminal(f"orch-open-{tmp_path.name}", 100)
    try:
        probe = tmp_path / "probe"
        cli = f"env SHELL=/bin/sh ORCHESTRATOR_HOME={d.home} {sys.executable} -m orchestrator open --shell {running}"
        t.start(cli)
        t.shows("git is off here", "the shell's note")
        t.keys(f"pwd > {probe}; git status >> {probe} 2>&1; exit", "Enter")
        until(t.ended, timeout=15, what="exit leaves the shell")
        said = probe.read_text()
        assert said.splitlines()[0] == where and "not a git repository" in said, said
    finally:
        t.close()
    gate.touch()
    assert d.cli("wait", str(running), str(waiting), "--timeout", "60").returncode == 0
    out = d.cli("attach", str(running))
    assert out.returncode == 2 and "landed" in out.stderr


def test_a_cancelled_job_s_terminal_ends_with_everything_in_it(make_repo, daemon_factory, tmp_path):
    """Cancelling a job whose CLI runs in its tmux (and ignores SIGHUP) ends the CLI, the tmux server and the
    terminal's dir: nothing of the job is left running."""
    import subprocess

    repo = make_repo()
    tag = f"orch-term-{tmp_path.name}"
    d = daemon_factory()
    (d.home / "config").mkdir(parents=True)
    argv = ["sh", "-c", "trap '' HUP; echo up-$((20+22)); while :; do sleep 0.2; done", tag]
    (d.home / "config" / "config.toml").write_text(f"[runners.stubborn]\nargv = {json.dumps(argv)}\n")
    d.start()
    job = d.enqueue(repo, "run", "--runner", "stubborn", "--path", "x.txt")
    until(lambda: "up-42" in d.cli("logs", str(job)).stdout, timeout=60, what="the CLI started")
    assert (d.home / "run" / "tmux" / str(job) / "sock").exists()
    assert d.cli("cancel", str(job)).returncode == 0
    until(lambda: d.cli_json("show", str(job))["state"] == "cancelled", timeout=60, what="cancelled")

    def left() -> str:
        return subprocess.run(["pgrep", "-af", f"{tag}|tmux -S {d.home}"], capture_output=True, text=True).stdout

    until(lambda: not left(), timeout=30, what="nothing of the job left running")
    assert not (d.home / "run" / "tmux" / str(job)).exists()
