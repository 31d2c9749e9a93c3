"""Local evidence: what the text names, read against the repository at the base revision. No network.

Sources, each adding `Evidence` with its reason:
- named: paths, file names, modules and file stems the text names (`src/api.py`, `api.py`, `flask.cli`,
  "blueprints" → `blueprints.py`, `docs/blueprints.rst`);
- symbol: files that define an identifier the text names (`git grep` at the base, no checkout);
- test: the tests that go with a claimed source file (`test_x.py`, `x_test.go`, `x.test.ts`, imports);
- cochange: files that changed together with a claimed file in most past commits (`History`);
- history: when the text names nothing of the repo, files of past changes described in the same words.

Confidence says how much the claim rests on: a path or definition the text names is strong; a bare
word matching a file stem, or similar past changes, is weaker. `calibration` reports how well each did.
"""

from __future__ import annotations

import posixpath
import re
import subprocess
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from orchestrator.core import claims
from orchestrator.core.models import Claim, ClaimSource
from orchestrator.git import repos
from orchestrator.plan import manifests
from orchestrator.plan.base import Evidence, Kind, Note, Plan
from orchestrator.plan.history import History, title
from orchestrator.plan.text import Mentions, mentions

STRONG = 0.8
"""The text names the paths or the definitions: confident."""
STEM = 0.6
"""A word of the text is a file's stem, or past changes in the same words agree."""
WEAK = 0.3
"""Some evidence, but too loose to run beside others."""
CLOSED = 0.8
"""The share of past changes a claim must have contained for local evidence to be confident in it."""
WIDEN_MAX = 6
"""Most co-changed files added to make a claim hold the repo's past changes to its files."""
SIMILAR = 0.34
"""Word overlap (Jaccard) at which a past change counts as described in the same words."""
NEIGHBOURS = 6
"""Most similar past changes looked at."""
MIN_SEEN = 3
"""Past changes to the named files needed before their record decides the confidence."""
WORD_SUPPORT = 0.5
"""The share of past changes whose description has a word that must have touched the file the word names
for the word to count as naming it (else a bare word matching a file's name is weak evidence)."""
MAX_PER_NAME = 4
"""A name matching more files than this says little: it is left out."""
DIR_SHARE = 0.5
"""A claim holding at least this share of a directory's files (two or more) claims the directory."""
DIR_MIN_FILES = 4
"""Directories with fewer files than this are claimed file by file."""
LOCKS = {
    "pyproject.toml": ("uv.lock", "poetry.lock", "pdm.lock"),
    "package.json": ("package-lock.json", "yarn.lock", "pnpm-lock.yaml"),
    "Cargo.toml": ("Cargo.lock",),
    "go.mod": ("go.sum",),
    "Gemfile": ("Gemfile.lock",),
    "composer.json": ("composer.lock",),
}
"""Manifests and the lock files generated from them beside them: a change to one rewrites the other."""
_COMPILED = {".in": ".txt", ".txt": ".in"}
"""`requirements/x.in` and the `x.txt` pip-compile makes of it."""
_TEST_DIR = re.compile(r"(^|/)(tests?|spec|__tests__|testing)/")
_GENERIC_STEMS = frozenset({"__init__", "index", "main", "conf", "setup", "readme", "license", "init", "mod", "lib"})


@dataclass
class Files:
    """The file list of one tree, indexed by base name and stem."""

    paths: frozenset[str]
    dirs: frozenset[str]
    by_name: dict[str, list[str]] = field(default_factory=dict)
    by_stem: dict[str, list[str]] = field(default_factory=dict)
    by_dir: dict[str, list[str]] = field(default_factory=dict)
    """The files directly in each directory."""

    @classmethod
    def of(cls, paths: Iterable[str]) -> Files:
        ps = frozenset(paths)
        dirs = {d for p in ps for d in claims.ancestors(p) if d}
        by_name: dict[str, list[str]] = defaultdict(list)
        by_stem: dict[str, list[str]] = defaultdict(list)
        by_dir: dict[str, list[str]] = defaultdict(list)
        for p in sorted(ps):
            base = posixpath.basename(p)
            by_name[base].append(p)
            by_stem[_stem(base).lower()].append(p)
            by_dir[posixpath.dirname(p)].append(p)
        return cls(ps, frozenset(dirs), dict(by_name), dict(by_stem), dict(by_dir))


