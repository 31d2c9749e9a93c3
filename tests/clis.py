"""The real agent CLIs the end-to-end tests drive: found where `.ci/run` installs them, or on PATH.

`.ci/run` installs Claude Code (npm `@anthropic-ai/claude-code`) and aider (PyPI `aider-chat`, in a venv
of its own) under `.tools/` and links both into `.tools/bin`. A test needing one skips, saying what to
install, where neither place has it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parent.parent / ".tools" / "bin"
INSTALL = {
    "claude": "npm install --prefix .tools/claude-code @anthropic-ai/claude-code (or run bash .ci/run)",
    "aider": "python3 -m venv .tools/aider && .tools/aider/bin/pip install aider-chat (or run bash .ci/run)",
}


@cache
def find(name: str) -> str | None:
    """The CLI's absolute path: `.tools/bin/NAME` first, then PATH."""
    local = TOOLS / name
    if local.exists() and os.access(local, os.X_OK):
        return str(local)
    return shutil.which(name)


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
    """The directory to put on a daemon's PATH so that the bare command name finds the CLI."""
    return str(Path(need(name)).parent)
