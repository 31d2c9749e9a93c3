"""`orchestrator mcp` and a job's door: the real MCP server process over stdio, against the door the real job plane
opened for a running job (in-process plane: real store, real git, running shell jobs). Real Claude Code asking it
is in `test_agent_clis.py`."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import pytest

from orchestrator import beneath
from orchestrator.core.models import JobState
from orchestrator.jobs.door import Doors
from orchestrator.runners import mcp
from tests.conftest import git
from tests.plane import plane


class Client:
    """The real `orchestrator mcp` process, spoken to as an MCP client does: one JSON-RPC message a line."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.ids = 0

    async def send(self, method: str, params: dict[str, Any] | None = None, *, notify: bool = False) -> Any:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, **({"params": params} if params else {})}
        if not notify:
            self.ids += 1
            message["id"] = self.ids
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        await self.proc.stdin.drain()
        if notify:
            return None
        answer = json.loads(await asyncio.wait_for(self.proc.stdout.readline(), 30))
        assert answer["id"] == self.ids and answer["jsonrpc"] == "2.0"
        return answer

    async def call(self, tool: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        result = (await self.send("tools/call", {"name": tool, "arguments": arguments}))["result"]
        return result["content"][0]["text"], result["isError"]


async def _server(door: mcp.Door) -> Client:
    env = {**os.environ, mcp.ENV_DOOR: str(door.path), mcp.ENV_TOKEN: door.token}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "orchestrator", "mcp", env=env,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    return Client(proc)


def _wait(path, limit: int = 1200) -> str:
    return f"n=0; while [ ! -e {path} ] && [ $n -lt {limit} ]; do sleep 0.05; n=$((n+1)); done"


async def test_the_mcp_server_speaks_mcp_and_answers_from_its_jobs_door(make_repo, tmp_path):
    """initialize (a known protocol version echoed, an unknown one answered with the newest), tools/list, held_paths
    (the other running job's claim and touched paths, by id), claim_paths (a held path refused naming the holder,
    a free one granted and in the job's claim), a notification unanswered, a wrong method or tool a JSON-RPC error."""
    repo = make_repo()
    go, wrote = tmp_path / "go", tmp_path / "wrote"
    async with plane(tmp_path, max_concurrent=2, per_repo=2) as p:
        holder = await p.enqueue(repo, f"echo more > docs/more.md; touch {wrote}; {_wait(go)}", "src/a.py")
        me = await p.enqueue(repo, _wait(go), "src/b.py")
        await p.until("the holder wrote", lambda: asyncio.to_thread(wrote.exists))
        await p.reach(me, JobState.RUNNING)
        door = await Doors(p.parts.watch).open(me, p.home / "doors" / str(me))
        client = await _server(door.address)
        try:
            init = (await client.send("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}}))["result"]
            assert init["protocolVersion"] == "2025-06-18" and init["capabilities"] == {"tools": {}}
            assert init["serverInfo"]["name"] == "orchestrator"
            newer = (await client.send("initialize", {"protocolVersion": "2099-01-01"}))["result"]
            assert newer["protocolVersion"] == mcp.PROTOCOL_VERSIONS[0]
            assert await client.send("notifications/initialized", notify=True) is None
            tools = (await client.send("tools/list"))["result"]["tools"]
            assert [t["name"] for t in tools] == ["held_paths", "claim_paths"]
            held, error = await client.call("held_paths", {})
            assert not error and "Your claim: src/b.py." in held, held
            await p.until("the holder's touch seen", lambda: _has(p, holder, "docs/more.md"))
            held, _ = await client.call("held_paths", {})
            assert f"Job {holder} (running) holds: docs/more.md, src/a.py." in held, held
            refused, error = await client.call("claim_paths", {"paths": ["src/a.py", "docs/"]})
            assert not error and "Refused: docs/, src/a.py" in refused and f"job {holder}" in refused, refused
            granted, _ = await client.call("claim_paths", {"paths": ["notes/new.md", "src/b.py"]})
            assert granted == "Granted: notes/new.md now in your claim.", granted
            assert "notes/new.md" in (await p.store.jobs.get(me)).grown
            again, _ = await client.call("claim_paths", {"paths": ["notes/new.md"]})
            assert again.startswith("Nothing to claim"), again
            bad, error = await client.call("claim_paths", {"paths": []})
            assert error and "paths:" in bad
            assert (await client.send("resources/list"))["error"]["code"] == mcp.NO_METHOD
            assert (await client.send("tools/call", {"name": "cancel_job", "arguments": {}}))["error"]["code"] == (
                mcp.INVALID_PARAMS
            )
        finally:
            assert client.proc.stdin is not None
            client.proc.stdin.close()
            await asyncio.wait_for(client.proc.wait(), 30)
            await door.close()
        assert client.proc.returncode == 0
        go.touch()
        for job in (holder, me):
            await p.reach(job, JobState.LANDED, JobState.FAILED, JobState.UNCHANGED, timeout=60)


async def _has(p, job_id: int, path: str) -> bool:
    return path in p.parts.watch.actual.get(job_id, frozenset())


async def test_a_door_answers_only_its_own_job_with_its_own_token(make_repo, tmp_path):
    """A request with another token (another job's, or a guess) is refused and said so; an unknown op is refused; a
    job that is not running gets no answer about others; the socket is the job's alone (0600) and gone when closed."""
    repo = make_repo()
    go = tmp_path / "go"
    async with plane(tmp_path, max_concurrent=2, per_repo=2) as p:
        a = await p.enqueue(repo, _wait(go), "src/a.py")
        b = await p.enqueue(repo, _wait(go), "src/b.py")
        await p.reach(a, JobState.RUNNING)
        await p.reach(b, JobState.RUNNING)
        doors = Doors(p.parts.watch)
        door_a = await doors.open(a, p.home / "doors" / str(a))
        door_b = await doors.open(b, p.home / "doors" / str(b))
        try:
            assert oct(door_a.path.stat().st_mode & 0o777) == "0o600"
            with_b_token = mcp.Door(door_a.path, door_b.token)
            with pytest.raises(mcp.DoorError, match="wrong token"):
                await asyncio.to_thread(with_b_token.ask, {"op": "held"})
            with pytest.raises(mcp.DoorError, match="held and claim only"):
                await asyncio.to_thread(door_a.address.ask, {"op": "cancel", "job": b})
            assert (await asyncio.to_thread(door_a.address.ask, {"op": "held"}))["claim"] == ["src/a.py"]
            assert (await door_a.answer(b"not json"))["error"] == "the request is not JSON"
        finally:
            await door_b.close()
            await door_a.close()
        assert not door_a.path.exists() and not door_b.path.exists()
        go.touch()
        for job in (a, b):
            await p.reach(job, JobState.LANDED, JobState.FAILED, JobState.UNCHANGED, timeout=60)
        gone = await doors.open(a, p.home / "doors" / f"{a}-after")
        try:
            with pytest.raises(mcp.DoorError, match="not running"):
                await asyncio.to_thread(gone.address.ask, {"op": "held"})
        finally:
            await gone.close()


def test_the_server_is_wired_into_a_scratch_home_for_claude_code_and_codex(tmp_path):
    """Claude Code: the server in its user config and its tools allowed in its settings, beside what the home had;
    codex: one `[mcp_servers.orchestrator]` table in its config.toml after the user's own, however often wired; a
    link the job left in its home is never followed."""
    import tomllib

    home = tmp_path / "home"
    (home / ".claude").mkdir(parents=True)
    (home / ".claude.json").write_text(json.dumps({"theme": "dark", "mcpServers": {"mine": {"command": "x"}}}))
    door = tmp_path / "private" / "door.sock"
    mcp.wire("claude-code", home, door, "t0k")
    user = json.loads((home / ".claude.json").read_text())
    server = user["mcpServers"]["orchestrator"]
    assert user["theme"] == "dark" and "mine" in user["mcpServers"]
    assert server["command"] == sys.executable and server["args"] == ["-m", "orchestrator", "mcp"]
    assert server["env"] == {mcp.ENV_DOOR: str(door), mcp.ENV_TOKEN: "t0k"}
    assert json.loads((home / ".claude" / "settings.json").read_text())["permissions"]["allow"] == ["mcp__orchestrator"]

    (home / ".codex").mkdir()
    (home / ".codex" / "config.toml").write_text('model = "gpt-5"\n')
    mcp.wire("codex", home, door, "first")
    mcp.wire("codex", home, door, "second")  # a run that goes on from the last one: wired again, not twice
    config = tomllib.loads((home / ".codex" / "config.toml").read_text())
    assert config["model"] == "gpt-5"
    assert config["mcp_servers"]["orchestrator"]["env"][mcp.ENV_TOKEN] == "second"

    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    (home / ".claude.json").unlink()
    (home / ".claude.json").symlink_to(outside)
    with pytest.raises(beneath.Escape):
        mcp.wire("claude-code", home, door, "t0k")
    assert outside.read_text() == "{}", "nothing written through the job's link"


async def test_a_run_whose_mcp_server_cannot_be_wired_into_its_home_is_not_started(tmp_path):
    """A run that goes on from the last one keeps the HOME that run left; a link the job planted where its CLI's
    config goes cannot take the server: the run does not start without its claim tools (it used to, with only a
    note in its log), it fails saying why and what to do, and nothing is written through the link."""
    from orchestrator.config import RunnerTemplate
    from orchestrator.core.job import Job
    from orchestrator.core.models import Code
    from orchestrator.proc.sandbox import Sandbox
    from orchestrator.runners.base import RunContext
    from orchestrator.runners.command import CommandRunner

    cli = tmp_path / "bin" / "fakecli"
    cli.parent.mkdir()
    cli.write_text('#!/bin/sh\necho ran > "$ORCHESTRATOR_WORKTREE/from-the-cli.txt"\n')
    cli.chmod(0o755)
    template = RunnerTemplate(argv=(str(cli), "{prompt}"), scratch_home=True, mcp="claude-code", terminal="none")
    runner = CommandRunner("fake", template, Sandbox())
    job = Job(id=1, repo=str(tmp_path), branch="main", text="write it", runner="fake", state=JobState.RUNNING)
    (tmp_path / "wt").mkdir()
    private = tmp_path / "private"
    home = private / "home"
    home.mkdir(parents=True)
    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    (home / ".claude.json").symlink_to(outside)  # what the job's last run left in its HOME
    ctx = RunContext(
        job=job, worktree=tmp_path / "wt", log_path=tmp_path / "1.log", timeout=60, private_dir=private,
        door=mcp.Door(private / "door.sock", "t0k"), resume="the review asks for more",
    )  # fmt: skip
    result = await runner.run(ctx)
    assert not result.ok and result.code == Code.RUNNER_ERROR, result
    assert "MCP server" in result.summary and str(home) in result.summary, result.summary
    assert "cancel the job and queue its text again" in result.summary, result.summary
    assert 'mcp = "" in [runners.fake]' in result.summary, result.summary
    assert not (ctx.worktree / "from-the-cli.txt").exists(), "its CLI never started"
    assert outside.read_text() == "{}", "nothing written through the job's link"
    assert "[fake was not started: its MCP server" in ctx.log_path.read_text()


async def test_a_new_file_claimed_in_a_directory_reads_as_what_it_is(make_repo, tmp_path):
    """A job claiming a new file in changelog.d/ (`changelog.d/+`): its command's ORCHESTRATOR_CLAIM, `show` and
    `status` and the MCP server's held_paths say "a new file in changelog.d/", never `changelog.d/+`; another agent
    is told a file of its own there is fine, may claim one (granted in those words) and is refused the directory."""
    from orchestrator.commands import fit
    from orchestrator.commands import jobs as jobs_cmd

    repo = make_repo()
    go, wrote = tmp_path / "go", tmp_path / "wrote"
    async with plane(tmp_path, max_concurrent=2, per_repo=2) as p:
        adder = await p.enqueue(repo, f"printf '%s' \"$ORCHESTRATOR_CLAIM\" > claim.txt; touch {wrote}; {_wait(go)}",
                                "changelog.d/+", "claim.txt")  # fmt: skip
        me = await p.enqueue(repo, _wait(go), "src/b.py")
        await p.until("the adder wrote", lambda: asyncio.to_thread(wrote.exists))
        await p.reach(me, JobState.RUNNING)
        shown = (await p.store.jobs.get(adder)).to_json()
        assert jobs_cmd.claim_paths(shown["claim"]["paths"]) == "a new file in changelog.d/, claim.txt"
        assert fit.reasons(shown) == ["claims a new file in changelog.d/, claim.txt"], fit.reasons(shown)
        door = await Doors(p.parts.watch).open(me, p.home / "doors" / str(me))
        client = await _server(door.address)
        try:
            await client.send("initialize", {"protocolVersion": "2025-06-18"})
            held, _ = await client.call("held_paths", {})
            said = f"Job {adder} (running) holds: claim.txt; and adds a new file in changelog.d/ (a new file of your "
            assert said + "own there is fine)." in held, held
            assert "+" not in held, held
            refused, _ = await client.call("claim_paths", {"paths": ["changelog.d/"]})
            assert refused.startswith("Refused: changelog.d/: ") and f"job {adder}" in refused, refused
            assert "changelog.d/+" not in refused, refused
            granted, _ = await client.call("claim_paths", {"paths": ["changelog.d/+"]})
            assert granted == "Granted: a new file in changelog.d/ now in your claim.", granted
            mine, _ = await client.call("held_paths", {})
            assert "Your claim: a new file in changelog.d/, src/b.py." in mine, mine
        finally:
            assert client.proc.stdin is not None
            client.proc.stdin.close()
            await asyncio.wait_for(client.proc.wait(), 30)
            await door.close()
        go.touch()
        await p.reach(adder, JobState.LANDED, timeout=60)
        await p.reach(me, JobState.LANDED, JobState.UNCHANGED, timeout=60)
    assert git(repo, "show", "main:claim.txt") == "a new file in changelog.d/\nclaim.txt"
