"""`bench chat`'s figures from its rows: ratios, the median over repeated runs, gate against naive, tables.

A row is one (run, policy, slots, N) measurement. Ratios to one session are taken within a run (the same
policy's N=1 row of the same run and slot count); gate against naive is taken within a run too (the two
policies ran side by side, minutes apart at most), and only then is the median over runs taken, so a
machine whose load drifts between runs moves both policies together and the ratio stays honest.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

FIGURES = ("first_ollama_mean_s", "done_min_s", "done_mean_s", "done_max_s", "wall_done_s", "wall_drained_s",
           "ttfa_p99_s", "ttfa_server_p99_s")  # fmt: skip
"""The figures a median row carries (each with its spread over the runs)."""
VERSUS = ("done_max_s", "done_mean_s", "wall_drained_s", "wall_done_s", "first_ollama_mean_s")
"""The figures compared gate / naive, run by run."""


def ratios(rows: list[dict[str, Any]]) -> None:
    """Each row's ratios to the same run's, policy's and slot count's single session (in place)."""
    singles = {(r.get("run", 0), r["policy"], r["slots"]): r for r in rows if r["n"] == 1}
    for r in rows:
        one = singles.get((r.get("run", 0), r["policy"], r["slots"]))
        one = one or next((s for s in rows if s["n"] == 1 and s["policy"] == r["policy"]), None)
        if one:
            base = one["done_mean_s"]
            r["wall_done_ratio"] = round(r["wall_done_s"] / (r["n"] * base), 2)
            r["done_max_x_single"] = round(r["done_max_s"] / base, 2)
            r["done_mean_x_single"] = round(r["done_mean_s"] / base, 2)
            r["drained_x_single"] = round(r["wall_drained_s"] / one["wall_drained_s"], 2)


def _spread(values: Iterable[float]) -> dict[str, float]:
    v = sorted(values)
    return {"median": round(statistics.median(v), 4), "min": round(v[0], 4), "max": round(v[-1], 4)}


def medians(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (policy, slots, N): each figure's median over the runs, and its spread (min, max)."""
    groups: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["policy"], r["slots"], r["n"]), []).append(r)
    out = []
    for (policy, slots, n), mine in groups.items():
        row: dict[str, Any] = {"policy": policy, "slots": slots, "n": n, "runs": len(mine), "spread": {}}
        for key in FIGURES:
            values = [float(r[key]) for r in mine if r.get(key) is not None and not math.isnan(float(r[key]))]
            if values:
                s = _spread(values)
                row[key] = s["median"]
                row["spread"][key] = [s["min"], s["max"]]
        row["errors"] = [e for r in mine for e in r["errors"]]
        out.append(row)
    return out