def _stem(base: str) -> str:
    return base.split(".", 1)[0] if not base.startswith(".") else base


def is_test(path: str) -> bool:
    base = posixpath.basename(path)
    return bool(
        _TEST_DIR.search(path)
        or base.startswith("test_")
        or re.search(r"(_test|_spec|\.test|\.spec)\.\w+$", base)
        or base.startswith("Test")
    )


def _git(repo: Path, *args: str) -> str:
    # A repository's object store only: no work tree is read (`-C` plus a revision in every call).
    out = subprocess.run(
        ["git", "-C", str(repo), *args],
        capture_output=True,
        text=True,
        env=repos.git_env(Path(repo)),
        stdin=subprocess.DEVNULL,
        timeout=60,
        check=False,
    )
    if out.returncode not in (0, 1):  # git grep exits 1 when nothing matched
        raise RuntimeError(f"git {args[0]} failed: {out.stderr.strip()[:200]}")
    return out.stdout


@lru_cache(maxsize=32)
def tree_files(repo: str, base: str) -> Files:
    """Every file at `base` (a commit sha: the cache key never goes stale)."""
    return Files.of(p for p in _git(Path(repo), "ls-tree", "-r", "-z", "--name-only", base).split("\0") if p)


def definition_pattern(names: Sequence[str]) -> str:
    alt = "|".join(re.escape(n) for n in names)
    return (
        rf"^\s*((async\s+)?def|class|function|func|fn|struct|enum|trait|interface|type|const|let|var|module)"
        rf"\s+(\([^)]*\)\s*)?({alt})\b|^\s*({alt})\s*[:=]"
    )


def definitions(repo: Path, base: str, names: Sequence[str]) -> dict[str, list[str]]:
    """For each identifier: the files at `base` that define it (`git grep` on the tree, no checkout)."""
    if not names:
        return {}
    out = _git(repo, "grep", "-I", "-n", "-E", "-e", definition_pattern(names), base, "--")
    found: dict[str, list[str]] = defaultdict(list)
    for line in out.splitlines():
        try:
            _, path, _, text = line.split(":", 3)
        except ValueError:
            continue
        for n in names:
            if re.search(rf"\b{re.escape(n)}\b", text) and path not in found[n]:
                found[n].append(path)
    return found


def importers(repo: Path, base: str, module: str) -> list[str]:
    """Test files at `base` that import a Python module (`from pkg.mod import`, `import pkg.mod`)."""
    dotted = "[[:alnum:]_.]*"  # POSIX brackets: `\w` is not a class inside `[...]` for git grep -E
    pattern = rf"^\s*(from\s+{dotted}\b{re.escape(module)}\b{dotted}\s+import|import\s+{dotted}\b{re.escape(module)}\b)"
    out = _git(repo, "grep", "-l", "-I", "-E", "-e", pattern, base, "--", "*test*")
    return [line.split(":", 1)[1] for line in out.splitlines() if ":" in line]


def tests_for(path: str, files: Files) -> list[str]:
    """Test files that go with a source file by naming convention (`test_x.py`, `x_test.go`, `x.test.ts`)."""
    base = posixpath.basename(path)
    stem = _stem(base)
    if is_test(path) or stem.lower() in _GENERIC_STEMS:
        return []
    names = {f"test_{stem}", f"{stem}_test", f"{stem}.test", f"{stem}.spec", f"{stem}_spec", f"Test{stem}"}
    out = []
    for candidates in (files.by_stem.get(n.lower(), []) for n in names):
        out += [c for c in candidates if is_test(c)]
    return sorted(set(out))


