"""Ranking a tree's files by the evidence a ticket gives for each: the features of every candidate file.

Pure over its inputs (the ticket's `Mentions`, a `TreeIndex` at the base, the repository's `History`); the
caller holds the index's lock. Every candidate gets named features, each a number, and the reasons a
person reads (`Evidence` kinds with a sentence); `plan.score` turns the features into a probability.

Evidence, by kind (independent kinds are what confidence rests on):
- named: the text names the path, a suffix of it (a traceback frame's absolute path, a link to the file),
  its module, its file name or its stem;
- traceback: the file is a frame of a traceback in the text (the innermost frame inside the repository
  most of all);
- symbol: the file defines an identifier the text names (`Class.method` most of all), counted by how
  few files define it; names seen only on import lines or in `>>>` sessions count little, definitions in
  tests and docs not at all;
- content: BM25 retrieval of the text's words over the source files' words;
- history: past changes described in similar words touched it; co-change: it changes with a file above.
"""

from __future__ import annotations

import itertools
import math
import posixpath
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from orchestrator.plan.base import Kind
from orchestrator.plan.history import History, tokens
from orchestrator.plan.index import TreeIndex, grep_fixed, terms
from orchestrator.plan.kinds import is_doc, is_test, path_class
from orchestrator.plan.text import Mentions, Where, has_body, reports

TOP_CONTENT = 40
"""Files taken from content retrieval alone."""
TOP_DOCS = 10
"""Documentation files taken from content retrieval alone."""
TOP_CONFIG = 5
"""Settings and manifests taken from content retrieval alone."""
TOP_HISTORY = 8
"""Similar past changes looked at."""
MAX_DEFINERS = 6
"""An identifier defined in more source files than this says nothing about which one."""
MAX_NAMED = 6
"""A file name or stem matching more files than this says nothing about which one."""
K1, B = 1.2, 0.75
"""BM25's term-frequency saturation and length normalisation."""
PLACE_WEIGHT: Mapping[Where, float] = {
    Where.TITLE: 2.0,
    Where.QUOTED: 1.5,
    Where.PROSE: 1.0,
    Where.TRACE: 0.8,
    Where.CODE: 0.6,
    Where.SESSION: 0.25,
    Where.IMPORT: 0.1,
    Where.SETUP: 0.0,
}
"""How much a name says by where it occurs (`text.Where`)."""
GENERIC_STEMS = frozenset(
    """__init__ index main conf setup readme license init mod lib utils util base core common test tests
    models views types helpers compat version""".split()  # noqa: SIM905 - a word list reads better as prose
)
"""File stems too common to be named by a bare word."""


@dataclass
class Candidate:
    """One file with the features of its evidence and the reasons behind them."""

    path: str
    features: dict[str, float] = field(default_factory=dict)
    reasons: list[tuple[Kind, str]] = field(default_factory=list)

    def add(self, feature: str, value: float, kind: Kind | None = None, why: str = "") -> None:
        self.features[feature] = self.features.get(feature, 0.0) + value
        if kind is not None and why and (kind, why) not in self.reasons:
            self.reasons.append((kind, why))

    @property
    def kinds(self) -> frozenset[Kind]:
        return frozenset(k for k, _ in self.reasons)


class Ranking:
    """The candidates of one ticket at one base, by path."""

    def __init__(self, index: TreeIndex, long: float = 0.0, docs: bool = False, report: bool = False) -> None:
        self.index = index
        self.report = report
        """The text reports what is wrong or wanted instead of saying what to change (`text.reports`)."""
        self.docs = docs
        """The text asks for documentation: docs gain, code loses (`doc_asked`, `code_unasked`)."""
        self.long = long
        """How long the text is (`length`): the model weighs evidence from tickets and commit messages apart."""
        self.by_path: dict[str, Candidate] = {}
        self.defining: set[str] = set()
        """Files that are the only source file defining an identifier a text with a body names (`floatformat()`,
        `InheritDocstrings`): the text points at them as a path would. A title alone (SWE-bench-Live's) is left
        out: of 26 such titles the file defining what they named held the fix for 17."""

    def get(self, path: str) -> Candidate:
        c = self.by_path.get(path)
        if c is None:
            c = self.by_path[path] = Candidate(path)
            c.features["test"] = float(is_test(path))
            c.features["doc"] = float(is_doc(path))
            c.features["long"] = self.long
            if self.docs:
                c.features["doc_asked" if is_doc(path) else "code_unasked"] = 1.0
        return c

    def __iter__(self) -> Iterator[Candidate]:
        return iter(self.by_path.values())


