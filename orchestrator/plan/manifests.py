"""Dependency updates and releases: the files such a change touches, read from the manifests at the base.

A dependency update (`Bump actions/checkout from 3 to 4`, `Update httpcore requirement from <0.17 to
<0.18`) touches the manifests that declare that dependency; a release (`v2.32.0`, `Release version 3.0.0`)
touches the files that hold the version, and what the repo's past releases touched beside them (a
changelog). Both are found in the tree at the base (`git grep`: real evidence, not a guess), and trusted
only as far as the repo's own past changes of the same kind stayed inside such files: in a repo where
dependency updates also fix the code the new version flags, the claim is kept but not trusted.

Pure: the patterns and the record; `evidence` runs the greps.
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from enum import StrEnum
from functools import lru_cache

from orchestrator.core import claims
from orchestrator.plan.history import VERSION_TOKEN, History, tokens

MANIFESTS = (
    ".github/workflows/*",
    ".github/actions/*",
    ".pre-commit-config.yaml",
    "*requirements*.txt",
    "*requirements*.in",
    "requirements/*",
    "*pyproject.toml",
    "*setup.cfg",
    "*setup.py",
    "*tox.ini",
    "*package.json",
    "*Cargo.toml",
    "*go.mod",
    "*Gemfile",
    "*Dockerfile",
    "*.gemspec",
    "*composer.json",
)
"""Files that declare dependencies (git pathspecs: `*` crosses `/`)."""
LOCKFILES = ("*.lock", "*-lock.json", "*-lock.yaml", "*go.sum")
"""Files generated from the manifests."""
VERSION_HOLDERS = (*MANIFESTS, "*__init__.py", "*version.py", "*__version__.py")
"""Files where a project's version is set."""
VERSION_PATTERN = r"""^\s*["']?(__version__|version)["']?\s*[:=]\s*["']?v?[0-9]"""
"""A line setting the version (`version = "3.0.0.dev"`, `__version__ = "2.31.0"`, `"version": "1.0.0"`)."""
SUPPORT = 0.5
"""The share of past releases that must have touched a file for a release to claim it."""
MIN_SEEN = 3
"""Past changes of the kind needed before their record can make a claim confident."""
CLOSED = 0.8
"""The share of them that must have stayed inside such a claim."""
ADDS = 0.05
"""The share of the past changes of a kind that must have added a file to a directory releases fold (a news
fragment) for a change of that kind to claim a new file there. Low: such a claim meets only a release (and a
claim of the directory itself), which then waits for the jobs queued before it, as its changelog needs; in a
project whose pull requests land as several commits, one of each adds the fragment."""
ADDS_RECENT = 50
"""The most recent past changes of a kind that say how often such a change adds a news fragment."""
RECENT = 10
"""The most recent past changes of a kind that say what such a change touches now (a project that moved
from `requirements/*.txt` to `uv.lock` updates its dependencies in the new files)."""

_DEPENDENCY = re.compile(
    r"^(?:\w+\(deps[\w-]*\):\s*)?(?:bump|update|upgrade)\s+(?!the\b|to\b|all\b|dev\b|min\b)"
    r"([A-Za-z0-9][\w.:/@-]*)\s+(?:requirement\s+)?(?:from\s+\S+\s+)?(?:to\s+)?[<>=~!^]*v?\d",
    re.I,
)
_GROUP = re.compile(r"^(?:bump|update)\s+the\s+(\S+)\s+group\b", re.I)
_URL_BUMP = re.compile(r"^(?:bump|update|upgrade)\s+(https?://\S+)", re.I)
_RELEASE = re.compile(r"\b(release|bump)\s+(version|v?\d)", re.I)
_GENERIC = frozenset({"python", "version", "versions", "dependencies", "deps", "requirements", "pin", "pins"})


class Kind(StrEnum):
    DEPENDENCY = "dependency"
    RELEASE = "release"
    RECURRING = "recurring"
    """A change whose title, numbers and refs aside, past changes had word for word (`update dev
    dependencies`, `Bump https://github.com/astral-sh/ruff-pre-commit (#7598)`): it touches what they did."""


def dependency(title: str) -> str | None:
    """The dependency a title says is updated (`Bump actions/checkout from 3 to 4` → `actions/checkout`)."""
    m = _DEPENDENCY.match(title.strip()) or _URL_BUMP.match(title.strip())
    if m is None or m.group(1).lower() in _GENERIC:
        return None
    return m.group(1).rstrip(".,:")


def group(title: str) -> str | None:
    """The dependabot group a title says is updated (`Bump the github-actions group with 4 updates`)."""
    m = _GROUP.match(title.strip())
    return m.group(1) if m else None


