"""Runners behind one interface (`base.Runner`), picked by name from one table.

Built in: `shell` (a command), `replay` (a recorded change), `claude` (the built-in agent); plus one
`command` runner per `[runners.NAME]` template of the config (agent CLIs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.proc.sandbox import Sandbox
from orchestrator.runners.base import Runner, UnknownRunner
from orchestrator.runners.replay import ReplayRunner
from orchestrator.runners.shell import ShellRunner

if TYPE_CHECKING:
    from orchestrator.config import Config
    from orchestrator.llm.shared import SharedClaude


def registry(
    cfg: Config | None = None, claude: SharedClaude | None = None, sandbox: Sandbox | None = None
) -> dict[str, Runner]:
    """Every runner this daemon offers, by name."""
    sandbox = sandbox or Sandbox()
    replay = ReplayRunner()
    if cfg is not None:  # a replay merges changelogs as landings do
        replay = ReplayRunner(cfg.mergeable)
    runners: dict[str, Runner] = {"shell": ShellRunner(sandbox), "replay": replay}
    if cfg is not None and claude is not None:
        from orchestrator.runners.claude import ClaudeRunner

        runners["claude"] = ClaudeRunner(claude, cfg.agent, cfg.anthropic.model, sandbox)
    if cfg is not None:
        from orchestrator.runners.command import CommandRunner

        for name, template in cfg.runners.items():
            runners[name] = CommandRunner(name, template, sandbox)
    return runners


def get(name: str, runners: dict[str, Runner]) -> Runner:
    try:
        return runners[name]
    except KeyError:
        raise UnknownRunner(f"unknown runner {name!r}: use one of {', '.join(sorted(runners))}") from None


def task(runners: dict[str, Runner], name: str, text: str) -> str:
    """What of a job's text says its task, as its runner reads the text (what planners read): the whole text
    unless the runner defines `task`."""
    read = getattr(runners.get(name), "task", None)
    return read(text) if callable(read) else text


async def unready(runners: dict[str, Runner], name: str) -> str | None:
    """Why runner `name` cannot start a job here now (None: it can), for runners that can tell (`unready`)."""
    if name not in runners:
        return f"no runner {name!r} (`orchestrator runners` lists them)"
    ask = getattr(runners[name], "unready", None)
    return await ask() if callable(ask) else None
