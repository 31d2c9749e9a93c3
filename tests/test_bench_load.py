"""`bench load` under the default sandbox: its gate job lands, every figure comes from samples it took, and a figure
no sample gave reads "-" (null in JSON), never 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from orchestrator.lab.bench import load
from orchestrator.lab.bench import schedule as sched
from tests.test_sandbox import needs_bwrap


def test_a_figure_without_samples_is_none_not_zero() -> None:
    """Quantiles, means and maxima of nothing are None; rounding keeps None."""
    assert sched.pct([], 0.5) is None and sched.mean([]) is None and sched.most([]) is None
    assert sched.fig(None, 3) is None and sched.fig(sched.pct([0.2, 0.1, 0.4], 0.5), 3) == 0.2


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "ORCHESTRATOR_SANDBOX"}  # the default: auto
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", "bench", "load", *args], env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip


@needs_bwrap
@pytest.mark.timeout(300)
def test_bench_load_lands_its_gate_job_under_the_default_sandbox() -> None:
    """The latency phase times real landings under bubblewrap (its gate is a file a job can see), and the figures
    of the throughput phase that took no sample (too short a queue to sample status) are null, not 0."""
    out = _bench("--jobs", "6", "--slots", "2", "--waiting", "6", "--landings", "2", "--json")
    assert out.returncode == 0, out.stderr
    rows = {r["bench"]: r for r in json.loads(out.stdout)["rows"]}
    latency = rows["latency"]
    assert latency["landings"] == 2
    assert latency["landing_to_admission_p50_s"] is not None and latency["landing_to_admission_max_s"] is not None
    throughput = rows["throughput"]
    assert throughput["landed"] == 6
    for key in ("status_api_p50_s", "status_api_p99_s", "status_cli_p50_s", "status_cli_p99_s"):
        assert (throughput[key] is None) is (throughput["status_samples"] == 0), (key, throughput)


def test_the_report_prints_a_dash_for_a_figure_without_samples() -> None:
    """On the terminal a figure no sample gave is "-", a measured one its value."""
    m = {"cores": 2, "ram_mb": 1, "python": "3", "load_1m": 0.5}
    shown = load.report(m, [{"bench": "latency", "landings": 0, "landing_to_admission_p50_s": None, "x_s": 0.25}])
    assert "    landing_to_admission_p50_s     -" in shown and "    x_s                            0.25" in shown
