"""`orchestrator service ...`, `orchestrator hook ...` and `orchestrator doctor`: running it for real.

The work lives in `orchestrator.service` (unit, manager, hooks, doctor); these are the thin commands.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click

from orchestrator import paths
from orchestrator.commands import term
from orchestrator.commands.common import FAILED, OK, REJECTED, emit, err, json_option

T = TypeVar("T")


@click.group()
def service() -> None:
    """The daemon as a systemd user service: install, uninstall, status."""


@service.command("install")
@click.option("--dry-run", is_flag=True, help="Print the unit on stdout; change nothing.")
@json_option
def service_install(dry_run: bool, as_json: bool) -> None:
    """Write the unit for this installation, enable and start it, wait until it is ready, try linger."""
    from orchestrator.service import manager

    try:
        report = manager.install(dry_run=dry_run)
    except manager.ServiceError as e:
        err(f"orchestrator: {e}")
        sys.exit(FAILED)
    if dry_run and not as_json:
        click.echo(report.data["unit"], nl=False)
    _report(report, as_json)


@service.command("uninstall")
@json_option
def service_uninstall(as_json: bool) -> None:
    """Stop and disable the service and remove its unit."""
    from orchestrator.service import manager

    _report(manager.uninstall(), as_json)


@service.command("status")
@json_option
def service_status(as_json: bool) -> None:
    """The unit, its state and its STATUS= line; exit 1 unless it is active."""
    from orchestrator.service import manager

    report = manager.status()
    _report(report, as_json)
    sys.exit(OK if report.ok else FAILED)


def _report(report: object, as_json: bool) -> None:
    if as_json:
        emit({"ok": report.ok, "messages": report.lines, **report.data})  # type: ignore[attr-defined]
    else:
        for line in report.lines:  # type: ignore[attr-defined]
            err(line)


repo_option = click.option(
    "--repo", type=click.Path(path_type=Path, file_okay=False), default=".", show_default=True, help="The repository."
)


@click.group()
def hook() -> None:
    """Git hooks that queue work from commits (trailers `Orchestrator: ...`, ticket files)."""


@hook.command("install")
@repo_option
@click.option("--tickets", help="Ticket folder in this repository (default .orchestrator/tickets).")
@json_option
def hook_install(repo: Path, tickets: str | None, as_json: bool) -> None:
    """Install post-commit and post-rewrite; a hook already there is moved aside and still runs."""
    import os

    from orchestrator.service import hooks

    repo, done = _in_repo(lambda r: hooks.install(r, home=os.environ.get("ORCHESTRATOR_HOME"), tickets=tickets), repo)
    if tickets:
        done.append(f"ticket folder: {tickets}")
    _remember(repo)
    _report_done(repo, done, as_json)


@hook.command("uninstall")
@repo_option
@json_option
def hook_uninstall(repo: Path, as_json: bool) -> None:
    """Remove the hooks and restore the ones install moved aside."""
    from orchestrator.service import hooks

    repo, done = _in_repo(hooks.uninstall, repo)
    _report_done(repo, done, as_json)


def _report_done(repo: Path, done: list[str], as_json: bool) -> None:
    if as_json:
        emit({"repo": str(repo), "done": done})
        return
    for line in done:
        err(line)


@hook.command("status")
@repo_option
@json_option
def hook_status(repo: Path, as_json: bool) -> None:
    """Which hooks are installed, chained or someone else's; exit 1 unless both are installed and runnable."""
    from orchestrator.service import hooks

    repo, states = _in_repo(hooks.status, repo)
    if as_json:
        emit({"repo": str(repo), "hooks": [s.to_json() for s in states]})
    else:
        for s in states:
            term.echo(f"{s.hook:13} {s.state:10} {'chained ' if s.chained else ''}{s.detail}")
    sys.exit(OK if all(s.state == "installed" and s.python_ok for s in states) else FAILED)


def _in_repo(action: Callable[[Path], T], repo: Path) -> tuple[Path, T]:
    """Run a hook action on the resolved repository; a HookError is exit 2 with its message."""
    from orchestrator.service import hooks

    repo = repo.expanduser().resolve()
    try:
        return repo, action(repo)
    except hooks.HookError as e:
        err(f"orchestrator: {e}")
        sys.exit(REJECTED)


def _remember(repo: Path) -> None:
    """Note the repository for `doctor` (which checks the hooks of every known repository)."""
    p = paths.resolve()
    known = p.state_dir / "hooked-repos"
    lines = known.read_text().splitlines() if known.exists() else []
    if str(repo) not in lines:
        with os.fdopen(paths.open_private(known, os.O_WRONLY | os.O_APPEND), "a") as f:  # dirs 0700, file 0600
            f.write(f"{repo}\n")


@click.command()
@json_option
def doctor(as_json: bool) -> None:
    """Check config, dirs, socket, service, linger, hooks, Ollama, the Claude key, bubblewrap, agent CLIs; exit 1 on a
    failure."""
    from orchestrator.service import doctor as doctor_mod

    checks = doctor_mod.run()
    failed = any(c.level == doctor_mod.FAIL for c in checks)
    if as_json:
        emit({"ok": not failed, "checks": [c.to_json() for c in checks]})
    else:
        from orchestrator.commands.jobs import width

        cols = width()
        for c in checks:
            for line in checked(c.level, c.name, term.visible(c.detail), cols):
                term.echo(line)
    sys.exit(FAILED if failed else OK)


HANG = 19
"""Where a check's detail starts: after its level and its name (a longer name pushes only its first line)."""


def checked(level: str, name: str, detail: str, cols: int | None) -> list[str]:
    """One check as lines of at most `cols` columns (None: one line), its detail broken between words (a path longer
    than a line broken inside, never cut) and hung under its own column."""
    import textwrap

    first = f"{level:4}  {name:12} "
    if cols is None:
        return [first + detail]
    return textwrap.wrap(
        detail, max(cols, HANG + 20), initial_indent=first, subsequent_indent=" " * HANG, break_on_hyphens=False
    ) or [first.rstrip()]