DEPENDABOT = (".github/dependabot.yml", ".github/dependabot.yaml")
"""Where dependabot's configuration lives: each update block's ecosystem, directory and groups."""
ACTIONS_DIR = ".github/workflows"


def group_directory(config: str, name: str) -> tuple[str, str] | None:
    """(ecosystem, directory) of the dependabot update block that defines the group `name`: the files
    such a group's update touches are that ecosystem's manifests in that directory."""
    for block in re.split(r"(?m)^\s*-\s+(?=package-ecosystem:)", config)[1:]:
        eco = re.search(r"package-ecosystem:\s*[\"']?([\w-]+)", block)
        where = re.search(r"(?m)^\s*directory:\s*[\"']?([^\s\"']+)", block)
        if eco and where and re.search(rf"(?m)^\s+{re.escape(name)}:\s*$", block):
            return eco.group(1), where.group(1).strip("/")
    return None


def is_release(title: str) -> bool:
    """A title that says a release: only a version number (`v2.32.0`), or `Release version 3.0.0`."""
    return tokens(title) == frozenset({VERSION_TOKEN}) or _RELEASE.search(title) is not None


@lru_cache(maxsize=8192)
def kind_of(title: str) -> Kind | None:
    """What kind of change a title says (cached: each past change's title is asked on every plan of the kind)."""
    if dependency(title) is not None or group(title) is not None:
        return Kind.DEPENDENCY
    return Kind.RELEASE if is_release(title) else None


def declaration_pattern(name: str) -> str:
    """A line declaring the dependency `name` with a version or a ref after it (`mypy==1.0`, `"rich>=10"`,
    `uses: actions/checkout@v3`, `- repo: https://github.com/x/y`), for `git grep -i -E`."""
    return rf"""(^|[^[:alnum:]_.-]){re.escape(name)}[[:space:]]*(==|>=|<=|~=|!=|<|>|@|/|\[|;|,|"|'|$)"""


def is_manifest(path: str) -> bool:
    return any(fnmatch.fnmatchcase(path, p) for p in (*MANIFESTS, *LOCKFILES))


def past(history: History, kind: Kind, title: str = "") -> list[tuple[str, ...]]:
    """The files of the recent past changes of this kind (a recurring change: those with `title`'s shape),
    oldest first."""
    if kind is Kind.RECURRING:
        want = shape(title)
        return [c.files for c in history.changes[-history.window :] if want and shape(c.subject) == want]
    return [c.files for c in history.changes[-history.window :] if kind_of(c.subject) is kind]


@lru_cache(maxsize=8192)
def shape(title: str) -> tuple[str, ...]:
    """A title's words without what differs between instances of one recurring change: numbers, versions,
    refs, hashes. Fewer than two words is no shape (`fix`, `wip`: they say nothing of what is touched)."""
    t = re.sub(r"#\d+|\b[0-9a-f]{7,40}\b|\bv?\d[\w.+-]*", " ", title.lower())
    words = tuple(re.findall(r"[a-z]+", t))
    return words if len(words) >= 2 else ()


def recurring(history: History, title: str, present: frozenset[str], ignore: Sequence[str]) -> list[str]:
    """The files (still in the tree) that at least SUPPORT of the past changes with `title`'s shape
    touched (of the `RECENT` last), when there are MIN_SEEN of them; else none."""
    alike = past(history, Kind.RECURRING, title)
    if len(alike) < MIN_SEEN:
        return []
    return _common(alike[-RECENT:], present, ignore)


def _common(changes: Sequence[tuple[str, ...]], present: frozenset[str], ignore: Sequence[str]) -> list[str]:
    count: Counter[str] = Counter(f for files in changes for f in set(files))
    return sorted(
        f
        for f, k in count.items()
        if f in present and k >= 2 and k >= SUPPORT * len(changes) and not (ignore and claims.matches(f, tuple(ignore)))
    )


def release_companions(history: History, present: frozenset[str], ignore: Sequence[str]) -> list[str]:
    """Files (still in the tree) that at least SUPPORT of the past releases touched, and the directories whose
    files the `RECENT` last of them folded (`folded`: a project that took to news fragments lately folds them now)."""
    releases = past(history, Kind.RELEASE)
    return _common(releases, present, ignore) + folded(releases[-RECENT:], present, ignore)


def folded(changes: Sequence[tuple[str, ...]], present: frozenset[str], ignore: Sequence[str]) -> list[str]:
    """The directories (`d/`) where at least SUPPORT of the past releases (two or more) touched files the tree
    no longer has: news fragments a release folds into its changelog and deletes. Each fragment is a file of its
    own, seen once, so no file-level count finds them; a release claims their directory, and a job adding one
    there waits for it (or it for the job) instead of running beside it and folding a fragment that is not on
    its base yet."""
    count: Counter[str] = Counter()
    for files in changes:
        gone = {posixpath.dirname(f) for f in files if f not in present and "/" in f}
        count.update(d for d in gone if not (ignore and claims.matches(d + "/", tuple(ignore))))
    return sorted(d + "/" for d, k in count.items() if k >= 2 and k >= SUPPORT * len(changes))


