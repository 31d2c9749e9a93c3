"""Whether a job's text is a shell command or a task in words (pure).

A user of agent boards types prose first: `enqueue "Fix the docstring of echo in src/click/utils.py"`. Run by the
`shell` runner, that is `/bin/sh` trying a program named `Fix` (exit 127). So a text queued with no runner named
is read once: its first word (after blank lines, `#` comments and a `Paths:` front-matter line) is a command when
the shell knows it (a keyword or builtin, an assignment, a path, a program on the job's PATH) or it starts with
shell syntax; anything else is prose, which goes to the configured agent (`jobs.agent`) or is refused with the
command to use. Except a command line whose program a job cannot find (`pytest -q tests/` where no pytest is on a
job's PATH: a lower-case program name followed by an option or a shell operator): that is no task for an agent,
and run it would fail with exit 127, so it is refused saying so (`missing`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

SHELL_WORDS = frozenset({
    "!", "{", "}", "[", "[[", ":", ".", "alias", "bg", "break", "builtin", "case", "cd", "command", "continue",
    "declare", "echo", "eval", "exec", "exit", "export", "false", "fg", "for", "function", "getopts", "hash", "if",
    "jobs", "kill", "let", "local", "printf", "pushd", "popd", "pwd", "read", "readonly", "return", "select",
    "set", "shift", "source", "test", "time", "times", "trap", "true", "type", "typeset", "ulimit", "umask",
    "unalias", "unset", "until", "wait", "while"
})  # fmt: skip
"""POSIX (and common bash) keywords and builtins: not on any PATH, yet commands."""
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_FRONT_MATTER = re.compile(r"\s*paths\s*:", re.IGNORECASE)
_OPERATORS = re.compile(r"[;&|<>()]")
_PROGRAM_NAME = re.compile(r"[a-z0-9_][a-z0-9._+-]*")
_OPTION_OR_OPERATOR = re.compile(r"-{1,2}[A-Za-z0-9]|[|&;<>]|2>")


@dataclass(frozen=True, slots=True)
class Reading:
    """How a text reads: `prose` or not, and the word that decided (for the message)."""

    prose: bool
    word: str
    why: str
    missing: bool = False
    """A command line whose program a job's PATH does not have: run, it fails (exit 127)."""


def first_line(text: str) -> str:
    """The first line the shell would run: after blank lines, comments and a `Paths:` line."""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#") and not _FRONT_MATTER.match(stripped):
            return stripped
    return ""


def first_word(text: str) -> str:
    """The first word the shell would run (of `first_line`), cut at an operator."""
    line = first_line(text)
    if not line:
        return ""
    word = line.split()[0]
    return _OPERATORS.split(word, maxsplit=1)[0] or word[:1]


def _command_line(line: str) -> bool:
    """A program name in lower case followed, further on, by an option or a shell operator: `pytest -q tests/`."""
    words = line.split()
    return bool(_PROGRAM_NAME.fullmatch(words[0])) and any(_OPTION_OR_OPERATOR.match(w) for w in words[1:])


def read(text: str, is_program: Callable[[str], bool]) -> Reading:
    """How `text` reads; `is_program(word)` says whether a job's PATH has a program of that name."""
    word = first_word(text)
    if not word:
        return Reading(False, word, "it names no word")
    if word in SHELL_WORDS:
        return Reading(False, word, f"`{word}` is a shell keyword or builtin")
    if _ASSIGNMENT.match(word):
        return Reading(False, word, f"`{word}` sets a variable")
    if word[0] in "/.~$`'\"\\(;&|<>" or "/" in word:
        return Reading(False, word, f"`{word}` is shell syntax or a path")
    if is_program(word):
        return Reading(False, word, f"`{word}` is a program on a job's PATH")
    if _command_line(first_line(text)):
        return Reading(False, word, f"`{word}` is no program on a job's PATH", missing=True)
    return Reading(True, word, f"`{word}` is no command a job's shell knows")
