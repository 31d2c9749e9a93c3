"""Team nodes for the tests: real daemons, each with its own home and clone of one bare remote, sharing one real
PostgreSQL database."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import git
from tests.harness import Daemon


class Node(Daemon):
    """A daemon in a session (and process group) of its own, as a service manager starts one: it can be killed with
    its whole process group."""

    def start(self, *args: str, wait: bool = True) -> Node:
        self.home.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "orchestrator", "daemon", *args], env=self.env, stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        if wait:
            self.wait_ready()
        return self


def make_node(
    root: Path, bare: Path, url: str, name: str, *, lease: float = 3, env: dict[str, str] | None = None, **team: Any
) -> tuple[Node, Path]:
    """Node `name`: a clone of `bare` under `root` and a home whose config names `url` (no password: it comes from
    the environment, PGPASSWORD) and this clone; `team` adds `[team]` keys (TOML values as Python ones)."""
    clone = root / f"clone-{name}"
    git(root, "clone", "-q", str(bare), clone.name)
    d = Node(root / f"home-{name}", {"MAX_CONCURRENT_JOBS": "2", **(env or {})})
    (d.home / "config").mkdir(parents=True)
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in team.items())
    (d.home / "config" / "config.toml").write_text(
        f'[store]\nurl = "{url}"\n\n[team]\nnode = "{name}"\nlease = {lease}\n{extra}\n[repos."{clone}"]\n'
    )
    return d, clone


def states(d: Daemon) -> dict[int, dict[str, Any]]:
    """Every job of the team as `status --json` on node `d` shows it."""
    out = d.cli("status", "--json")
    assert out.returncode == 0, out.stderr
    return {j["id"]: j for j in json.loads(out.stdout)}


def landed_once(bare: Path) -> list[int]:
    """The job ids whose commits are on the remote's main, one entry per commit (a job landed twice shows twice)."""
    out = git(bare, "log", "main", "--format=%(trailers:key=Orchestrator-Job,valueonly,separator=)")
    return sorted(int(line) for line in out.split() if line.strip())


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
