"""Runners behind one interface (`base.Runner`), picked by name from one table: `shell`, `replay`, ..."""

from __future__ import annotations

from orchestrator.runners.base import Runner, UnknownRunner
from orchestrator.runners.replay import ReplayRunner
from orchestrator.runners.shell import ShellRunner


def registry() -> dict[str, Runner]:
    return {"shell": ShellRunner(), "replay": ReplayRunner()}


def get(name: str, runners: dict[str, Runner]) -> Runner:
    try:
        return runners[name]
    except KeyError:
        raise UnknownRunner(f"unknown runner {name!r}: use one of {', '.join(sorted(runners))}") from None