class _Collector:
    def __init__(self) -> None:
        self.evidence: list[Evidence] = []
        self.seen: set[tuple[str, Kind]] = set()

    def add(self, path: str, kind: Kind, why: str) -> None:
        if (path, kind) not in self.seen:
            self.seen.add((path, kind))
            self.evidence.append(Evidence(path, kind, why))

    def paths(self, *kinds: Kind) -> list[str]:
        return list(dict.fromkeys(e.path for e in self.evidence if not kinds or e.kind in kinds))


def _named(m: Mentions, files: Files, ev: _Collector, history: History | None = None) -> bool:
    """Paths, file names and modules the text names; True when one of them is explicit (not a bare word)."""
    explicit = False
    for tok in m.paths:
        if claims.is_glob(tok):
            hits = [p for p in files.paths if claims.overlaps(p, tok)]
            if hits:
                ev.add(tok, Kind.NAMED, f"the text names the pattern {tok} ({len(hits)} files)")
                explicit = True
            continue
        name = tok.rstrip("/")
        if name in files.paths:
            ev.add(name, Kind.NAMED, "the text names this path")
            explicit = True
        elif name in files.dirs:
            ev.add(name + "/", Kind.NAMED, "the text names this directory")
            explicit = True
        elif (
            "." not in posixpath.basename(name)
            and 0 < len(hits := [p for p in files.paths if posixpath.splitext(p)[0] == name]) <= MAX_PER_NAME
        ):
            for p in hits:
                ev.add(p, Kind.NAMED, f"the text names {name}")
            explicit = True
        elif hits := [p for p in files.paths if p.endswith("/" + name)]:
            if len(hits) <= MAX_PER_NAME:
                for p in hits:
                    ev.add(p, Kind.NAMED, f"the text names {name}")
                explicit = True
        elif _new_file(name, files):
            try:
                ev.add(claims.normalize(name), Kind.NAMED, "the text names this file (new at the base)")
                explicit = True
            except claims.ClaimError:
                pass
    for ident in m.identifiers:
        if "." not in ident:
            continue
        rel = ident.replace(".", "/")
        hits = [p for p in files.paths if re.search(rf"(^|/){re.escape(rel)}(\.\w+|/__init__\.py)$", p)]
        if 0 < len(hits) <= MAX_PER_NAME:
            for p in hits:
                ev.add(p, Kind.NAMED, f"the text names the module {ident}")
            explicit = True
    for word in m.words:
        if word in _GENERIC_STEMS:
            continue
        hits = [p for w in _forms(word) for p in files.by_stem.get(w, []) if not is_test(p)]
        if not 0 < len(hits) <= MAX_PER_NAME:
            continue
        n, k = history.word_support(word, hits) if history is not None else (0, 0)
        if n >= MIN_SEEN and k == 0:
            continue  # this repo's history says the word does not mean these files
        confirmed = k >= 2 and k / n >= WORD_SUPPORT
        for p in hits:
            why = f"'{word}' is this file's name"
            why += f" ({k} of the {n} past changes saying it touched it)" if confirmed else ""
            ev.add(p, Kind.NAMED, why)
        explicit = explicit or confirmed
    return explicit


def _forms(word: str) -> list[str]:
    """The word and its singular or plural (`session` matches `sessions.py`, `hooks` matches `hook.py`)."""
    other = word[:-1] if word.endswith("s") and len(word) > 3 else word + "s"
    return [word, other]


def _new_file(name: str, files: Files) -> bool:
    """A path the text names that is not in the tree yet, but plausibly a file to create: its directory
    exists and it has a word-like extension (not a branch name such as `origin/1.1.x`)."""
    parent, base = posixpath.split(name)
    return bool(parent) and parent in files.dirs and re.fullmatch(r"[\w-]+\.[A-Za-z][A-Za-z0-9]{0,7}", base) is not None


