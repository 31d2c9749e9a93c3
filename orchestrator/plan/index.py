"""A repository's tree at one base, indexed for planning: its files, what each source file defines, the
words it uses (for BM25-style retrieval) and the modules it imports. No checkout: blobs are read from
the object store.

Building the index of a django-sized tree takes a second or two; after that, moving it to another base
applies the tree diff between the two (a commit or two apart: milliseconds), and every blob is read
once (facts are cached by blob id, so a blob shared by many bases costs nothing more). One `TreeIndex`
per repository (`for_repo`), used under its lock (plans run in threads).
"""

from __future__ import annotations

import posixpath
import re
import subprocess
import threading
from collections import Counter, OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pygit2

from orchestrator.git import repos

MAX_BYTES = 512 * 1024
"""Larger files (generated tables, vendored bundles) are listed, not read."""
CODE_EXT = frozenset(
    """py pyi pyx pxd js jsx ts tsx mjs cjs go rs rb java kt kts scala c h cc cpp cxx hpp hh cs php swift m mm
    lua pl pm r jl ex exs erl hs ml mli clj dart vue svelte sh bash zsh ps1 sql""".split()  # noqa: SIM905 - a word list reads better as prose
)
"""Extensions of the files whose contents are read (definitions, words, imports)."""
DOC_EXT = frozenset({"rst", "md", "txt", "adoc"})
"""Documentation: read for its words only."""
CONFIG_EXT = frozenset({"toml", "cfg", "ini", "yaml", "yml"})
"""Settings and manifests: read for their words only."""
BLOB_CACHE = 120_000
"""Most blob facts kept (least recently used go first)."""

_WORD = re.compile(rb"[A-Za-z_][A-Za-z0-9_]+")
_PY_SCOPE = re.compile(
    rb"^([ \t]*)(?:"
    rb"(?:async[ \t]+)?(def|class)[ \t]+([A-Za-z_]\w*)"  # a definition
    rb"|(self\.)?([A-Za-z_]\w*)[ \t]*(?::[^=\n]*)?=(?!=)"  # an assignment to a name, or to an attribute of self
    rb"|(?:if|elif|else|try|except|finally|for|while|with|async[ \t]+(?:for|with))\b[^\n]*:[ \t]*(?:#[^\n]*)?$"
    rb")",  # a compound statement's header: it closes the definitions it is not inside of
    re.M,
)
"""The lines of Python source that tell what it defines, and in which scope."""
_PY_IMPORT = re.compile(rb"^[ \t]*(?:from[ \t]+(\.*[\w.]*)[ \t]+import\b|import[ \t]+([\w.]+))", re.M)
_OTHER_DEF = re.compile(
    rb"^[ \t]*(?:export[ \t]+)?(?:default[ \t]+)?(?:pub(?:\([^)]*\))?[ \t]+)?(?:async[ \t]+)?(?:static[ \t]+)?"
    rb"(?:function|func|fn|struct|enum|trait|interface|type|class|module|def|const|let|var)[ \t]+"
    rb"(?:\([^)]*\)[ \t]*)?([A-Za-z_]\w*)",
    re.M,
)
_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")
_NOISE = frozenset(
    """self cls def class return import from none true false and not the for with this that pass elif else
    raise try except finally lambda yield while args kwargs assert print len str int isinstance super init
    var let const function new null undefined void public private static""".split()  # noqa: SIM905 - a word list reads better as prose
)
"""Words every source file uses: they say nothing about which file a text means."""


def terms(word: str) -> list[str]:
    """The search terms of one word: itself lower-cased and, for `snake_case` or `CamelCase`, its parts
    (`_print_SeqFormula` → `_print_seqformula`, `print`, `seqformula`, `seq`, `formula`)."""
    low = word.lower()
    out = [low] if low not in _NOISE else []
    chunks = [c for c in word.split("_") if c]
    for chunk in chunks:
        c = chunk.lower()
        if len(chunks) > 1 and len(c) > 2 and c not in _NOISE and c not in out:
            out.append(c)
        if not chunk.islower() and not chunk.isupper():
            parts = [p.lower() for p in _CAMEL.findall(chunk)]
            if len(parts) > 1:
                out += [p for p in parts if len(p) > 2 and p not in _NOISE and p not in out]
    return out


