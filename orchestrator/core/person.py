"""A person as git writes one, `Name <email>` (pure): who queued a job, the author of its commits when the daemon
has no git identity of its own."""

from __future__ import annotations

import re

PERSON = re.compile(r"([^<>\n]+?)\s*<([^<>\n]+)>")
MAX_LENGTH = 300


def split(person: str) -> tuple[str, str]:
    """(`Name`, `email`) of `Name <email>`; ("", "") for anything else. Read by position, not by `PERSON` (whose name
    and the spaces after it may take the same characters: a long run of tabs took seconds)."""
    whole = person.strip()
    name, lt, rest = whole.partition("<")
    email, gt, after = rest.partition(">")
    name = name.rstrip()  # the spaces before `<` (a line break too) are no part of the name
    if not (lt and gt and name and email) or after or ">" in name or "<" in email or "\n" in name + email:
        return ("", "")
    return (name.strip(), email.strip())


def valid(person: str) -> bool:
    """Empty (nobody named), or one `Name <email>` of a sane length."""
    return not person or (len(person) <= MAX_LENGTH and split(person) != ("", ""))
