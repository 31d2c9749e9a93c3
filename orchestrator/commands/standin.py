"""`orchestrator stand-in`: a scripted stand-in of the Claude Messages API, for a first agent job without a key.

It serves until stopped (Ctrl-C, SIGTERM) and says how to point the daemon at it. What its "model" does is in
`orchestrator.lab.doubles.standin` (the lab is loaded only by this command).
"""

from __future__ import annotations

import asyncio
import signal

import click

from orchestrator.commands.common import err


@click.command("stand-in")
@click.option("--port", type=int, default=8765, show_default=True, help="The port on 127.0.0.1 (0: a free one).")
def stand_in(port: int) -> None:
    """A scripted stand-in of the Claude API on 127.0.0.1:PORT: try an agent job with Claude Code, no account.

    Asked a task, its "model" has Claude Code write the file the task names (its first path, else STAND-IN.md)
    holding the task's first line. Start the daemon with the ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY it prints."""
    from orchestrator.lab.doubles.anthropic import AnthropicDouble
    from orchestrator.lab.doubles.standin import KEY, script

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            async with AnthropicDouble(script(err), port=port) as double:
                err(f"stand-in of the Claude API at {double.url} (Ctrl-C stops it); run the daemon with:")
                err(f"  export ANTHROPIC_BASE_URL={double.url} ANTHROPIC_API_KEY={KEY}")
                await stop.wait()
        except OSError as e:
            raise click.ClickException(f"cannot serve on 127.0.0.1:{port} ({e.strerror}): pick another --port") from e

    asyncio.run(serve())
