"""A person as git writes one, `Name <email>` (pure): who queued a job, the author of its commits when the daemon
has no git identity of its own."""

from __future__ import annotations

import re

PERSON = re.compile(r"([^<>\n]+?)\s*<([^<>\n]+)>")
MAX_LENGTH = 300


def split(person: str) -> tuple[str, str]:
    """(`Name`, `email`) of `Name <email>`; ("", "") for anything else."""
    m = PERSON.fullmatch(person.strip())
    return (m.group(1).strip(), m.group(2).strip()) if m else ("", "")


def valid(person: str) -> bool:
    """Empty (nobody named), or one `Name <email>` of a sane length."""
    return not person or (len(person) <= MAX_LENGTH and split(person) != ("", ""))
