"""`orchestrator mcp`: the per-job MCP server an agent CLI starts (stdio), its tools backed by the job's door."""

from __future__ import annotations

import sys

import click


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--check", is_flag=True, help="Exit 0 once everything the server needs is loaded, serving nothing: how "
              "the daemon asks, from inside a job's sandbox, whether a job can start it.")  # fmt: skip
def mcp(check: bool) -> None:
    """Serve a job's MCP tools on stdin/stdout: which paths the other running jobs hold, and growing the job's claim
    before it writes. An agent CLI run as a job starts it from its scratch config (its door and token are set
    there); it reaches nothing else of the daemon."""
    from orchestrator.runners import mcp as server

    sys.exit(0 if check else server.main())
