"""A queue of real changes for the jobs benchmark: their touch pattern, and a repository that replays it.

A history is JSON lines, one change each: `{"sha", "subject", "files": [[path, added, deleted], ...]}`, oldest
first (`orchestrator/data/flask-history.jsonl` ships with the package: 496 merged changes of a public
project). `from_repo` reads the same from a range of a real repository's authored changes.

`replayrepo` builds the repository a benchmark row replays on, and the commit each job replays.
"""

from __future__ import annotations

import json
import math
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path, PurePosixPath

__all__ = ["Change", "bundled", "durations", "from_file", "from_repo", "predict"]


class HistoryError(ValueError):
    """The history cannot be read; the message says what to pass instead."""


@dataclass(frozen=True, slots=True)
class Change:
    """One recorded change: the files it touched and the lines it changed."""

    index: int
    sha: str
    subject: str
    files: tuple[str, ...]
    lines: int
    message: str = ""
    """The whole commit message, when the change comes from a real repository (else the subject says it all)."""

    def duration(self, scale: float) -> float:
        """Seconds its replay sleeps: grows with the log of its size, so a huge merge is not a whole run."""
        return round(scale * (1.0 + math.log2(1 + self.lines)), 3)


def bundled() -> Path:
    """The history that ships with the package."""
    return Path(str(resources.files("orchestrator") / "data" / "flask-history.jsonl"))


def _usable(path: str) -> bool:
    parts = PurePosixPath(path).parts
    return bool(parts) and not path.startswith("/") and ".." not in parts and ".git" not in parts


def _changes(records: Iterable[dict]) -> list[Change]:
    out: list[Change] = []
    for rec in records:
        files = [f for f in rec.get("files", []) if isinstance(f, list | tuple) and f and _usable(str(f[0]))]
        if not files:
            continue
        lines = sum(int(f[1] or 0) + int(f[2] or 0) for f in files if len(f) >= 3)
        paths = tuple(dict.fromkeys(str(f[0]) for f in files))
        subject, message = str(rec.get("subject", "")), str(rec.get("message", ""))
        out.append(Change(len(out), str(rec.get("sha", "")), subject, paths, lines, message))
    return _no_file_dir_clash(out)


def _no_file_dir_clash(changes: list[Change]) -> list[Change]:
    """Drop paths that are a file in one change and a directory in another (a rename across the range)."""
    all_paths = {p for c in changes for p in c.files}
    dirs = {str(parent) for p in all_paths for parent in PurePosixPath(p).parents if str(parent) != "."}
    clash = all_paths & dirs
    if not clash:
        return changes
    kept: list[Change] = []
    for c in changes:
        files = tuple(p for p in c.files if p not in clash)
        if files:
            kept.append(Change(len(kept), c.sha, c.subject, files, c.lines, c.message))
    return kept


def from_file(path: Path) -> list[Change]:
    """The changes of a history file, oldest first."""
    try:
        text = path.read_text()
    except OSError as e:
        raise HistoryError(f"cannot read the history {path}: {e.strerror}; pass a JSON-lines file") from None
    records = []
    for n, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise HistoryError(f"{path}:{n}: not JSON ({e.msg}); one change per line is expected") from None
    changes = _changes(records)
    if not changes:
        raise HistoryError(f'{path} holds no change with files; each line needs "files": [[path, added, deleted]]')
    return changes


def from_repo(repo: Path, rev_range: str, merges: bool = False) -> list[Change]:
    """The touch pattern of the authored changes (merge commits left out: the commits a merge brings are
    each a change) in a range (`A..B`) of a real repository, oldest first, with their whole messages. With
    `merges`, the first-parent line instead (each merge one change, against its first parent)."""
    walk = ["--first-parent", "-m"] if merges else ["--no-merges"]
    # A move is a deletion and an addition: both paths are what the change touches (and what an oracle claims).
    argv = ["git", "-C", str(repo), "log", *walk, "--reverse", "--numstat", "--no-renames", "--format=@%H %s"]
    proc = subprocess.run([*argv, rev_range], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise HistoryError(f"`git log {rev_range}` in {repo} failed: {proc.stderr.strip()}; pass --range A..B")
    records: list[dict] = []
    for line in proc.stdout.splitlines():
        if line.startswith("@"):
            sha, _, subject = line[1:].partition(" ")
            records.append({"sha": sha, "subject": subject, "files": []})
        elif line.strip() and records:
            added, deleted, path = line.split("\t", 2)
            size = [int(n) if n.isdigit() else 1 for n in (added, deleted)]  # binary files: "-"
            records[-1]["files"].append([path, *size])
    bodies = subprocess.run(
        ["git", "-C", str(repo), "log", *walk, "--reverse", "--format=%H%x00%B%x1e", rev_range],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    messages = dict(entry.strip("\n").split("\0", 1) for entry in bodies.stdout.split("\x1e") if "\0" in entry)
    for rec in records:
        rec["message"] = messages.get(rec["sha"], rec["subject"]).strip()
    changes = _changes(records)
    if not changes:
        raise HistoryError(f"{rev_range} in {repo} has no change with files")
    return changes


def git(repo: Path, *args: str) -> None:
    """The git CLI in `repo` with a fixed identity (benchmark repositories only)."""
    ident = ["-c", "user.name=bench", "-c", "user.email=bench@localhost"]
    subprocess.run(["git", "-C", str(repo), *ident, *args], check=True, capture_output=True, timeout=120)


def predict(change: Change, predictor: str) -> list[str]:
    """The paths a job declares under a predictor: `oracle` the real files, `declared` their top directories,
    `local` none (the daemon's own planner claims from the job's text)."""
    if predictor == "local":
        return []
    if predictor == "oracle":
        return list(change.files)
    if predictor == "declared":
        # What a person names with --path: the top-level directory of each file (or the file at the root).
        tops = {p.split("/", 1)[0] + "/" if "/" in p else p for p in change.files}
        return sorted(tops)
    raise HistoryError(f"unknown predictor {predictor!r}: use declared, local or oracle")


def durations(changes: list[Change], scale: float) -> list[float]:
    return [c.duration(scale) for c in changes]