# ---------------------------------------------------------------------------------------------- paths


def _clean(token: str) -> str:
    tok = re.sub(r"(#L\d+(-L?\d+)?|:\d+(:\d+)?)$", "", token.strip().strip("'\"`(),;"))
    tok = tok.replace("\\", "/")
    while tok.startswith("./"):
        tok = tok[2:]
    return tok


def suffix_match(index: TreeIndex, token: str, min_segments: int = 1) -> tuple[list[str], int]:
    """The files whose path ends with the longest suffix of `token` that is in the tree (at least
    `min_segments` segments), and how many segments matched. A path in the tree is its own match."""
    tok = _clean(token).lstrip("/")
    if not tok:
        return [], 0
    if tok in index.blobs:
        return [tok], tok.count("/") + 1
    segs = [s for s in tok.split("/") if s not in ("", ".")]
    if not segs:
        return [], 0
    named = index.by_name.get(segs[-1])
    if not named:
        return [], 0
    for k in range(len(segs), min_segments - 1, -1):
        suffix = "/".join(segs[-k:])
        hits = sorted(p for p in named if p == suffix or p.endswith("/" + suffix))
        if hits:
            return hits, k
    return [], 0


def _paths(m: Mentions, index: TreeIndex, r: Ranking) -> None:
    for tok in m.paths:
        if "/" in tok.rstrip("/") or tok.endswith("/"):
            name = _clean(tok).rstrip("/")
            if index.is_dir(name):
                continue  # a directory is an area, not a file: its files are judged on their own evidence
            hits, _ = suffix_match(index, tok, min_segments=2)
            if hits and len(hits) <= MAX_NAMED:
                for p in hits:
                    r.get(p).add("path", 1.0 / len(hits), Kind.NAMED, f"the text names {tok}")
                continue
            if "." not in posixpath.basename(name):  # `ci/b: bump` names `ci/b.yml`
                stem = posixpath.basename(name).lower()
                hits = sorted(p for p in index.by_stem.get(stem, ()) if p.rsplit(".", 1)[0] == name)
                if 0 < len(hits) <= MAX_NAMED:
                    for p in hits:
                        r.get(p).add("path", 1.0 / len(hits), Kind.NAMED, f"the text names {name}")
                    continue
            if _new_file(name, index):
                r.get(name).add("path", 1.0, Kind.NAMED, f"the text names {name} (not in the tree yet: a new file)")
                continue
        base = posixpath.basename(_clean(tok))
        hits = sorted(p for p in index.by_name.get(base, ()) if not is_test(p) or is_test(base))
        if hits and len(hits) <= MAX_NAMED:
            for p in hits:
                r.get(p).add("name", 1.0 / len(hits), Kind.NAMED, f"the text names {base}")


def _new_file(name: str, index: TreeIndex) -> bool:
    """A path the text names that is not in the tree yet, but plausibly a file to create: its directory
    exists and it has a word-like extension (not a branch name such as `origin/1.1.x`). Never a pattern:
    `*`, `?` and `[` are not name characters here."""
    parent, base = posixpath.split(name)
    return (
        bool(parent)
        and not name.startswith("/")
        and index.is_dir(parent)
        and re.fullmatch(r"[\w-]+\.[A-Za-z][A-Za-z0-9]{0,7}", base) is not None
        and ".." not in name.split("/")
    )


