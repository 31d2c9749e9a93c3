"""The crash test: kill -9 the daemon at random moments, restart it, and check that nothing was lost or doubled.

Each round, in a fresh temp dir: a repository whose main checkout is on the target branch with the user's own
uncommitted edit in an unrelated file, a landing check, sometimes a slow `core.fsmonitor` (it widens the
window between the ref move and the checkout update); a daemon started in its own session with a random
mix of shell jobs (disjoint files, and appends to one shared file that overlap); a `kill -9` of the daemon
(or of its whole process group) at a random moment, weighted towards landings; a restart with
`jobs.requeue_interrupted` on, until every job has ended. Then the invariants:

1. every acknowledged job is there, and ended;
2. every landed job's change is on the branch exactly once, and no other job's at all;
3. the user's checkout is consistent with its branch: `git status` shows only their own edit, intact;
4. no runner process of the dead daemon is left;
5. after `clean`, no worktree or branch of the orchestrator is left;
6. `git fsck` is clean.

    orchestrator bench crash [--kills 50] [--seed 0] [--max-jobs 6] [--keep DIR] [--json]

Exit 0 when no round broke an invariant, 1 otherwise (each violation printed on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.client import ApiError, Client, Unreachable
from orchestrator.core.models import ENDED as TERMINAL_STATES
from orchestrator.proc import process

USER_FILE = "notes/mine.txt"
USER_EDIT = "the user's own uncommitted edit\n"
SHARED = "shared.txt"
READY_TIMEOUT = 30.0
SETTLE_TIMEOUT = 180.0
ENDED = (*sorted(str(s) for s in TERMINAL_STATES), "missing")


@dataclass
class Round:
    n: int
    jobs: dict[int, str] = field(default_factory=dict)
    """Acknowledged job id → its token (a line only that job writes)."""
    killed_at: str = ""
    group_kill: bool = False
    slow_checkout: bool = False
    states: dict[int, str] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _git(cwd: Path, *args: str, check: bool = True) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_AUTHOR_NAME="bench", GIT_AUTHOR_EMAIL="b@x", GIT_COMMITTER_NAME="bench", GIT_COMMITTER_EMAIL="b@x")
    out = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if check and out.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} in {cwd}: {out.stderr.strip()}")
    return out.stdout.strip()


def _make_repo(root: Path, slow_checkout: bool) -> Path:
    repo = root / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "README.md").write_text("crash test\n")
    (repo / SHARED).write_text("shared\n")
    (repo / "notes").mkdir()
    (repo / USER_FILE).write_text("committed\n")
    (repo / ".gitattributes").write_text(f"{SHARED} merge=union\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "initial")
    (repo / USER_FILE).write_text(USER_EDIT)
    if slow_checkout:
        hook = root / "fsmonitor"
        hook.write_text("#!/bin/sh\nsleep 0.2\nexit 1\n")
        hook.chmod(0o755)
        _git(repo, "config", "core.fsmonitor", str(hook))
    return repo


def _config(home: Path, repo: Path) -> None:
    cfg = home / "config"
    cfg.mkdir(parents=True, exist_ok=True)
    (cfg / "config.toml").write_text(
        "[jobs]\nmax_concurrent = 3\nrequeue_interrupted = true\nkill_grace = 1\nmax_attempts = 6\n"
        f'[repos."{repo}"]\ncheck = "sleep 0.1; test -f README.md"\n'
    )


class Daemon:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = {**os.environ, "ORCHESTRATOR_HOME": str(home)}
        self.env.pop("JOURNAL_STREAM", None)
        self.log = home / "daemon.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.client = Client(home / "run" / "orchestrator.sock", timeout=30)

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "orchestrator", "daemon"],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # so a kill of "its process group" is the daemon's, not ours
            )
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited {self.proc.returncode}: see {self.log}")
            try:
                self.client.health()
                return
            except (Unreachable, OSError):
                time.sleep(0.05)
        raise RuntimeError(f"daemon not ready in {READY_TIMEOUT}s: see {self.log}")

    def kill(self, group: bool) -> None:
        assert self.proc is not None
        if group:
            os.killpg(self.proc.pid, signal.SIGKILL)
        else:
            self.proc.kill()
        self.proc.wait(30)

    def stop(self) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def events_seen(self, name: str) -> int:
        try:
            return self.log.read_text().count(f'"event": "{name}"')
        except FileNotFoundError:
            return 0


def _job_text(token: str, path: str, pids: Path, sleep: float) -> str:
    # Records its pid (to check none survives a dead daemon), works a while, then writes its token.
    return f"echo $$ >> {pids}; sleep {sleep:.2f}; echo {token} >> {path}"


def run_round(n: int, rng: random.Random, root: Path, max_jobs: int = 6) -> Round:
    r = Round(n)
    started = time.monotonic()
    r.slow_checkout = rng.random() < 0.5
    r.group_kill = rng.random() < 0.5
    repo = _make_repo(root, r.slow_checkout)
    home = root / "home"
    _config(home, repo)
    pids = root / "pids"
    d = Daemon(home)
    d.start()
    try:
        for j in range(rng.randint(3, max(3, max_jobs))):
            token = f"token-{n}-{j}-{rng.randrange(1 << 30)}"
            overlapping = rng.random() < 0.4
            path = SHARED if overlapping else f"f{j}.txt"
            text = _job_text(token, path, pids, rng.choice((0.0, 0.2, 0.6, 1.5)))
            job = d.client.enqueue(repo=str(repo), text=text, paths=[path])
            r.jobs[int(job["id"])] = token
        _kill_sometime(d, rng, r)
        before = set(pids.read_text().split()) if pids.exists() else set()
        d.start()
        _settle(d, r)
        _check(d, repo, r, before)
    finally:
        d.stop()
        r.seconds = time.monotonic() - started
    return r


def _kill_sometime(d: Daemon, rng: random.Random, r: Round) -> None:
    """Most rounds: just after the n-th landing starts (a random small delay into it); else at a random time."""
    if rng.random() < 0.7:
        nth = rng.randint(1, max(1, len(r.jobs) - 1))
        delay = rng.choice((0.0, 0.005, 0.02, 0.05, 0.1, 0.2))
        deadline = time.monotonic() + 30
        while d.events_seen("landing.started") < nth and time.monotonic() < deadline:
            time.sleep(0.002)
        time.sleep(delay)
        r.killed_at = f"landing {nth} +{delay * 1000:.0f}ms"
    else:
        delay = rng.uniform(0.1, 3.0)
        time.sleep(delay)
        r.killed_at = f"t+{delay:.2f}s"
    d.kill(r.group_kill)


def _settle(d: Daemon, r: Round) -> None:
    """Until every acknowledged job has ended; interrupted ones are re-queued by the restart itself."""
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while time.monotonic() < deadline:
        jobs = {int(j["id"]): j for j in d.client.jobs()}
        r.states = {i: str(jobs[i]["state"]) if i in jobs else "missing" for i in r.jobs}
        if all(s in ENDED for s in r.states.values()):
            for i, s in r.states.items():
                if s in ("failed", "interrupted", "conflicted"):
                    r.violations.append(f"job {i} ended {s}: {jobs[i]['reason']}")
            return
        try:
            d.client.wait(list(r.jobs), timeout=5)
        except (ApiError, Unreachable, OSError):
            time.sleep(0.2)
    r.violations.append(f"jobs not ended after {SETTLE_TIMEOUT:.0f}s: {r.states}")


def _check(d: Daemon, repo: Path, r: Round, before_kill: set[str]) -> None:
    v = r.violations
    for i in r.jobs:
        if r.states.get(i) == "missing":
            v.append(f"acknowledged job {i} is missing")
    tree = {p: _git(repo, "show", f"main:{p}") for p in _git(repo, "ls-tree", "-r", "--name-only", "main").split()}
    for i, token in r.jobs.items():
        times = sum(text.split("\n").count(token) for text in tree.values())
        want = 1 if r.states.get(i) == "landed" else 0
        if times != want:
            v.append(f"job {i} ({r.states.get(i)}): its change is on main {times} times, expected {want}")
    status = subprocess.run(
        ["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True, check=False
    ).stdout.splitlines()
    if status != [f" M {USER_FILE}"]:
        v.append(f"user's checkout not consistent with main: git status {status}")
    if (repo / USER_FILE).read_text() != USER_EDIT:
        v.append("the user's own edit was changed")
    if _git(repo, "symbolic-ref", "HEAD") != "refs/heads/main":
        v.append("the user's checkout is no longer on main")
    alive = [p for p in before_kill if process.alive(int(p))]
    if alive:
        v.append(f"runner processes of the dead daemon still alive: {alive}")
    for i in r.jobs:
        try:
            d.client.clean(i)
        except ApiError as e:
            v.append(f"clean {i}: {e}")
    listing = _git(repo, "worktree", "list", "--porcelain").splitlines()
    # The warm pool's worktrees (`pool-*`, bounded) are the daemon's own, not a job's leftovers.
    worktrees = [line for line in listing if line.startswith("worktree ") and "/pool-" not in line]
    if len(worktrees) != 1:
        v.append(f"worktrees left after clean: {worktrees[1:]}")
    branches = _git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads/orchestrator/")
    if branches:
        v.append(f"branches left after clean: {branches.split()}")
    fsck = subprocess.run(["git", "fsck", "--no-progress"], cwd=repo, capture_output=True, text=True, check=False)
    if fsck.returncode != 0:
        v.append(f"git fsck failed: {fsck.stderr.strip() or fsck.stdout.strip()}")


def run(kills: int, seed: int, keep: Path | None = None, out: Any = None, max_jobs: int = 6) -> list[Round]:
    """`kills` rounds, each one kill -9 and one restart; the rounds' results (violations empty when all held)."""
    rng = random.Random(seed)
    rounds = []
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
    for n in range(kills):
        root = Path(tempfile.mkdtemp(prefix=f"orchestrator-crash-{n}-", dir=keep))
        try:
            r = run_round(n, rng, root, max_jobs)
        except (RuntimeError, OSError, ApiError, subprocess.SubprocessError) as e:
            r = Round(n, violations=[f"round could not run: {type(e).__name__}: {e}"])
        rounds.append(r)
        if out is not None:
            mark = "ok" if not r.violations else "VIOLATED"
            print(
                f"kill {n + 1}/{kills}: {mark} ({len(r.jobs)} jobs, killed at {r.killed_at}, "
                f"{'group' if r.group_kill else 'daemon'}, {'slow' if r.slow_checkout else 'plain'} checkout, "
                f"{r.seconds:.1f}s)",
                file=out,
            )
            for line in r.violations:
                print(f"  {line}", file=out)
        if keep is None or not r.violations:
            shutil.rmtree(root, ignore_errors=True)
    return rounds


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="orchestrator bench crash", description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=50, help="rounds, one kill -9 each")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-jobs", type=int, default=6, help="jobs per round: 3 to this many")
    ap.add_argument("--keep", type=Path, default=None, help="keep the dirs of rounds that broke an invariant here")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = ap.parse_args(argv)
    started = time.monotonic()
    rounds = run(args.kills, args.seed, args.keep, out=sys.stderr, max_jobs=args.max_jobs)
    broken = [r for r in rounds if r.violations]
    summary = {
        "kills": len(rounds),
        "violations": sum(len(r.violations) for r in rounds),
        "rounds_with_violations": [r.n for r in broken],
        "jobs": sum(len(r.jobs) for r in rounds),
        "landed": sum(1 for r in rounds for s in r.states.values() if s == "landed"),
        "killed_in_landing": sum(1 for r in rounds if r.killed_at.startswith("landing")),
        "group_kills": sum(1 for r in rounds if r.group_kill),
        "seconds": round(time.monotonic() - started, 1),
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"{summary['kills']} kills, {summary['violations']} violations "
            f"({summary['jobs']} jobs, {summary['landed']} landed, {summary['killed_in_landing']} kills during "
            f"landings, {summary['group_kills']} of the whole process group) in {summary['seconds']}s"
        )
    sys.exit(1 if broken else 0)
