"""Small, synchronous facts about a repository: where it is, where its branches point, what changed.

Everything here is pygit2 and fast enough for a thread hop; callers on the event loop use
`asyncio.to_thread`. Errors are `RepoError`s whose message says what to do about them, because they
reach a person through the CLI.
"""

from __future__ import annotations

import fnmatch
import os
import shlex
import subprocess
from collections.abc import Mapping
from pathlib import Path

import pygit2
from pygit2.enums import DiffFind

__all__ = [
    "RepoError",
    "branch_head",
    "canonical",
    "changed_paths",
    "default_branch",
    "gitattributes_union",
    "open_repo",
    "worktrees",
]


class RepoError(ValueError):
    """A repository, branch or revision the user named cannot be used; the message says how to fix it."""


def borrowed_dirs(repo: Path) -> list[Path]:
    """The repository's work dir and object dir: a job's own git dir borrows its objects, so a sandbox shows
    both to it read-only (just the path when it is no repository)."""
    try:
        common = common_dir(open_repo(repo))
    except RepoError:
        return [repo]
    return [repo, common / "objects"]


def canonical(path: Path | str) -> Path:
    """The top-level work dir of the repository holding `path` (symlinks resolved).

    From a linked worktree (ours or the user's) this is the main worktree, so every job of one
    repository gets the same key however the repository was named.
    """
    p = Path(path).expanduser().resolve()
    if not p.exists():
        raise RepoError(f"{p} does not exist: pass --repo with the path of a git repository")
    gitdir = pygit2.discover_repository(str(p))
    if gitdir is None:
        raise RepoError(
            f"{p} is not inside a git repository: run `git init` there or pass --repo with a repository path"
        )
    common = _common_dir(Path(gitdir))
    try:
        repo = pygit2.Repository(str(common))
    except pygit2.GitError as exc:
        raise RepoError(f"{p}: git cannot open the repository at {common} ({exc}): check it with `git status`") from exc
    if repo.is_bare or repo.workdir is None:
        raise RepoError(
            f"{common} is a bare repository: orchestrator lands onto a branch of a repository with a work tree; "
            "pass the path of a clone"
        )
    return Path(repo.workdir).resolve()


def open_repo(path: Path | str) -> pygit2.Repository:
    """Open the repository (or linked worktree) whose work dir is exactly `path`.

    Never searches parent folders: a job's worktree that lost its `.git` must fail here, not open an
    enclosing repository (a dotfiles repo at $HOME) and have the job's work committed into that.
    """
    try:
        return pygit2.Repository(str(path), pygit2.enums.RepositoryOpenFlag.NO_SEARCH)
    except pygit2.GitError as exc:
        raise RepoError(f"{path} is not a git work tree ({exc}): pass --repo with a repository path") from exc


def common_dir(repo: pygit2.Repository) -> Path:
    """The git dir shared by a repository and all its linked worktrees (resolved)."""
    return _common_dir(Path(repo.path)).resolve()


def worktrees(repo: pygit2.Repository) -> list[tuple[Path, Path]]:
    """Every checkout of the repository (its main work tree, then each linked worktree), with the file holding
    its HEAD: read from git's own files (the common dir's `HEAD`, each `worktrees/<name>/gitdir`), as `git
    worktree list` does, without a process. A linked worktree whose directory is gone is left out."""
    common = common_dir(repo)
    found = []
    top = repo if Path(repo.path).resolve() == common else open_repo(common)
    if not top.is_bare and top.workdir:
        found.append((Path(top.workdir), common / "HEAD"))
    admin_root = common / "worktrees"
    for admin in sorted(admin_root.iterdir()) if admin_root.is_dir() else []:
        try:
            pointer = Path((admin / "gitdir").read_text().strip())
        except (FileNotFoundError, NotADirectoryError):
            # The worktree pool renames and prunes its own worktrees beside a landing: one vanished as
            # we read. Never the user's (the pool only removes its own).
            continue
        path = (pointer if pointer.is_absolute() else (admin / pointer).resolve()).parent
        if path.is_dir():
            found.append((path, admin / "HEAD"))
    return found


def branch_head(repo_path: Path | str, branch: str) -> str:
    """The sha of the commit local branch `branch` points at."""
    repo = open_repo(repo_path)
    ref = repo.branches.local.get(branch)
    if ref is None:
        names = sorted(repo.branches.local)
        choices = f"one of: {', '.join(names)}" if names else "an existing branch (this repository has none yet)"
        raise RepoError(
            f"branch '{branch}' does not exist in {_workdir(repo)}: create it (git branch {shlex.quote(branch)}) "
            f"or pass --branch with {choices}"
        )
    return str(ref.peel(pygit2.Commit).id)


def commits_since(repo_path: Path | str, branch: str, base: str, limit: int = 10_000) -> frozenset[str]:
    """The commits on `branch` that `base` does not have (at most `limit` of them, newest first): what reached the
    branch since a job took `base` as its own."""
    repo = open_repo(repo_path)
    walker = repo.walk(pygit2.Oid(hex=branch_head(repo_path, branch)), pygit2.enums.SortMode.TOPOLOGICAL)
    seen = pygit2.Oid(hex=base)
    if seen in repo:  # else its base is gone (pruned after a rewrite): every commit of the branch is new to it
        walker.hide(seen)
    return frozenset(str(c.id) for c, _ in zip(walker, range(limit), strict=False))


def default_branch(repo_path: Path | str) -> str:
    """The branch HEAD points at in the repository's main work tree."""
    repo = open_repo(repo_path)
    if repo.head_is_unborn:
        raise RepoError(f"{_workdir(repo)} has no commits yet: commit first (git commit), then jobs can branch from it")
    if repo.head_is_detached:
        raise RepoError(f"HEAD is detached in {_workdir(repo)}: check out a branch there or pass --branch")
    return repo.head.shorthand


