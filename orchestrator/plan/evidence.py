"""Local evidence: what the text names, read against the repository at the base revision. No network.

The ranking (`plan.rank`) gives every file the text points at its features and reasons; `plan.focus` turns
them into probabilities (the shipped model, recalibrated on the repository's own record, `plan.record`),
claims the smallest set holding what the job most likely touches, and estimates the risk beyond it.
Around that: files generated from claimed ones come with them (a manifest's lock file), a claim holding
most of a directory claims the directory, and dependency updates and releases claim what the manifests
say (`plan.manifests`).

Confidence is the estimated chance that the job touches nothing outside its claim, and only a claim whose
most likely file has two independent kinds of evidence (a name or a traceback, a definition, its
contents, its history) is called confident; admission reads the risk instead when `plan.risk` is set.
"""

from __future__ import annotations

import math
import posixpath
import re
import subprocess
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

from orchestrator.core import claims
from orchestrator.core.models import Claim, ClaimSource, Risk
from orchestrator.core.risk import KNOWN, area_of, mapped
from orchestrator.git import repos
from orchestrator.plan import index as index_mod
from orchestrator.plan import manifests
from orchestrator.plan.base import Evidence, Kind, Note, Plan
from orchestrator.plan.focus import GROUND_P, Focus, focus, spread
from orchestrator.plan.history import History, title
from orchestrator.plan.rank import rank
from orchestrator.plan.score import Calibration
from orchestrator.plan.text import mentions

STRONG = 0.8
"""The most a claim's confidence says with one kind of evidence behind it is `WEAK`; with two, its coverage."""
WEAK = 0.3
"""Some evidence, but too loose to run beside others on confidence alone."""
RANKED = 20
"""Files shown in a plan's ranking."""
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


def local_plan(
    repo: Path,
    base: str,
    text: str,
    history: History | None = None,
    ignore: Sequence[str] = (),
    calibration: Calibration | None = None,
) -> Plan:
    """The claim local evidence supports for `text` at `base` (blocking: run it in a thread).

    `ignore`: union-mergeable patterns (changelogs), never claimed and never a miss. `calibration`: the
    repository's record (`plan.record`); without one the probabilities are the shipped model's and the
    risk is unknown. A dependency update or a release also claims the manifests or version files it
    touches (`manifests`).
    """
    plan = _evidence_plan(repo, base, text, history, ignore, calibration)
    subject = title(text)
    files = tree_files(str(repo), base)
    known = kind_files(repo, base, subject, files, history, ignore)
    if known is not None:
        kind, found, why = known
        plan = _kind_plan(plan, kind, found, why, subject, files, history, ignore, calibration)
    return _with_additions(plan, manifests.additions(history, subject, files.paths, ignore) if history else [])


def _with_additions(plan: Plan, added: Sequence[str]) -> Plan:
    """The plan with the new files its kind of change adds (news fragments a release folds) in its claim."""
    new = [p for p in added if p not in plan.claim.paths]
    if not new:
        return plan
    why = "past changes like it added a file here (a news fragment a release folds)"
    ev = tuple(Evidence(p, Kind.HISTORY, why) for p in new)
    claim = replace(plan.claim, paths=plan.claim.paths | frozenset(new))
    return replace(plan, claim=claim, evidence=plan.evidence + ev)


def kind_files(
    repo: Path, base: str, subject: str, files: Files, history: History | None, ignore: Sequence[str] = ()
) -> tuple[manifests.Kind, list[str], str] | None:
    """For a change of a known kind (a dependency update, a release, a recurring change: `manifests`), the
    files the tree at `base` or its past changes of the kind say it touches, and why; else None."""
    kind = manifests.kind_of(subject)
    if kind is None and history is not None and (found := manifests.recurring(history, subject, files.paths, ignore)):
        return manifests.Kind.RECURRING, found, "past changes with this title touched it"
    if kind is None:
        return None
    if kind is manifests.Kind.DEPENDENCY and (name := manifests.dependency(subject)):
        # a name that is the repo's own file or directory (`Update README.md to v2`) is no dependency
        own = name.rstrip("/") in files.paths or name.rstrip("/") in files.dirs
        found = [] if own else _grep_files(repo, base, manifests.declaration_pattern(name), manifests.MANIFESTS)
        why = f"declares {name}"
    elif kind is manifests.Kind.DEPENDENCY:
        name = manifests.group(subject) or ""
        found = _group_files(repo, base, name, files)
        why = f"a manifest of the dependabot group {name}"
    else:
        setting = _grep_files(repo, base, manifests.VERSION_PATTERN, manifests.VERSION_HOLDERS)
        found = manifests.version_files(setting, history)
        if history is not None:
            found += [f for f in manifests.release_companions(history, files.paths, ignore) if f not in found]
        why = "holds the version, or past releases touched it"
    return (kind, found, why) if found else None


