"""Keep an agent's file access inside its worktree: every path it names is resolved here first.

Pure path logic (it only reads the file system to follow symlinks). A path leads out when it is absolute,
climbs with `..` above the worktree, or passes through a symlink whose target is outside; it is refused
with a message the model can read and act on. `.git` (the worktree's link to the repository) is refused
too: the agent changes files, the daemon makes the commits.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath


class Escape(ValueError):
    """The path leads outside the worktree (or into `.git`); the message says so in the model's terms."""


def inside(worktree: Path, raw: str) -> Path:
    """The real path of `raw` (worktree-relative) inside `worktree`, or `Escape`.

    Symlinks are followed as the OS would (including a dangling last component, which a write would
    create at its target), so a link inside that points outside is refused before anything is read or
    written through it.
    """
    if not isinstance(raw, str) or not raw.strip():
        raise Escape("give a path relative to the repository root, e.g. 'src/app.py'")
    if "\0" in raw:
        raise Escape(f"{raw!r}: a path cannot contain NUL")
    rel = PurePosixPath(raw.strip())
    if rel.is_absolute() or raw.startswith("~"):
        raise Escape(f"{raw}: absolute paths are refused; use a path relative to the repository root")
    if ".." in rel.parts:
        raise Escape(f"{raw}: '..' is refused; every path must stay inside the repository")
    root = Path(os.path.realpath(worktree))
    if rel.parts[:1] == (".git",):
        raise Escape(f"{raw}: .git is off limits; change files and the orchestrator commits them")
    target = Path(os.path.realpath(root.joinpath(*rel.parts)))
    if target != root and root not in target.parents:
        raise Escape(f"{raw}: leads outside the repository (through a symbolic link); refused")
    if target != root and target.relative_to(root).parts[:1] == (".git",):
        raise Escape(f"{raw}: leads into .git (through a symbolic link); refused")
    return target


def relative(worktree: Path, path: Path) -> str:
    """`path` (inside `worktree`) as the model sees it: repo-relative, POSIX."""
    root = Path(os.path.realpath(worktree))
    rel = Path(os.path.realpath(path)).relative_to(root)
    return rel.as_posix() if rel.parts else "."
