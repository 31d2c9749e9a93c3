"""The team benchmark's report for a person: tables that fit a terminal; `--json` for the report itself."""

from __future__ import annotations

import io

from rich.console import Console

from orchestrator.lab.bench.report.team import print_report


def setup(makespan: float | None) -> dict:
    return {
        "nodes": 3, "slots": 2, "jobs": 60, "landed": 60, "landed_once": True, "fsck_clean": True,
        "makespan_s": makespan, "admission_p50_s": 0.412, "admission_p99_s": 3.21, "landing_p50_s": 0.35,
        "landing_p99_s": None, "overlapping_at_once": 0, "requeued": 2,
    }  # fmt: skip


def by_nodes(n: int) -> dict:
    return {
        "runs": 3, "landed_once": True, "admission_p50_s": 0.1 * n, "admission_p99_s": 0.3 * n, "landing_p50_s": 0.2,
        "landing_p99_s": 0.9, "p50_over_1_node": None if n == 1 else float(n),
    }  # fmt: skip


def test_the_team_report_is_two_tables_that_fit_80_columns_with_no_figure_made_up():
    """Both setups side by side and the admission latency by nodes, every figure whole at 80 and 120 columns; a
    figure with no samples reads "-" (never 0.0)."""
    report = {
        "machine": {"cores": 2, "ram_mb": 24000, "python": "3.11.7"},
        "team_3x2": setup(31.25),
        "single_1x6": setup(None),
        "makespan_ratio_team_over_single": None,
        "admission_by_nodes": {str(n): by_nodes(n) for n in (1, 2, 3)},
        "load_1m_after": 1.5,
    }
    for width in (80, 120):
        out = io.StringIO()
        print_report(report, Console(file=out, width=width, highlight=False))
        text = out.getvalue()
        assert "…" not in text and max(len(line) for line in text.splitlines()) <= width, text
        assert "3 nodes × 2 slots" in text and "1 node × 6 slots" in text and "31.2" in text, text
        makespan = next(line for line in text.splitlines() if line.startswith("makespan s"))
        assert makespan.split()[-1] == "-", "no sample: `-`"
        assert "0.0" not in makespan and "makespan, team ÷ single: -" in text
        assert "admission latency by nodes" in text and "0.300" in text


def test_the_many_files_run_is_one_table_that_fits_80_columns():
    """`--measure files` alone: its figures (the API's p99 on the writing node, each node's least lease margin, the
    jobs taken over) in one table at 80 columns, and no empty queue table."""
    many = {
        "files": 1000000, "lease_s": 15.0, "big_job_s": 312.4, "big_job_state": "failed", "big_job_actual": 1,
        "api_calls": 4000, "api_p50_s": 0.0051, "api_p99_s": 0.2531, "api_max_s": 1.9, "small_jobs": 40,
        "small_landed_once": True, "small_job_mean_s": 2.1, "lease_margin_min_s": {"n0": 9.62, "n1": 9.9},
        "taken_over": 0,
    }  # fmt: skip
    out = io.StringIO()
    print_report({"machine": {"cores": 2}, "many_files": many}, Console(file=out, width=80, highlight=False))
    text = out.getvalue()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80, text
    assert "one queue" not in text and "API p99 s" in text and "0.253" in text
    assert "least lease margin s, n0" in text and "9.620" in text and "jobs taken over" in text
