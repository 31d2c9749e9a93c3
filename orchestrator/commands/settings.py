"""`orchestrator config`: `show` (the effective config, each value with its source: default, file or env, and
whether the running daemon has read the file as it is now) and `example` (the commented default config)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tomllib
from collections.abc import Mapping
from typing import Any

import click

from orchestrator import paths
from orchestrator.commands import fit, term
from orchestrator.commands.common import emit, err, json_option


def _flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """`jobs.max_concurrent` → value, for every leaf of a Config (repos keyed `repos."/path".key`)."""
    out: dict[str, Any] = {}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            out.update(_flatten(getattr(obj, f.name), f"{prefix}{f.name}."))
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            out.update(_flatten(v, f'{prefix}"{k}".'))
    else:
        out[prefix.rstrip(".")] = obj
    return out


def _shown(key: str, value: Any) -> Any:
    from orchestrator.config import Secret

    if isinstance(value, Secret):
        return "****" if value else ""
    return list(value) if isinstance(value, tuple) else value


def sources(data: Mapping[str, Any], env: Mapping[str, str]) -> list[dict[str, Any]]:
    """Every effective setting with its source: `env` if the environment changed it, else `file` if the file
    set it, else `default`. Computed by building the config three ways, so new settings need no table here."""
    from orchestrator import config

    defaults = _flatten(config.parse({}, {}))
    from_file = _flatten(config.parse(data, {}))
    effective = _flatten(config.parse(data, env))
    rows = []
    for key, value in effective.items():
        if key in from_file and from_file[key] != value:
            source = "env"
        elif key not in defaults or defaults[key] != from_file.get(key) or _in_file(data, key):
            source = "file"
        else:
            source = "default"
        rows.append({"key": key, "value": _shown(key, value), "source": source})
    return rows


def _in_file(data: Mapping[str, Any], key: str) -> bool:
    section, _, name = key.partition(".")
    table = data.get(section)
    return isinstance(table, dict) and name in table


def restart_notice(p: paths.Paths) -> str | None:
    """What to say when the running daemon has not read the config file as it is now (None: it has, or no
    daemon answers)."""
    from orchestrator import config as config_mod
    from orchestrator.client import Client, Unreachable

    try:
        health = Client(p.socket, timeout=2).health()
    except (Unreachable, OSError):
        return None
    if "config_stamp" not in health or health["config_stamp"] == config_mod.stamp(p.config_file):
        return None
    return (
        f"{p.config_file} changed after the running daemon read it: restart the daemon to apply it "
        "(`systemctl --user restart orchestrator`, or `orchestrator daemon --stop` and start it again)"
    )


@click.group()
def config() -> None:
    """The daemon's settings."""


@config.command()
def example() -> None:
    """Print the commented default config (every key, with what it does): a start for config.toml."""
    from orchestrator.config import DEFAULT_TOML

    click.echo(DEFAULT_TOML, nl=False)


@config.command()
@json_option
def show(as_json: bool) -> None:
    """Print the effective config: every value, and whether it came from the default, the file or the env."""
    from orchestrator.config import EX_CONFIG, ConfigError

    p = paths.resolve()
    data: dict[str, Any] = {}
    if p.config_file.exists():
        try:
            data = tomllib.loads(p.config_file.read_text())
        except tomllib.TOMLDecodeError as e:
            err(f"orchestrator: invalid config: {p.config_file}: not valid TOML: {e}")
            sys.exit(EX_CONFIG)
    try:
        rows = sources(data, os.environ)
    except ConfigError as e:
        err(f"orchestrator: invalid config: {p.config_file}: {e}")
        sys.exit(EX_CONFIG)
    notice = restart_notice(p)
    if as_json:
        emit({"file": str(p.config_file), "exists": p.config_file.exists(), "restart_needed": notice is not None,
              "settings": rows})  # fmt: skip
        return
    err(f"config file: {p.config_file}" + ("" if p.config_file.exists() else " (absent: defaults)"))
    if notice:
        err(notice)
    for line in lines(rows, shutil.get_terminal_size().columns - 1):
        term.echo(line)


NAME_MAX = 24
"""A setting's name column is at most this wide: a longer name has a line of its own, its value under it."""


def lines(rows: list[dict[str, Any]], width: int) -> list[str]:
    """The settings as TOML-like sections (`[jobs]`, `[runners."aider"]`), each value beside its name and then its
    source (`# default`), lined up, a long value broken between words to `width` columns."""
    out: list[str] = []
    sections: dict[str, list[tuple[str, str, str]]] = {}
    for r in rows:
        section, _, name = r["key"].rpartition(".")
        sections.setdefault(section, []).append((name, json.dumps(r["value"]), f"# {r['source']}"))
    for section, items in sections.items():
        out.append(f"[{section}]")
        name_w = min(max(len(n) for n, _, _ in items), NAME_MAX)
        hang = " " * (name_w + 4)
        room = max(width - len(hang), 20)
        fits = room - 2 - max(len(src) for _, _, src in items)
        value_w = max((len(v) for _, v, _ in items if len(v) <= fits), default=0)
        for name, value, source in items:
            if len(name) > name_w:
                out.append(f"  {name}")
                first = hang
            else:
                first = f"  {name:<{name_w}}  "
            if len(value) <= value_w:
                out.append(f"{first}{value:<{value_w}}  {source}")
                continue
            parts = fit.fill(value, room)
            out += [(first if n == 0 else hang) + p for n, p in enumerate(parts)]
            if len(out[-1]) + 2 + len(source) <= width:
                out[-1] += f"  {source}"
            else:
                out.append(hang + source)
    return out
