"""The systemd user unit, rendered for the entry point that is really installed.

`render()` is pure; `entry_point()` finds the interpreter running this package, so the unit works
the same for a venv, pipx or a user install (`sys.executable -m orchestrator`). The copy under
`systemd/` in the repository is `render(GENERIC)`: it finds `orchestrator` on the unit's PATH.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from orchestrator import config, paths
from orchestrator.store import EX_STATE

NAME = "orchestrator.service"

NO_RESTART: tuple[int, ...] = (EX_STATE, config.EX_CONFIG)
"""Exit codes that restarting cannot fix (a database it must not open, a bad config): no restart loop. Never
`EX_TEMPFAIL` (75): a team node whose PostgreSQL is not up yet exits so, to be started again."""

RESTART_SEC = 5
"""Seconds between a failed daemon and its restart."""
START_LIMIT = (300, 5)
"""At most 5 starts in 300 s, then systemd gives up (a crash loop). A node waiting for its PostgreSQL spends
`[team] start_wait` (60 s) on each start before it exits 75, so its restarts stay under this limit for good:
the bounded back-off is the wait's own (1, 2, 4, 8, 15 s between tries) plus `RESTART_SEC`."""

GENERIC: tuple[str, ...] = ("/usr/bin/env", "orchestrator")
"""The entry point of the repository's example unit: `orchestrator` found on the unit's PATH."""

WATCHDOG_SEC = 60
BASE_PATH = ("%h/.local/bin", "/usr/local/bin", "/usr/bin", "/bin")


def no_restart_codes() -> tuple[int, ...]:
    """The exit codes the unit does not restart, in order."""
    return tuple(sorted(NO_RESTART))


def entry_point() -> tuple[str, ...]:
    """The interpreter running us with `-m orchestrator`: absolute, and never resolved through a venv's symlink."""
    return (os.path.abspath(sys.executable), "-m", "orchestrator")


def _quote(arg: str) -> str:
    # systemd splits ExecStart like a shell, but `%` and `$` are its own specifiers: escape them.
    return shlex.quote(arg.replace("%", "%%").replace("$", "$$"))


def render(
    command: Sequence[str] = GENERIC,
    *,
    environment: Mapping[str, str] | None = None,
    extra_path: Iterable[str] = (),
    no_restart: Iterable[int] | None = None,
    watchdog_sec: int = WATCHDOG_SEC,
    env_path: str = "%E/orchestrator/env",
) -> str:
    """The unit text for `command daemon`; `environment` adds `Environment=` lines (e.g. ORCHESTRATOR_HOME), and
    `env_path` is the `EnvironmentFile=` (the config dir's `env`: `env_file`)."""
    codes = " ".join(str(c) for c in (no_restart_codes() if no_restart is None else no_restart))
    path = ":".join(dict.fromkeys([*extra_path, *BASE_PATH]))
    env_lines = "".join(f'Environment="{k}={v}"\n' for k, v in sorted((environment or {}).items()))
    exec_start = " ".join(_quote(a) for a in (*command, "daemon"))
    return f"""\
# orchestrator: systemd user unit. `orchestrator service install` writes it with this machine's paths.
# Logs: journalctl --user -u orchestrator -o cat   (one JSON object per line)
[Unit]
Description=orchestrator: git-aware worktree orchestrator daemon
# No network-online.target: a user manager has none, and the daemon needs no network to start.
StartLimitIntervalSec={START_LIMIT[0]}
StartLimitBurst={START_LIMIT[1]}

[Service]
# Ready only once the API socket listens and recovery is done; STATUS= says what runs and waits.
Type=notify
NotifyAccess=main
ExecStart={exec_start}
Restart=on-failure
RestartSec={RESTART_SEC}
# Exit codes a restart cannot fix (78: invalid config; 65: a database it must not open). 75 (the team's
# PostgreSQL not up yet, after waiting for it a minute) is restarted.
RestartPreventExitStatus={codes}
# Pings come only while the scheduler loop makes progress; a stuck loop is restarted.
WatchdogSec={watchdog_sec}
TimeoutStartSec=90
TimeoutStopSec=45
# SIGTERM to the daemon only: it stops its own runners, then systemd kills what is left.
KillMode=mixed
# The service's cgroup is the daemon's to divide: one child cgroup per command, so nothing a job starts
# (setsid, a cleared environment) outlives it. No controller is used.
Delegate=yes
UMask=0077
Environment=PYTHONUNBUFFERED=1
Environment="PATH={path}"
{env_lines}# Agent CLIs' settings and API keys (ANTHROPIC_API_KEY=...), one KEY=value a line; optional.
EnvironmentFile=-{env_path}

[Install]
WantedBy=default.target
"""


def env_file(env: Mapping[str, str] | None = None) -> Path:
    """The file the unit reads its environment from: `env` in the config dir (`$ORCHESTRATOR_HOME/config/env`, else
    `~/.config/orchestrator/env`, what `%E/orchestrator/env` names in the unit)."""
    env = os.environ if env is None else env
    if env.get("ORCHESTRATOR_HOME"):
        return paths.resolve(dict(env)).env_file
    return Path(env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")) / "orchestrator" / "env"


def read_env_file(path: Path) -> dict[str, str]:
    """The variables an `EnvironmentFile=` sets, as systemd reads it: `KEY=value` lines, `#`/`;` comments,
    a value in matching quotes unquoted. A missing file sets nothing."""
    try:
        text = path.read_text(errors="replace")
    except (FileNotFoundError, IsADirectoryError):
        return {}
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;" or "=" not in line:
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key.strip().removeprefix("export ").strip()] = value
    return out


def unit_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where a user's own units live: `$XDG_CONFIG_HOME/systemd/user` (default ~/.config/systemd/user)."""
    env = os.environ if env is None else env
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "systemd" / "user"


if __name__ == "__main__":  # regenerate the repository's example: python -m orchestrator.service.unit
    sys.stdout.write(render())
