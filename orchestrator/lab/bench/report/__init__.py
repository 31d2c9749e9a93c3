"""How the jobs benchmark shows its rows: a rich table on stdout, and an optional PNG chart."""

from __future__ import annotations

from orchestrator.lab.bench.report.table import print_table, row_line

__all__ = ["print_table", "row_line"]