def local_plan(
    repo: Path, base: str, text: str, history: History | None = None, ignore: Sequence[str] = ()
) -> Plan:
    """The claim local evidence supports for `text` at `base` (blocking: run it in a thread).

    `ignore`: union-mergeable patterns (changelogs), which never count as a miss. A dependency update or a
    release also claims the manifests or version files it touches (`manifests`), confidently when the
    repo's past changes of that kind stayed inside such files.
    """
    plan = _evidence_plan(repo, base, text, history, ignore)
    kind = manifests.kind_of(title(text))
    if kind is None:
        return plan
    files = tree_files(str(repo), base)
    if kind is manifests.Kind.DEPENDENCY and (name := manifests.dependency(title(text))):
        # a name that is the repo's own file or directory (`Update README.md to v2`) is no dependency
        own = name.rstrip("/") in files.paths or name.rstrip("/") in files.dirs
        found = [] if own else _grep_files(repo, base, manifests.declaration_pattern(name), manifests.MANIFESTS)
        why = f"declares {name}"
    elif kind is manifests.Kind.DEPENDENCY:
        name = manifests.group(title(text)) or ""
        found = _group_files(repo, base, name, files)
        why = f"a manifest of the dependabot group {name}"
    else:
        setting = _grep_files(repo, base, manifests.VERSION_PATTERN, manifests.VERSION_HOLDERS)
        found = manifests.version_files(setting, history)
        if history is not None:
            found += [f for f in manifests.release_companions(history, files.paths, ignore) if f not in found]
        why = "holds the version, or past releases touched it"
    if not found:
        return plan
    ev = _Collector()
    for e in plan.evidence:
        ev.add(e.path, e.kind, e.why)
    for p in found:
        ev.add(p, Kind.NAMED, why)
    paths = _covered(_directories(_generated(plan.claim.paths | frozenset(found), files, ev), files, ev))
    n, inside = manifests.trusted(history, kind, paths, ignore)
    confidence = plan.claim.confidence
    notes = list(plan.notes)
    if n >= manifests.MIN_SEEN and inside / n >= manifests.CLOSED:
        confidence = max(confidence, STEM)
    else:
        notes.append((Note.WIDE, f"{inside} of the {n} past changes of this kind ({kind}) stayed inside such a claim"))
    basis = plan.basis if plan.claim.confidence >= confidence else str(Kind.NAMED)
    return Plan(Claim(paths, confidence, ClaimSource.EVIDENCE), tuple(ev.evidence), "", basis, tuple(notes))


def _covered(paths: frozenset[str]) -> frozenset[str]:
    """The claim without the paths a directory it claims already holds."""
    dirs = [p for p in paths if p.endswith("/")]
    return frozenset(p for p in paths if not any(p != d and p.startswith(d) for d in dirs))


def _group_files(repo: Path, base: str, name: str, files: Files) -> list[str]:
    """The manifests a dependabot group's update touches: its ecosystem's, in its directory."""
    for config in manifests.DEPENDABOT:
        if config in files.paths:
            found = manifests.group_directory(_git(repo, "show", f"{base}:{config}"), name)
            if found is None:
                return []
            eco, d = found
            if eco == "github-actions":
                return sorted(p for p in files.paths if p.startswith(manifests.ACTIONS_DIR + "/"))
            return sorted(p for p in files.by_dir.get(d, ()) if manifests.is_manifest(p))
    return []


def _grep_files(repo: Path, base: str, pattern: str, pathspecs: Sequence[str]) -> list[str]:
    """Files at `base` (among `pathspecs`) with a line matching `pattern` (case-insensitive)."""
    out = _git(repo, "grep", "-l", "-I", "-i", "-E", "-e", pattern, base, "--", *pathspecs)
    return sorted({line.split(":", 1)[1] for line in out.splitlines() if ":" in line})


