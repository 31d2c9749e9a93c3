"""Whether a job can start its MCP server: the daemon's interpreter and the orchestrator package, seen from inside.

A CLI told of the job's MCP server (`runners.mcp`) starts it inside the job's sandbox as `PYTHON -m orchestrator
mcp`, PYTHON the daemon's own interpreter. A venv under `/tmp` (or the package, or a HOME holding it) is empty
there: the server never starts and the agent would work without its claim tools, its CLI saying nothing of it.
So the command runner asks first (`problem`), as it asks for its CLI (`proc.visible`), and a job it cannot
serve does not start; `doctor` asks too.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import orchestrator
from orchestrator.proc import jobpath, process, sandbox, visible
from orchestrator.proc.sandbox import Sandbox
from orchestrator.runners import mcp


def problem(box: Sandbox, env: Mapping[str, str], runner: str = "", *, scratch_home: bool = False) -> str | None:
    """Why a job whose environment is `env` cannot start the MCP server (`orchestrator mcp --check` run as the CLI
    would run it, inside the sandbox), with what to do; None when it can. Sync: call in a thread."""
    argv = mcp.command()
    why = visible.starts(box, [*argv, "--check"], env, scratch_home=scratch_home)
    if why is None:
        return None
    package = Path(orchestrator.__file__).parent
    where = visible.hidden_in(package, box)
    if "No module named" in why and where is not None:
        why += (
            f". The orchestrator package is {package}, which a job cannot see: {where} is empty inside a job's "
            f"sandbox. Install orchestrator (its venv) outside {where}"
        )
    elif "No module named" in why:
        why += (
            f". The orchestrator package is {package}, which {argv[0]} does not find with a job's environment (no "
            "PYTHONPATH, and a scratch HOME hides a `pip install --user`): install orchestrator into that "
            "interpreter's own environment (a venv)"
        )
    turn_off = f'set mcp = "" in [runners.{runner}]' if runner else 'set mcp = "" in the runner\'s [runners.NAME]'
    return (
        f"the job's MCP server (its claim tools: `{' '.join(argv)}`) cannot start in a job: {why}; "
        f"or {turn_off} to run the agent without claim tools"
    )


def asked(mode: str, team: bool, hide: tuple[Path, ...], runner: str = "") -> str | None:
    """`problem` for a job started now, asked outside the daemon (`doctor`, `orchestrator runners`): the sandbox of
    `mode` (probed), a job's PATH (the login shell asked), a scratch HOME. Of this interpreter: the daemon runs the
    same one when started from this install (`orchestrator service install` does). Sync."""
    box = sandbox.detect(sandbox.mode_for(mode, team), hide)
    env = process.environment((), {"PATH": jobpath.learn(quiet=True)})
    return problem(box, env, runner, scratch_home=True)
