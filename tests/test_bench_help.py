"""Every benchmark answers `--help` with its own options, not the `bench` command's."""

from __future__ import annotations

import pytest

from orchestrator.cli import BENCHES
from tests.harness import cli


@pytest.mark.parametrize("name", BENCHES)
def test_each_bench_has_its_own_help(name: str) -> None:
    """`orchestrator bench NAME --help` prints NAME's usage and exits 0."""
    out = cli("bench", name, "--help")
    assert out.returncode == 0, out.stderr
    assert f"orchestrator bench {name}" in out.stdout
