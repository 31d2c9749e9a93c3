"""What every command shares: the API client, exit codes, `--json`, and error mapping.

Data goes to stdout, human messages to stderr. Exit codes: 0 ok, 1 failed, 2 rejected or usage,
3 daemon unreachable, 4 `wait` timed out, 78 invalid config.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import click

from orchestrator import paths
from orchestrator.client import ApiError, Client, Unreachable
from orchestrator.commands import term
from orchestrator.core import models
from orchestrator.validate import BadRequest

OK, FAILED, REJECTED, UNREACHABLE, TIMED_OUT, UNCHANGED = 0, 1, 2, 3, 4, 5
F = TypeVar("F", bound=Callable[..., Any])

# The groups of states the commands use, as `core.models` names them (a state is a str: `"ready" in OPEN`).
ENDED_STATES = tuple(sorted(models.ENDED))
FAILED_STATES = models.DEAD | models.HELD
"""Ended without landing, not as asked (an unchanged job did what it was asked): `--failed`, exit 1."""
CANCELLABLE_STATES = tuple(sorted(models.CANCELLABLE))
RETRYABLE_STATES = tuple(sorted(models.RETRYABLE))


def err(message: str) -> None:
    """A message for a person, on stderr; what a job put in it cannot drive the terminal (`term.output`)."""
    click.echo(term.output(message, colours=False), err=True)


def tell(*lines: str) -> None:
    """Lines for a person on stderr, every string from a job in them made visible; on a terminal, each broken
    between words to its width (a `quoted command` whole)."""
    from orchestrator.commands import fit

    width = shutil.get_terminal_size().columns - 1 if sys.stderr.isatty() else None
    for line in lines:
        for part in fit.fill(line, width, indent="  ") if width else [line]:
            term.echo(part, err=True)


def client() -> Client:
    return Client(paths.resolve().socket)


def api_call(fn: F) -> F:
    """Map the client's failures onto exit codes with the daemon's own message."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Unreachable as e:
            err(f"orchestrator: {e}")
            sys.exit(UNREACHABLE)
        except ApiError as e:
            err(f"orchestrator: {e.message}")
            sys.exit(REJECTED if e.status < 500 else FAILED)
        except BadRequest as e:  # refused here already, as the daemon would refuse it
            err(f"orchestrator: {e}")
            sys.exit(REJECTED)

    return wrapper  # type: ignore[return-value]


def emit(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False))


def emit_lines(items: list[Any]) -> None:
    """A JSON array with one item a line: C-fast for thousands of items (`indent` is pure Python), and greppable."""
    click.echo("[\n" + ",\n".join("  " + json.dumps(x) for x in items) + "\n]" if items else "[]")


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout.")