def _kind_plan(
    plan: Plan,
    kind: manifests.Kind,
    found: Sequence[str],
    why: str,
    subject: str,
    files: Files,
    history: History | None,
    ignore: Sequence[str],
    calibration: Calibration | None,
) -> Plan:
    """The claim of a change of a known kind: the files the tree (or its past changes of the kind) say it
    touches, trusted as far as those past changes stayed inside such a claim, and its risk beyond it what
    they measure (`manifests.escapes`), not the area rates of text evidence."""
    ev = _Collector()
    for e in plan.evidence:
        ev.add(e.path, e.kind, e.why)
    for p in found:
        ev.add(p, Kind.NAMED, why)
    wanted = frozenset(found) | plan.claim.paths  # what else the text points at comes along
    paths = _claimable(_covered(_directories(_generated(wanted, files, ev), files, ev)))
    record = manifests.record(history, kind, paths, ignore, subject)
    n, inside = manifests.trusted(record, kind, paths)
    closed = n >= manifests.MIN_SEEN and inside / n >= manifests.CLOSED
    if closed and plan.claim.confidence <= WEAK:
        # the kind's record holds it: what the text's loose evidence adds is left to the measured risk
        paths = _claimable(_covered(_directories(_generated(frozenset(found), files, ev), files, ev)))
        record = manifests.record(history, kind, paths, ignore, subject)
        n, inside = manifests.trusted(record, kind, paths)
        closed = n >= manifests.MIN_SEEN and inside / n >= manifests.CLOSED
    notes = [n_ for n_ in plan.notes if n_[0] is not Note.NAMES_NOTHING]
    if closed:
        confidence = 0.6
    else:
        confidence = WEAK
        notes.append((Note.WIDE, f"{inside} of the {n} past changes of this kind ({kind}) stayed inside such a claim"))
    held = claims.PathIndex(paths)
    risk = plan.claim.risk  # too few past changes of the kind: the text's evidence says what the risk is
    if n >= manifests.MIN_SEEN and calibration is not None and not calibration.unknown:
        near, rest = manifests.escapes(record, paths, files.paths)
        area = claim_area(paths)
        near_ = tuple((claims.literal(p), q) for p, q in near if _valid(p))
        risk = Risk(
            near_,
            rest,
            area,
            (),
            calibration.nonmerge(area),
            calibration.meet,
            KNOWN,
            calibration.floor,
            calibration.scale,
        )
    if risk is not None:
        risk = replace(risk, near=tuple((p, q) for p, q in risk.near if not held.meets(p)))
    claim = Claim(paths, confidence, ClaimSource.EVIDENCE, risk)
    return Plan(claim, tuple(ev.evidence), "", str(Kind.NAMED), tuple(notes))


def claim_area(paths: Iterable[str]) -> str:
    """The area most of a claim's paths are in."""
    areas = [area_of(p) for p in sorted(paths)]
    return max(dict.fromkeys(areas), key=areas.count) if areas else ""


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


def _evidence_plan(
    repo: Path, base: str, text: str, history: History | None, ignore: Sequence[str], calibration: Calibration | None
) -> Plan:
    index = index_mod.for_repo(repo)
    with index.lock:
        index.move(base)
        m = mentions(text)
        s = spread(rank(m, text, index, history), history, index)
        f = focus(s, calibration or Calibration(), ignore)
        files = tree_files(str(repo), base)
    return focused_plan(f, files, calibration)