def _evidence_plan(repo: Path, base: str, text: str, history: History | None, ignore: Sequence[str]) -> Plan:
    m = mentions(text)
    files = tree_files(str(repo), base)
    ev = _Collector()
    explicit = _named(m, files, ev, history)
    idents = [i for i in m.identifiers if "." not in i][:12]
    defined = definitions(repo, base, idents) if idents else {}
    for ident, where in defined.items():
        if 0 < len(where) <= MAX_PER_NAME - 1:
            for p in where:
                ev.add(p, Kind.SYMBOL, f"defines {ident}")
            explicit = True
    seeds = [
        p
        for p in ev.paths()
        if not claims.is_glob(p) and not p.endswith("/") and not (ignore and claims.matches(p, tuple(ignore)))
    ]  # a changelog named in the text says nothing about where the work is
    for p in seeds:
        for t in tests_for(p, files):
            ev.add(t, Kind.TEST, f"the test file of {p} (naming convention)")
        if p.endswith(".py") and not is_test(p):
            module = _stem(posixpath.basename(p))
            if module not in _GENERIC_STEMS:
                for t in importers(repo, base, module)[:MAX_PER_NAME]:
                    ev.add(t, Kind.TEST, f"imports {module}")
    if history is not None:
        for p in seeds:
            for g, together, n in history.cochanged(p)[:MAX_PER_NAME]:
                if g in files.paths:
                    ev.add(g, Kind.COCHANGE, f"changed with {p} in {together} of its {n} past changes")
    notes: list[tuple[Note, str]] = []
    if ev.evidence:
        paths = frozenset(claims.normalize(p) for p in ev.paths())
        if history is not None and seeds:
            paths = _widen(seeds, paths, history, files, ignore, ev)
        paths = _directories(_generated(paths, files, ev), files, ev)
        only_mergeable = all(ignore and claims.matches(p, tuple(ignore)) for p in paths)
        confidence = WEAK if only_mergeable else _anchored_confidence(seeds, paths, explicit, history, ignore, notes)
        basis = Kind.NAMED if explicit or Kind.SYMBOL not in {e.kind for e in ev.evidence} else Kind.SYMBOL
        if confidence < STEM and history is not None:
            similar = _similar(text, history, files, ignore)
            if similar is not None:  # past changes in the same words agree: they carry the claim
                return similar
        return Plan(Claim(paths, confidence, ClaimSource.EVIDENCE), tuple(ev.evidence), "", str(basis), tuple(notes))
    if history is not None:
        similar = _similar(text, history, files, ignore)
        if similar is not None:
            return similar
    notes.append((Note.NAMES_NOTHING, "the text names no path, file, module or identifier of the repository"))
    return Plan(Claim(), (), "", "none", tuple(notes))


def _widen(
    seeds: Sequence[str], paths: frozenset[str], history: History, files: Files, ignore: Sequence[str], ev: _Collector
) -> frozenset[str]:
    """Add, most frequent first, the files past changes to the seeds also touched, until the claim holds
    most of those changes (at most WIDEN_MAX files; none when that is not enough)."""
    n, inside = history.closure(seeds, paths, ignore)
    if n < MIN_SEEN or inside / n >= CLOSED:
        return paths
    added: list[tuple[str, int]] = []
    wider = set(paths)
    for f, k in history.escapes(seeds, paths, ignore).most_common(WIDEN_MAX):
        if f not in files.paths or k < 2:
            break
        wider.add(f)
        added.append((f, k))
        n, inside = history.closure(seeds, wider, ignore)
        if inside / n >= CLOSED:
            for g, kk in added:
                ev.add(g, Kind.COCHANGE, f"touched by {kk} of the {n} past changes to {', '.join(seeds[:2])}")
            return frozenset(wider)
    return paths


def _generated(paths: frozenset[str], files: Files, ev: _Collector) -> frozenset[str]:
    """The files generated from claimed ones (or these from them) beside them: lock files of a manifest,
    a pip-compile `.txt` and its `.in`."""
    out = set(paths)
    for p in sorted(paths):
        d, base = posixpath.split(p)
        stem, ext = posixpath.splitext(base)
        names = [*LOCKS.get(base, ()), *([stem + _COMPILED[ext]] if ext in _COMPILED else [])]
        for name in names:
            if (g := posixpath.join(d, name)) in files.paths and g not in out:
                out.add(g)
                ev.add(g, Kind.COCHANGE, f"generated with {p}")
    return frozenset(out)


