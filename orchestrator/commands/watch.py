"""`orchestrator watch`: a live view of running, waiting and ready jobs per repo, fed by the daemon's events.

The daemon pushes every job change on `GET /events` (NDJSON); this view keeps the jobs in memory and
redraws with rich `Live` when something changed (and once a second, for the ages). Keys are read in
cbreak mode (no Enter needed): `q` quits (Ctrl-C too); jobs waiting for review (`ready`) come first, one
of them selected (`↑`/`↓` or `k`/`j` choose), and `d` shows its diff in the pager, `l` lands it, `r`
rejects it (after a `y`). If the daemon goes away the view says so and reconnects when it is back.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from orchestrator.client import ApiError, Client, Unreachable
from orchestrator.commands import fit, term
from orchestrator.commands.common import api_call, client, json_option
from orchestrator.commands.status import job_line
from orchestrator.core import models

OPEN = models.OPEN | models.HELD
"""What the view lists per repo: jobs that run or wait, and interrupted ones (they keep their place)."""
ORDER = {str(s): n for n, s in enumerate(models.VIEW_ORDER)}
UP, DOWN = ("k", "\x1b[A"), ("j", "\x1b[B")


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
        self.selected: int | None = None
        """The ready job the review keys act on."""
        self.message = ""
        """What the last key did ("job 7: landing"), or the question it asks."""
        self.confirm: int | None = None
        """A job `r` asked to reject: `y` rejects it, any other key keeps it."""

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

    def ready(self, repo: str | None) -> list[int]:
        """The ready jobs in the order the view shows them (by repo, then id)."""
        with self.lock:
            rows = [j for j in self.jobs.values() if j["state"] == "ready" and repo in (None, j["repo"])]
        return [j["id"] for j in sorted(rows, key=lambda j: (j["repo"], j["id"]))]

    def select(self, repo: str | None, step: int = 0) -> int | None:
        """Keep the selection on a ready job (the first when none or gone), moved by `step`."""
        ids = self.ready(repo)
        if not ids:
            self.selected = None
        elif self.selected not in ids:
            self.selected = ids[0]
        else:
            self.selected = ids[(ids.index(self.selected) + step) % len(ids)]
        return self.selected


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


class Keys:
    """The terminal's keys, one at a time, in cbreak mode while the view runs (`paused` for a pager)."""

    def __init__(self) -> None:
        self.fd = sys.stdin.fileno() if sys.stdin.isatty() else None
        self._saved: Any = None

    def __enter__(self) -> Keys:
        if self.fd is not None:
            import termios
            import tty

            self._saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None and self._saved is not None:
            import termios

            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """The terminal as it was, for a program that reads it itself (the pager)."""
        self.__exit__()
        try:
            yield
        finally:
            self.__enter__()

    def read(self, timeout: float) -> str | None:
        """The next key ("" at end of input), or None when none came within `timeout`."""
        if self.fd is None:
            time.sleep(timeout)
            return None
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return None
        data = os.read(self.fd, 8).decode(errors="replace")
        return data if data.startswith("\x1b[") else data[:1]


def render(view: View, width: int, repo: str | None) -> Any:
    from rich.console import Group
    from rich.text import Text

    with view.lock:
        every = list(view.jobs.values())
        controls, landing, note = dict(view.controls), list(view.landing), view.note
        selected, message = view.selected, view.message
    jobs = [j for j in every if repo is None or j["repo"] == repo]
    open_ = [j for j in jobs if j["state"] in OPEN]
    holds = fit.review_holds(every)  # a job in review may hold back a job of another repo (a slot)
    head = Text()
    head.append("orchestrator watch", style="bold")
    head.append(f"  {fit.summary(open_)}", style="")
    if controls.get("*", {}).get("paused"):
        head.append("  · daemon PAUSED", style="bold yellow")
    keys = " · ".join([*(["↑↓ choose · d diff · l land · r reject"] if selected is not None else []), "q quits"])
    if len(head) + 4 + len(keys) > width:  # a narrow terminal: the keys on a line of their own
        parts: list[Any] = [head, Text(keys, style="magenta")]
    else:
        parts = [head + Text(f"  · {keys}", style="magenta")]
    if note:
        parts.append(Text(term.visible(note), style="bold red"))
    if message:
        parts.append(Text(term.visible(message), style="bold"))
    parts += [Text(said, style="magenta") for said in holding(holds, width)]
    by_repo: dict[str, list[dict[str, Any]]] = {}
    for j in sorted(open_, key=lambda j: (ORDER[j["state"]], j["id"])):
        by_repo.setdefault(j["repo"], []).append(j)
    if not by_repo:
        parts.append(Text("no running, waiting or ready jobs", style="dim"))
    lay = fit.layout(open_, width - 3, repo=False)
    for path, rows in sorted(by_repo.items()):
        name = term.visible(Path(path).name)
        title = Text(f"\n{name}", style="bold blue")
        c = controls.get(path, {})
        said = []
        if c.get("paused"):
            said.append(("PAUSED", "bold yellow"))
        if c.get("slots") is not None:
            said.append((f"{c['slots']} slots", "yellow"))
        said += [(f"landing into {term.visible(branch)} in flight", "cyan") for r, branch in landing if r == path]
        room = width - len(name) - sum(len(t) + 2 for t, _ in said) - 2
        if room >= 12:
            title.append(f"  {fit.cut_middle(term.visible(path), room)}", style="dim")
        for text, style in said:
            title.append(f"  {text}", style=style)
        title.no_wrap, title.overflow = True, "ellipsis"
        parts.append(title)
        for j in rows:
            line = Text("› " if j["id"] == selected else "  ", style="bold magenta")
            line.append_text(job_line(j, lay, held=holds.get(j["id"])))
            line.no_wrap, line.overflow = True, "ellipsis"
            parts.append(line)
    ended = [j for j in jobs if j["state"] not in OPEN]
    if ended:
        parts.append(Text(f"\nended: {fit.summary(ended)}", style="dim"))
    return Group(*parts)


