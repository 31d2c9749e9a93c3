"""`orchestrator chat`: one turn, its reply streamed to the terminal (only click at import: fast start)."""

from __future__ import annotations

import json
import sys
import urllib.parse

import click

from orchestrator import requests as rq
from orchestrator.commands import term
from orchestrator.commands.common import FAILED, REJECTED, api_call, client, err, json_option


@click.command()
@click.option("--session", "-s", default="default", show_default=True, help="The conversation this turn belongs to.")
@click.option("--end", is_flag=True, help="Last turn of the session: extract its memories once the server is free.")
@json_option
@click.argument("text", nargs=-1, required=True)
@api_call
def chat(session: str, end: bool, as_json: bool, text: tuple[str, ...]) -> None:
    """Send TEXT to the chat plane and stream the reply (--json: the NDJSON events, one a line).

    Exit 1 when the turn failed (the model server down, a timeout); 2 when refused (busy: retry later).
    """
    failed = None
    shown = sys.stdout.isatty()  # a model's words on a terminal: they must not drive it (`term.output`)
    # Quoted: a name such as `../x` reaches the daemon as the name it is (which says what names may be).
    path = f"/chat/{urllib.parse.quote(session, safe='')}"
    for ev in client().post_lines(path, rq.ChatTurn(" ".join(text), end).to_json()):
        if as_json:
            click.echo(json.dumps(ev))
        elif ev["event"] == "token":
            sys.stdout.write(term.output(ev["text"], colours=False) if shown else ev["text"])
            sys.stdout.flush()
        elif ev["event"] == "intent":
            err(f"[{session}] intent: {ev['intent']} ({ev['source']})")
        elif ev["event"] == "merged":
            err(f"[{session}] merged into the turn already waiting ({ev['messages']} messages)")
        elif ev["event"] == "done" and not as_json:
            click.echo()
        if ev["event"] == "error":
            failed = ev
            if not as_json:
                err(f"orchestrator: {ev['message']}")
    if failed is not None:
        sys.exit(REJECTED if failed.get("code") == "Busy" else FAILED)
