"""A line-wise three-way merge of a file whose conflicting stretches are settled by a rule, by default a union that
keeps each side's removals (a changelog). Pure, no I/O.

libgit2's union favour settles a conflicting hunk by writing both sides' lines one after the other. That keeps
what a side added, but also what a side removed when the other side kept it: a heading one job reworded
(`## Unreleased` to `## 26.1.0`) next to an entry another job added above it comes out as both headings, the old
one back, and the rewording silently half lost. Here a conflicting hunk keeps the lines each side added, and a line
of the base only when neither side removed it; the hunks that do not conflict merge as any three-way merge does.
The replay runner settles them by another rule (`runners.replay`: the side a later recorded state has), and
replays a change without what a later recorded state made on top of it undid (`undone`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from difflib import SequenceMatcher

Lines = Sequence[bytes]
Settle = Callable[[Lines, Lines, Lines], list[bytes]]
"""What a stretch both sides changed differently becomes: (base, ours, theirs) lines → the merged lines."""


def union(base: Lines, ours: Lines, theirs: Lines) -> list[bytes]:
    """A conflicting stretch as the union of both sides' additions (ours' first) and the base lines neither removed."""
    had = Counter(base)
    gone_ours, gone_theirs = had - Counter(ours), had - Counter(theirs)
    both_kept = had - gone_ours - gone_theirs
    out = []
    for line in ours:
        if gone_theirs[line]:  # a base line they removed
            gone_theirs[line] -= 1
        else:
            out.append(line)
    for line in theirs:
        if both_kept[line]:  # a base line ours kept too: written already
            both_kept[line] -= 1
        elif gone_ours[line]:  # a base line we removed
            gone_ours[line] -= 1
        else:
            out.append(line)
    return out


def merge(base: bytes, ours: bytes, theirs: bytes, settle: Settle = union) -> bytes | None:
    """The three-way merge of `ours` and `theirs` over `base`, each conflicting stretch settled by `settle` (by
    default a union that keeps both sides' additions and removals). None for binary content (no line-wise
    matter)."""
    if any(b"\0" in text for text in (base, ours, theirs)):
        return None
    # A last line without its end is the same line as with one (one side appended after it, the other did not).
    b, o, t = (_ended(text).splitlines(keepends=True) for text in (base, ours, theirs))
    out: list[bytes] = []
    at_b = at_o = at_t = 0
    for sb, eb, so, st in _stable(b, o, t):
        out += _hunk(b[at_b:sb], o[at_o:so], t[at_t:st], settle)
        out += b[sb:eb]
        at_b, at_o, at_t = eb, so + eb - sb, st + eb - sb
    merged = b"".join(out)
    unended = all(text and not text.endswith(b"\n") for text in (ours, theirs))
    return merged[:-1] if unended and merged.endswith(b"\n") else merged


def _ended(text: bytes) -> bytes:
    return text + b"\n" if text and not text.endswith(b"\n") else text


def _stable(base: Lines, ours: Lines, theirs: Lines) -> list[tuple[int, int, int, int]]:
    """Runs of base lines both sides kept in place, as (base start, base end, ours start, theirs start), ending
    with an empty run at the ends of all three."""
    mo = [m for m in SequenceMatcher(None, base, ours, autojunk=False).get_matching_blocks() if m.size]
    mt = [m for m in SequenceMatcher(None, base, theirs, autojunk=False).get_matching_blocks() if m.size]
    runs: list[tuple[int, int, int, int]] = []
    i = j = 0
    while i < len(mo) and j < len(mt):
        a, b = mo[i], mt[j]
        lo, hi = max(a.a, b.a), min(a.a + a.size, b.a + b.size)
        if lo < hi:
            runs.append((lo, hi, a.b + lo - a.a, b.b + lo - b.a))
        if a.a + a.size < b.a + b.size:
            i += 1
        else:
            j += 1
    runs.append((len(base), len(base), len(ours), len(theirs)))
    return runs


def _hunk(base: Lines, ours: Lines, theirs: Lines, settle: Settle) -> list[bytes]:
    """One stretch between stable runs: the side that changed it, or, when both did differently, `settle`'s."""
    if list(ours) == list(theirs) or list(theirs) == list(base):
        return list(ours)
    if list(ours) == list(base):
        return list(theirs)
    return settle(base, ours, theirs)


def newer(final: bytes) -> Settle:
    """A settle rule for replaying a change after `final`, a later state made on top of it, landed: a conflicting
    stretch keeps the base's side (`ours`) when `final` has it and not the recorded side, else the recorded side."""
    seen = b"\n" + _ended(final)

    def settle(base: Lines, ours: Lines, theirs: Lines) -> list[bytes]:
        return list(ours) if _within(ours, seen) and not _within(theirs, seen) else list(theirs)

    return settle


def undone(base: bytes, theirs: bytes, final: bytes) -> bytes | None:
    """`theirs` (a change to `base`) without the stretches of it that `final`, a later state made on top of it, undid:
    a stretch it changed whose base lines `final` has and whose own lines it has not keeps the base lines (a line
    it added that `final` lacks is left out; one it removed that `final` has again stays). A change replayed after a
    later one made on it landed first then does not bring back what the later one took away. None for binary."""
    if any(b"\0" in text for text in (base, theirs, final)):
        return None
    b, t = _ended(base).splitlines(keepends=True), _ended(theirs).splitlines(keepends=True)
    seen = b"\n" + _ended(final)
    out: list[bytes] = []
    for tag, i1, i2, j1, j2 in SequenceMatcher(None, b, t, autojunk=False).get_opcodes():
        old, new = b[i1:i2], t[j1:j2]
        undid = tag != "equal" and _within(old, seen) and not (new and _within(new, seen))
        out += old if undid else new
    kept = b"".join(out)
    return kept[:-1] if theirs and not theirs.endswith(b"\n") and kept.endswith(b"\n") else kept


def _within(lines: Lines, seen: bytes) -> bool:
    """Whether `seen` (a text after a newline) holds these whole lines in a row (no lines: always)."""
    return not lines or (b"\n" + b"".join(lines)) in seen
