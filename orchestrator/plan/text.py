"""What a ticket text names: front-matter paths, path-like tokens, identifiers and plain words. Pure.

A ticket may start with front matter, e.g.

    Paths: src/api.py, tests/test_api.py
    ---
    refactor the api module ...

or with one `Paths:` line of its own. Those paths are declared: the strongest claim there is.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

_PATHS_LINE = re.compile(r"^\s*paths\s*:\s*(.*)$", re.I)
_SPLIT = re.compile(r"[,\s]+")
_BACKTICK = re.compile(r"`([^`\n]{1,200})`")
# A token that looks like a path: has a '/' or an extension, made of path characters. Looked for only where a run of
# path characters starts: from every offset of a long run (20,000 `*`) it took seconds.
_PATHLIKE = re.compile(
    r"(?<![\w/.*?\[\]-])((?:[\w.*?\[\]-]+/)*[\w*?\[\]-][\w.*?\[\]-]*(?:\.[A-Za-z0-9]{1,8}|/))(?![\w/-])"
)
# A slashed token without an extension (`examples/javascript`, `docs/ssl`): a directory, or a file's path
# without its extension (`area: subject` commit messages name them so).
_SLASHED = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)+[A-Za-z_][\w-]*)(?![\w/.-])")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
# Code-like identifiers: snake_case with an underscore, camelCase/PascalCase with an inner capital, dotted.
_CODELIKE = re.compile(r"^(?:_*[a-z0-9]+(?:_[a-z0-9]+)+_*|[a-z]+[A-Z]\w*|[A-Z][a-z0-9]+[A-Z]\w*|\w+(?:\.\w+)+)$")
_URL = re.compile(r"\b[a-z][a-z0-9+.-]{0,30}://\S+|(?<!\S)[^\s@]+@[^\s@]+\.\w+")
"""A link or an address. Linear in the text: a scheme is short, and an address is looked for only from a word's start
with one `@` (`\\S+@\\S+` from every offset took minutes on a line of 10,000 `@`: a job's text is anyone's)."""
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


class Where(StrEnum):
    """Where in a ticket a name occurs: how much it says about the files the work is in."""

    TITLE = "title"
    """The first line: what the ticket is about."""
    PROSE = "prose"
    """The ticket's sentences."""
    QUOTED = "quoted"
    """Inside backticks."""
    CODE = "code"
    """A line of code the reporter ran (indented, fenced, or code-shaped)."""
    IMPORT = "import"
    """An import line: what the reporter's code uses, rarely what is broken."""
    SESSION = "session"
    """An interactive session (`>>>` lines and their output)."""
    TRACE = "trace"
    """A traceback."""
    SETUP = "setup"
    """The reporter's setup: versions, platform, installed packages and extensions (an issue template's environment
    section, `show_versions()` or `pip list` output, a test run's header). What the reporter has, not where the work
    is: a name found only there is left out of `Mentions` (every report of one repository names the same few there:
    `Sphinx extensions: sphinx.ext.autodoc`, `xr.show_versions()`)."""


WEAK_PLACES = frozenset({Where.IMPORT, Where.SESSION, Where.SETUP})
"""Places whose names say little about where the fix goes."""


@dataclass(frozen=True, slots=True)
class Frame:
    """One traceback frame: the file as written (any absolute prefix kept), and the function."""

    path: str
    func: str
    raises: bool = False
    """Its line is a `raise`: the code there reports the error on purpose (a check, a conversion refusing its
    input); the fault is as often in the caller that handed it what it refused."""


