"""The command line: a thin client of the daemon's API (and the daemon itself).

Commands live in `orchestrator.commands` (one module per area) and are registered at the bottom of this
file, one line each. Data goes to stdout, human messages to stderr; `--json` on every command. Exit
codes: 0 ok, 1 failed, 2 rejected or usage, 3 daemon unreachable, 4 `wait` timed out, 78 invalid config.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from orchestrator import __version__, paths
from orchestrator.chat import cli as chat_cli
from orchestrator.commands import jobs, predict, queue, review, service, settings, status, watch
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
from orchestrator.config import EX_CONFIG, ConfigError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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
def daemon(burst: bool, grace: float) -> None:
    """Run the daemon in the foreground (systemd runs it this way)."""
    from orchestrator import config
    from orchestrator import daemon as daemon_mod

    p = paths.resolve()
    try:
        cfg = config.load(p.config_file)
    except ConfigError as e:
        err(f"orchestrator: invalid config: {e}")
        sys.exit(EX_CONFIG)
    sys.exit(daemon_mod.run(cfg, p, burst=burst, grace=grace))


BENCHES = ["admission", "worktrees", "hook", "chat", "crash", "jobs", "load", "predict"]


# No interspersed args: everything after the bench's name is the bench's own, `--help` included.
@main.command(
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "allow_interspersed_args": False}
)
@click.argument("name", type=click.Choice(BENCHES))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench(name: str, args: tuple[str, ...]) -> None:
    """Benchmark mode: `admission`, `worktrees` (pooled vs fresh), `hook` (commit time), `chat`, `jobs` (replay a
    history), `load` (long queues), `predict` (claims vs history), `crash` (kill -9 the daemon, check nothing is
    lost); --help for each."""
    import importlib

    entry = importlib.import_module(f"orchestrator.bench.{name}").main
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


# Commands, one line each.
main.add_command(jobs.enqueue)
main.add_command(jobs.show)
main.add_command(jobs.why)
main.add_command(jobs.logs)
main.add_command(jobs.plan)
main.add_command(status.status)
main.add_command(status.wait)
main.add_command(queue.cancel)
main.add_command(queue.retry)
main.add_command(queue.clean)
main.add_command(chat_cli.chat)
main.add_command(queue.pause)
main.add_command(queue.resume)
main.add_command(queue.limit)
main.add_command(review.diff)
main.add_command(review.land)
main.add_command(review.reject)
main.add_command(predict.stats)
main.add_command(watch.watch)
main.add_command(settings.config)
main.add_command(service.service)
main.add_command(service.hook)
main.add_command(service.doctor)


if __name__ == "__main__":  # pragma: no cover
    main()
