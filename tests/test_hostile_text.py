"""A job's text, a commit's author, a logged line are anyone's: what reads them takes time linear in their length.

Each check runs in a process of its own with a deadline, so that a pattern gone back to trying every offset fails the
test instead of hanging the suite. Every input below took seconds to minutes before (a line of 10,000 `@` 415 s in
the planner's `mentions`; `token` and 40,000 letters 83 s in the log's secret masking, on the event loop)."""

from __future__ import annotations

import subprocess
import sys

import pytest

UNITS = (
    "@", "a@", "x", "*", "a-", "a.", "(", "a:", "a`", "/a", "http", "token", "token-", "--token", "\t", " \t", "key ",
)  # fmt: skip
"""What a long line is made of, each repeated to 200,000 characters."""

READERS = {
    "plan": "from orchestrator.plan import text\nread = text.mentions",
    "chains": "from orchestrator.core import chains\nread = lambda s: chains.words(chains.naming(s))",
    "log": "from orchestrator import logging as olog\nread = lambda s: (olog.mask(s), olog._masked(['-x', s, s]))",
    "person": "from orchestrator.core import person\nread = lambda s: person.split('a' + s[6:] * 2 + 'x')",
}


@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_hostile_line_is_read_in_time_linear_in_its_length(reader):
    program = (
        f"{READERS[reader]}\n"
        f"for unit in {UNITS!r}:\n"
        "    read('title\\n' + unit * (200_000 // len(unit)))\n"
        "print('read')\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "read", done.stderr


def test_masking_still_masks_what_it_masked():
    """The linear masking finds what the patterns found: a secret-named variable, header, JSON key or option's value,
    a bearer token; a value after a name that holds no secret's name is left, and looked into."""
    from orchestrator import logging as olog

    line = 'GITHUB_TOKEN=abc123 a=token=zzz "api-key": "v" --token foo --api-key=bar Bearer abcdefghij x-token: 123'
    assert olog.mask(line) == (
        'GITHUB_TOKEN=**** a=token=**** "api-key": "****" --token **** --api-key=**** Bearer **** x-token: 123'
    )
    assert olog._masked(["run", "--password", "hunter2", "--name", "x"]) == ["run", "--password", "****", "--name", "x"]
