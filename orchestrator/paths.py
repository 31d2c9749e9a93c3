"""Where orchestrator keeps its files: XDG dirs through platformdirs, or all under `ORCHESTRATOR_HOME`.

`ORCHESTRATOR_HOME=DIR` puts config, state and runtime under DIR, for tests and side-by-side instances.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import platformdirs

APP = "orchestrator"


@dataclass(frozen=True, slots=True)
class Paths:
    config_dir: Path
    state_dir: Path
    runtime_dir: Path

    @property
    def config_file(self) -> Path:
        return self.config_dir / "config.toml"

    @property
    def db(self) -> Path:
        return self.state_dir / "orchestrator.db"

    @property
    def job_logs(self) -> Path:
        return self.state_dir / "jobs"

    @property
    def worktrees(self) -> Path:
        return self.state_dir / "worktrees"

    @property
    def scratch(self) -> Path:
        """Short-lived worktrees for landing checks."""
        return self.state_dir / "scratch"

    @property
    def socket(self) -> Path:
        return self.runtime_dir / "orchestrator.sock"

    @property
    def lock(self) -> Path:
        return self.runtime_dir / "daemon.lock"

    def job_log(self, job_id: int) -> Path:
        return self.job_logs / f"{job_id}.log"

    def job_private(self, job_id: int) -> Path:
        """A job's own dir for what its runner writes outside the worktree (scripts, prompts)."""
        return self.state_dir / "private" / str(job_id)

    def ensure(self) -> None:
        """Create the dirs; the runtime dir is 0700 so only the owner can reach the socket."""
        for d in (self.config_dir, self.state_dir, self.job_logs, self.worktrees, self.scratch):
            d.mkdir(parents=True, exist_ok=True)
        self.runtime_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.runtime_dir, 0o700)


def resolve(env: dict[str, str] | None = None) -> Paths:
    """The paths for this user, honouring `ORCHESTRATOR_HOME` then the XDG variables."""
    env = dict(os.environ) if env is None else env
    home = env.get("ORCHESTRATOR_HOME")
    if home:
        root = Path(home).expanduser().resolve()
        return Paths(root / "config", root / "state", root / "run")
    runtime = env.get("XDG_RUNTIME_DIR")
    runtime_dir = Path(runtime) / APP if runtime else Path(platformdirs.user_runtime_dir(APP))
    return Paths(
        Path(platformdirs.user_config_dir(APP)),
        Path(platformdirs.user_state_dir(APP)),
        runtime_dir,
    )