@dataclass(frozen=True, slots=True)
class Mentions:
    """What a text names, in order of appearance, without duplicates."""

    declared: tuple[str, ...] = ()
    """Paths from `Paths:` front matter."""
    paths: tuple[str, ...] = ()
    """Path-like tokens (`src/api.py`, `api.py`, `docs/`), literal (a `*` or `[` in one is part of a name)."""
    identifiers: tuple[str, ...] = ()
    """Code-like names (`send_file`, `BlueprintSetupState`, `app.run`, backticked words)."""
    words: tuple[str, ...] = ()
    """Other content words, lower-case (`blueprints`, `logging`): matched against module and file stems."""
    frames: tuple[Frame, ...] = ()
    """Traceback frames, outermost first (the order Python prints them)."""
    links: tuple[str, ...] = ()
    """The paths of URLs (`https://github.com/o/r/blob/main/src/x.py#L3` → `o/r/blob/main/src/x.py`)."""
    where: Mapping[str, frozenset[Where]] = field(default_factory=dict)
    """For each path, identifier and word: the places it occurs."""
    phrases: tuple[str, ...] = ()
    """Two or three adjacent words of the title or prose run together, lower-case (`LaTeX printer` →
    `latexprinter`): a class written as words."""
    messages: tuple[str, ...] = ()
    """Runs of plain words from quoted strings and error lines (`is used by multiple models`): what a
    program printed, to be found verbatim in the source that prints it."""

    @property
    def empty(self) -> bool:
        return not (self.declared or self.paths or self.identifiers or self.words or self.frames or self.links)

    def weak(self, name: str) -> bool:
        """The name occurs only in import lines or interactive sessions."""
        places = self.where.get(name)
        return places is not None and bool(places) and places <= WEAK_PLACES


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


_FENCE = re.compile(r"^\s*(```|~~~|\{\{\{|\}\}\})")
_IMPORT_LINE = re.compile(r"^\s*(?:>>>\s*|\.\.\.\s*)?(?:from\s+[\w.]+\s+import\s|import\s+[\w.]+)")
_SESSION_LINE = re.compile(r"^\s*(>>>|\.\.\.|In \[\d+\]:|Out\[\d+\]:)")
_CODE_LINE = re.compile(
    r"^(\s{4,}|\t)\S|^\s*(\w+(\.\w+)*(\[[^\]]*\])?\s*[-+*/]?=[^=]|print\(|return\b|def |class |@\w|#)"
    r"|^\s*[\w.]+\(.*\)\s*$"
)
_TRACE_START = re.compile(r"^\s*Traceback \(most recent call last\)")
_COMMENT = re.compile(r"<!--.*?(?:-->|\Z)", re.S)
"""An HTML comment: an issue template's instructions, not the reporter's words (they do not show)."""
_HEADING = re.compile(
    r"^(?:#{1,6}\s+(?P<md>.+?)\s*#*|\*\*(?P<bold>[^*]+?)\*\*\s*:?|(?:<details>\s*)?<summary>(?P<summary>.*?)</summary>"
    r"|(?!(?:if|elif|else|for|while|def|class|try|except|with)\b)"
    r"(?P<plain>[A-Za-z][\w ()/-]{0,40}:|[A-Z][A-Z0-9 _/()-]{3,40}))\s*$"
)
"""A line that heads a section: a markdown heading, a bold line, a `<summary>`, a short `Label:` or UPPER CASE line
(from its first column, not a line of code)."""
_SETUP_HEADING = re.compile(
    r"\b(?:environment|versions?|installed|installation|platform|operating system|os|system (?:details|info\w*)"
    r"|dependencies|pip (?:list|freeze)|conda (?:list|info)|show_versions|backend|extensions|extra tools)\b",
    re.I,
)
"""What an environment section's heading says (`### Sphinx version`, `**Environment info**`, `System Details`)."""
_SETUP_LINE = re.compile(
    r"^\s*(?:[-*+]\s+)?(?:"
    r"[A-Za-z][\w.()/+-]*(?:\s+[\w.()/+-]+){0,2}?"
    r"(?:\s*:\s*v?\d+\.\d+[\w.+-]*|\s+version\s*:?\s*\S+|\s+v?\d+\.\d+\.\d+[\w.+-]*)(?:\s*[|(\[].*)?"
    r"|platform \S+ -- Python \d.*|(?:rootdir|cachedir|plugins|configfile|inifile)\s*:.*)\s*$",
    re.I,
)
"""A line stating a version (`xarray: 0.12.3`, `Sphinx version: 3.1`, `attrs 21.2.0`, `Python 3.6.0 |Anaconda|`: a name
of three words at most) or a test run's header (`platform linux -- Python 3.9.7, pytest-7.1.2`, `rootdir: /home/x`)."""
SETUP_PROSE = 7
"""A line of this many words that states no version is prose again: it ends an environment section (a report that goes
on after its versions)."""
_DETAILS_END = re.compile(r"^\s*</details>", re.I)
_FRAME = re.compile(r'File "([^"\n]+)", line \d+(?:, in ([\w<>.]+))?')
_PYTEST_FRAME = re.compile(r"^\s*([\w./\\:~-]+\.\w{1,5}):\d+:(?: in ([\w<>.]+))?")
_PHRASE_WORD = re.compile(r"(?<![\w.])[A-Za-z]+(?![\w(])")
_URL_PATH = re.compile(r"\b[a-z][a-z0-9+.-]{0,30}://[^/\s]+/([^\s#?)\]>\"'`]+)")


