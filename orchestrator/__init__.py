"""orchestrator: a git-aware worktree orchestrator daemon."""

__version__ = "0.1.0"