def versus(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each gate policy / naive per (slots, N > 1), taken in each run, then the median and spread over the runs."""
    by = {(r.get("run", 0), r["policy"], r["slots"], r["n"]): r for r in rows}
    keys = sorted({(r["policy"], r["slots"], r["n"]) for r in rows if r["n"] > 1 and r["policy"] != "naive"})
    out = []
    for policy, slots, n in keys:
        runs = sorted({run for run, p, s, k in by if p == policy and s == slots and k == n})
        per_run = []
        for run in runs:
            gate, naive = by.get((run, policy, slots, n)), by.get((run, "naive", slots, n))
            if gate is None or naive is None:
                continue
            per_run.append({k: round(gate[k] / naive[k], 3) for k in VERSUS if gate.get(k) and naive.get(k)})
        if not per_run:
            continue
        row: dict[str, Any] = {"policy": policy, "slots": slots, "n": n, "runs": per_run}
        for k in VERSUS:
            values = [p[k] for p in per_run if k in p]
            if values:
                row[k] = _spread(values)
        row["gate_ttfa_p99_s"] = _spread(float(by[(run, policy, slots, n)]["ttfa_p99_s"]) for run in runs)
        out.append(row)
    return out


def cell(key: str, v: Any) -> str:
    """A table cell with its unit: ttfa in ms, times in s, CPU in %, RAM in MB, ratios bare."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if not isinstance(v, int | float) or isinstance(v, bool):
        return str(v)
    if key.startswith("ttfa"):
        return f"{v * 1000:.1f} ms"
    if key.endswith("_s"):
        return f"{v:.2f} s"
    if key.endswith("_pct"):
        return f"{v:.0f} %"
    if key.endswith("_mb"):
        return f"{v:,.0f} MB"
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def _console() -> Any:
    from rich.console import Console

    return Console(width=220 if not sys.stdout.isatty() else None)


def table(rows: list[dict[str, Any]], title: str = "bench chat") -> None:
    from rich.table import Table

    t = Table(title=title, box=None, pad_edge=False)
    cols = [
        ("run", "run"), ("policy", "policy"), ("slots", "slots"), ("N", "n"), ("ttfa", "ttfa_mean_s"),
        ("ttfa p99", "ttfa_p99_s"), ("server p99", "ttfa_server_p99_s"), ("first-Ollama", "first_ollama_mean_s"),
        ("done min/mean/max", None), ("wall done", "wall_done_s"), ("wall drained", "wall_drained_s"),
        ("CPU max", "cpu_max_pct"), ("min free RAM", "min_free_ram_mb"), ("wait int/bg", None),
        ("done/(N×1)", "wall_done_ratio"), ("max×1", "done_max_x_single"), ("mean×1", "done_mean_x_single"),
        ("errors", None),
    ]  # fmt: skip
    if len({r.get("run", 0) for r in rows}) < 2:
        cols = cols[1:]
    for name, _ in cols:
        t.add_column(name, justify="right")
    for r in rows:
        cells = []
        for name, key in cols:
            if name.startswith("done min"):
                cells.append(f"{r['done_min_s']:.1f} / {r['done_mean_s']:.1f} / {r['done_max_s']:.1f} s")
            elif name.startswith("wait"):
                cells.append(f"{r['gate_wait_interactive_s']:.2f} / {r['gate_wait_background_s']:.2f} s")
            elif name == "errors":
                cells.append(str(len(r["errors"])))
            elif name == "run":
                cells.append(str(r["run"] + 1))
            else:
                cells.append(cell(key or "", r.get(key or "")))
        t.add_row(*cells)
    _console().print(t)


def versus_table(rows: list[dict[str, Any]]) -> None:
    """Gate / naive, the median over the runs and [min–max]: below 1 the gate is ahead."""
    from rich.markup import escape
    from rich.table import Table

    if not rows:
        return
    runs = max(len(r["runs"]) for r in rows)
    title = "gate / naive, side by side in each run" + (f" (median of {runs} runs [min–max])" if runs > 1 else "")
    t = Table(title=escape(title), box=None, pad_edge=False)
    names = {"done_max_s": "done max", "done_mean_s": "done mean", "wall_drained_s": "drained",
             "wall_done_s": "wall done", "first_ollama_mean_s": "first-Ollama"}  # fmt: skip
    for name in ("policy", "slots", "N", *names.values(), "ttfa p99"):
        t.add_column(name, justify="right")
    for r in rows:
        cells = [r["policy"], str(r["slots"]), str(r["n"])]
        for k in names:
            s = r.get(k)
            cells.append("-" if s is None else f"{s['median']:.3f}" + (
                f" [{s['min']:.2f}–{s['max']:.2f}]" if runs > 1 else ""))  # fmt: skip
        p = r["gate_ttfa_p99_s"]
        cells.append(f"{p['median'] * 1000:.1f} ms" + (f" [{p['min'] * 1000:.1f}–{p['max'] * 1000:.1f}]"
                                                       if runs > 1 else ""))  # fmt: skip
        t.add_row(*cells)
    _console().print(t)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("orchestrator: --plot needs matplotlib (`pip install 'orchestrator[plot]'`)", file=sys.stderr)
        sys.exit(2)
    fig, ax = plt.subplots(figsize=(7, 4))
    for policy, slots in sorted({(r["policy"], r["slots"]) for r in rows}):
        mine = sorted((r for r in rows if r["policy"] == policy and r["slots"] == slots), key=lambda r: r["n"])
        label = f"{policy} ({slots} slots)"
        ax.plot([r["n"] for r in mine], [r["wall_done_s"] for r in mine], marker="o", label=f"{label}: wall done")
        ax.plot([r["n"] for r in mine], [r["wall_drained_s"] for r in mine], marker="x", ls="--",
                label=f"{label}: drained")  # fmt: skip
    ax.set_xticks(sorted({r["n"] for r in rows}))
    ax.set_xlabel("concurrent sessions (N)")
    ax.set_ylabel("seconds")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