def _place(line: str, title: bool, fenced: bool, trace: bool) -> Where:
    if title:
        return Where.TITLE
    if trace:
        return Where.TRACE
    if _IMPORT_LINE.match(line):
        return Where.IMPORT
    if _SESSION_LINE.match(line):
        return Where.SESSION
    if fenced or _CODE_LINE.match(line):
        return Where.CODE
    return Where.PROSE


def mentions(text: str) -> Mentions:
    """Everything `text` names (see `Mentions`), and where."""
    declared, body = front_matter(text)
    body = _COMMENT.sub("", _TRAILER.sub("", body))
    where: dict[str, set[Where]] = {}
    paths: list[str] = []
    idents: list[str] = []
    words: list[str] = []
    frames: list[Frame] = []
    links: list[str] = []
    phrases: list[str] = []
    messages: list[str] = []

    def seen(name: str, place: Where) -> None:
        where.setdefault(name, set()).add(place)

    fenced = trace = False
    setup = False  # in an environment section (`_SETUP_HEADING`), until the next heading
    session = False  # the output lines after a `>>>` line belong to the session
    first = True
    after_frame = False  # the line after a frame's is its source line
    for line in body.splitlines():
        if not line.strip():
            session = trace = after_frame = False
            continue
        if after_frame and re.match(r"\s*raise\b", line):
            frames[-1] = replace(frames[-1], raises=True)
        after_frame = False
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced and not first and (heading := _heading(line)) is not None:
            setup = _SETUP_HEADING.search(heading) is not None
        elif _DETAILS_END.match(line) or (
            setup and not fenced and len(line.split()) >= SETUP_PROSE and not _SETUP_LINE.match(line)
        ):
            setup = False
        if _TRACE_START.match(line):
            trace, session, setup = True, False, False
        for m in _URL_PATH.finditer(line):
            links.append(m.group(1))
        frame = _FRAME.search(line) or (_PYTEST_FRAME.match(line) if not _URL_PATH.search(line) else None)
        if frame:
            frames.append(Frame(frame.group(1).replace("\\", "/"), frame.group(2) or ""))
            after_frame = True
        plain = _URL.sub(" ", line)
        place = _place(plain, first, fenced, trace or bool(frame))
        if _SESSION_LINE.match(plain):
            session = True
        elif session and place is not Where.TITLE:
            place = Where.SESSION
        if place is not Where.TITLE and (setup or _SETUP_LINE.match(plain)):
            place = Where.SETUP
        first = False
        _line_mentions(plain, place, paths, idents, words, seen)
        if place is Where.SETUP:
            continue
        messages += _messages(line)
        if place in (Where.TITLE, Where.PROSE):
            run = [w.lower() for w in _PHRASE_WORD.findall(plain)]
            phrases += ["".join(run[i : i + n]) for n in (2, 3) for i in range(len(run) - n + 1)]
    setup_only = {name for name, places in where.items() if places == {Where.SETUP}}
    for name in setup_only:
        del where[name]
    return Mentions(
        declared=declared,
        paths=_uniq([p for p in paths if p not in setup_only]),
        identifiers=_uniq([i for i in idents if i.lower() not in _STOP and i not in setup_only]),
        words=_uniq([w for w in words if w not in setup_only]),
        frames=tuple(frames),
        links=_uniq(links),
        phrases=_uniq(phrases),
        messages=_uniq(messages)[:MAX_MESSAGES],
        where={k: frozenset(v) for k, v in where.items()},
    )