def holding(holds: dict[int, list[int]], width: int) -> list[str]:
    """For each job in review that holds back waiting jobs, a line that says so and what to do about it."""
    by_ready: dict[int, list[int]] = {}
    for waiting, ready in holds.items():
        for r in ready:
            by_ready.setdefault(r, []).append(waiting)
    lines = []
    for r, held in sorted(by_ready.items()):
        who = f"job {held[0]}" if len(held) == 1 else f"jobs {', '.join(map(str, sorted(held)))}"
        said = (
            f"job {r} in review holds back {who}: select it and press d (its diff), l (land) or r (reject); "
            f"or `orchestrator land {r}`"
        )
        lines += fit.fill(said, width, indent="  ")
    return lines


def page(text: str) -> None:
    """Show `text` in the user's pager (`$PAGER`, else `less`), or print it when there is none."""
    env = {**os.environ, "LESS": os.environ.get("LESS", "R")}
    try:
        subprocess.run(os.environ.get("PAGER") or "less", shell=True, input=text.encode(), env=env, check=False)
    except OSError:
        sys.stdout.write(text)


class Review:
    """What the review keys do to the selected ready job, through the daemon's API."""

    def __init__(self, c: Client, view: View, repo: str | None) -> None:
        self.c, self.view, self.repo = c, view, repo

    def say(self, message: str) -> None:
        self.view.message = message
        self.view.changed.set()

    def key(self, key: str, pager: Any) -> None:
        v = self.view
        if v.confirm is not None:
            asked, v.confirm = v.confirm, None
            if key in ("y", "Y"):
                self._call(asked, "rejected", self.c.reject)
            else:
                self.say(f"job {asked}: kept")
            return
        job = v.select(self.repo, -1 if key in UP else 1 if key in DOWN else 0)
        if job is None or key in UP + DOWN:
            v.changed.set()
            return
        if key == "d":
            try:
                data = self.c.diff(job)
            except ApiError as e:
                self.say(f"job {job}: {e.message}")
                return
            pager(term.output(data["diff"], colours=False) or f"job {job}: no difference against its base\n")
            self.say(f"job {job}: its diff was shown")
        elif key == "l":
            self._call(job, "landing", self.c.land)
        elif key == "r":
            v.confirm = job
            self.say(f"reject job {job}? y rejects it (its branch is kept), any other key keeps it")

    def _call(self, job: int, what: str, call: Any) -> None:
        try:
            call(job)
        except ApiError as e:
            self.say(f"job {job}: {e.message}")
            return
        self.say(f"job {job}: {what}")


@click.command()
@click.option("--repo", type=click.Path(path_type=Path), help="Only this repository's jobs.")
@json_option
@api_call
def watch(repo: Path | None, as_json: bool) -> None:
    """A live view of running, waiting and ready jobs per repo, each with its reason; `q` quits.

    Jobs waiting for review (`ready`) come first: `↑`/`↓` choose one, `d` shows its diff, `l` lands it,
    `r` rejects it. With --json, prints the daemon's event stream (one JSON object a line) instead.
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
    console = Console()
    review = Review(c, view, where)
    drawn = 0.0
    try:
        with Keys() as keys, Live(console=console, auto_refresh=False, screen=False) as live:

            def pager(text: str) -> None:
                live.transient = True  # the view leaves the screen to the pager, and comes back after it
                live.stop()
                with keys.paused():
                    page(text)
                live.transient = False
                live.start()

            while not stop.is_set():
                key = keys.read(0.1)
                if key in ("q", "Q", ""):
                    break
                if key is not None:
                    review.key(key, pager)
                if view.changed.is_set() or time.monotonic() - drawn >= 1.0:
                    view.changed.clear()
                    view.select(where)
                    live.update(render(view, console.width, where), refresh=True)
                    drawn = time.monotonic()
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
