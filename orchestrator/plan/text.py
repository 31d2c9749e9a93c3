"""What a ticket text names: front-matter paths, path-like tokens, identifiers and plain words. Pure.

A ticket may start with front matter, e.g.

    Paths: src/api.py, tests/test_api.py
    ---
    refactor the api module ...

or with one `Paths:` line of its own. Those paths are declared: the strongest claim there is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PATHS_LINE = re.compile(r"^\s*paths\s*:\s*(.*)$", re.I)
_SPLIT = re.compile(r"[,\s]+")
_BACKTICK = re.compile(r"`([^`\n]{1,200})`")
# A token that looks like a path: has a '/' or an extension, made of path characters.
_PATHLIKE = re.compile(r"(?<![\w/.-])((?:[\w.*?\[\]-]+/)*[\w*?\[\]-][\w.*?\[\]-]*(?:\.[A-Za-z0-9]{1,8}|/))(?![\w/-])")
# A slashed token without an extension (`examples/javascript`, `docs/ssl`): a directory, or a file's path
# without its extension (`area: subject` commit messages name them so).
_SLASHED = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)+[A-Za-z_][\w-]*)(?![\w/.-])")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
# Code-like identifiers: snake_case with an underscore, camelCase/PascalCase with an inner capital, dotted.
_CODELIKE = re.compile(r"^(?:_*[a-z0-9]+(?:_[a-z0-9]+)+_*|[a-z]+[A-Z]\w*|[A-Z][a-z0-9]+[A-Z]\w*|\w+(?:\.\w+)+)$")
_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+|\S+@\S+\.\w+")
_TRAILER = re.compile(r"^[A-Z][\w-]*-by:.*$", re.M)
"""Commit trailers (`Signed-off-by:`, `Co-authored-by:`): people, not code."""
_VERSION = re.compile(r"v?\d+(?:\.\w+)+/?")
_CALL = re.compile(r"\b([A-Za-z_]\w*)\(\)")
_FILE_EXT = frozenset(
    """py pyi pyx rst md txt toml cfg ini yaml yml json lock in js jsx ts tsx mjs cjs html htm css scss c h cc cpp
    hpp go rs java kt rb php sh bash zsh sql xml svg png jpg jpeg gif ico csv tsv proto mk cmake gradle swift lua
    pl r ex exs erl hs ml scala dart vue el clj conf env pem crt key typed bat ps1""".split()  # noqa: SIM905 - a word list reads better as prose
)
"""Extensions that make `x.ext` a file name; `Response.reason` or `Session.get` name an attribute instead."""
_STOP = frozenset(
    """a an and are as at be by can do does done for from has have in into is it its make makes more no not of on
    or so than that the then this to too use used uses using via was we when where which while with without
    add adds added adding fix fixes fixed fixing update updates updated remove removes removed change changes
    changed merge merged pull request branch bump bumps support supports allow allows new old now also should
    instead only don doesn isn more less some any all file files code test tests docs doc""".split()  # noqa: SIM905 - a word list reads better as prose
)


@dataclass(frozen=True, slots=True)
class Mentions:
    """What a text names, in order of appearance, without duplicates."""

    declared: tuple[str, ...] = ()
    """Paths from `Paths:` front matter."""
    paths: tuple[str, ...] = ()
    """Path-like tokens (`src/api.py`, `api.py`, `docs/`)."""
    identifiers: tuple[str, ...] = ()
    """Code-like names (`send_file`, `BlueprintSetupState`, `app.run`, backticked words)."""
    words: tuple[str, ...] = ()
    """Other content words, lower-case (`blueprints`, `logging`): matched against module and file stems."""

    @property
    def empty(self) -> bool:
        return not (self.declared or self.paths or self.identifiers or self.words)


def _uniq(items: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(i for i in items if i))


def front_matter(text: str) -> tuple[tuple[str, ...], str]:
    """Declared paths from a leading `Paths:` line (or front matter block), and the text without them."""
    lines = text.splitlines()
    i = 0
    while i < len(lines) and not lines[i].strip():
        i += 1
    fenced = i < len(lines) and lines[i].strip() == "---"
    j = i + 1 if fenced else i
    declared: list[str] = []
    consumed = None
    while j < len(lines):
        line = lines[j]
        m = _PATHS_LINE.match(line)
        if m:
            declared += [p.strip("'\"") for p in _SPLIT.split(m.group(1)) if p.strip("'\"")]
            consumed = j
        elif fenced and line.strip() == "---":
            consumed = j
            break
        elif not fenced or not re.match(r"^\s*[\w-]+\s*:", line):
            break
        j += 1
    if consumed is None:
        return (), text
    if not fenced and consumed + 1 < len(lines) and lines[consumed + 1].strip() == "---":
        consumed += 1
    return _uniq(declared), "\n".join(lines[consumed + 1 :])


def mentions(text: str) -> Mentions:
    """Everything `text` names (see `Mentions`)."""
    declared, body = front_matter(text)
    body = _URL.sub(" ", _TRAILER.sub("", body))
    quoted = _BACKTICK.findall(body)
    paths: list[str] = []
    idents: list[str] = []
    for chunk in [*quoted, body]:
        for m in _PATHLIKE.finditer(chunk):
            tok = m.group(1).strip(".")
            if tok and not _VERSION.fullmatch(tok):
                paths.append(tok if not m.group(1).endswith("/") else m.group(1))
                if "/" not in tok and _WORD.fullmatch(tok) and tok.rsplit(".", 1)[1].lower() not in _FILE_EXT:
                    idents += [tok, *(p for p in tok.split(".") if _CODELIKE.match(p) or p[:1].isupper())]
        paths += [m.group(1) for m in _SLASHED.finditer(chunk)]
    for q in quoted:
        q = q.strip().rstrip("()")
        if _WORD.fullmatch(q):
            idents += [q, *q.split(".")] if "." in q else [q]
        else:
            idents += [w for w in _WORD.findall(q) if _CODELIKE.match(w)]
    idents += _CALL.findall(body)
    words: list[str] = []
    path_set = set(paths)
    for w in _WORD.findall(body):
        if "." in w:
            if not any(p.endswith(w) for p in path_set) and _CODELIKE.match(w):
                idents += [w, *(p for p in w.split(".") if _CODELIKE.match(p) or p[:1].isupper())]
        elif _CODELIKE.match(w):
            idents.append(w)
        elif w.lower() not in _STOP and len(w) > 2:
            words.append(w.lower())
    for q in quoted:  # backticked words that are not identifiers (`flask run`, `exclude-patterns`)
        words += [w.lower() for w in re.findall(r"[A-Za-z][A-Za-z0-9]+", q) if w.lower() not in _STOP]
    return Mentions(
        declared=declared,
        paths=_uniq(paths),
        identifiers=_uniq([i for i in idents if i.lower() not in _STOP]),
        words=_uniq(words),
    )