def _directories(paths: frozenset[str], files: Files, ev: _Collector) -> frozenset[str]:
    """A claim that holds most of a directory's files claims the directory instead: a change to a set of
    sibling files (workflows, requirements, certificates) touches the ones added there since as well."""
    by_dir: dict[str, list[str]] = defaultdict(list)
    for p in paths:
        if p in files.paths and (d := posixpath.dirname(p)):
            by_dir[d].append(p)
    out = set(paths)
    for d, held in sorted(by_dir.items()):
        n = len(files.by_dir.get(d, ()))
        if len(held) >= 2 and n >= DIR_MIN_FILES and len(held) >= DIR_SHARE * n:
            out.difference_update(held)
            out.add(d + "/")
            ev.add(d + "/", Kind.COCHANGE, f"the claim holds {len(held)} of this directory's {n} files")
    return frozenset(out)


def _anchored_confidence(
    seeds: Sequence[str],
    paths: frozenset[str],
    explicit: bool,
    history: History | None,
    ignore: Sequence[str],
    notes: list[tuple[Note, str]],
) -> float:
    """How far to trust a claim anchored on named files: the repo's own record of past changes to those
    files staying inside such a claim, when it has one; else by how explicitly the text named them."""
    if not explicit:
        return WEAK  # a bare word matching a file's name says little about whether the job touches it
    n, inside = history.closure(seeds, paths, ignore) if history is not None and seeds else (0, 0)
    if n >= MIN_SEEN:
        if inside / n >= CLOSED:
            return STRONG
        notes.append((Note.WIDE, f"only {inside} of the {n} past changes to these files stayed inside this claim"))
        return WEAK
    return STEM


def _similar(text: str, history: History, files: Files, ignore: Sequence[str]) -> Plan | None:
    """Files of past changes described in the same words, trusted when each of them is covered by the
    others (leave-one-out), widened to their directories when that is what makes them agree."""
    near = [c for s, c in history.similar(title(text), limit=NEIGHBOURS) if s >= SIMILAR]  # history keeps titles
    sets = []
    for c in near:  # files deleted since are left out: what is left is what such a change touches now
        kept = frozenset(f for f in c.files if not (ignore and claims.matches(f, tuple(ignore))))
        if len(present := kept & files.paths) * 2 >= len(kept):
            kept = present  # else the change is of another layout of the repo: taken as it was
        if kept:
            sets.append(kept)
    if len(sets) < 2:
        return None
    claim = frozenset().union(*sets)
    if _leave_one_out(sets) < CLOSED:
        dirs = {posixpath.dirname(f) for f in claim}
        if "" in dirs or len(dirs) > 3:
            return None
        sets = [frozenset(posixpath.dirname(f) + "/" for f in s) for s in sets]
        claim = frozenset().union(*sets)
        if _leave_one_out(sets) < CLOSED:
            return None
    ev = _Collector()
    for p in sorted(claim):
        if p in files.paths or (p.endswith("/") and p[:-1] in files.dirs):
            ev.add(p, Kind.HISTORY, f"touched by past changes described in the same words ({len(sets)} of them)")
    if not ev.evidence:
        return None
    paths = _directories(_generated(frozenset(ev.paths()), files, ev), files, ev)
    return Plan(Claim(paths, STEM, ClaimSource.EVIDENCE), tuple(ev.evidence), "", str(Kind.HISTORY))


def _leave_one_out(sets: Sequence[frozenset[str]]) -> float:
    """The share of the sets that the union of the others covers."""
    hits = 0
    for i, s in enumerate(sets):
        others = frozenset().union(*(t for j, t in enumerate(sets) if j != i))
        hits += len(claims.PathIndex(others).meeting(s)) == len(s)
    return hits / len(sets)
