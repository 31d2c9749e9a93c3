"""A node's clones of the team's repositories: which shared repository (remote URL and branch) a local path is.

In team mode a repository is its remote and target branch (`git.remote.Remote`), not a local path: every node
has a clone of its own, maybe at another path. A node names the remote of a clone by the clone's `origin`
(the user's own configuration of their own clone, read once per path, never a job's workspace).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pygit2

from orchestrator.git import repos
from orchestrator.git.remote import Remote, shown
from orchestrator.store import NotShared

REMOTE_NAME = "origin"


@lru_cache(maxsize=256)
def origin_url(repo_path: str) -> str:
    """The URL of the clone's `origin` remote; NotShared when it has none."""
    try:
        repo = repos.open_repo(Path(repo_path))
        url = repo.remotes[REMOTE_NAME].url
    except (KeyError, pygit2.GitError, repos.RepoError):
        url = None
    if not url:
        raise NotShared(
            f"{repo_path} has no remote {REMOTE_NAME!r}: in team mode a job lands on the team's shared remote; "
            f"add it (git -C {repo_path} remote add {REMOTE_NAME} URL)"
        )
    return str(url)


def remote_of(repo_path: str, branch: str) -> Remote:
    """The shared repository and branch a job of this clone lands on."""
    return Remote(origin_url(repo_path), branch)


def identity_of(repo_path: str) -> tuple[str, str]:
    """(the team-wide name of this clone's remote, `Remote.identity`; its URL as shown: no password)."""
    remote = remote_of(repo_path, "")
    return remote.identity, shown(remote.url)
