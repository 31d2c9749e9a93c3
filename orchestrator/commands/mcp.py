"""`orchestrator mcp`: the per-job MCP server an agent CLI starts (stdio), its tools backed by the job's door."""

from __future__ import annotations

import sys

import click


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
def mcp() -> None:
    """Serve a job's MCP tools on stdin/stdout: which paths the other running jobs hold, and growing the job's claim
    before it writes. An agent CLI run as a job starts it from its scratch config (its door and token are set
    there); it reaches nothing else of the daemon."""
    from orchestrator.runners import mcp as server

    sys.exit(server.main())
