"""`orchestrator runners`: the runners a job can name (`enqueue --runner NAME`), and whether each can run here.

The built-in ones, then one per `[runners.NAME]` of the config file: its command, where a job finds it (on a
job's PATH, looked for from inside a job's sandbox: `proc.visible`) or why a job cannot, and which of the
variables it is given (`pass_env`) are set in this environment (presence only: values are never printed).
With the daemon up, a configured runner it has not loaded (the config changed since it started) says so.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from dataclasses import replace
from typing import Any

import click

from orchestrator import paths
from orchestrator.client import Client, Unreachable
from orchestrator.commands import fit, term
from orchestrator.commands.common import emit, err, json_option
from orchestrator.proc import visible

BUILTIN = {
    "shell": "the job's text is a /bin/sh script run in its workspace (or an exact argv after `enqueue --`)",
    "replay": "applies a recorded commit or patch after a delay, no model (benchmarks, demos)",
    "claude": "the built-in coding agent over the Claude Messages API (ANTHROPIC_API_KEY; model anthropic.model)",
}


def _patterns_set(names: tuple[str, ...]) -> dict[str, bool]:
    """Each `pass_env` entry (a name or a pattern such as `AIDER_*`) and whether this environment sets it."""
    import fnmatch

    return {n: any(fnmatch.fnmatchcase(k, n) and v for k, v in os.environ.items()) for n in names}


def sights(cfg: Any, p: paths.Paths) -> dict[str, visible.Sight]:
    """Each command runner's CLI as a job would look for it: on a job's PATH, from inside a job's sandbox; one whose
    CLI a job finds but whose MCP server (`mcp`) a job cannot start has that as its problem (its jobs do not start)."""
    from orchestrator.runners import mcp_sight

    hide = (p.state_dir, p.config_dir, p.runtime_dir)
    named = {name: t.argv[0] for name, t in cfg.runners.items()}
    seen = visible.commands(named, cfg.jobs.sandbox, bool(cfg.store.url), hide)
    told = [name for name, s in seen.items() if s.ok and cfg.runners[name].mcp]
    if told and (why := mcp_sight.asked(cfg.jobs.sandbox, bool(cfg.store.url), hide)):
        seen |= {name: replace(seen[name], problem=why) for name in told}
    return seen


def rows(cfg: Any, loaded: list[str] | None, seen: dict[str, visible.Sight] | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for name, what in BUILTIN.items():
        row: dict[str, Any] = {"name": name, "kind": "built-in", "what": what}
        if name == "claude":
            row["env"] = {"ANTHROPIC_API_KEY": bool(cfg.anthropic.api_key)}
        out.append(row)
    for name, t in cfg.runners.items():
        sight = (seen or {}).get(name)
        out.append(
            {
                "name": name,
                "kind": "command",
                "what": shlex.join(t.argv),
                "command": t.argv[0],
                "found": sight.inside if sight is not None and sight.ok else None,
                "problem": sight.problem if sight is not None else None,
                "env": _patterns_set(t.pass_env),
                "scratch_home": t.scratch_home,
                "loaded": None if loaded is None else name in loaded,
                "terminal": _terminal(t.terminal),
            }
        )
    for row in out:
        row["default"] = row["name"] == cfg.jobs.default_runner
    return out


TERMINAL_NOTES = {
    "tmux": "in a tmux of its own: `orchestrator attach ID` joins it",
    "pipe": 'on a pipe: nothing to attach to (terminal = "auto" and tmux give it one)',
    "missing": 'terminal = "tmux" but tmux is not installed: its jobs fail until it is',
}


def _terminal(mode: str) -> str:
    """Where a command runner's CLI runs here: "tmux" (a person can `attach`), "pipe", or "missing" (it asks for
    tmux, which is not installed: its jobs fail until it is)."""
    found = shutil.which("tmux") is not None
    if mode == "none" or (mode == "auto" and not found):
        return "pipe"
    return "tmux" if found else "missing"


def variables(env: dict[str, bool]) -> str:
    """Which of the variables a runner is given are set here, in one line: the set ones by name, the rest
    counted (a CLI needs one of its providers' keys, not all of them; `--json` lists each)."""
    given = [k for k, v in env.items() if v]
    unset = [k for k, v in env.items() if not v]
    if len(env) == 1:
        return f"{next(iter(env))} {'set' if given else 'unset'}"
    if not unset:
        return f"all of its {len(given)} variables set"
    if given:
        return f"{', '.join(given)} set; {len(unset)} more it may use unset"
    return f"none of its {len(unset)} variables set ({unset[0]}, ...)"


def lines(table: list[dict[str, Any]], width: int) -> list[str]:
    """The runners on lines of at most `width` columns: name, kind and what it runs, then under it whether its
    command is found and which of its variables are set."""
    name_w = max(len(r["name"]) for r in table)
    hang = " " * (name_w + 12)
    room = max(width - len(hang), 20)
    out = []
    for r in table:
        what = r["what"] + ("  (default)" if r["default"] else "")
        said = fit.fill(what, room) if r["kind"] == "built-in" else [fit.cut_middle(what, room)]
        out.append(f"{r['name']:<{name_w}}  {r['kind']:<8}  {said[0]}")
        out += [hang + part for part in said[1:]]
        notes = []
        if r["kind"] == "command":
            notes.append(r["problem"] or f"{r['command']}: {r['found']}")
            if r["loaded"] is False:
                notes.append("not loaded by the running daemon: restart it")
            notes.append(TERMINAL_NOTES[r["terminal"]])
        if r.get("env"):
            notes.append(variables(r["env"]))
        out += [hang + part for note in notes for part in fit.fill(note, room, indent="  ")]
    return out


@click.command()
@json_option
def runners(as_json: bool) -> None:
    """List the runners jobs can use, and whether each can run here (its command on PATH, its variables set)."""
    from orchestrator import config

    p = paths.resolve()
    try:
        cfg = config.load(p.config_file)
    except config.ConfigError as e:
        err(f"orchestrator: invalid config: {e}")
        sys.exit(config.EX_CONFIG)
    try:
        loaded = list(Client(p.socket, timeout=2).health().get("runners") or []) or None
    except (Unreachable, OSError):
        loaded = None
    table = rows(cfg, loaded, sights(cfg, p))
    if as_json:
        emit(table)
        return
    for line in lines(table, shutil.get_terminal_size().columns - 1):
        term.echo(line)
    if not cfg.runners:
        err("no agent CLIs configured: `orchestrator config example` shows [runners.NAME] examples")
