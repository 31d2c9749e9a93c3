"""Claim paths: normalisation, prefix-aware overlap, glob matching and ambiguity. Pure, no I/O.

A claim path is a repo-relative POSIX string: a file or a name that may be either (`src/a.py`, `src`),
a directory (`src/`, it ends with `/`), the root (`ROOT`, the empty string), a glob pattern
(`src/*.py`, `docs/**`): `*`, `?` and `[...]` match within one path segment, `**` any number of segments;
or an addition (`changelog.d/+`, see `addition`): a new file in a directory, its name not known yet.

Overlap is decided on path segments, and every doubt resolves to "overlap": a name without a trailing
slash may be a directory, so `src` overlaps `src/a.py` and `src/`; the only paths that do not overlap
are those where neither is a segment-prefix of the other (`src/a.py` and `src/ab.py`). A pattern meets a
path when it matches it, or may match something under it; two patterns meet unless their literal parts
tell them apart (conservatively: `src/*.py` and `src/*.md` meet). An addition meets what holds its
directory (`changelog.d/`, an ancestor, ROOT), never a file (an existing file is not the new one) nor
another addition (two new files are two files): news-fragment adders run together, and a release that
folds their directory waits for them.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from functools import lru_cache

from orchestrator.core.models import ROOT, Claim, ClaimSource, Policy

__all__ = [
    "NEW",
    "ROOT",
    "ClaimError",
    "PathIndex",
    "added_in",
    "addition",
    "ambiguity",
    "ancestors",
    "describe",
    "foresees",
    "glob_prefix",
    "is_addition",
    "is_glob",
    "literal",
    "matches",
    "name_of",
    "normalize",
    "normalize_all",
    "overlapping",
    "overlaps",
    "reaches",
    "split_mergeable",
]

_DRIVE = re.compile(r"^[A-Za-z]:")
_GLOB = frozenset("*?[")
_CLASS = re.compile(r"(?:[^\[]|\[!?\]?[^\]]*\])*")
"""A segment whose every `[` opens a closed character class."""


NEW = "+"
"""The last segment of an addition (`changelog.d/+`): a new file in that directory."""


class ClaimError(ValueError):
    """A path that cannot be a claim; the message says what is wrong and what to do."""


@lru_cache(maxsize=65536)
def normalize(path: str) -> str:
    """Return `path` as a normalised repo-relative claim path, or raise `ClaimError`.

    Leading `./`, repeated `/` and `.` segments go; `""`, `"."` and `"./"` are `ROOT`; a trailing `/`
    (or a trailing `/.`) marks a directory and is kept. Rejected: absolute paths (`/x`, `C:\\x`, `C:x`),
    `..` segments, NUL bytes, git internals (a `.git` segment anywhere, any case) and backslashes.
    Backslashes are rejected rather than converted: on POSIX `a\\b` is one legal file name, so turning it
    into `a/b` could make a claim name a different path than the one the job touches.
    """
    if "\0" in path:
        raise ClaimError(f"claim path {path!r} contains a NUL byte: name a real repo-relative path")
    if path.startswith("/") or _DRIVE.match(path):
        raise ClaimError(f"claim path {path!r} is absolute: give it relative to the repository root")
    if "\\" in path:
        raise ClaimError(f"claim path {path!r} contains a backslash: separate directories with '/'")
    parts = path.split("/")
    is_dir = parts[-1] in ("", ".")
    segments = [p for p in parts if p not in ("", ".")]
    for seg in segments:
        if seg == "..":
            raise ClaimError(f"claim path {path!r} has a '..' segment: name the path inside the repository")
        if seg.lower() == ".git":
            raise ClaimError(f"claim path {path!r} is inside git internals (.git): claim working-tree files")
        if "**" in seg and seg != "**":
            raise ClaimError(f"claim path {path!r}: '**' must be a whole segment (`src/**/x.py`), not part of a name")
        if "[" in seg and not _CLASS.fullmatch(seg):
            raise ClaimError(f"claim path {path!r} has an unclosed '[': quote a literal '[' as '[[]'")
    if not segments:
        return ROOT
    return "/".join(segments) + ("/" if is_dir else "")


def literal(path: str) -> str:
    """A file's own name as a claim path: glob characters in it (`pages/[id].tsx`) quoted, so the claim
    names that file and no pattern (`pages/[[]id].tsx`). Raises `ClaimError` like `normalize`."""
    quoted = re.sub(r"([*?\[])", r"[\1]", path)
    return normalize(quoted)


def addition(directory: str) -> str:
    """The claim path of a new file in the tree's `directory` (`changelog.d/` → `changelog.d/+`; ROOT → `+`).
    Raises `ClaimError` like `literal`."""
    d = name_of(literal(directory))
    return f"{d}/{NEW}" if d else NEW


def is_addition(path: str) -> bool:
    """True for an addition (`changelog.d/+`): a new file in a directory, no file of the tree."""
    return path == NEW or path.endswith("/" + NEW)


def added_in(path: str) -> str | None:
    """The directory an addition adds its new file to (`changelog.d/+` → `changelog.d/`, `+` → ROOT); None for any
    other claim path."""
    if not is_addition(path):
        return None
    return path[: -len(NEW)]


def foresees(claimed: str, touched: str) -> bool:
    """True when the claim path `claimed` names the touched file `touched` (`overlaps`), or is an addition to the
    directory `touched` lies under: a new file there is what it claimed (its name was not known; as the evidence for it
    counts, `plan.manifests`, any file under the directory the job touched, not only one it added). For judging a claim
    against what a job did (precision, recall), never for admission: there an addition meets no file."""
    if (d := added_in(claimed)) is not None:
        return touched.startswith(d) and touched != d
    return overlaps(claimed, touched)


def describe(path: str) -> str:
    """A claim path as a person or an agent reads it: an addition as the new file it is (`changelog.d/+` → `a new
    file in changelog.d/`), the root as `/ (the whole repository)`, any other path as it is."""
    if (d := added_in(path)) is not None:
        return f"a new file in {d}" if d else "a new file in the repository"
    return path if path else "/ (the whole repository)"


def normalize_all(paths: Iterable[str]) -> frozenset[str]:
    """Normalise every path (see `normalize`); the first bad one raises `ClaimError`."""
    return frozenset(normalize(p) for p in paths)


def name_of(path: str) -> str:
    """The path without its directory marker: `src/` and `src` name the same thing."""
    return path[:-1] if path.endswith("/") else path


@lru_cache(maxsize=65536)
def ancestors(name: str) -> tuple[str, ...]:
    """The strict ancestors of a path name (no trailing slash), outermost first, ROOT included.

    `a/b/c` → `("", "a", "a/b")`; ROOT has none. Names, not directories: `a/b/` is named `a/b`.
    """
    if not name:
        return ()
    out = [ROOT]
    i = name.find("/")
    while i != -1:
        out.append(name[:i])
        i = name.find("/", i + 1)
    return tuple(out)


def is_glob(path: str) -> bool:
    """True when a claim path is a pattern (`*`, `?` or `[` in it)."""
    return not _GLOB.isdisjoint(path)


def glob_prefix(path: str) -> str:
    """The literal directory part of a pattern (`src/*.py` → `src/`, `*.py` → ROOT); a plain path as it is."""
    if not is_glob(path):
        return path
    cut = min(i for i in (path.find(c) for c in _GLOB) if i != -1)
    return path[: path.rfind("/", 0, cut) + 1]


def _segments_meet(ns: tuple[str, ...], gs: tuple[str, ...], gdir: bool) -> bool:
    """Can the pattern segments `gs` match the name `ns`, or a path under `ns` (a name may be a directory)?"""
    if not gs:
        return not ns or gdir  # a directory pattern holds everything under it
    if not ns:
        return True  # something under the name may match what is left of the pattern
    if gs[0] == "**":
        return _segments_meet(ns, gs[1:], gdir) or _segments_meet(ns[1:], gs, gdir)
    return fnmatch.fnmatchcase(ns[0], gs[0]) and _segments_meet(ns[1:], gs[1:], gdir)


def _glob_meets(path: str, pattern: str) -> bool:
    name = name_of(path)
    ns = tuple(name.split("/")) if name else ()
    return _segments_meet(ns, tuple(name_of(pattern).split("/")), pattern.endswith("/"))


def overlaps(a: str, b: str) -> bool:
    """True when two normalised claim paths may name a common file.

    Equal names overlap, and so does any path with any path under it: `src/` and `src` both overlap
    `src/a.py`; ROOT overlaps everything. `src/a.py` does not overlap `src/ab.py`. A pattern overlaps a
    path it matches or that may hold a match (`src/*.py` meets `src/api.py` and `src/`, not `src/x.md`);
    two patterns overlap when their literal directory parts do. An addition overlaps only what may hold its
    directory (`d/+` meets `d/`, `d` and ROOT, not `d/x.rst` nor another `d/+`).
    """
    if is_addition(a) and is_addition(b):
        return False  # two new files: each job names its own
    ga, gb = is_glob(a), is_glob(b)
    if ga and gb:
        return overlaps(glob_prefix(a), glob_prefix(b))
    if ga or gb:
        path, pattern = (b, a) if ga else (a, b)
        return _glob_meets(path, pattern)
    na, nb = name_of(a), name_of(b)
    if na == nb or not na or not nb:
        return True
    short, long = (na, nb) if len(na) < len(nb) else (nb, na)
    return long.startswith(short) and long[len(short)] == "/"


class PathIndex:
    """A set of claim paths indexed for overlap tests in O(depth) per query.

    It keeps every path's name and every strict ancestor of every name: a query meets the index when
    its name is one of those, or when one of its own ancestors is a name in the index. An addition keeps
    only its ancestors (it is no name another path can meet), and as a query meets only by them.
    """

    __slots__ = ("_added", "_globs", "_names", "_under")

    def __init__(self, paths: Iterable[str] = ()) -> None:
        self._added: set[str] = set()
        """Additions: met by name only by a pattern."""
        self._names: set[str] = set()
        self._under: set[str] = set()
        self._globs: list[str] = []
        """Patterns: rare, so tested one by one."""
        for p in paths:
            self.add(p)

    def add(self, path: str) -> None:
        if is_glob(path):
            self._globs.append(path)
            return
        name = name_of(path)
        (self._added if is_addition(path) else self._names).add(name)
        self._under.update(ancestors(name))

    def __bool__(self) -> bool:
        return bool(self._names or self._added or self._globs)

    def meets(self, path: str) -> bool:
        """True when `path` overlaps some path of the index."""
        if self._globs and any(overlaps(path, g) for g in self._globs):
            return True
        if is_glob(path):
            return any(overlaps(path, n) for n in (*self._names, *self._added))
        name = name_of(path)
        if not is_addition(path) and (name in self._names or name in self._under):
            return True
        names = self._names
        return any(a in names for a in ancestors(name))

    def meeting(self, paths: Iterable[str]) -> frozenset[str]:
        """The paths of `paths` that overlap some path of the index."""
        return frozenset(p for p in paths if self.meets(p))


def overlapping(claim_paths: Iterable[str], other_paths: Iterable[str]) -> frozenset[str]:
    """The paths of `claim_paths` that overlap any path of `other_paths` (normalised paths)."""
    return PathIndex(other_paths).meeting(claim_paths)


def outside(actual: Iterable[str], claim_paths: Iterable[str]) -> frozenset[str]:
    """The paths a job touched that its claim does not hold (no claimed file, directory or pattern covers them)."""
    touched = frozenset(actual)
    return touched - overlapping(touched, claim_paths)


@lru_cache(maxsize=256)
def _compile(patterns: tuple[str, ...]) -> re.Pattern[str] | None:
    if not patterns:
        return None
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns))


def _basename(name: str) -> str:
    return name[name.rfind("/") + 1 :]


def matches(path: str, patterns: Iterable[str]) -> bool:
    """True when a glob of `patterns` matches the whole path or its base name (case-sensitive fnmatch).

    `CHANGES*` matches `CHANGES.rst` and `docs/CHANGES.md`; `.github/workflows/*` matches
    `.github/workflows/ci.yaml` (`*` also crosses `/`, as in fnmatch). A directory matches on its own
    name (`docs/` is tested as `docs`), never on what it may contain: see `reaches` for that. ROOT
    matches nothing.
    """
    rx = _compile(patterns if isinstance(patterns, tuple) else tuple(patterns))
    name = name_of(path)
    if rx is None or not name:
        return False
    return rx.match(name) is not None or ("/" in name and rx.match(_basename(name)) is not None)


@lru_cache(maxsize=256)
def _literal_dirs(patterns: tuple[str, ...]) -> tuple[str, ...]:
    """For each pattern with a `/`: its literal directory prefix (`.github/workflows/*` → `.github/workflows/`)."""
    out = []
    for p in patterns:
        if "/" not in p:
            continue
        cut = min((i for i in (p.find(c) for c in "*?[") if i != -1), default=len(p))
        prefix = p[: p.rfind("/", 0, cut) + 1]
        if prefix:
            out.append(prefix)
    return tuple(out)


def reaches(path: str, patterns: Iterable[str]) -> bool:
    """True when `path` matches a pattern, or may hold a path that does (used for barriers).

    A claim may hold what a pattern names when the pattern's literal directory prefix lies under it:
    `.github/` and `.github/workflows/` reach `.github/workflows/*`; `docs` reaches `docs/conf.py`;
    ROOT reaches everything. Patterns without a `/` (`pyproject.toml`, `*.lock`) match base names at
    any depth, so they would make every directory a barrier: they count only by name. Patterns that start
    with a wildcard (`*/migrations/*`) likewise count only by name. A job's actual paths are checked
    too, so a barrier file it really touches is caught while it runs.
    """
    pats = patterns if isinstance(patterns, tuple) else tuple(patterns)
    if is_glob(path):
        return bool(pats) and reaches(glob_prefix(path), pats)  # a pattern may match any file of its directory
    if matches(path, pats):
        return True
    name = name_of(path)
    if not name:
        return bool(pats)
    return any(d.startswith(name + "/") for d in _literal_dirs(pats))


def split_mergeable(
    paths: Iterable[str], patterns: Iterable[str], extra: frozenset[str] = frozenset()
) -> tuple[frozenset[str], frozenset[str]]:
    """Split paths into (counted, mergeable).

    A path is mergeable (union-merged, e.g. a changelog: never an overlap) when it is in `extra`, or a
    glob of `patterns` or of `extra` (gitattributes-style entries) matches it. Directories and ROOT always
    count: they may hold files that do not merge by union.
    """
    pats = tuple(patterns) + tuple(sorted(extra))
    counted: set[str] = set()
    mergeable: set[str] = set()
    for p in paths:
        if p and not p.endswith("/") and not is_glob(p) and (p in extra or matches(p, pats)):
            mergeable.add(p)
        else:
            counted.add(p)
    return frozenset(counted), frozenset(mergeable)


def ambiguity(claim: Claim, policy: Policy, repo: str = "") -> str | None:
    """None when the claim is specific and confident enough to run beside others; else a short reason.

    The threshold is the repo's own when calibration raised it (`Policy.raised`). With `Policy.risk` above 0,
    a local-evidence claim is judged by its estimated risk instead (admission compares it pairwise), and
    one without an estimate is ambiguous."""
    # A predicted new fragment alone says nothing of the change; a declared one (a person's, or an agent's asked ahead
    # of its write: claim growth) says all there is: a new file in that directory.
    declared = claim.source is ClaimSource.DECLARED
    files = [p for p in claim.paths if declared or not is_addition(p)]
    if not files and not (policy.risk > 0 and claim.source is ClaimSource.EVIDENCE and claim.risk is not None):
        return "empty claim"  # a text that names nothing runs beside others only at its record's base rate
    if ROOT in claim.paths:
        return "root-wide claim"
    if policy.risk > 0 and claim.source is ClaimSource.EVIDENCE:
        # Local evidence is judged pairwise by its estimated risk; without an estimate it runs alone.
        return None if claim.risk is not None else "risk unknown: the repository's record cannot estimate it"
    threshold = policy.min_confidence_for(repo) if repo else policy.min_confidence
    if claim.confidence < threshold:
        raised = " (raised: this repo's confident claims kept missing)" if threshold > policy.min_confidence else ""
        return f"confidence {claim.confidence:.2f} below {threshold:.2f}{raised}"
    return None
