"""`command` runners: an agent CLI (Claude Code, aider, codex, ...) from a profile or a config template.

The template's argv is run as it is (exec, never through a shell). In each argument `{prompt}` (the job's
text), `{plan}` (the pre-plan, if any), `{worktree}`, `{job_id}` and `{feedback}` (what a run that goes on from
the last one is told: `resume_argv`) are replaced, so the prompt reaches the
CLI as exactly one argument whatever quotes, newlines or `$(...)` it holds; an argument that is exactly
`{paths}` becomes one argument per claimed file that exists at the base (for CLIs that take the files to
edit as arguments; the whole claim is in `ORCHESTRATOR_CLAIM`, one path a line). The environment is the
basic allow-list plus the template's `pass_env` names, then its fixed `env` values: every other secret of
the daemon stays out. With `scratch_home = true` each job gets a HOME of its own holding copies of
`home_files` (what the CLI needs to sign in), so concurrent jobs never share, and never leave behind, a
CLI's history. New files matching `ignore` (a CLI's side files) are removed before the job's result is
taken. `output = "claude-json"` reads Claude Code's JSON result (cost, tokens, session) into the job's
usage and keeps its transcript beside the job's log. `rate_limits` names the CLI's signs of a rate limit
(`ratelimit.SIGNS`): only a template that names some is ever stopped as rate-limited by what it prints.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import os
import shutil
import stat
import time
from pathlib import Path
from typing import Any

from orchestrator import beneath
from orchestrator.config import RunnerTemplate
from orchestrator.core.models import Code
from orchestrator.paths import open_private, private_dir, socket_too_long
from orchestrator.proc import process, terminal, visible
from orchestrator.proc.sandbox import Sandbox
from orchestrator.runners import confined, mcp, mcp_sight, ratelimit
from orchestrator.runners.base import RunContext, RunResult, note

PATHS = "{paths}"


def expand(argv: tuple[str, ...], values: dict[str, str], paths: list[str] | None = None) -> list[str]:
    """Replace the known `{name}` placeholders in each argument; anything else in braces stays as written.
    An argument that is exactly `{paths}` becomes the `paths`, one argument each."""
    out = []
    for arg in argv:
        if arg == PATHS and paths is not None:
            out += paths
            continue
        for key, value in values.items():
            arg = arg.replace("{" + key + "}", value)
        out.append(arg)
    return out


def claimed_files(worktree: Path, claim: frozenset[str]) -> list[str]:
    """The claimed paths that are regular files in the worktree as the job starts (not directories, globs or files
    still to be made: a CLI given a missing file may create it empty). Only a path inside it, reached by no link: a
    claim is data (in team mode read from the shared store), and a CLI shows the model every file it is given."""
    return sorted(p for p in claim if p and not p.endswith("/") and _file_within(worktree, p))


def _file_within(worktree: Path, path: str) -> bool:
    try:
        names = beneath.parts(path)
    except beneath.Escape:
        return False
    try:
        with beneath.Root(worktree) as root:
            fd = root.open(names, os.O_RDONLY | os.O_NONBLOCK)
            try:
                return stat.S_ISREG(os.fstat(fd).st_mode)
            finally:
                os.close(fd)
    except (OSError, beneath.Escape):
        return False


def side_files(worktree: Path, patterns: tuple[str, ...], tracked: set[str]) -> list[str]:
    """New paths (not in `tracked`, the base's files) whose path or name matches `patterns`: top-most only."""
    found: list[str] = []
    tracked_dirs = {str(parent) for t in tracked for parent in Path(t).parents}
    for root, dirs, files in os.walk(worktree):
        rel_root = Path(root).relative_to(worktree)
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in sorted([*dirs, *files]):
            rel = (rel_root / name).as_posix()
            if rel in tracked or rel in tracked_dirs:
                continue
            if any(fnmatch.fnmatchcase(rel, p) or fnmatch.fnmatchcase(name, p) for p in patterns):
                found.append(rel)
        dirs[:] = [d for d in dirs if (rel_root / d).as_posix() not in found]
    return found


def remove_side_files(worktree: Path, patterns: tuple[str, ...], tracked: set[str]) -> list[str]:
    """Delete the CLI's new side files (never following a link: a link itself is removed)."""
    gone = side_files(worktree, patterns, tracked)
    for rel in gone:
        p = worktree / rel
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)
    return gone