def _heading(line: str) -> str | None:
    """The words of a line that heads a section (`_HEADING`), tags and markup left out; else None."""
    m = _HEADING.match(line)
    if m is None:
        return None
    words = re.sub(r"<[^>]+>", " ", next(g for g in m.groups() if g is not None))
    return words if len(words.split()) <= 6 else None


MAX_MESSAGES = 12
_QUOTED = re.compile(r"\"([^\"\n]{12,200})\"|'([^'\n]{12,200})'")
_ERROR_LINE = re.compile(r"(?:Error|Exception|Warning|error|warning|\([a-z_.]+\.[EWC]\d+\))\s*:?\s+(.{12,300})$")
_FRAGMENT = re.compile(r"[A-Za-z][A-Za-z ,\-]*[A-Za-z]")


def _messages(line: str) -> list[str]:
    """Word runs of four or more words from the line's quoted strings and its error message, if any."""
    found = [a or b for a, b in _QUOTED.findall(line)]
    if m := _ERROR_LINE.search(line):
        found.append(m.group(1))
    out = []
    for text in found:
        for frag in _FRAGMENT.findall(text):
            frag = re.sub(r"\s+", " ", frag).strip(" ,-")
            if frag.count(" ") >= 3 and len(frag) >= 16:
                out.append(frag)
    return out


def _sentence_start(line: str, at: int) -> bool:
    before = line[:at].rstrip()
    return not before or before[-1] in ".!?:;"


def _line_mentions(
    line: str, place: Where, paths: list[str], idents: list[str], words: list[str], seen: Callable[[str, Where], None]
) -> None:
    """The paths, identifiers and words of one line, each noted with its place."""
    quoted = _BACKTICK.findall(line)
    found_paths: list[str] = []
    found_idents: list[str] = []
    for chunk in [*quoted, line]:
        for m in _PATHLIKE.finditer(chunk):
            tok = m.group(1).strip(".")
            if tok and not _VERSION.fullmatch(tok):
                found_paths.append(tok if not m.group(1).endswith("/") else m.group(1))
                if "/" not in tok and _WORD.fullmatch(tok) and tok.rsplit(".", 1)[1].lower() not in _FILE_EXT:
                    found_idents += [tok, *(p for p in tok.split(".") if _CODELIKE.match(p) or p[:1].isupper())]
        found_paths += [m.group(1) for m in _SLASHED.finditer(chunk)]
    for q in quoted:
        q = q.strip().rstrip("()")
        if _WORD.fullmatch(q):
            found_idents += [q, *q.split(".")] if "." in q else [q]
        else:
            found_idents += [w for w in _WORD.findall(q) if _CODELIKE.match(w)]
    found_idents += _CALL.findall(line)
    path_set = set(found_paths)
    found_words: list[str] = []
    for wm in _WORD.finditer(line):
        w = wm.group(0)
        if "." in w:
            if not any(p.endswith(w) for p in path_set) and _CODELIKE.match(w):
                found_idents += [w, *(p for p in w.split(".") if _CODELIKE.match(p) or p[:1].isupper())]
        elif _CODELIKE.match(w) or (place is not Where.PROSE and place is not Where.TITLE and w[:1].isupper()):
            found_idents.append(w)
        elif w.lower() not in _STOP and len(w) > 2:
            found_words.append(w.lower())
            if w[:1].isupper() and len(w) > 3 and not _sentence_start(line, wm.start()):
                found_idents.append(w)  # `Subquery`, `Paginator`: a class name written in prose
    for q in quoted:  # backticked words that are not identifiers (`flask run`, `exclude-patterns`)
        found_words += [w.lower() for w in re.findall(r"[A-Za-z][A-Za-z0-9]+", q) if w.lower() not in _STOP]
    qplace = Where.QUOTED if place in (Where.PROSE, Where.TITLE) else place
    for p in found_paths:
        seen(p, place)
    for i in found_idents:
        seen(i, qplace if any(i in q for q in quoted) and place is not Where.TITLE else place)
    for w in found_words:
        seen(w, place)
    paths += found_paths
    idents += found_idents
    words += found_words