def additions(history: History, title: str, present: frozenset[str], ignore: Sequence[str]) -> list[str]:
    """The new files (`claims.addition`) a change titled `title` adds to the directories the recent releases folded
    (`folded`: news fragments): one per directory where two or more, and ADDS, of the ADDS_RECENT last past changes
    of its kind (a dependency update, a recurring change with its title's shape, else the ordinary changes), MIN_SEEN
    or more, touched a file. A release claims such a directory, so it waits for the jobs that add a fragment there
    (or they for it) instead of folding one that is not on its base yet; adders stay apart from each other (each
    adds its own file). A release adds none."""
    kind = kind_of(title)
    if kind is Kind.RELEASE:
        return []
    dirs = folded(past(history, Kind.RELEASE)[-RECENT:], present, ignore)
    if not dirs:
        return []
    alike = past(history, Kind.RECURRING, title) if kind is None else []
    if len(alike) < MIN_SEEN:
        alike = [c.files for c in history.changes[-history.window :] if kind_of(c.subject) is kind]
    alike = alike[-ADDS_RECENT:]
    if len(alike) < MIN_SEEN:
        return []
    out = []
    for d in dirs:
        added = sum(any(f.startswith(d) for f in files) for files in alike)
        if added >= 2 and added >= ADDS * len(alike):
            try:
                out.append(claims.addition(d))
            except claims.ClaimError:
                continue  # a directory no claim can name (a backslash): landing order decides
    return out


def record(
    history: History | None, kind: Kind, claim: Iterable[str], ignore: Sequence[str], title: str = ""
) -> list[tuple[str, ...]]:
    """The past changes of this kind such a change is judged by (their files, union-mergeable ones left
    out): a dependency update, past updates that touched a file of `claim` (where this dependency is
    declared); a release or a recurring change, all past ones of its kind. The `RECENT` last of them."""
    if history is None:
        return []
    index = claims.PathIndex(claim)
    out = []
    for files in past(history, kind, title):
        rest = tuple(f for f in files if not (ignore and claims.matches(f, tuple(ignore))))
        if rest and not (kind is Kind.DEPENDENCY and not index.meeting(rest)):
            out.append(rest)
    return out[-RECENT:]


def trusted(changes: Sequence[tuple[str, ...]], kind: Kind, claim: Iterable[str]) -> tuple[int, int]:
    """Of the past changes of the kind (`record`): (how many, how many stayed inside what such a change
    claims now). A dependency update is inside when it touched only manifests; the others when within
    `claim`."""
    index = claims.PathIndex(claim)
    inside = 0
    for rest in changes:
        if kind is Kind.DEPENDENCY:
            inside += all(is_manifest(f) for f in rest)
        else:
            inside += len(index.meeting(rest)) == len(rest)
    return len(changes), inside


def escapes(
    changes: Sequence[tuple[str, ...]], claim: Iterable[str], present: frozenset[str]
) -> tuple[list[tuple[str, float]], float]:
    """The risk beyond `claim` that the past changes of the kind (`record`) measure: each file of the tree
    (`present`) some of them touched outside it, with the share that did (add-one-half: seen once in 9 is
    15%, not 11%); and for any other file, the chance of a file never seen there (as many as were seen only
    once, plus one, in n + 2), spread over the tree."""
    index = claims.PathIndex(claim)
    n = len(changes)
    count: Counter[str] = Counter(f for rest in changes for f in set(rest) if not index.meets(f))
    once = sum(1 for k in count.values() if k == 1)
    near = sorted(((f, (k + 0.5) / (n + 1)) for f, k in count.items() if f in present), key=lambda t: (-t[1], t[0]))
    return near, (once + 1) / (n + 2) / max(1, len(present))


def version_files(found: Iterable[str], history: History | None) -> list[str]:
    """Of the files setting a version: those past releases touched, else those at the least depth (the
    project's own version, not an example's)."""
    ps = sorted(found)
    touched = {f for files in past(history, Kind.RELEASE) for f in files} if history is not None else set()
    return [p for p in ps if p in touched] or _shallowest(ps)


def _shallowest(ps: list[str]) -> list[str]:
    if not ps:
        return []
    depth = min(p.count("/") for p in ps)
    return [p for p in ps if p.count("/") == depth or posixpath.basename(p) == "__version__.py"]