@lru_cache(maxsize=200_000)
def _terms(raw: bytes) -> tuple[str, ...]:
    return tuple(terms(raw.decode()))


@dataclass(frozen=True, slots=True)
class Facts:
    """What one file content defines, says and imports."""

    defs: frozenset[str]
    """Names it defines: classes, functions, methods, module-level assignments."""
    members: frozenset[str]
    """`Class.member` for the methods and attributes its classes define (Python)."""
    classes: frozenset[str]
    """The classes (or types) among `defs`."""
    tf: dict[str, int]
    """Search terms and how often each occurs."""
    length: int
    """Terms in all."""
    imports: tuple[str, ...]
    """Modules it imports (Python; relative imports keep their dots)."""


EMPTY = Facts(frozenset(), frozenset(), frozenset(), {}, 0, ())


def _python_defs(data: bytes, defs: set[str], members: set[str], classes: set[str]) -> None:
    """What Python source defines, each name in its scope: functions, classes and assignments outside any
    function (at module level, or under a module-level `if`/`try`: `if TYPE_CHECKING:` aliases), and for
    each class its methods, its class attributes and the attributes its methods assign to `self`."""
    stack: list[tuple[int, bool, str]] = []  # (indent, is a class, name) of the definitions around a line
    for m in _PY_SCOPE.finditer(data):
        indent = len(m.group(1).expandtabs(4))
        if m.group(2):  # def or class
            name = m.group(3).decode()
            is_class = m.group(2) == b"class"
            while stack and stack[-1][0] >= indent:
                stack.pop()
            if stack and stack[-1][1]:
                members.add(f"{stack[-1][2]}.{name}")
            if not stack or is_class or indent <= 4:
                defs.add(name)
            if is_class:
                classes.add(name)
            stack.append((indent, is_class, name))
        elif m.group(5) is None:  # a block header
            while stack and stack[-1][0] >= indent:
                stack.pop()
        else:  # an assignment reads its scope without closing any: a continuation line that looks like one
            k = len(stack)  # (of a call, of a string) must not end the class around it
            while k and stack[k - 1][0] >= indent:
                k -= 1
            if not k:
                if not m.group(4):
                    defs.add(m.group(5).decode())
            elif m.group(4):  # self.x = ...: an attribute of the class whose method assigns it
                if k >= 2 and not stack[k - 1][1] and stack[k - 2][1]:
                    members.add(f"{stack[k - 2][2]}.{m.group(5).decode()}")
            elif stack[k - 1][1]:
                members.add(f"{stack[k - 1][2]}.{m.group(5).decode()}")


def facts_of(path: str, data: bytes, words: bool = True) -> Facts:
    """Read one file's content (pure); `words` False leaves its search terms out (tests are not searched)."""
    ext = path.rsplit(".", 1)[-1].lower() if "." in posixpath.basename(path) else ""
    defs: set[str] = set()
    members: set[str] = set()
    classes: set[str] = set()
    imports: list[str] = []
    if ext in DOC_EXT or ext in CONFIG_EXT:
        pass  # documentation and settings define nothing: their words only
    elif ext in ("py", "pyi", "pyx", "pxd"):
        _python_defs(data, defs, members, classes)
        for m in _PY_IMPORT.finditer(data):
            mod = (m.group(1) or m.group(2) or b"").decode()
            if mod:
                imports.append(mod)
    else:
        defs.update(m.group(1).decode() for m in _OTHER_DEF.finditer(data))
        classes.update(d for d in defs if d[:1].isupper())
    tf: Counter[str] = Counter()
    for raw, n in Counter(_WORD.findall(data)).items() if words else ():
        for t in _terms(raw):
            tf[t] += n
    return Facts(
        frozenset(defs),
        frozenset(members),
        frozenset(classes),
        dict(tf),
        sum(tf.values()),
        tuple(dict.fromkeys(imports)),
    )


