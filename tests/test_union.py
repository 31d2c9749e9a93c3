"""The line-wise union merge of a union-merged file (a changelog): both sides' additions, and their removals."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.git.union import merge

lines = st.lists(st.sampled_from([b"- a\n", b"- b\n", b"- c\n", b"\n", b"## head\n"]), max_size=8).map(b"".join)


def test_entries_added_at_one_place_are_both_kept_ours_first():
    """Two entries written at the same place by both sides: both stay, as a union merge keeps them."""
    assert merge(b"# c\n\n- old\n", b"# c\n\n- ours\n- old\n", b"# c\n\n- theirs\n- old\n") == (
        b"# c\n\n- ours\n- theirs\n- old\n"
    )


def test_a_line_one_side_removed_is_gone_when_the_other_side_kept_it():
    """A reworded heading beside a section added above it: the new heading and the added section, not the old
    heading kept by the side that only added next to it."""
    base = b"top\n## Unreleased\n\n- x\n"
    ours = b"top\n## Next\n\n## Unreleased\n\n- x\n"
    theirs = b"top\n## 1.0\n\n- x\n"
    assert merge(base, ours, theirs) == b"top\n## Next\n\n## 1.0\n\n- x\n"


def test_a_last_line_without_its_end_is_one_line():
    """Both sides append after a last line that has no newline: no doubled line, no glued lines."""
    assert merge(b"a\nb", b"a\nb\nc", b"a\nb\nd") == b"a\nb\nc\nd"
    assert merge(b"", b"x", b"y") == b"x\ny"


def test_binary_content_is_no_line_wise_matter():
    """A NUL byte on any side: no merge (the caller reports the conflict)."""
    assert merge(b"a\n", b"a\0\n", b"b\n") is None


@given(lines, lines)
def test_a_side_that_changed_nothing_takes_the_other(base, other):
    """Only one side changed the file: the merge is that side, whichever it is; both made the same: that."""
    assert merge(base, base, other) == other
    assert merge(base, other, base) == other
    assert merge(base, other, other) == other
