"""The typed requests the CLI, the git hook and the spool send and the daemon reads back: one definition, both
sides, every field checked the same way wherever the request came from."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from orchestrator import requests as rq
from orchestrator.validate import BadRequest

SAMPLES = [
    rq.Enqueue(repo="/r", text="make it so"),
    rq.Enqueue(
        repo="/r", argv=("printf", "%s\n", "a b"), branch="dev", paths=("src/", "a.py"), runner="shell", before=3,
        after=(1, 2), labels=("gpu",), land="review",
    ),
    rq.Enqueue(repo="/r", text="x", priority=-4),
    rq.Tickets("/r", "main", "abc123", (rq.Ticket("do a", ("a.py",), "claude", 2, "T-1").keyed("main"),)),
    rq.Edit(text="new"),
    rq.Edit(paths=()),
    rq.Edit(priority=7),
    rq.Plan(repo="/r", text="t", branch="b", base="HEAD~1", paths=("x",)),
    rq.Wait((4, 5), 2.5),
    rq.Wait(),
    rq.Control("/r", 0),
    rq.Control(),
    rq.Revise("more tests"),
    rq.Move(9),
    rq.Switch(2),
    rq.ChatTurn("what is up"),
    rq.ChatTurn("bye", end=True),
]


@pytest.mark.parametrize("request_", SAMPLES, ids=lambda r: type(r).__name__)
def test_a_request_reads_back_as_it_was_sent(request_):
    """What a client sends (`to_json`, through JSON) the daemon reads back (`from_json`) as the same request."""
    wire = json.loads(json.dumps(request_.to_json()))
    assert type(request_).from_json(wire) == request_


@pytest.mark.parametrize(
    ("kind", "data", "says"),
    [
        (rq.Enqueue, {"text": "x"}, "missing field 'repo'"),
        (rq.Enqueue, {"repo": "/r", "text": "  "}, "the job text is empty"),
        (rq.Enqueue, {"repo": "/r", "text": "x", "priority": "high"}, "field 'priority' has the wrong type"),
        (rq.Enqueue, {"repo": "/r", "text": "x", "priority": 1, "before": 2}, "leave out --priority"),
        (rq.Enqueue, {"repo": "/r", "text": "x", "land": "sometimes"}, "--land 'sometimes'"),
        (rq.Enqueue, {"repo": "/r", "text": "x", "after": [True]}, "list of job ids"),
        (rq.Tickets, {"repo": "/r", "tickets": {}}, "must be a list"),
        (rq.Tickets, {"repo": "/r", "tickets": [{"text": "x"}]}, "needs a 'key' and a 'text'"),
        (rq.Tickets, {"repo": "/r", "tickets": [{"key": "k", "text": "x", "priority": "2"}]}, "'priority'"),
        (rq.Edit, {}, "nothing to edit"),
        (rq.Wait, {"ids": [1], "timeout": -1}, "number of seconds"),
        (rq.Control, {"repo": "/r", "slots": -1}, "0 or more"),
        (rq.Switch, {}, "missing field 'with'"),
        (rq.ChatTurn, {"text": " "}, 'missing "text": send {"text": "your message"}'),
        (rq.ChatTurn, {"text": "x", "end": "yes"}, "field 'end' has the wrong type"),
        (rq.ChatTurn, {"text": "\udc80"}, "field 'text' is not valid text"),
    ],
)
def test_a_malformed_request_is_refused_with_what_to_send(kind, data, says):
    """Each malformed field is a BadRequest naming it and what to send instead."""
    with pytest.raises(BadRequest, match=says):
        kind.from_json(data)


def test_the_cli_refuses_a_bad_request_itself_with_the_daemons_words(tmp_path):
    """An empty job text is refused by the CLI as the daemon would refuse it (exit 2), with no daemon to ask."""
    home = tmp_path / "home"
    env = {**os.environ, "ORCHESTRATOR_HOME": str(home)}
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator", "enqueue", "--repo", str(tmp_path), " "],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "the job text is empty" in out.stderr
