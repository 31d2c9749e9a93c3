"""The `on_end` command's template (pure): the fields a word may name, and each word filled in.

`[jobs] on_end = ["notify-send", "orchestrator: {summary}"]` is an argv template, never a shell line: each word
is formatted with a job's fields, so a value never becomes two words. Config checks a template when it loads
(`check`); `jobs.notify` fills it in when a job ends (`render`).
"""

from __future__ import annotations

from collections.abc import Sequence

FIELDS = ("id", "state", "repo", "repo_name", "branch", "code", "reason", "subject", "summary")
"""What an `on_end` word may name in braces, e.g. "{summary}"."""


class TemplateError(ValueError):
    """An `on_end` word names a field that does not exist."""


def render(template: Sequence[str], values: dict[str, str]) -> list[str]:
    """Each word of `template` formatted with `values` (no shell: a value never becomes two words)."""
    try:
        return [word.format_map(values) for word in template]
    except (KeyError, IndexError, ValueError) as e:
        raise TemplateError(f"on_end: {e} is not a field; use {', '.join('{' + f + '}' for f in FIELDS)}") from None


def check(template: Sequence[str]) -> None:
    """Raise TemplateError now (at config load) rather than at the first job's end."""
    render(template, dict.fromkeys(FIELDS, "x"))