def _frames(m: Mentions, index: TreeIndex, r: Ranking) -> None:
    """Each frame in the tree; the innermost in-repo frame most of all. A frame whose line raises the error
    on purpose passes that to the frame that called it, when one is in the repo (the caller handed it
    what it refused)."""
    found = []
    for frame in reversed(m.frames):  # innermost first
        hits, _ = suffix_match(index, frame.path, min_segments=2)
        if hits and len(hits) <= 2:
            found.append((frame, hits))
    source = [n for n, (_, hits) in enumerate(found) if not all(is_test(p) for p in hits)]
    inner = next((n for n in source if not found[n][0].raises), source[0] if source else None)
    for n, (frame, hits) in enumerate(found):
        for p in hits:
            c = r.get(p)
            if n == inner and not is_test(p):
                c.add(
                    "trace_inner",
                    1.0 / len(hits),
                    Kind.TRACEBACK,
                    f"the innermost traceback frame in the repo ({frame.func or '?'})"
                    if n == source[0]
                    else f"the innermost frame in the repo that did not raise the error itself ({frame.func or '?'})",
                )
            else:
                c.add("trace", 1.0 / len(hits), Kind.TRACEBACK, f"a traceback frame ({frame.func or '?'})")
            if frame.func and frame.func in index.facts.get(p, _NO_FACTS).defs:
                c.add("trace_func", 1.0, Kind.TRACEBACK, f"defines {frame.func}, a function in the traceback")


def _links(m: Mentions, index: TreeIndex, r: Ranking) -> None:
    for link in m.links:
        segs = [s for s in _clean(link).split("/") if s]
        for k in range(len(segs), 0, -1):  # the longest tail that is a path of the tree
            tail = "/".join(segs[-k:])
            if tail in index.blobs:
                r.get(tail).add("link", 1.0, Kind.NAMED, "a link in the text points at it")
                break


def _modules(m: Mentions, index: TreeIndex, r: Ranking) -> None:
    """Dotted names that are modules of the tree (`django.db.models.query`, `_pytest.python`)."""
    for ident in m.identifiers:
        if "." not in ident:
            continue
        parts = ident.split(".")
        weak = m.weak(ident)
        for n in range(len(parts), 1, -1):  # the longest prefix that is a module
            rel = "/".join(parts[:n])
            hits = _module_files(index, rel)
            if hits and len(hits) <= MAX_NAMED:
                for p in hits:
                    feature = "module_weak" if weak or n < len(parts) - 1 else "module"
                    why = f"the text names the module {'.'.join(parts[:n])}"
                    r.get(p).add(feature, 1.0 / len(hits), Kind.NAMED, why + (" (in an import)" if weak else ""))
                break


def _module_files(index: TreeIndex, rel: str) -> list[str]:
    """The files of module `rel` (`a/b` for `a.b`, or a tail of one): `a/b.py`, or a package's `a/b/__init__.py`
    and its namesake module `a/b/b.py` when it has one (where a package like `printing.pretty` keeps its code)."""
    base = rel.rsplit("/", 1)[-1]
    out = []
    for name in (base + ".py", "__init__.py"):
        for p in sorted(index.by_name.get(name, ())):
            target = p[:-3] if name != "__init__.py" else p[: -len("/__init__.py")]
            if target == rel or target.endswith("/" + rel):
                out.append(p)
                namesake = f"{target}/{base}.py"
                if name == "__init__.py" and namesake in index.blobs:
                    out.append(namesake)
    return sorted(set(out))


def _stems(m: Mentions, index: TreeIndex, r: Ranking) -> None:
    """A bare word that is a source file's stem (`autoreload`, `latex`, `formsets`)."""
    for word in m.words:
        if word in GENERIC_STEMS or len(word) < 4:
            continue
        forms = {word, word[:-1] if word.endswith("s") else word + "s"}
        hits = sorted({p for f in forms for p in index.by_stem.get(f, ()) if not is_test(p) and not is_doc(p)})
        if hits and len(hits) <= MAX_NAMED:
            weight = max(PLACE_WEIGHT[w] for w in m.where.get(word, {Where.PROSE}))
            for p in hits:
                r.get(p).add("stem", weight / len(hits), Kind.NAMED, f"'{word}' is its name")


# -------------------------------------------------------------------------------------------- symbols


_NO_FACTS = type("_NoFacts", (), {"defs": frozenset(), "members": frozenset()})()


def _weight(m: Mentions, name: str) -> float:
    places = m.where.get(name) or {Where.PROSE}
    return max(PLACE_WEIGHT[w] for w in places)


