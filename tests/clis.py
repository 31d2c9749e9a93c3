"""The real agent CLIs the end-to-end tests drive: found where `.ci/run` installs them, or on PATH.

`.ci/run` installs Claude Code (npm `@anthropic-ai/claude-code`), codex (npm `@openai/codex`) and aider (PyPI
`aider-chat`, in a venv of its own) under `$ORCHESTRATOR_TEST_TOOLS` (default `~/.cache/orchestrator-test-tools`,
or `/var/tmp/orchestrator-test-tools-UID` when HOME is under `/tmp`: never where a job's sandbox shows an empty
dir; kept between runs) and links each into its `bin/`.
A test needing one skips, saying what to install, where neither that dir nor PATH has it, or why a job cannot see
the one found.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from orchestrator.proc import sandbox, visible

_HOME = Path.home()
TOOLS = Path(
    os.environ.get("ORCHESTRATOR_TEST_TOOLS")
    or (f"/var/tmp/orchestrator-test-tools-{os.getuid()}" if _HOME.is_relative_to("/tmp") else "")
    or _HOME / ".cache" / "orchestrator-test-tools"
)
"""Where `.ci/run` installs the CLIs: never under /tmp (with HOME there, /var/tmp), which a job's sandbox empties."""
INSTALL = {
    "claude": "bash .ci/run installs it (npm @anthropic-ai/claude-code)",
    "aider": "bash .ci/run installs it (pip aider-chat, in a venv of its own)",
    "codex": "bash .ci/run installs it (npm @openai/codex)",
}


@cache
def find(name: str) -> str | None:
    """The CLI's absolute path, under its own name: the tools dir first, then PATH."""
    local = TOOLS / "bin" / name
    return str(local) if local.exists() and os.access(local, os.X_OK) else shutil.which(name)


@cache
def version(name: str) -> str:
    """What `NAME --version` says (the README names the versions the tests ran)."""
    path = find(name)
    if path is None:
        return ""
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    return out.stdout.strip()


def need(name: str) -> str:
    """The CLI's path, or skip the test saying how to install it (or why a job's sandbox cannot see it)."""
    path = find(name)
    if path is None:
        pytest.skip(f"{name} is not installed: {INSTALL[name]}")
    if (problem := out_of_sight(path)) is not None:
        pytest.skip(f"{problem}; ORCHESTRATOR_TEST_TOOLS outside /tmp and `bash .ci/run` install it where jobs see it")
    if name in MCP and (problem := mcp_out_of_sight()) is not None:
        pytest.skip(problem)
    return path


MCP = frozenset({"claude", "codex"})
"""The CLIs the daemon tells of a job's MCP server: a job of theirs does not start where it cannot start that server."""


@cache
def mcp_out_of_sight() -> str | None:
    """Why a job cannot start the MCP server here: the tests' interpreter or orchestrator package under a dir a job's
    sandbox shows empty (a checkout and venv made under /tmp), where the daemon refuses such a job (None: it can)."""
    import orchestrator

    box = sandbox.detect("auto")
    if not box.active:
        return None
    for what, path in (("interpreter", sys.executable), ("orchestrator package", Path(orchestrator.__file__).parent)):
        if (where := visible.hidden_in(path, box)) is not None:
            return (
                f"the tests' {what} {path} is under {where}, empty inside a job's sandbox: a job cannot start the "
                f"MCP server there (`orchestrator doctor` says so); run these tests from a checkout and venv outside "
                f"{where}"
            )
    return None


@cache
def out_of_sight(path: str) -> str | None:
    """Why a job under bubblewrap cannot start the CLI at `path` (None: it can, or there is no bubblewrap)."""
    box = sandbox.detect("auto")
    if not box.active:
        return None
    return visible.look(box, path, os.environ.get("PATH", "/usr/bin:/bin")).problem


def bin_dir(name: str) -> str:
    """The directory to put on a daemon's PATH so that the bare command name finds the CLI (its real path:
    a job's sandbox shows no `/tmp` and may not follow a link that leads through it)."""
    return os.path.realpath(Path(need(name)).parent)
