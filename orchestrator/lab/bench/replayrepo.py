"""The repository a jobs-benchmark row replays on, and the commit each job replays with the `replay` runner.

Two sources:

- `synthesise`: a repository built from a touch-pattern history (same paths, same subjects, same order,
  generated contents). The changes before the replayed ones become main's past, so the planner's local
  evidence mines a real history of co-changes and subjects; each replayed change becomes one commit of a
  chain kept off main (`refs/bench/replay`). A change rewrites the first line of each file it touches
  with its own marker, so two changes to one file made side by side conflict (the touch pattern has no
  hunks, so the benchmark assumes the worst); in union-mergeable files (changelogs) it fills a slot of
  its own, which merges cleanly in any order.
- `clone`: a real repository's range `A..B`, cloned (sharing its objects) with main at the first replayed
  change's parent; the jobs replay the range's own authored commits, their messages as the job texts.

Either way a job's text names its commit with `conflict: theirs`: a change recorded on top of one that
has not landed yet still runs, and the daemon's own landing check sees the conflict; and with `end:` the newest
replayed commit made on top of it (`newest`), so that landing after such a later change does not undo it. `lost`
compares main at the end with the recorded end state, file by file; for a real repository `serial` compares it
with the landed changes applied one after another in landing order (a broken landing is a file where
they differ).
"""

from __future__ import annotations

import contextlib
import functools
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pygit2

from orchestrator.core import claims
from orchestrator.git.merging import Mergeable
from orchestrator.lab.bench.history import Change, HistoryError, git
from orchestrator.runners.replay import ReplayError, replayed_on, replayed_tree

REPLAY_REF = "refs/bench/replay"


@dataclass(frozen=True)
class ReplayRepo:
    path: Path
    commits: tuple[str, ...]
    """Per replayed change (by index), the commit its job replays."""
    final: str
    """The commit whose tree is the recorded end state (the last replayed commit)."""
    start: str = ""
    """For a real repository: the commit main starts at (the first replayed change's parent); "" when
    synthesised."""


_SPEC_LINE = re.compile(r"^(\s*)(commit|patch|after|hold|conflict|end)(\s*:)", re.I | re.M)


def job_text(change: Change, commit: str, after: float, hold: float = 0.0, end: str | None = None) -> str:
    """The replay runner's spec for one change: its message (what the planner reads: the whole message of a
    real repository's commit, as a person's ticket would say it), then its commit, its wait before applying it
    and how long the job runs on with it applied; `end`, the newest replayed commit made on top of it: a later
    change that landed first is not undone by this one's side of a conflicting hunk."""
    text = change.message.strip() or change.subject.strip() or f"change {change.index}"
    text = _SPEC_LINE.sub(r"\1> \2\3", text)  # a message's own `after: ...` line is not the spec's
    held = f"\nhold: {hold:g}" if hold else ""
    ends = f"\nend: {end}" if end else ""
    return f"{text}\ncommit: {commit}\nafter: {after:g}{held}\nconflict: theirs{ends}"


class _Files:
    """Generated contents per path: a marker line over fixed lines, or a changelog with a slot per change."""

    def __init__(self, paths: Sequence[str], slots: dict[str, list[int]], mergeable: tuple[str, ...]) -> None:
        self.mergeable = mergeable
        self.head = {p: "original" for p in paths}
        self.past: dict[str, list[str]] = {p: [] for p in paths}
        self.slots = slots
        self.filled: dict[str, set[int]] = {p: set() for p in paths}

    def is_log(self, path: str) -> bool:
        return claims.matches(path, self.mergeable)

    def text(self, p: str) -> str:
        if not self.is_log(p):
            return f"{self.head[p]}\n" + "".join(f"line {i} of {p}\n" for i in range(1, 6))
        out = ["# changes\n", *(f"- {line}\n" for line in self.past[p])]
        for n in self.slots.get(p, []):  # two fixed lines around each slot: the slots never touch
            out += [f"slot {n}\n", *([f"- change {n}\n"] if n in self.filled[p] else []), f"end {n}\n"]
        return "".join(out)

    def edit(self, p: str, marker: str, replayed: int | None) -> None:
        if not self.is_log(p):
            self.head[p] = marker
        elif replayed is None:
            self.past[p].append(marker)
        else:
            self.filled[p].add(replayed)


