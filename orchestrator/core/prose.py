"""Whether a job's text is a shell command or a task in words (pure).

A user of agent boards types prose first: `enqueue "Fix the docstring of echo in src/click/utils.py"`. Run by the
`shell` runner, that is `/bin/sh` trying a program named `Fix` (exit 127). So a text queued with no runner named
is read once: its first word (after blank lines, `#` comments and a `Paths:` front-matter line) is a command when
the shell knows it (a keyword or builtin, an assignment, a path, a program on the job's PATH) or it starts with
shell syntax; anything else is prose, which goes to the configured agent (`jobs.agent`) or is refused with the
command to use.
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


@dataclass(frozen=True, slots=True)
class Reading:
    """How a text reads: `prose` or not, and the word that decided (for the message)."""

    prose: bool
    word: str
    why: str


def first_word(text: str) -> str:
    """The first word the shell would run: after blank lines, comments and a `Paths:` line; cut at an operator."""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or _FRONT_MATTER.match(stripped):
            continue
        word = stripped.split()[0]
        cut = _OPERATORS.split(word, maxsplit=1)[0]
        return cut or word[:1]
    return ""


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
    return Reading(True, word, f"`{word}` is no command a job's shell knows")