class _BlobCache:
    """Facts by blob id, least recently used dropped first; shared by every repository (ids are content)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._d: OrderedDict[str, Facts] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> Facts | None:
        with self._lock:
            hit = self._d.get(key)
            if hit is not None:
                self._d.move_to_end(key)
            return hit

    def put(self, key: str, facts: Facts) -> None:
        with self._lock:
            self._d[key] = facts
            while len(self._d) > self.size:
                self._d.popitem(last=False)


_BLOBS = _BlobCache(BLOB_CACHE)


_UNSEARCHED = re.compile(r"(^|/)(tests?|testing)/|(^|/)test_[^/]*$|_tests?\.\w+$")


def _searched_not(path: str) -> bool:
    """Tests: read for definitions and imports, not searched for words."""
    return _UNSEARCHED.search(path) is not None


_READ = CODE_EXT | DOC_EXT | CONFIG_EXT


def readable(path: str) -> bool:
    """A file whose content is read: source code and documentation, by their extensions."""
    base = posixpath.basename(path)
    return "." in base and base.rsplit(".", 1)[1].lower() in _READ


class TreeIndex:
    """One repository's tree at `base`, with per-file facts and the tables retrieval needs.

    Mutable: `move(base)` brings it to another commit. Callers hold `lock` from `move` until they are done
    reading (`plan.rank` does).
    """

    def __init__(self, repo: Path) -> None:
        self.repo_path = repo
        self.lock = threading.RLock()
        self.base: str | None = None
        self.blobs: dict[str, str] = {}
        """path → blob id, every file of the tree."""
        self.facts: dict[str, Facts] = {}
        """path → facts, for readable files."""
        self.defs: dict[str, set[str]] = {}
        """name → paths defining it."""
        self.members: dict[str, set[str]] = {}
        """`Class.member` → paths defining it."""
        self.classes: dict[str, set[str]] = {}
        """lower-cased class name → paths defining it (`latexprinter` for `LatexPrinter`)."""
        self.df: Counter[str] = Counter()
        """term → files using it."""
        self.total = 0
        """Terms in all readable files."""
        self.by_name: dict[str, set[str]] = {}
        """base name → paths."""
        self.by_stem: dict[str, set[str]] = {}
        """lower-case stem (the name up to its first dot) → paths."""
        self.dir_files: Counter[str] = Counter()
        """directory → files under it, at any depth (ROOT, "", holds all)."""

    # -- reading -------------------------------------------------------------------------------------

    @property
    def files(self) -> Iterable[str]:
        return self.blobs.keys()

    def is_dir(self, name: str) -> bool:
        """A directory of the tree (not the root)."""
        d = name.rstrip("/")
        return bool(d) and self.dir_files.get(d, 0) > 0 and d not in self.blobs

    def avg_length(self) -> float:
        return self.total / max(1, len(self.facts))

    # -- moving --------------------------------------------------------------------------------------

    def move(self, base: str) -> None:
        """Bring the index to the commit `base` (a sha): a full build the first time, a tree diff after."""
        if base == self.base:
            return
        repo = repos.open_repo(self.repo_path)
        commit = repo.revparse_single(base).peel(pygit2.Commit)
        if self.base is None:
            for path, oid in _walk(repo, commit.tree, ""):
                self._add(repo, path, oid)
        else:
            old = repo.revparse_single(self.base).peel(pygit2.Commit)
            diff = old.tree.diff_to_tree(commit.tree)
            for delta in diff.deltas:
                if delta.old_file.path in self.blobs and delta.status_char() in "DMRT":
                    self._remove(delta.old_file.path)
                if delta.status_char() != "D" and delta.new_file.mode in (0o100644, 0o100755, 0o120000):
                    if delta.new_file.path in self.blobs:
                        self._remove(delta.new_file.path)
                    self._add(repo, delta.new_file.path, str(delta.new_file.id))
        self.base = str(commit.id)

    def _add(self, repo: pygit2.Repository, path: str, oid: str) -> None:
        self.blobs[path] = oid
        base = posixpath.basename(path)
        self.by_name.setdefault(base, set()).add(path)
        self.by_stem.setdefault(_stem(base), set()).add(path)
        for d in _dirs(path):
            self.dir_files[d] += 1
        if not readable(path):
            return
        facts = _BLOBS.get(oid)
        if facts is None:
            blob = repo.get(oid)
            data = blob.data if isinstance(blob, pygit2.Blob) and blob.size <= MAX_BYTES else b""
            facts = facts_of(path, data, not _searched_not(path)) if data and b"\0" not in data[:8000] else EMPTY
            _BLOBS.put(oid, facts)
        self.facts[path] = facts
        for name in facts.defs:
            self.defs.setdefault(name, set()).add(path)
        for name in facts.members:
            self.members.setdefault(name, set()).add(path)
        for name in facts.classes:
            self.classes.setdefault(name.lower(), set()).add(path)
        self.df.update(facts.tf.keys())
        self.total += facts.length

    def _remove(self, path: str) -> None:
        self.blobs.pop(path, None)
        base = posixpath.basename(path)
        _discard(self.by_name, base, path)
        _discard(self.by_stem, _stem(base), path)
        for d in _dirs(path):
            self.dir_files[d] -= 1
            if self.dir_files[d] <= 0:
                del self.dir_files[d]
        facts = self.facts.pop(path, None)
        if facts is None:
            return
        for name in facts.defs:
            _discard(self.defs, name, path)
        for name in facts.members:
            _discard(self.members, name, path)
        for name in facts.classes:
            _discard(self.classes, name.lower(), path)
        self.df.subtract(facts.tf.keys())
        self.total -= facts.length


def _discard(table: dict[str, set[str]], key: str, path: str) -> None:
    paths = table.get(key)
    if paths is not None:
        paths.discard(path)
        if not paths:
            del table[key]


def _stem(base: str) -> str:
    return (base.split(".", 1)[0] if not base.startswith(".") else base).lower()


def _dirs(path: str) -> Iterator[str]:
    """The directories holding `path`, ROOT ("") first."""
    yield ""
    i = path.find("/")
    while i != -1:
        yield path[:i]
        i = path.find("/", i + 1)


def _walk(repo: pygit2.Repository, tree: pygit2.Tree, prefix: str) -> Iterator[tuple[str, str]]:
    for entry in tree:
        if entry.type_str == "tree":
            sub = repo.get(entry.id)
            if isinstance(sub, pygit2.Tree):
                yield from _walk(repo, sub, f"{prefix}{entry.name}/")
        elif entry.type_str == "blob":
            yield f"{prefix}{entry.name}", str(entry.id)


def grep_fixed(repo: Path, base: str, strings: Iterable[str]) -> dict[str, list[str]]:
    """For each string: the readable files at `base` holding it verbatim (one `git grep -F`, no checkout)."""
    wanted = list(dict.fromkeys(strings))
    if not wanted:
        return {}
    args = ["git", "-C", str(repo), "grep", "-F", "-I", "-o", "--no-color"]
    for s in wanted:
        args += ["-e", s]
    args += [base, "--", *(f"*.{e}" for e in sorted(CODE_EXT))]
    out = subprocess.run(
        args, capture_output=True, text=True, env=repos.git_env(repo), stdin=subprocess.DEVNULL, timeout=60
    )
    if out.returncode not in (0, 1):
        raise RuntimeError(f"git grep failed: {out.stderr.strip()[:200]}")
    found: dict[str, list[str]] = {}
    for line in out.stdout.splitlines():
        try:
            _, path, match = line.split(":", 2)
        except ValueError:
            continue
        paths = found.setdefault(match, [])
        if path not in paths:
            paths.append(path)
    return found


_INDEXES: dict[str, TreeIndex] = {}
_INDEXES_LOCK = threading.Lock()


def for_repo(repo: Path | str) -> TreeIndex:
    """The one index of a repository (created empty; `move` builds it)."""
    key = str(repo)
    with _INDEXES_LOCK:
        index = _INDEXES.get(key)
        if index is None:
            index = _INDEXES[key] = TreeIndex(Path(key))
        return index