def base_files(repo: str, base: str | None) -> set[str]:
    """Every file path in the tree of `base` in `repo` (empty when it cannot be read)."""
    import pygit2

    try:
        tree = pygit2.Repository(repo).revparse_single(base or "HEAD").peel(pygit2.Tree)
    except (KeyError, ValueError, pygit2.GitError):
        return set()
    out: set[str] = set()

    def walk(t: Any, prefix: str) -> None:
        for entry in t:
            path = prefix + entry.name
            if entry.type_str == "tree":
                walk(entry, path + "/")
            else:
                out.add(path)

    walk(tree, "")
    return out


def claude_result(output: str) -> dict[str, Any] | None:
    """Claude Code's `--output-format json` result: the last `{"type": "result", ...}` line of its output."""
    for line in reversed(output.splitlines()):
        line = line.strip()
        if line.startswith("{") and '"result"' in line:
            try:
                data = json.loads(line)
            except ValueError:
                continue
            if isinstance(data, dict) and data.get("type") == "result":
                return data
    return None


def log_tail(log: Path, cap: int = 1 << 20) -> str:
    """The last `cap` bytes of a job's log, as text ("" when it cannot be read)."""
    try:
        with log.open("rb") as f:
            f.seek(max(0, log.stat().st_size - cap))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def claude_usage(result: dict[str, Any]) -> dict[str, Any]:
    """The job's `usage` from Claude Code's result: tokens, turns, its own cost figure, the session to resume."""
    u = result.get("usage") or {}
    models = sorted((result.get("modelUsage") or {}).keys())
    counts = {
        "input_tokens": int(u.get("input_tokens") or 0),
        "output_tokens": int(u.get("output_tokens") or 0),
        "cache_write_tokens": int(u.get("cache_creation_input_tokens") or 0),
        "cache_read_tokens": int(u.get("cache_read_input_tokens") or 0),
    }
    return {
        "model": ", ".join(models),
        "calls": int(result.get("num_turns") or 0),
        **counts,
        "tokens": sum(counts.values()),
        "cost_usd": result.get("total_cost_usd"),
        "session_id": result.get("session_id"),
        "source": "claude-code",
    }


