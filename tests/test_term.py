"""The one way views show a string from a job: whatever a terminal would obey is made visible, the rest kept."""

from __future__ import annotations

import sys
import unicodedata

from orchestrator.commands import fit, term

OBEYED = ("Cc", "Cf", "Cs", "Zl", "Zp")


def test_every_control_format_and_separator_character_is_escaped() -> None:
    """Every character of Python's Unicode database in the categories a terminal obeys or breaks a line on (controls,
    format characters such as bidi overrides, surrogates, separators) is escaped; no other character is."""
    missed = [
        hex(cp) for cp in range(sys.maxunicode + 1)
        if unicodedata.category(chr(cp)) in OBEYED and not term.UNSAFE.fullmatch(chr(cp))
    ]  # fmt: skip
    assert not missed, f"update term._BUT_C0 to this Python's Unicode {unicodedata.unidata_version}: {missed[:20]}"
    for cp in range(sys.maxunicode + 1):
        ch = chr(cp)
        if term.UNSAFE.fullmatch(ch):
            shown = term.visible(ch)
            assert shown.startswith("\\") and shown.isprintable(), (hex(cp), shown)
        elif cp < 0x3000:
            assert term.visible(ch) == ch


def test_a_name_with_escape_sequences_and_a_newline_is_one_visible_line() -> None:
    """OSC 52, OSC 0, CSI 2J and a newline in a name: shown escaped, on one line; a byte that was not UTF-8 (read
    with surrogateescape) is shown as that byte."""
    name = "osc\x1b]52;c;cm0gLXJmIH4K\x07\x1b]0;PWNED\x1b\\\x1b[2Jname\nstate        landed\u202etxt.exe"
    shown = term.visible(name)
    assert shown == (
        "osc\\x1b]52;c;cm0gLXJmIH4K\\x07\\x1b]0;PWNED\\x1b\\\\x1b[2Jname\\nstate        landed\\u202etxt.exe"
    )
    assert "\n" not in shown and shown.isprintable()
    assert term.visible(b"p\xff".decode("utf-8", "surrogateescape")) == "p\\xff"
    assert term.visible("plain text, é, 漢字 → ok") == "plain text, é, 漢字 → ok"
    assert term.shown({"a\x1b": ["b\n", {"c": "\x9b2J"}], "n": 3}) == {"a\\x1b": ["b\\n", {"c": "\\x9b2J"}], "n": 3}


def test_a_jobs_output_keeps_its_lines_tabs_and_colours_and_nothing_else() -> None:
    """Output shown on a terminal (`logs`, `diff`): lines, tabs and colours (SGR) as written; a CRLF is a line
    end; a lone CR (which would overwrite the line), cursor moves, OSC and a bell are escaped."""
    raw = "\x1b[31mred\x1b[0m\tcol\r\nnext\rover\x1b[2J\x1b]0;t\x07\x1b[1;1H\x9b2J"
    assert term.output(raw) == "\x1b[31mred\x1b[0m\tcol\nnext\\rover\\x1b[2J\\x1b]0;t\\x07\\x1b[1;1H\\x9b2J"
    assert term.output("\x1b[31mred", colours=False) == "\\x1b[31mred"


def test_a_stream_cut_anywhere_is_shown_as_if_whole() -> None:
    """A log read in chunks: a colour sequence, a UTF-8 character or a CRLF cut between two chunks is shown as if
    it came whole; an escape left open at the end is shown escaped."""
    data = "a\x1b[31mé\r\nb\x1b]0;x\x07\x1b[0m€\x1b[".encode()
    whole = "".join(term.chunks(iter([data])))
    for cut in range(1, len(data)):
        parts = [data[:cut], data[cut:]]
        assert "".join(term.chunks(iter(parts))) == whole, cut
    assert whole == "a\x1b[31mé\nb\\x1b]0;x\\x07\x1b[0m€\\x1b["


def test_text_broken_to_a_width_keeps_commands_and_spacing() -> None:
    """`fill` breaks between words at the width, never inside a `quoted command`, and keeps the spaces inside a
    line (a name with two spaces stays so)."""
    text = "job 7 in review holds back jobs 8, 9: `orchestrator diff 7` shows it, `orchestrator land 7` lands  it"
    lines = fit.fill(text, 30, indent="  ")
    assert all(len(line) <= 30 for line in lines), lines
    assert "`orchestrator diff 7`" in "\n".join(lines) and "lands  it" in lines[-1]


def test_a_diff_and_its_agents_turns_side_by_side_fit_and_escape_what_the_job_wrote() -> None:
    """`diff --transcript`: at 160 columns the diff and the agent's turns share lines, at 80 they follow each other;
    every line fits, and the escapes the job and its agent wrote are shown, not obeyed."""
    import io

    from rich.console import Console

    from orchestrator.commands.review import side_by_side

    patch = "diff --git a/x.txt b/x.txt\n--- a/x.txt\n+++ b/x.txt\n@@ -1 +1 @@\n-old\n+new \x1b]0;PWNED\x07\n"
    entries = [
        {"type": "user", "message": {"role": "user", "content": "Fix x.txt"}},
        {"type": "assistant", "message": {"role": "assistant", "content": [
            {"type": "text", "text": "I will edit x.txt \x1b[2J now"},
            {"type": "tool_use", "name": "Edit", "input": {"file_path": "x.txt"}},
        ]}},
    ]  # fmt: skip
    for width, beside in ((160, True), (80, False)):
        out = io.StringIO()
        side_by_side(patch, entries, 7, Console(file=out, width=width, highlight=False))
        text = out.getvalue()
        lines = text.splitlines()
        assert max(len(line) for line in lines) <= width, text
        assert "\x1b" not in text and "\\x1b]0;PWNED\\x07" in text and "\\x1b[2J" in text, text
        shared = any("--- a/x.txt" in line and "assistant: I will edit" in line for line in lines)
        assert shared is beside, text
        assert "assistant → Edit" in text