# ------------------------------------------------------------------------------------------ what kind of text

_CHANGE_VERBS = frozenset(
    """add address adjust align allow amend apply avoid backport break bump cache call cap change check clarify clean
    cleanup clear close collect combine complete consolidate convert copy correct cover create dedup default
    define delete deprecate derive describe detect disable document drop embed emend emit enable enforce ensure
    exclude expand expose extend extract factor favor fetch fill filter finalize finish fix flip fold follow
    forbid format forward generalize generate get guard handle harden hide ignore implement import improve
    include increase inherit inline install introduce invert keep let limit link lint list load log make mark
    memoize mention merge migrate modernize modify move normalize note optimize override parse pass patch pin
    polish port prefer prepare preserve prevent print propagate provide prune publish raise read rebuild
    recognize record reduce refactor refer refine reformat regenerate register reject release reload relocate
    remove rename reorder reorganize replace require reset resolve respect restore restrict retry return reuse
    revert reword rework rewrite run save separate set show silence simplify skip sort speed split standardize
    start stop store strip support suppress switch sync test tidy tighten track treat trigger trim truncate tune
    turn tweak type unify unpin unskip update upgrade use validate vendor warn wrap write""".split()  # noqa: SIM905 - a word list reads better as prose
)
"""Verbs a change's description starts with (`Fix ...`, `Added ...`, `Refs #12 -- Moved ...`), in their base form."""
_CONVENTIONAL = re.compile(
    r"^\s*(?:feat|fix|refactor|docs?|tests?|chore|perf|style|ci|build|revert)(?:\([^)\n]*\))?!?:", re.I
)
"""A conventional commit's type: the text says which kind of change it is."""
_ISSUE_TAG = re.compile(
    r"^\s*\[\s*(?:bugs?|enh|enhancement|feature(?: request)?|question|help|docs?|documentation|proposal|idea|"
    r"discussion|regression)\s*\]",
    re.I,
)
"""An issue template's tag (`[Bug]:`, `[ENH]:`, `[feature]`): a report, whatever follows."""
_LEADS = re.compile(
    r"^\s*(?:(?i:refs?|see)\s+#\d+\s*(?:--|:|-)\s*|\[[^\]\n]{1,30}\]\s*:?\s*|[^\s:,]+(?:\([^)\n]*\))?!?:\s+"
    r"|[\w.+#/ -]{1,24}[:,]\s+(?=[A-Za-z])|[A-Z]{2,5}\b(?![:.])\s+(?=[A-Za-z]))+"
)
"""What may precede a change's verb: `Refs #12 --`, a `[tag]`, an `area:`, `area(scope):` or `C++ domain:` prefix, a
numpy-style kind (`DOC fix ...`, `MAINT follow ...`)."""
_LANDED = re.compile(r"\(#\d+\)\s*$|^\s*(?:merge|revert)\b|^\s*v?\d+(?:\.\w+)+\s*$", re.I)
"""A subject that a landing wrote: a pull request's number at its end, a merge, a revert, a version."""
_AUXILIARIES = frozenset(
    """is are was were be been has have had should can could would will may might must does did doesn't isn't aren't
    wasn't can't cannot won't shouldn't""".split()  # noqa: SIM905 - a word list reads better as prose
)
_ADVERBS = frozenset("please only also always never just partially temporarily properly correctly now".split())  # noqa: SIM905


