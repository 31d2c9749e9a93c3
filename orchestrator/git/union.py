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


def undone(base: bytes, theirs: bytes, final: bytes, ours: bytes) -> bytes | None:
    """`theirs` (a change to `base`) without the stretches of it that a later change made on it undid, once that
    change has landed. `final` is a later state made on top of the change, `ours` the text it is replayed onto.

    The later state undid a stretch the change made when `final` lacks a (non-blank) line the change put there, or
    has again, in a row, the lines it took away. The stretch keeps the base lines when the later change has landed
    in `ours`: `ours` holds a (non-blank) line the later edits put over the stretch that neither `base` nor the
    change has anywhere (where they put none such, reverting or removing it: any line of `final` that neither has),
    and every line of the stretch that `final` still has (moved elsewhere) is in `ours` already.
    A change replayed after a later one made on it then does not bring back what that one took away; before that one
    lands (one job at a time, in the recorded order) the change's own lines stand, and the later one rewrites them
    when it lands. None for binary."""
    if any(b"\0" in text for text in (base, theirs, final, ours)):
        return None
    b, t, f, o = (_ended(text).splitlines(keepends=True) for text in (base, theirs, final, ours))
    seen, has, have = b"\n" + b"".join(f), set(f), set(o)
    before = set(b).union(t)
    arrived = any(line.strip() and line in have for line in has - before)
    later = SequenceMatcher(None, t, f, autojunk=False).get_opcodes()
    out: list[bytes] = []
    for tag, i1, i2, j1, j2 in SequenceMatcher(None, b, t, autojunk=False).get_opcodes():
        old, new = b[i1:i2], t[j1:j2]
        undid = tag != "equal" and (
            any(line.strip() and line not in has for line in new) or (bool(old) and _within(old, seen))
        )
        if undid:
            put = [line for line in _put_over(later, f, j1, j2) if line.strip() and line not in before]
            kept = all(line in have for line in new if line.strip() and line in has)  # none of it left behind
            undid = kept and (any(line in have for line in put) if put else arrived)
        out += old if undid else new
    text = b"".join(out)
    return text[:-1] if theirs and not theirs.endswith(b"\n") and text.endswith(b"\n") else text


def _put_over(later: Sequence[tuple[str, int, int, int, int]], final: Lines, j1: int, j2: int) -> list[bytes]:
    """The lines later edits (opcodes from a text to `final`) put over its lines `j1:j2`: edits overlapping them, an
    insertion strictly inside them, or, for an empty stretch (a removal), an edit around or at its place."""
    out: list[bytes] = []
    for tag, a1, a2, b1, b2 in later:
        if tag == "equal":
            continue
        inside = (a1 < j2 and j1 < a2) if a1 < a2 else j1 < a1 < j2
        if inside if j1 < j2 else a1 <= j1 <= a2:
            out += final[b1:b2]
    return out


def _within(lines: Lines, seen: bytes) -> bool:
    """Whether `seen` (a text after a newline) holds these whole lines in a row (no lines: always)."""
    return not lines or (b"\n" + b"".join(lines)) in seen