def focused_plan(f: Focus, files: Files, calibration: Calibration | None) -> Plan:
    """The plan a focus makes at a tree (pure): its claim, with directories and generated files, and its risk."""
    if f.apart:
        return _apart_plan(f)
    if not f.names or not f.claim:
        return _blind_plan(f, calibration)
    ev = _Collector()
    top = f.ranked[0]
    for r in f.ranked:
        if r.path in f.claim:
            for kind, why in r.reasons or [(Kind.CONTENT, "the most likely file")]:
                ev.add(r.path, kind, f"{why} (p {r.p:.2f})")
    paths = _claimable(_covered(_directories(_generated(f.claim, files, ev), files, ev)))
    confident = top.independent >= 2
    confidence = round(f.coverage if confident else min(f.coverage, WEAK), 3)
    notes: list[tuple[Note, str]] = []
    if calibration is None:
        notes.append((Note.NO_RECORD, "the repository's record is too short to estimate the risk: the job runs alone"))
    elif calibration.unknown:
        notes.append((Note.UNCALIBRATED, f"{calibration.unknown}: risk unknown, the job runs alone"))
    elif not f.grounded:
        top = f.ranked[0]
        why = (
            f"its most likely file {top.path} is only {top.p:.0%} likely: a guess, its alternatives claimed with it"
            if top.p < GROUND_P
            else f"nothing the text names points at {top.path}, its most likely file: a guess, its alternatives "
            "claimed with it"
        )
        notes.append((Note.GUESSED, why))
    elif f.coverage < 0.5:
        worst = ", ".join(f"{p} {q:.0%}" for p, q in f.risk.near[:3])
        notes.append((Note.WIDE, f"{1 - f.coverage:.0%} chance it touches files outside the claim ({worst})"))
    held = claims.PathIndex(paths)  # files a claimed directory holds are no risk beyond the claim
    near = tuple((claims.literal(p), q) for p, q in f.risk.near if _valid(p) and not held.meets(claims.literal(p)))
    risk = replace(f.risk, near=near) if calibration is not None and not calibration.unknown else None
    basis = next((str(k) for k in _BASIS_ORDER if k in top.kinds), str(Kind.CONTENT))
    claim = Claim(paths, confidence, ClaimSource.EVIDENCE, risk)
    return Plan(claim, tuple(ev.evidence), "", basis, tuple(notes), ranking=_ranking(f))


def _apart_plan(f: Focus) -> Plan:
    """A short text that says what is wrong, not what to change, and names no file, frame nor `Class.member`
    (`Focus.apart`): its claim is the whole repository, and the note says why, with the file it most likely is in."""
    top = f.ranked[0] if f.ranked else None
    likely = f"its most likely file, {top.path} ({top.p:.0%}), is a guess; " if top is not None else ""
    why = (
        "the text reports what is wrong, not what to change, and names no file (by its path or name), no traceback "
        f"frame, no `Class.member`: where the work is cannot be told ({likely}tickets like it meet where no plan "
        "foresaw), so it runs apart from the repository's other jobs. Name the files (`Paths: a.py`), a traceback, or "
        "the change to make, to run beside them"
    )
    claim = Claim(frozenset({claims.ROOT}), 0.0, ClaimSource.EVIDENCE, None)
    return Plan(claim, (), "", "none", ((Note.APART, why),), ranking=_ranking(f))


def _blind_plan(f: Focus, calibration: Calibration | None) -> Plan:
    """A text that names nothing of the repository claims nothing. Where the record is good, its risk beside any
    job is the repository's base rate (`Calibration.blind_meet`, how often its changes that named nothing met their
    neighbours, times its share of meetings that would not merge); else it runs alone."""
    why = "the text names no path, file, module or identifier of the repository"
    if calibration is None or calibration.unknown:
        return Plan(Claim(), (), "", "none", ((Note.NAMES_NOTHING, why),), ranking=_ranking(f))
    meet = calibration.blind_meet
    nonmerge = calibration.nonmerge("")
    risk = Risk((), 0.0, "", (), nonmerge, (0.0, _logit(meet)), "", meet, calibration.scale)
    rate = mapped(calibration.scale, meet * nonmerge) if calibration.scale else meet * nonmerge
    why += f": weighed at the repository's base rate (meet {meet:.1%} \u00d7 no merge {nonmerge:.0%}: {rate:.1%})"
    claim = Claim(frozenset(), 0.0, ClaimSource.EVIDENCE, risk)
    return Plan(claim, (), "", "none", ((Note.NAMES_NOTHING, why),), ranking=_ranking(f))


def _logit(p: float) -> float:
    p = min(max(p, 1e-6), 1.0 - 1e-6)
    return math.log(p / (1.0 - p))


def _valid(path: str) -> bool:
    try:
        claims.literal(path)
    except claims.ClaimError:
        return False
    return True


def _claimable(paths: Iterable[str]) -> frozenset[str]:
    """Tree paths as claim paths: glob characters in a file's name quoted (it names that file, no pattern);
    a path no claim can hold (none should reach here: they are the tree's own) is left out."""
    return frozenset(claims.literal(p) for p in paths if _valid(p))


_BASIS_ORDER = (Kind.NAMED, Kind.TRACEBACK, Kind.SYMBOL, Kind.HISTORY, Kind.TEST, Kind.COCHANGE, Kind.CONTENT)


def _ranking(f: Focus) -> tuple[dict[str, object], ...]:
    return tuple({**r.to_json(), "claimed": r.path in f.claim} for r in f.ranked[:RANKED])


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