_REPORTED = re.compile(
    r"\?|\w(?:Error|Exception|Warning)\b|n't\b|\b(?:not|no longer|cannot|unable|impossible|without|never|missing|lacks?"
    r"|fail\w*|crash\w*|broken|breaks?|wrong\w*|incorrect\w*|inconsistent\w*|unexpected\w*|bad\w*|bugs?|buggy|issues?"
    r"|problems?|errors?|exceptions?|warnings?|regression|false positive|false negative|ignor\w*|misalign\w*"
    r"|duplicat\w*|leak\w*|hangs?|slow\w*|invalid|weird|strange|confus\w*|mismatch\w*|overrid\w*|raises?|throws?|should|does|when|if"
    r"|support for|feature|a way|option to|ability|possible|would|how to|proposal|enhancement|request)\b",
    re.I,
)
"""Words that tell what is wrong or wanted: a symptom (`fails`, `raises`, `TypeError`, `false positive`, `doesn't`), a
question, a wish (`support for`, `a way to`, `would be`)."""


_COMMAND = re.compile(
    r";|&&|\|\||\s\|\s|\s>>?\s*\S|\$\(|^\s*(?:sed|echo|sleep|while|for|if|cd|true|false|printf|cat|touch|mkdir|rm|cp|mv|"
    r"sh|bash|env|exit|test)\s"
)
"""A command line: a shell operator (`;`, `&&`, `|`, `>`), or a shell word first."""


def reports(text: str) -> bool:
    """The text's first line reports what is wrong or wanted (`Legend ignores alpha`, `[Bug]: ...`, `Support for
    X?`) instead of saying what to change (`describes_change`): an issue's title, not a commit's subject. Pure."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    if _COMMAND.search(first):
        return False  # a shell job's command line (`sed -i 's/fail-under=100/.../' Makefile`) is no prose
    return bool(_ISSUE_TAG.match(first)) or (not describes_change(first) and _REPORTED.search(first) is not None)


def has_body(text: str) -> bool:
    """The text goes on past its first line (an issue's description, not its title alone). Pure."""
    return sum(1 for line in text.strip().splitlines() if line.strip()) > 1


def describes_change(text: str) -> bool:
    """The text's first line says what to change (`Fix the legend's alpha`, `docs: clarify X`, `Refs #1 -- Moved
    Y`), as a commit message does, rather than what is wrong or wanted (`Legend ignores alpha`, `[Bug]: ...`,
    `Support for X?`): the repository's record, replayed on its commit messages, calibrates plans of the former.
    Pure: a verb list, not a parser."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    if _ISSUE_TAG.match(first):
        return False
    if _LANDED.search(first) or _CONVENTIONAL.match(first):
        return True
    return _verb_first(first) or _verb_first(_LEADS.sub("", first))


def _verb_first(line: str) -> bool:
    """The line starts with a change's verb (past an adverb: `Only run ...`; `Don't ...` too)."""
    words = line.split()
    while len(words) > 1 and (words[0].lower() in _ADVERBS or (words[0].endswith("ly") and not _verb(words[0]))):
        words = words[1:]
    if not words:
        return False
    word = words[0].lower().rstrip(":,")
    if word in ("don't", "dont", "do", "never"):
        return True
    if len(words) > 1 and words[1].lower() in _AUXILIARIES:
        return False  # `copy should ...`, `Defaults are ...`: the first word is what the sentence is about
    if len(words) > 1 and words[1].lower() in ("for", "of") and word not in ("fix", "fixes"):
        return False  # `Support for X`, `Handling of Y`: a noun, what is wanted
    return _verb(word.split("/")[0].rsplit("-", 1)[-1])  # `Fix/revisit`, `Re-enable`


def _verb(word: str) -> bool:
    word = word.lower()
    return re.fullmatch(r"[a-z']+", word) is not None and bool(_base_forms(word) & _CHANGE_VERBS)


def _base_forms(word: str) -> set[str]:
    """The base forms `word` may be of (`fixes`, `fixed` → `fix`; `applied` → `apply`; `doc'd` → `doc`). Not a gerund:
    `Creating a subclass errors` reports."""
    word = word.replace("'d", "ed")
    out = {word}
    for suffix in ("ies", "es", "s", "ied", "ed", "d"):
        if word.endswith(suffix) and len(word) > len(suffix) + 2:
            stem = word[: -len(suffix)]
            out |= {stem, stem + "e", stem + "y"}
            if len(stem) > 3 and stem[-1] == stem[-2]:
                out.add(stem[:-1])  # `stopped` → `stop`
    return out