def keep_transcript(home: Path, session: str, dest: Path) -> bool:
    """Copy Claude Code's transcript of `session` out of the job's scratch HOME (0600), before HOME goes."""
    found = sorted((home / ".claude" / "projects").glob(f"*/{session}.jsonl"))
    if not found or found[0].is_symlink():
        return False
    fd = open_private(dest, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
    with os.fdopen(fd, "wb") as out, found[0].open("rb") as src:
        shutil.copyfileobj(src, out)
    return True


def transcript_path(log_path: Path) -> Path:
    """Where a job's CLI transcript is kept: beside its log (`<id>.transcript.jsonl`)."""
    return log_path.with_name(log_path.stem + ".transcript.jsonl")


def resumed_prompt(text: str, resume: str) -> str:
    """The job's text for a CLI that cannot resume its own session: the task, then what it is told now."""
    return f"{text}\n\nYour earlier work on this task is already in the working tree; go on from there.\n\n{resume}"


class CommandRunner:
    def __init__(self, name: str, template: RunnerTemplate, sandbox: Sandbox) -> None:
        self.name = name
        self.template = template
        self.sandbox = sandbox
        self._serves: set[tuple[str, ...]] = set()
        """The MCP server commands a job was seen to start (`_mcp_problem`): asked once, not at every job's start."""

    @property
    def resumes(self) -> bool:
        """Its CLI goes on with its own session (`resume_argv`): a job stopped on a real conflict goes on from
        where it was, on the new head, instead of starting again."""
        return bool(self.template.resume_argv)

    @property
    def wants_door(self) -> bool:
        """Its CLI is told of the job's MCP server (`mcp`): the executor opens the job's door for it."""
        return bool(self.template.mcp)

    async def unready(self) -> str | None:
        """Why a job of this runner cannot start here now (its CLI, or the MCP server it is told of, out of a job's
        sight, or no sandbox where one is required), or None."""
        if why := self.sandbox.check():
            return why
        env = process.environment(self.template.pass_env)
        sight = await asyncio.to_thread(visible.look, self.sandbox, self.template.argv[0], env.get("PATH", ""))
        if sight.problem is not None:
            return sight.problem
        if not self.template.mcp:
            return None
        return await self._mcp_problem(env, scratch_home=True)

    async def _mcp_problem(self, env: dict[str, str], *, scratch_home: bool = False) -> str | None:
        """Why a job cannot start the MCP server its CLI is told of (`mcp_sight`), or None. A server seen to start
        is not asked again: its interpreter and package are the daemon's own, and only a failure can change."""
        command = tuple(mcp.command())
        if command in self._serves:
            return None
        why = await asyncio.to_thread(mcp_sight.problem, self.sandbox, env, self.name, scratch_home=scratch_home)
        if why is None:
            self._serves.add(command)
        return why

    async def run(self, ctx: RunContext) -> RunResult:
        if why := self.sandbox.check():
            return RunResult(False, None, why, code=Code.SANDBOX_UNAVAILABLE)
        t = self.template
        values = {
            "prompt": ctx.job.text,
            "plan": str(getattr(ctx.job, "plan_text", "") or ""),
            "worktree": str(ctx.worktree),
            "job_id": str(ctx.job.id),
            "feedback": ctx.resume,
        }
        files = await asyncio.to_thread(claimed_files, ctx.worktree, ctx.job.claim.paths)
        session = bool(ctx.resume and ctx.session and t.resume_argv)
        if ctx.resume and not session:
            values["prompt"] = resumed_prompt(ctx.job.text, ctx.resume)
        argv = expand(t.resume_argv if session else t.argv, values, files)
        env, home, unwired = await self._environment(ctx, values)
        if unwired is not None:  # told of claim tools it would not have: not started (its log says why)
            await asyncio.to_thread(note, ctx.log_path, f"[{self.name} was not started: {unwired}]")
            return RunResult(False, None, unwired, code=Code.RUNNER_ERROR)
        # A CLI a job cannot see would fail with only bwrap's `execvp NAME: No such file`: say where it is instead.
        sight = await asyncio.to_thread(visible.look, self.sandbox, argv[0], env.get("PATH", ""))
        if sight.problem is not None:
            await asyncio.to_thread(note, ctx.log_path, f"[{self.name} was not started: {sight.problem}]")
            return RunResult(False, None, sight.problem, code=Code.RUNNER_ERROR)
        # Nor does a job run without the claim tools its CLI is told of: a server it cannot start, its CLI hides.
        why = await self._mcp_problem(env) if t.mcp and ctx.door else None
        if why is not None:
            await asyncio.to_thread(note, ctx.log_path, f"[{self.name} was not started: {why}]")
            return RunResult(False, None, why, code=Code.RUNNER_ERROR)
        timeout = t.timeout or ctx.timeout
        # A CLI that would retry a rate limit on its own is stopped: the daemon waits. Only by its profile's signs,
        # read where that CLI prints them: what its agent or tools print is the job's own output.
        signs = ratelimit.SIGNS.get(t.rate_limits)
        watch = ratelimit.Watch(signs) if signs is not None else None
        wrapped = await self._in_terminal(ctx, argv, confined.prefix(self.sandbox, ctx, home=home))
        if isinstance(wrapped, RunResult):
            return wrapped
        argv, prefix = wrapped
        result = await process.run(
            argv,
            prefix=prefix,
            env=env,
            timeout=timeout,
            what=f"job {ctx.job.id} runner {self.name}",
            stop_when=watch,
            **ctx.process_options(),
        )
        usage = await asyncio.to_thread(self._read_output, ctx, home)
        if t.ignore:
            tracked = await asyncio.to_thread(base_files, ctx.job.repo, ctx.job.base)
            gone = await asyncio.to_thread(remove_side_files, ctx.worktree, t.ignore, tracked)
            if gone:
                await asyncio.to_thread(note, ctx.log_path, f"[left out, {self.name}'s own files: {', '.join(gone)}]")
        said = watch.seen if watch is not None and result.stopped else "" if result.ok else result.output_tail
        if signs is not None and (limit := ratelimit.detect(said, signs, time.time())):
            why = f"{self.name} was rate-limited by its model API: {limit.message}"
            return RunResult(
                False, result.returncode, why, usage, Code.RATE_LIMITED, limit.retry_after, limit.forgeable
            )
        if result.timed_out:
            return RunResult(False, None, f"{self.name} timed out after {timeout:g}s", usage=usage)
        if result.ok:
            return RunResult(True, 0, f"{self.name} exited 0", usage=usage)
        return RunResult(False, result.returncode, f"{self.name} {result.status}", usage=usage)

    async def _environment(
        self, ctx: RunContext, values: dict[str, str]
    ) -> tuple[dict[str, str], Path | None, str | None]:
        """The command's environment, its scratch HOME when its template asks for one (its MCP server wired there
        when the job has a door), and why that server could not be wired (None: it was, or none is asked for)."""
        t = self.template
        extra = {
            **ctx.env,
            "ORCHESTRATOR_JOB_ID": str(ctx.job.id),
            "ORCHESTRATOR_WORKTREE": str(ctx.worktree),
            "ORCHESTRATOR_CLAIM": ctx.claim_lines,
        }
        home, unwired = None, None
        if t.scratch_home:
            home = await asyncio.to_thread(confined.private_home, ctx, t.home_files)
            extra.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"))
            if t.mcp and ctx.door is not None:  # its MCP server: the claims of the jobs beside it
                try:
                    await asyncio.to_thread(mcp.wire, t.mcp, home, ctx.door.path, ctx.door.token)
                except (beneath.Escape, OSError) as e:  # the home a run of the job left is the job's own
                    unwired = (
                        f"its MCP server (the claims of the jobs beside it) could not be written into its HOME "
                        f"{home}: {e}; an earlier run of this job left that file so: cancel the job and queue its "
                        f'text again (a new job gets a new HOME), or set mcp = "" in [runners.{self.name}]'
                    )
        extra.update({k: expand((v,), values)[0] for k, v in t.env.items()})
        return confined.env(self.sandbox, ctx, process.environment(t.pass_env, extra)), home, unwired

    async def _in_terminal(
        self, ctx: RunContext, argv: list[str], prefix: list[str]
    ) -> tuple[list[str], list[str]] | RunResult:
        """(argv, prefix) to run: in a tmux of the job's own when its template wants one and tmux is here (so a
        person can `orchestrator attach`), else as they are; a RunResult when tmux is required and missing."""
        t = self.template
        tmux = terminal.tmux() if t.terminal != "none" and ctx.terminal is not None else None
        if t.terminal == "tmux" and tmux is None:
            why = f'runner {self.name} has terminal = "tmux" but tmux is not installed: install it, or set "auto"'
            return RunResult(False, None, why, code=Code.RUNNER_ERROR)
        if tmux is None or ctx.terminal is None:
            return argv, prefix
        if too_long := socket_too_long(terminal.socket(ctx.terminal)):
            await asyncio.to_thread(note, ctx.log_path, f"[no terminal to attach to: {too_long}]")
            return argv, prefix
        # In a tmux of the job's own, outside the sandbox (its prefix runs in the pane): `orchestrator attach`.
        await asyncio.to_thread(private_dir, ctx.terminal)
        return terminal.wrap(tmux, ctx.terminal, [*prefix, *argv]), []

    def _read_output(self, ctx: RunContext, home: Path | None) -> dict[str, Any] | None:
        """The usage the CLI reported (and its transcript kept), for templates whose `output` says how."""
        if self.template.output != "claude-json":
            return None
        found = claude_result(log_tail(ctx.log_path))
        if found is None:
            return None
        usage = claude_usage(found)
        if home is not None and usage["session_id"]:
            usage["transcript"] = keep_transcript(home, str(usage["session_id"]), transcript_path(ctx.log_path))
        return usage
