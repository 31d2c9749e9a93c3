"""Every benchmark answers `--help` with its own options, not the `bench` command's."""

from __future__ import annotations

import subprocess
import sys

import pytest

from orchestrator.cli import BENCHES


@pytest.mark.parametrize("name", BENCHES)
def test_each_bench_has_its_own_help(name: str) -> None:
    """`orchestrator bench NAME --help` prints NAME's usage and exits 0."""
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator", "bench", name, "--help"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert f"orchestrator bench {name}" in out.stdout
