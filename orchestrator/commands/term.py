"""What a terminal is shown of a job: every string that came from a job, a ticket or another node, with the
characters a terminal would obey made visible, so that nothing a job wrote can drive the terminal of the person
reading about it.

A job's text, its file names, its reason (which quotes them), a teammate's node name: each is data a hostile job
chose. Printed raw, `ESC ] 52` sets the reader's clipboard, `ESC ] 0` the window title, `ESC [ 2 J` clears the
screen, and a newline in a file name forges an output line of its own. Every view writes such strings through
`visible` (one field on one line) or `output` (a job's own output, many lines): control characters (C0, DEL,
C1), Unicode format characters (bidirectional overrides, zero-width marks), line and paragraph separators and
lone surrogates (a name that is not UTF-8) become backslash escapes a person can read (`\\x1b`, `\\n`,
`\\u202e`); everything else is shown as it is. JSON output (`--json`) needs none of this: JSON escapes every
control character itself.

Pure; no terminal is needed to call it.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterator
from typing import Any

import click

# Unicode categories Cc (controls), Cf (format: bidi overrides, zero-width), Cs (surrogates: a name that was
# not UTF-8, decoded with surrogateescape), Zl and Zp (line and paragraph separators), as of Unicode 15.1;
# `tests/test_term.py` checks the table against the running Python's own Unicode database.
_BUT_C0 = (
    "\x7f-\x9f\xad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u2028-\u202e"
    "\u2060-\u2064\u2066-\u206f\ud800-\udfff\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f"
    "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f"
)
UNSAFE = re.compile(f"[\x00-\x1f{_BUT_C0}]")
"""One character a terminal may obey (or that breaks a line) rather than show."""
_UNSAFE_IN_OUTPUT = re.compile(f"[\x00-\x08\x0b-\x1f{_BUT_C0}]")
"""`UNSAFE` but for newline and tab: in lines of output, they are what they seem."""

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(ch: str) -> str:
    named = _NAMED.get(ch)
    if named is not None:
        return named
    cp = ord(ch)
    if 0xDC80 <= cp <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape): shown as that byte
        return f"\\x{cp - 0xDC00:02x}"
    if cp < 0x100:
        return f"\\x{cp:02x}"
    return f"\\u{cp:04x}" if cp < 0x10000 else f"\\U{cp:08x}"


def visible(text: Any) -> str:
    """`text` (any value, as `str()` shows it) on one line, with every character a terminal would obey escaped."""
    text = text if isinstance(text, str) else str(text)
    if text.isprintable():  # C-fast: the common case has nothing to escape
        return text
    return UNSAFE.sub(lambda m: _escape(m.group()), text)


def shown(value: Any) -> Any:
    """`value` (a job's JSON, a list of them, ...) with every string in it, keys too, made `visible`."""
    if isinstance(value, str):
        return visible(value)
    if isinstance(value, dict):
        return {visible(k) if isinstance(k, str) else k: shown(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [shown(v) for v in value]
    return value


def echo(line: Any = "", *, err: bool = False) -> None:
    """Print one line of a view: whatever came from a job in it is made `visible` first."""
    click.echo(visible(line), err=err)


# -- a job's own output (`logs`, `diff`): many lines, colours kept ---------------------------------------------

_SGR = re.compile(r"\x1b\[[0-9;:]*m")
"""A colour or text style (Select Graphic Rendition): it changes how text looks, never what a terminal does."""
_OPEN_ESCAPE = re.compile(r"\x1b(\[[0-9;:]*)?$")
"""The start of an escape sequence at the very end of a chunk: wait for the rest before deciding."""


def output(text: str, *, colours: bool = True) -> str:
    """A job's output for a terminal: its lines and tabs as they are (a lone CR escaped: it would overwrite the
    line), colours (SGR) kept when `colours`, every other control character made visible."""
    text = text.replace("\r\n", "\n")
    if not colours:
        return _UNSAFE_IN_OUTPUT.sub(lambda m: _escape(m.group()), text)
    out, pos = [], 0
    for m in _SGR.finditer(text):
        out.append(output(text[pos : m.start()], colours=False))
        out.append(m.group())
        pos = m.end()
    out.append(output(text[pos:], colours=False))
    return "".join(out)


class Output:
    """`output` for a stream of bytes (a log followed as it grows): decoded incrementally (a character cut
    between two chunks is whole), and an escape sequence cut between two chunks is decided once it is whole."""

    def __init__(self, *, colours: bool = True) -> None:
        self.colours = colours
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._held = ""

    def feed(self, chunk: bytes) -> str:
        text = self._held + self._decoder.decode(chunk)
        self._held = ""
        if text.endswith("\r"):  # may be the first half of CRLF
            text, self._held = text[:-1], "\r"
        elif m := _OPEN_ESCAPE.search(tail := text[-64:]):
            cut = len(text) - len(tail) + m.start()
            text, self._held = text[:cut], text[cut:]
        return output(text, colours=self.colours)

    def end(self) -> str:
        text, self._held = self._held + self._decoder.decode(b"", final=True), ""
        return output(text, colours=self.colours)


def chunks(stream: Iterator[bytes], *, colours: bool = True) -> Iterator[str]:
    """A byte stream as `output` text, chunk by chunk."""
    out = Output(colours=colours)
    for chunk in stream:
        if text := out.feed(chunk):
            yield text
    if text := out.end():
        yield text
