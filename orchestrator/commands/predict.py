"""`orchestrator stats predict`: how well the claims predicted what jobs really touched (calibration)."""

from __future__ import annotations

from pathlib import Path

import click

from orchestrator.commands import term
from orchestrator.commands.common import api_call, client, emit, err, json_option

COLUMNS = (
    ("jobs", "jobs"),
    ("confident_share", "confident"),
    ("recall", "recall"),
    ("precision", "precision"),
    ("confident_miss_rate", "conf. miss"),
    ("confident_collision_rate", "conf. meet"),
)
"""Each figure's key (as `--json` names it) and its column's heading: the table fits 80 columns."""


@click.group()
def stats() -> None:
    """Statistics the daemon keeps."""


@stats.command()
@click.option("--repo", type=click.Path(path_type=Path), help="Only this repository.")
@json_option
@api_call
def predict(repo: Path | None, as_json: bool) -> None:
    """Per repo and per basis: recall, precision and how often a confident claim missed (calibration)."""
    data = client().stats_predict(str(repo.expanduser().resolve()) if repo else None)
    if as_json:
        emit(data)
        return
    if not data["repos"]:
        err("no ended job with a claim yet: nothing to calibrate")
        return
    for name, r in data["repos"].items():
        note = " (raised by calibration)" if r["raised"] else ""
        term.echo(f"{name}: min confidence {r['min_confidence']:.2f}{note}")
        term.echo(f"  {'basis':<10}" + "".join(f"{h:>11}" for _, h in COLUMNS))
        for basis, row in [("all", r["all"]), *r["by_basis"].items()]:
            term.echo(f"  {basis:<10}" + "".join(f"{_figure(row[c]):>11}" for c, _ in COLUMNS))
    err("conf. miss: the share of confident claims that missed a path their job touched;")
    err("conf. meet: the share whose job touched a path outside its claim that another running job held")


def _figure(value: object) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)