def _symbols(m: Mentions, index: TreeIndex, r: Ranking) -> None:
    """Files defining the identifiers the text names: a `Class.member` pair most of all."""
    for ident in m.identifiers:
        w = _weight(m, ident)
        if "." in ident:
            parts = ident.split(".")
            for a, b in itertools.pairwise(parts):
                where = [p for p in sorted(index.members.get(f"{a}.{b}", ())) if not is_test(p) and not is_doc(p)]
                if where and len(where) <= MAX_DEFINERS:
                    for p in where:
                        r.get(p).add("member", w / len(where), Kind.SYMBOL, f"defines {a}.{b}")
            continue
        if len(ident) < 3:
            continue
        where = [p for p in sorted(index.defs.get(ident, ())) if not is_test(p) and not is_doc(p)]
        if len(where) == 1:
            r.defining.add(where[0])
        if where and len(where) <= MAX_DEFINERS:
            for p in where:
                r.get(p).add("symbol", w / len(where), Kind.SYMBOL, f"defines {ident}")
    for phrase in m.phrases:
        where = [p for p in sorted(index.classes.get(phrase, ())) if not is_test(p) and not is_doc(p)]
        if where and len(where) <= MAX_DEFINERS and phrase not in {i.lower() for i in m.identifiers}:
            for p in where:
                r.get(p).add(
                    "phrase", 1.0 / len(where), Kind.SYMBOL, f"defines the class the text spells out ({phrase})"
                )


# -------------------------------------------------------------------------------------------- content


def _literals(m: Mentions, index: TreeIndex, r: Ranking) -> None:
    """Files holding, verbatim, a message the text quotes (an error a program printed): one `git grep`."""
    if not m.messages or index.base is None:
        return
    found = grep_fixed(index.repo_path, index.base, m.messages)
    for msg, paths in found.items():
        paths = [p for p in paths if not is_test(p) and not is_doc(p)]
        if paths and len(paths) <= MAX_DEFINERS:
            for p in paths:
                r.get(p).add("literal", 1.0 / len(paths), Kind.CONTENT, f"holds the message '{msg[:60]}'")


def query_terms(m: Mentions) -> dict[str, float]:
    """The text's search terms, each weighted by the most telling place it occurs."""
    out: dict[str, float] = defaultdict(float)
    for name in (*m.identifiers, *m.words):
        w = _weight(m, name)
        for part in name.split("."):
            for t in terms(part):
                out[t] = max(out[t], w)
    return dict(out)


def content(
    index: TreeIndex, query: Mapping[str, float], limit: int = TOP_CONTENT, kind: str = "source"
) -> list[tuple[str, float]]:
    """BM25 of the query over the tree's files of one kind (`kinds.path_class`: source, doc or config;
    tests are not searched), best first."""
    n = max(1, len(index.facts))
    avg = index.avg_length() or 1.0
    idf = {}
    for t in query:
        df = index.df.get(t, 0)
        if df:
            idf[t] = math.log(1 + (n - df + 0.5) / (df + 0.5))
    if not idf:
        return []
    scored = []
    for path, facts in index.facts.items():
        tf = facts.tf
        if not tf or path_class(path) != kind:
            continue
        norm = K1 * (1 - B + B * facts.length / avg)
        s = 0.0
        for t, weight in idf.items():
            f = tf.get(t)
            if f:
                s += query[t] * weight * f * (K1 + 1) / (f + norm)
        if s > 0:
            scored.append((s, path))
    scored.sort(reverse=True)
    return [(p, s) for s, p in scored[:limit]]


def _content(m: Mentions, index: TreeIndex, r: Ranking) -> None:
    query = query_terms(m)
    for kind, limit in (("source", TOP_CONTENT), ("doc", TOP_DOCS), ("config", TOP_CONFIG)):  # ranked apart
        found = content(index, query, limit, kind)
        if not found:
            continue
        top = found[0][1]
        prefix = "" if kind == "source" else f"{kind}_"  # docs and settings weigh apart (`score`)
        for rank, (p, s) in enumerate(found):
            c = r.get(p)
            c.features[f"{prefix}content"] = s / top
            c.features[f"{prefix}content_rank"] = 1.0 / (1 + rank)
            if rank < 5:
                why = f"its words are among the text's best matches in its kind of file ({kind}, #{rank + 1})"
                c.add(f"{prefix}content_top", 1.0, Kind.CONTENT, why)


