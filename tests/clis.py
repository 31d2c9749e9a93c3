"""The real agent CLIs the end-to-end tests drive: found where `.ci/run` installs them, or on PATH.

`.ci/run` installs Claude Code (npm `@anthropic-ai/claude-code`), codex (npm `@openai/codex`) and aider (PyPI
`aider-chat`, in a venv of its own) under `$ORCHESTRATOR_TEST_TOOLS` (default `~/.cache/orchestrator-test-tools`:
outside `/tmp`, which a job's sandbox replaces with an empty one, and kept between runs) and links each into its
`bin/`.
A test needing one skips, saying what to install, where neither that dir nor PATH has it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest

TOOLS = Path(os.environ.get("ORCHESTRATOR_TEST_TOOLS") or Path.home() / ".cache" / "orchestrator-test-tools")
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
    """The CLI's path, or skip the test saying how to install it."""
    path = find(name)
    if path is None:
        pytest.skip(f"{name} is not installed: {INSTALL[name]}")
    return path


def bin_dir(name: str) -> str:
    """The directory to put on a daemon's PATH so that the bare command name finds the CLI (its real path:
    a job's sandbox shows no `/tmp` and may not follow a link that leads through it)."""
    return os.path.realpath(Path(need(name)).parent)
