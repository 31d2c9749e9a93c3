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


def figure(rows: list[dict[str, Any]], info: dict[str, Any] | None = None) -> Any:
    """The chart as a matplotlib Figure: per row its makespan, list schedule and ideal, under a title that says
    what was replayed on what machine; over each row's bars, its conflicts (and redone, lost or broken work)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['policy']}\n{r['predictor']}" for r in rows]
    xs = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(rows)), 4.5))
    ax.bar([x - 0.27 for x in xs], [r["makespan_s"] for r in rows], width=0.27, label="replay")
    ax.bar(list(xs), [r["list_s"] for r in rows], width=0.27, label="list schedule")
    ax.bar([x + 0.27 for x in xs], [r["ideal_s"] for r in rows], width=0.27, label="ideal (bound)")
    top = max((max(r["makespan_s"], r["list_s"], r["ideal_s"]) for r in rows), default=0)
    for x, r in zip(xs, rows, strict=True):
        shown = ("conflicts", *(k for k in ("redone", "lost", "broken") if r.get(k)))
        bad = [f"{r.get(k) or 0} {k}" for k in shown]
        worst = any(r.get(k) for k in ("conflicts", "lost", "broken"))
        ax.annotate("\n".join(bad), (x - 0.27, r["makespan_s"]), xytext=(0, 3), textcoords="offset points",
                    ha="center", va="bottom", fontsize=8, color="tab:red" if worst else "dimgray")  # fmt: skip
    ax.set_ylim(0, top * 1.25 or 1)
    ax.set_xticks(list(xs), labels)
    ax.set_ylabel("makespan (s)")
    ax.set_title(title(info), fontsize=10)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    return fig


def title(info: dict[str, Any] | None) -> str:
    """What the chart shows: the history replayed, how many changes, on what machine."""
    if not info:
        return "jobs bench: makespan per policy/predictor"
    m = info.get("machine") or {}
    where = f"{m.get('cores', '?')} cores, {m.get('ram_mb', '?')} MB RAM" if m else "this machine"
    history = Path(str(info.get("history", ""))).name or "a history"
    return f"jobs bench: {info.get('changes', '?')} changes of {history} replayed, makespan per policy ({where})"


def write(rows: list[dict[str, Any]], path: Path, info: dict[str, Any] | None = None) -> None:
    import matplotlib.pyplot as plt

    fig = figure(rows, info)
    fig.savefig(path, dpi=120)
    plt.close(fig)