# -------------------------------------------------------------------------------------------- history


def _history(m: Mentions, history: History, index: TreeIndex, r: Ranking) -> None:
    """Past changes described in similar words: BM25 over their descriptions, their files weighted by it
    (words seen only on import lines and in sessions left out)."""
    q = tokens(" ".join(n.replace(".", " ") for n in (*m.identifiers, *m.words) if not m.weak(n)))
    if not q:
        return
    first = max(0, len(history.changes) - history.window)
    n = len(history.changes) - first
    scores: dict[int, float] = defaultdict(float)
    for t in sorted(q):  # one order whatever the hash seed: sums and ties come out the same every run
        hits = [i for i in history.index.get(t, ()) if i >= first]
        if hits and (n < 20 or len(hits) <= n / 2):  # a word most changes say names nothing
            idf = math.log(1 + n / len(hits))
            for i in hits:
                scores[i] += idf
    best = sorted(scores.items(), key=lambda t: (-t[1], -t[0]))[:TOP_HISTORY]  # a tie: the newer change
    if not best:
        return
    top = best[0][1]
    for i, s in best:
        change = history.changes[i]
        files = [f for f in change.files if f in index.blobs]
        if not files or len(change.files) > 20:
            continue
        for f in files:
            r.get(f).add(
                "history",
                (s / top) / len(files),
                Kind.HISTORY,
                f"touched by a past change in similar words ({change.sha[:8]})",
            )


def _cochange(history: History, index: TreeIndex, r: Ranking, seeds: Iterable[str]) -> None:
    for p in seeds:
        n = history.count.get(p, 0)
        if n < 2:
            continue
        for g, k in history.pairs[p].most_common(8):
            if g in index.blobs and k >= 2:
                r.get(g).add("cochange", k / n, Kind.COCHANGE, f"changed with {p} in {k} of its {n} past changes")


def _hot(history: History, r: Ranking) -> None:
    top = max(history.count.values(), default=0)
    if not top:
        return
    for c in r:
        c.features["hot"] = math.log1p(history.count.get(c.path, 0)) / math.log1p(top)


# ------------------------------------------------------------------------------------------------ all

SEED_FEATURES = ("path", "trace_inner", "link", "module", "member", "symbol", "stem", "name")


def length(text: str) -> float:
    """How long a text is, 0 (20 words or fewer: a commit subject) to 1 (200 or more: a ticket)."""
    words = max(1, len(re.findall(r"\w+", text)))
    return min(1.0, max(0.0, (math.log(words) - math.log(20)) / (math.log(200) - math.log(20))))


_DOC_WORDS = frozenset(
    {"doc", "docs", "document", "documents", "documented", "documentation", "typo", "typos", "readme"}
    | {"tutorial", "guide", "changelog"}
)
"""Title words that ask for a documentation change."""


def asks_for_docs(text: str) -> bool:
    """The title is about documentation (`document using gevent`, `fix typo`, `docs: ...`)."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    return any(w in _DOC_WORDS for w in re.findall(r"[a-z]+", first.lower()))


def rank(m: Mentions, text: str, index: TreeIndex, history: History | None) -> Ranking:
    """Every file with some evidence, and its features."""
    r = Ranking(index, length(text), asks_for_docs(text), reports(text))
    _paths(m, index, r)
    _frames(m, index, r)
    _links(m, index, r)
    _modules(m, index, r)
    _stems(m, index, r)
    _symbols(m, index, r)
    if not has_body(text):
        r.defining.clear()
    _content(m, index, r)
    _literals(m, index, r)
    if history is not None:
        _history(m, history, index, r)
        seeds = [c.path for c in r if any(c.features.get(f, 0) > 0.3 for f in SEED_FEATURES) and not is_test(c.path)]
        _cochange(history, index, r, seeds[:10])
        _hot(history, r)
    return r