def resolve_rev(repo_path: Path | str, rev: str) -> str:
    """The commit sha a revision (sha, branch, tag, `HEAD~2`) names, or a RepoError that says so."""
    repo = open_repo(repo_path)
    try:
        return str(repo.revparse_single(rev).peel(pygit2.Commit).id)
    except (KeyError, ValueError, pygit2.GitError, pygit2.InvalidSpecError):
        raise RepoError(
            f"revision {rev!r} does not name a commit in {_workdir(repo)}: pass --base with one that does"
        ) from None


def changed_paths(repo_path: Path | str, old_sha: str, new_sha: str) -> frozenset[str]:
    """Repo-relative POSIX paths that differ between two commits; a rename counts both its sides."""
    repo = open_repo(repo_path)
    old = _tree(repo, old_sha)
    new = _tree(repo, new_sha)
    diff = old.diff_to_tree(new)
    diff.find_similar(flags=DiffFind.FIND_RENAMES)
    paths: set[str] = set()
    for delta in diff.deltas:
        paths.add(delta.old_file.path)
        paths.add(delta.new_file.path)
    return frozenset(paths)


def gitattributes_union(repo_path: Path | str, rev: str) -> frozenset[str]:
    """Patterns the top-level `.gitattributes` at `rev` marks `merge=union`.

    Kept simple on purpose: only the top-level file, patterns returned as written (no macro
    expansion, no nested `.gitattributes`). A later line for the same pattern that sets another
    merge driver, `-merge` or `!merge` takes the pattern out again, as in git.
    """
    repo = open_repo(repo_path)
    tree = _tree(repo, rev)
    try:
        entry = tree[".gitattributes"]
    except KeyError:
        return frozenset()
    blob = repo[entry.id]
    if not isinstance(blob, pygit2.Blob):
        return frozenset()
    union: dict[str, bool] = {}
    for line in blob.data.decode("utf-8", "replace").splitlines():
        line = line.strip()
        if not line or line.startswith("#") or line.startswith("[attr]"):
            continue
        try:
            pattern, *attrs = shlex.split(line, posix=True) if line.startswith('"') else line.split()
        except ValueError:
            continue
        for attr in attrs:
            if attr == "merge=union":
                union[pattern] = True
            elif attr in ("-merge", "!merge", "merge") or attr.startswith("merge="):
                union[pattern] = False
    return frozenset(p for p, on in union.items() if on)


GIT_ENV: tuple[str, ...] = (
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "LC_*", "TZ", "TMPDIR", "XDG_CONFIG_HOME",
    "GIT_CONFIG_NOSYSTEM", "GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM", "SSH_AUTH_SOCK", "GIT_SSH", "GIT_SSH_COMMAND",
    "http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "SSL_CERT_FILE", "SSL_CERT_DIR",
)  # fmt: skip
"""What of the daemon's environment a git process it starts may see (patterns allowed): where to find
programs and the user's git config, the locale, an ssh agent, proxies and CA certificates for fetches and
pushes to a team's remote. Never an API key, a job's variables or git's location variables: git runs hooks,
filters and fsmonitor commands of the user's config with it."""

GIT_TIMEOUT = 600.0
"""Seconds one git command of the daemon may take (a checkout through an LFS smudge filter can be slow)."""


def git_env(cwd: Path | None = None, *, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of every git process the daemon starts: `GIT_ENV` only, prompts off.

    With `cwd` (a work tree's top), git may not search above it: a work tree that lost its `.git` makes
    git fail instead of acting on an enclosing repository.
    """
    source = os.environ if environ is None else environ
    env = {k: v for k, v in source.items() if any(fnmatch.fnmatchcase(k, p) for p in GIT_ENV)}
    env["GIT_TERMINAL_PROMPT"] = "0"
    if cwd is not None:
        env["GIT_CEILING_DIRECTORIES"] = str(Path(cwd).resolve().parent)
    return env


def run_git(
    cwd: Path, *args: str, timeout: float = GIT_TIMEOUT, index: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The git CLI at the top of the work tree `cwd` (the user's checkout), output captured as text, never
    prompting, never raising on a non-zero exit, never searching above `cwd` for a repository, with the
    daemon's secrets out of its environment (`git_env`) and no hook run (what the daemon does there is
    bookkeeping, not the user's git command). The user's own config for their checkout applies otherwise
    (their fsmonitor, their filters); a command that outlives `timeout` fails with exit 124. `index`: the index
    file git reads and writes instead of the checkout's (`GIT_INDEX_FILE`)."""
    argv = ["git", "-c", "core.hooksPath=/dev/null", *args]
    env = git_env(cwd)
    if index is not None:
        env["GIT_INDEX_FILE"] = str(index)
    try:
        return subprocess.run(
            argv,
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"git {args[0]} took over {timeout:.0f} s")


def _common_dir(gitdir: Path) -> Path:
    # A linked worktree's git dir names the shared one in its `commondir` file (usually "../..").
    pointer = gitdir / "commondir"
    if pointer.is_file():
        return (gitdir / pointer.read_text().strip()).resolve()
    return gitdir


def _workdir(repo: pygit2.Repository) -> str:
    return os.path.normpath(repo.workdir or repo.path)


def _tree(repo: pygit2.Repository, rev: str) -> pygit2.Tree:
    try:
        return repo.revparse_single(rev).peel(pygit2.Tree)
    except (KeyError, ValueError, pygit2.GitError) as exc:
        raise RepoError(f"{rev!r} is not a commit in {_workdir(repo)}: pass a branch name or a commit sha") from exc
