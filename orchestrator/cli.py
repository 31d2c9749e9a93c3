"""The command line: a thin client of the daemon's API (and the daemon itself).

Commands live in `orchestrator.commands` (one module per area) and are registered at the bottom of this
file, one line each. Data goes to stdout, human messages to stderr; `--json` on every command. Exit
codes: 0 ok, 1 failed, 2 rejected or usage, 3 daemon unreachable, 4 `wait` timed out, 78 invalid config.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import click

from orchestrator import __version__, paths
from orchestrator.commands.common import (  # noqa: F401 - re-exported for commands registered from other modules
    FAILED,
    OK,
    REJECTED,
    TIMED_OUT,
    UNREACHABLE,
    api_call,
    client,
    emit,
    err,
    json_option,
)


class LazyGroup(click.Group):
    """A group whose commands are imported when named: `orchestrator status` imports the status command's
    module, not every command's (the CLI's start-up time is paid on every call, and by scripts in a loop)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy: dict[str, str] = {}

    def add_lazy(self, name: str, target: str) -> None:
        """Register command `name` as `module:attribute`, imported on first use."""
        self.lazy[name] = target

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        cmd = super().get_command(ctx, cmd_name)
        if cmd is None and cmd_name in self.lazy:
            module, attr = self.lazy[cmd_name].split(":")
            cmd = getattr(importlib.import_module(module), attr)
            self.add_command(cmd, cmd_name)
        return cmd


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="orchestrator")
def main() -> None:
    """A git-aware worktree orchestrator: runs coding jobs side by side when their paths are disjoint."""


@main.command()
@click.option("--burst", is_flag=True, help="Process until nothing is queued or running, then exit 0.")
@click.option(
    "--grace",
    type=float,
    default=2.0,
    show_default=True,
    help="In burst mode, how long to stay idle (for a client about to enqueue) before exiting.",
)
@click.option("--detach", is_flag=True, help="In the background: return once it answers (its log: the state dir).")
@click.option("--stop", is_flag=True, help="Stop the running daemon (its running jobs are interrupted).")
def daemon(burst: bool, grace: float, detach: bool, stop: bool) -> None:
    """Run the daemon in the foreground (systemd runs it this way); --detach: in the background; --stop: stop it."""
    from orchestrator import config
    from orchestrator import daemon as daemon_mod

    p = paths.resolve()
    if stop:
        from orchestrator.commands.detach import stop as end

        sys.exit(end(p))
    if detach:
        from orchestrator.commands.detach import detach as start

        sys.exit(start(p, [*(["--burst"] if burst else []), "--grace", str(grace)]))
    stamp = config.stamp(p.config_file)
    try:
        cfg = config.load(p.config_file)
    except config.ConfigError as e:
        err(f"orchestrator: invalid config: {e}")
        sys.exit(config.EX_CONFIG)
    sys.exit(daemon_mod.run(cfg, p, burst=burst, grace=grace, config_stamp=stamp))


BENCHES = ["admission", "worktrees", "hook", "chat", "crash", "jobs", "load", "predict", "team", "files"]


# No interspersed args: everything after the bench's name is the bench's own, `--help` included.
@main.command(
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "allow_interspersed_args": False}
)
@click.argument("name", type=click.Choice(BENCHES))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench(name: str, args: tuple[str, ...]) -> None:
    """Benchmark mode: `admission`, `worktrees` (pooled vs fresh), `hook` (commit time), `chat`, `jobs` (replay a
    history), `load` (long queues), `predict` (claims vs history), `crash` (kill -9 the daemon, check nothing is
    lost), `team` (nodes sharing PostgreSQL), `files` (a job writing a million files); --help for each."""
    import importlib

    entry = importlib.import_module(f"orchestrator.lab.bench.{name}").main
    if isinstance(entry, click.Command):
        entry.main(list(args), prog_name=f"orchestrator bench {name}")
    else:
        entry(list(args))


@main.command()
@click.option("--keep", type=click.Path(path_type=Path), help="Keep the demo here instead of a temp dir.")
@json_option
def demo(keep: Path | None, as_json: bool) -> None:
    """See it work on embedded defaults: a demo repo, a burst daemon, shell jobs side by side."""
    from orchestrator import demo as demo_mod

    sys.exit(demo_mod.run(keep, as_json=as_json))


# Commands, one line each (imported when named: see `LazyGroup`).
main.add_lazy("enqueue", "orchestrator.commands.jobs:enqueue")
main.add_lazy("show", "orchestrator.commands.jobs:show")
main.add_lazy("why", "orchestrator.commands.jobs:why")
main.add_lazy("logs", "orchestrator.commands.jobs:logs")
main.add_lazy("plan", "orchestrator.commands.jobs:plan")
main.add_lazy("status", "orchestrator.commands.status:status")
main.add_lazy("wait", "orchestrator.commands.status:wait")
main.add_lazy("cancel", "orchestrator.commands.queue:cancel")
main.add_lazy("retry", "orchestrator.commands.queue:retry")
main.add_lazy("clean", "orchestrator.commands.queue:clean")
main.add_lazy("chat", "orchestrator.commands.chat:chat")
main.add_lazy("pause", "orchestrator.commands.queue:pause")
main.add_lazy("resume", "orchestrator.commands.queue:resume")
main.add_lazy("limit", "orchestrator.commands.queue:limit")
main.add_lazy("edit", "orchestrator.commands.edit:edit")
main.add_lazy("move", "orchestrator.commands.edit:move")
main.add_lazy("switch", "orchestrator.commands.edit:switch")
main.add_lazy("open", "orchestrator.commands.workspace:open_")
main.add_lazy("attach", "orchestrator.commands.workspace:attach")
main.add_lazy("diff", "orchestrator.commands.review:diff")
main.add_lazy("land", "orchestrator.commands.review:land")
main.add_lazy("reject", "orchestrator.commands.review:reject")
main.add_lazy("revise", "orchestrator.commands.review:revise")
main.add_lazy("stats", "orchestrator.commands.predict:stats")
main.add_lazy("watch", "orchestrator.commands.watch:watch")
main.add_lazy("config", "orchestrator.commands.settings:config")
main.add_lazy("runners", "orchestrator.commands.runners:runners")
main.add_lazy("service", "orchestrator.commands.service:service")
main.add_lazy("hook", "orchestrator.commands.service:hook")
main.add_lazy("doctor", "orchestrator.commands.service:doctor")
main.add_lazy("mcp", "orchestrator.commands.mcp:mcp")
main.add_lazy("stand-in", "orchestrator.commands.standin:stand_in")


if __name__ == "__main__":  # pragma: no cover
    main()
