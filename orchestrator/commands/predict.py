"""`orchestrator stats predict`: how well the claims predicted what jobs really touched (calibration)."""

from __future__ import annotations

from pathlib import Path

import click

from orchestrator.commands.common import api_call, client, emit, err, json_option

COLUMNS = ("jobs", "confident_share", "recall", "precision", "confident_miss_rate", "confident_collision_rate")


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
        click.echo(f"{name}: min confidence {r['min_confidence']:.2f}{note}")
        click.echo(f"  {'basis':<10}" + "".join(f"{c:>26}" for c in COLUMNS))
        for basis, row in [("all", r["all"]), *r["by_basis"].items()]:
            click.echo(f"  {basis:<10}" + "".join(f"{'-' if row[c] is None else row[c]!s:>26}" for c in COLUMNS))
