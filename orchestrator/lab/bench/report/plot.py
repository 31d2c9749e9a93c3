"""An optional PNG chart of the jobs benchmark: each row's makespan, list schedule and ideal. Needs matplotlib."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

HINT = "--plot needs matplotlib: `pip install 'orchestrator[plot]'` (or `pip install matplotlib`)"


def check() -> None:
    """Fail early, before a long run, when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise click.UsageError(HINT) from None


def write(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['policy']}\n{r['predictor']}" for r in rows]
    xs = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(rows)), 4))
    ax.bar([x - 0.27 for x in xs], [r["makespan_s"] for r in rows], width=0.27, label="replay")
    ax.bar(list(xs), [r["list_s"] for r in rows], width=0.27, label="list schedule")
    ax.bar([x + 0.27 for x in xs], [r["ideal_s"] for r in rows], width=0.27, label="ideal (bound)")
    ax.set_xticks(list(xs), labels)
    ax.set_ylabel("makespan (s)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
