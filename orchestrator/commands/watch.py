"""`orchestrator watch`: a live view of running and waiting jobs per repo, fed by the daemon's events.

The daemon pushes every job change on `GET /events` (NDJSON); this view keeps the jobs in memory and
redraws with rich `Live` when something changed (and once a second, for the ages). `q` quits (keys are
read in cbreak mode, so no Enter is needed), Ctrl-C too. If the daemon goes away the view says so and
reconnects when it is back.
"""

from __future__ import annotations

import json
import os
import select
import sys
import threading
from pathlib import Path
from typing import Any

import click

from orchestrator.client import ApiError, Client, Unreachable
from orchestrator.commands import fit
from orchestrator.commands.common import api_call, client, json_option
from orchestrator.commands.status import job_line
from orchestrator.core import models

OPEN = models.OPEN | models.HELD
"""What the view lists per repo: jobs that run or wait, and interrupted ones (they keep their place)."""
ORDER = {str(s): n for n, s in enumerate(models.VIEW_ORDER)}


class View:
    """The jobs as the event stream last described them; the reader thread writes, the drawer reads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.changed = threading.Event()
        self.jobs: dict[int, dict[str, Any]] = {}
        self.controls: dict[str, Any] = {}
        self.landing: list[list[str]] = []
        self.connected = False
        self.note = "connecting…"

    def apply(self, ev: dict[str, Any]) -> None:
        with self.lock:
            kind = ev.get("type")
            if kind == "snapshot":
                self.jobs = {j["id"]: j for j in ev["jobs"]}
                self.connected, self.note = True, ""
            elif kind == "job":
                self.jobs[ev["job"]["id"]] = ev["job"]
            elif kind == "removed":
                self.jobs.pop(ev["id"], None)
            elif kind == "state":
                self.controls, self.landing = ev["controls"], ev["landing"]
        self.changed.set()

    def lost(self, why: str) -> None:
        with self.lock:
            self.connected, self.note = False, why
        self.changed.set()


def follow(c: Client, view: View, stop: threading.Event) -> None:
    """Read the event stream into `view`; reconnect (after a second) when it ends."""
    while not stop.is_set():
        try:
            for ev in c.events():
                if stop.is_set():
                    return
                view.apply(ev)
            view.lost("the daemon closed the event stream; reconnecting…")
        except (Unreachable, ApiError, OSError, ValueError) as e:
            view.lost(f"daemon unreachable ({type(e).__name__}); reconnecting…")
        stop.wait(1.0)


def keys(stop: threading.Event) -> None:
    """Set `stop` when `q` is pressed (stdin in cbreak mode: one key, no Enter)."""
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        while not stop.is_set():
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready:
                key = os.read(fd, 1)
                if key in (b"q", b"Q") or not key:
                    stop.set()
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def render(view: View, width: int, repo: str | None) -> Any:
    from rich.console import Group
    from rich.text import Text

    with view.lock:
        jobs = [j for j in view.jobs.values() if repo is None or j["repo"] == repo]
        controls, landing, note = dict(view.controls), list(view.landing), view.note
    open_ = [j for j in jobs if j["state"] in OPEN]
    head = Text()
    head.append("orchestrator watch", style="bold")
    head.append(f"  {fit.summary(open_)}", style="")
    if controls.get("*", {}).get("paused"):
        head.append("  · daemon PAUSED", style="bold yellow")
    head.append("  · q quits", style="dim")
    parts: list[Any] = [head]
    if note:
        parts.append(Text(note, style="bold red"))
    by_repo: dict[str, list[dict[str, Any]]] = {}
    for j in sorted(open_, key=lambda j: (ORDER[j["state"]], j["id"])):
        by_repo.setdefault(j["repo"], []).append(j)
    if not by_repo:
        parts.append(Text("no running or waiting jobs", style="dim"))
    for path, rows in sorted(by_repo.items()):
        title = Text(f"\n{Path(path).name}", style="bold blue")
        title.append(f"  {path}", style="dim")
        c = controls.get(path, {})
        if c.get("paused"):
            title.append("  PAUSED", style="bold yellow")
        if c.get("slots") is not None:
            title.append(f"  {c['slots']} slots", style="yellow")
        for r, branch in landing:
            if r == path:
                title.append(f"  landing into {branch} in flight", style="cyan")
        parts.append(title)
        for j in rows:
            line = Text()
            for n, (text, style) in enumerate(job_line(j, width - 1)):
                if n:
                    line.append(" ")
                line.append(text, style=style)
            line.no_wrap, line.overflow = True, "ellipsis"
            parts.append(line)
    ended = [j for j in jobs if j["state"] not in OPEN]
    if ended:
        parts.append(Text(f"\nended: {fit.summary(ended)}", style="dim"))
    return Group(*parts)


@click.command()
@click.option("--repo", type=click.Path(path_type=Path), help="Only this repository's jobs.")
@json_option
@api_call
def watch(repo: Path | None, as_json: bool) -> None:
    """A live view of running and waiting jobs per repo, each with its reason; `q` quits.

    With --json, prints the daemon's event stream (one JSON object a line) instead.
    """
    from rich.console import Console
    from rich.live import Live

    c = client()
    c.health()  # unreachable: exit 3 now, not a blank screen
    if as_json:
        for ev in c.events():  # NDJSON, as the daemon sends it
            click.echo(json.dumps(ev))
        return
    where = str(repo.expanduser().resolve()) if repo is not None else None
    view, stop = View(), threading.Event()
    reader = threading.Thread(target=follow, args=(Client(c.socket_path, timeout=None), view, stop), daemon=True)
    reader.start()
    keyboard = None
    if sys.stdin.isatty():
        keyboard = threading.Thread(target=keys, args=(stop,), daemon=True)
        keyboard.start()
    console = Console()
    try:
        with Live(render(view, console.width, where), console=console, auto_refresh=False, screen=False) as live:
            while not stop.is_set():
                view.changed.wait(1.0)
                view.changed.clear()
                live.update(render(view, console.width, where), refresh=True)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        if keyboard is not None:
            keyboard.join(timeout=1.0)  # restores the terminal's mode