def synthesise(past: Sequence[Change], changes: Sequence[Change], root: Path, mergeable: tuple[str, ...]) -> ReplayRepo:
    """A real repository at `root`: main holds every path and the `past` changes; the replayed chain beside it.

    Written with one `git fast-import` (hundreds of commits in well under a second), then checked out."""
    paths = sorted({p for c in [*past, *changes] for p in c.files})
    slots: dict[str, list[int]] = {}
    for c in changes:
        for p in c.files:
            slots.setdefault(p, []).append(c.index)
    files = _Files(paths, slots, mergeable)
    stream = _Stream()
    base = {".gitattributes": "".join(f"{pat} merge=union\n" for pat in mergeable), **{p: files.text(p) for p in paths}}
    stream.commit("refs/heads/main", "synthesised base", base)
    for n, c in enumerate(past):
        stream.commit("refs/heads/main", c.subject or f"past {n}", _edit(files, c, f"past {n}", None))
    for c in changes:
        start = "refs/heads/main" if c.index == 0 else None
        stream.commit(
            REPLAY_REF, c.subject or f"change {c.index}", _edit(files, c, f"change {c.index}", c.index), start
        )
    root.mkdir(parents=True)
    git(root, "init", "-q", "-b", "main")
    proc = subprocess.run(
        ["git", "-C", str(root), "fast-import", "--quiet"], input=stream.data(), capture_output=True, timeout=300
    )
    if proc.returncode != 0:
        raise HistoryError(f"could not build the replay repository: {proc.stderr.decode(errors='replace')[-400:]}")
    git(root, "checkout", "-q", "-f", "main")
    out = subprocess.run(
        ["git", "-C", str(root), "rev-list", "--reverse", f"main..{REPLAY_REF}"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    commits = tuple(out.stdout.split())
    return ReplayRepo(root, commits, commits[-1])


def _edit(files: _Files, change: Change, marker: str, replayed: int | None) -> dict[str, str]:
    for p in change.files:
        files.edit(p, marker, replayed)
    return {p: files.text(p) for p in change.files}


class _Stream:
    """A `git fast-import` stream of commits with inline file contents."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.time = 1_600_000_000

    def commit(self, ref: str, message: str, contents: dict[str, str], start: str | None = None) -> None:
        self.time += 60
        msg = message.encode()
        out = [f"commit {ref}\ncommitter bench <bench@localhost> {self.time} +0000\n".encode()]
        out.append(b"data %d\n%s\n" % (len(msg), msg))
        if start:
            out.append(f"from {start}\n".encode())
        for path, text in contents.items():
            data = text.encode()
            out.append(b"M 100644 inline %s\ndata %d\n%s\n" % (path.encode(), len(data), data))
        self.parts.append(b"".join(out))

    def data(self) -> bytes:
        return b"\n".join(self.parts) + b"\ndone\n"


def clone(source: Path, changes: Sequence[Change], root: Path) -> ReplayRepo:
    """A clone of `source` sharing its objects, main at the first replayed change's parent; the changes'
    own commits replay."""
    first = f"{changes[0].sha}^1"
    proc = subprocess.run(
        ["git", "-C", str(source), "rev-parse", "--verify", f"{first}^{{commit}}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if proc.returncode != 0:
        raise HistoryError(f"{changes[0].sha} has no parent in {source}: start the --range after the root commit")
    subprocess.run(
        ["git", "clone", "-q", "--shared", "--no-checkout", str(source), str(root)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    git(root, "checkout", "-q", "-B", "main", proc.stdout.strip())
    git(root, "update-ref", REPLAY_REF, changes[-1].sha)
    return ReplayRepo(root, tuple(c.sha for c in changes), changes[-1].sha, proc.stdout.strip())


def check_objects(source: Path, changes: Sequence[Change]) -> None:
    """HistoryError unless `source` holds every object the replay of `changes` reads: the tree their first one
    starts from and the changes themselves. A partial or damaged clone lacks some (a large file left out), and
    every row would otherwise fail on it after its jobs ran."""
    first = f"{changes[0].sha}^1"
    for args in (["--no-walk", first], [f"{first}..{changes[-1].sha}"]):
        proc = subprocess.run(
            ["git", "-C", str(source), "rev-list", "--objects", "--missing=print", *args],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        missing = [line[1:] for line in proc.stdout.splitlines() if line.startswith("?")]
        if proc.returncode != 0 or missing:
            what = _named(source, first, missing) if missing else proc.stderr.strip()
            raise HistoryError(
                f"{source} lacks objects the replay reads ({what}): a partial or damaged clone; fetch it whole "
                "(`git fetch --refetch`) or replay a clone that has them"
            )


def _named(source: Path, commit: str, missing: Sequence[str]) -> str:
    """The missing objects, by path where `commit`'s tree names them."""
    proc = subprocess.run(
        ["git", "-C", str(source), "ls-tree", "-r", commit], capture_output=True, text=True, timeout=300
    )
    paths = {line.split()[2]: line.split("\t", 1)[1] for line in proc.stdout.splitlines() if "\t" in line}
    names = [paths.get(m, m) for m in missing[:3]]
    return ", ".join(names) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")


def copy(template: ReplayRepo, root: Path) -> ReplayRepo:
    """A fresh clone of a synthesised repository (a row's own, built in a fraction of `synthesise`'s time)."""
    subprocess.run(["git", "clone", "-q", str(template.path), str(root)], check=True, capture_output=True, timeout=300)
    git(root, "fetch", "-q", "origin", f"{REPLAY_REF}:{REPLAY_REF}")
    return ReplayRepo(root, template.commits, template.final)


def newest(replay: ReplayRepo) -> list[str | None]:
    """Per replayed change, the last replayed commit made on top of it (its own line's newest recorded state), or
    None: its `end` (a range replayed without its merges interleaves branches: the range's last commit may be on
    another)."""
    repo = pygit2.Repository(str(replay.path))
    ids = [repo.revparse_single(c).peel(pygit2.Commit).id for c in replay.commits]
    return [
        next((str(ids[j]) for j in range(len(ids) - 1, i, -1) if repo.descendant_of(ids[j], ids[i])), None)
        for i in range(len(ids))
    ]


def lost(
    replay: ReplayRepo, changes: Sequence[Change], landed_at: Sequence[float], mergeable: tuple[str, ...] = ()
) -> tuple[list[int], int]:
    """The changes not on main at the end, and how many pairs of changes to one file landed out of order.

    Lost: not landed; or missing its own line in a changelog; or, for a file whose changes landed in the
    recorded order, main differs there from the recorded end state (its last change's edit is missing).
    A file whose changes landed in another order can differ from the recording without anything lost
    (each replay keeps its own side of a conflicting hunk), so those count as reordered pairs instead;
    union-mergeable files land in any order by design, and are not counted."""
    repo = pygit2.Repository(str(replay.path))
    main = repo.revparse_single("main").peel(pygit2.Commit).tree
    want = repo.revparse_single(replay.final).peel(pygit2.Commit).tree
    touched: dict[str, list[int]] = {}
    for c in changes:
        for p in c.files:
            touched.setdefault(p, []).append(c.index)
    out = {c.index for c in changes if not landed_at[c.index]}
    reordered: set[tuple[int, int]] = set()
    for p, ns in touched.items():
        done = [n for n in ns if landed_at[n]]
        pairs = {(a, b) for i, a in enumerate(done) for b in done[i + 1 :] if landed_at[b] < landed_at[a]}
        have, expected = _text(repo, main, p), _text(repo, want, p)
        slotted = [n for n in ns if f"- change {n}\n" in (expected or "")]
        if slotted:  # a changelog's slots merge in any order: each line must be there once
            out.update(n for n in slotted if (have or "").count(f"- change {n}\n") != 1)
        elif pairs:
            if not claims.matches(p, mergeable):
                reordered |= pairs
        elif have != expected and done:
            out.add(done[-1])
    return sorted(out), len(reordered)


def serial(
    replay: ReplayRepo, changes: Sequence[Change], landed_at: Sequence[float], mergeable: tuple[str, ...] = ()
) -> tuple[list[int], list[str], int]:
    """For a real repository's replay: the changes lost, the files a landing broke, the pairs reordered.

    Main at the end must be what applying the landed changes one after another, in the order they landed,
    gives (each applied like the replay runner applies it, three-way, its own side on a conflict): a file
    where it is not was broken by running its changes side by side. A change is lost when it did not land,
    or when main misses the edit of the last landed change to one of its files. Union-merged files
    (changelogs) land in any order: every line the serial application gives must be there."""
    repo = pygit2.Repository(str(replay.path))
    main = repo.revparse_single("main").peel(pygit2.Commit).tree
    union = functools.partial(claims.matches, patterns=mergeable)
    order = sorted((t, c.index) for c, t in zip(changes, landed_at, strict=True) if t)
    ends = [repo.revparse_single(e).peel(pygit2.Commit) if e else None for e in newest(replay)]
    # Not landed is lost, unless it had nothing to land: main holds its edit already (it ended unchanged), or the
    # edit of a later change made on it that landed first (its replay keeps that: nothing of it to land either).
    lost = {c.index for c in changes if not landed_at[c.index] and not _on_main(repo, c, main, ends[c.index], union)}
    tree: pygit2.Tree = repo.revparse_single(replay.start).peel(pygit2.Commit).tree
    last: dict[str, int] = {}
    for _, i in order:
        commit = repo.revparse_single(changes[i].sha).peel(pygit2.Commit)
        end = ends[i]
        with contextlib.suppress(ReplayError):  # what the replay runner would not have landed either
            tree = replayed_tree(repo, commit, tree, theirs=True, mergeable=union, end=end)
        for p in changes[i].files:
            last[p] = i
    broken = []
    for p, i in sorted(last.items()):
        if claims.matches(p, mergeable):
            lost |= _lines_lost(repo, changes, landed_at, p, main)
        elif _text(repo, main, p) != _text(repo, tree, p):
            broken.append(p)
            if not _has_edit(repo, changes[i].sha, p, main, ends[i], union):
                lost.add(i)
    return sorted(lost), broken, _reordered(changes, landed_at, mergeable)


def unreplayable(replay: ReplayRepo, changes: Sequence[Change], mergeable: tuple[str, ...] = ()) -> list[int]:
    """The changes that no schedule can land: applied one after another in their recorded order from main's
    start, as the replay runner applies them, each of these does not apply. A range cut out of a history that
    merges another line (a project template's) can hold a change whose base the range never builds, e.g. one
    deleting a file added on the other line before the range: every policy fails it, one-per-repo too, so it
    is not lost by running side by side (rows report it apart)."""
    repo = pygit2.Repository(str(replay.path))
    union = functools.partial(claims.matches, patterns=mergeable)
    head = repo.revparse_single(replay.start).peel(pygit2.Commit)
    sig = pygit2.Signature("bench", "bench@localhost", 0, 0)
    out = []
    for c in changes:
        commit = repo.revparse_single(c.sha).peel(pygit2.Commit)
        try:
            tree = replayed_on(repo, commit, head, theirs=True, mergeable=union)
        except ReplayError:
            out.append(c.index)
            continue
        head = repo[repo.create_commit(None, sig, sig, "serial", tree.id, [head.id])].peel(pygit2.Commit)
    return out


def _lines_lost(
    repo: pygit2.Repository, changes: Sequence[Change], landed_at: Sequence[float], path: str, main: pygit2.Tree
) -> set[int]:
    """The landed changes to a union-merged file (a changelog) whose lines main lacks. Such a file merges line by
    line in any order, so each change's effect is the lines it added: one is lost when a line it added is not on
    main and no later landed change (in the recorded order) removed or reworded that line."""
    present = {line.rstrip("\r") for line in (_text(repo, main, path) or "").split("\n")}
    edits = [(c.index, *_line_edit(repo, c.sha, path)) for c in changes if landed_at[c.index] and path in c.files]
    out = set()
    for n, (i, added, _) in enumerate(edits):
        rewritten = {line for _, _, removed in edits[n + 1 :] for line in removed}
        if any(line.strip() and line not in present and line not in rewritten for line in added):
            out.add(i)
    return out


def _line_edit(repo: pygit2.Repository, sha: str, path: str) -> tuple[list[str], set[str]]:
    """The lines a commit added to `path` and those it removed there (against its first parent)."""
    commit = repo.revparse_single(sha).peel(pygit2.Commit)
    parent = commit.parents[0].tree if commit.parents else None
    diff = parent.diff_to_tree(commit.tree) if parent is not None else commit.tree.diff_to_tree(swap=True)
    added: list[str] = []
    removed: set[str] = set()
    for patch in diff:
        if patch is None or path not in (patch.delta.old_file.path, patch.delta.new_file.path):
            continue
        for hunk in patch.hunks:
            for line in hunk.lines:
                text = line.raw_content.decode(errors="replace").rstrip("\r\n")
                if line.origin == "+":
                    added.append(text)
                elif line.origin == "-":
                    removed.add(text)
    return added, removed


def _reordered(changes: Sequence[Change], landed_at: Sequence[float], mergeable: tuple[str, ...]) -> int:
    """Pairs of landed changes to one file (union-merged files aside) that landed in the other order."""
    pairs: set[tuple[int, int]] = set()
    touched: dict[str, list[int]] = {}
    for c in changes:
        for p in c.files:
            if not claims.matches(p, mergeable):
                touched.setdefault(p, []).append(c.index)
    for ns in touched.values():
        done = [n for n in ns if landed_at[n]]
        pairs |= {(a, b) for i, a in enumerate(done) for b in done[i + 1 :] if landed_at[b] < landed_at[a]}
    return len(pairs)


def _on_main(
    repo: pygit2.Repository,
    change: Change,
    main: pygit2.Tree,
    end: pygit2.Commit | None = None,
    union: Mergeable | None = None,
) -> bool:
    """Main holds `change`'s edit of every file it touched (or, with `end`, what a later change made on it has)."""
    return bool(change.files) and all(_has_edit(repo, change.sha, p, main, end, union) for p in change.files)


def _has_edit(
    repo: pygit2.Repository,
    sha: str,
    path: str,
    main: pygit2.Tree,
    end: pygit2.Commit | None = None,
    union: Mergeable | None = None,
) -> bool:
    """Applying the change to main again as its replay does (with its `end`, a union-merged file line-wise) changes
    nothing at `path`: its edit is there, or a later change's made on it."""
    commit = repo.revparse_single(sha).peel(pygit2.Commit)
    if not commit.parents:
        return True
    try:
        tree = replayed_tree(repo, commit, main, theirs=True, mergeable=union, end=end)
    except ReplayError:
        return False
    return _text(repo, tree, path) == _text(repo, main, path)


def _text(repo: pygit2.Repository, tree: pygit2.Tree, path: str) -> str | None:
    try:
        blob = repo[tree[path].id]
    except KeyError:
        return None
    assert isinstance(blob, pygit2.Blob)
    return blob.data.decode(errors="replace")
