"""What the git hook adds to a commit, its background part included: `git commit` with and without it.

Two identical repositories, one with `orchestrator hook install`. Each round commits one small change in
both, in alternating order, twice: once with a message that names nothing (most commits: the hook must
decide in sh that there is nothing to queue, goal ≤ 5 ms added) and once with an `Orchestrator:` trailer
(the hook starts its Python side in the background, which reads the commit and sends or spools the
ticket; goal ≤ 30 ms added to what the user waits for).

Every commit runs under a small measuring process that is a child subreaper (`PR_SET_CHILD_SUBREAPER`):
the hook's background part, which leaves the commit's process tree, is re-parented to it and waited for.
So each figure has two sides: `wall`, the `git commit` the user waits for, and `whole cpu`, the user +
system CPU of everything the commit started (git, the hook, its background Python and every child),
which holds on a loaded machine where wall time swings. With `--daemon` a burst daemon answers the
tickets, otherwise they are spooled.

    orchestrator bench hook [--rounds 20] [--daemon] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.service import hooks

GOAL_NOTHING_MS = 5.0
GOAL_TRAILER_MS = 30.0

# Runs one command as a child subreaper and reports, as JSON, the command's wall time, the time until every
# process it left behind has ended, and the CPU of all of them (RUSAGE_CHILDREN once all are reaped).
_MEASURE = r"""
import ctypes, json, os, resource, subprocess, sys, time
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
start = time.perf_counter()
subprocess.run(sys.argv[1:], check=True)
wall = time.perf_counter() - start
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
drained = time.perf_counter() - start
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall_ms": wall * 1000, "drained_ms": drained * 1000, "cpu_ms": (r.ru_utime + r.ru_stime) * 1000}))
"""


def _git(cwd: Path, *args: str, env: dict[str, str] | None = None) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, env=env, timeout=60)


def _repo(root: Path) -> Path:
    root.mkdir(parents=True)
    _git(root, "init", "-q", "-b", "main")
    _git(root, "config", "user.name", "bench")
    _git(root, "config", "user.email", "bench@example.com")
    (root / "README.md").write_text("bench\n")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "initial")
    return root


def _measured_commit(repo: Path, i: int, trailer: bool, env: dict[str, str]) -> dict[str, float]:
    (repo / "f.txt").write_text(f"{i} {trailer}\n")
    _git(repo, "add", "f.txt", env=env)
    msg = f"change {i}\n\nOrchestrator: true bench {i}\nOrchestrator-Paths: f.txt" if trailer else f"change {i}"
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, "git", "commit", "-q", "-m", msg],
        cwd=repo, env=env, check=True, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return dict(json.loads(out.stdout))


def _stats(ms: list[float]) -> dict[str, float]:
    ordered = sorted(ms)
    return {
        "median_ms": round(statistics.median(ordered), 2),
        "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))], 2),
        "min_ms": round(ordered[0], 2),
    }


def _side(runs: list[dict[str, float]]) -> dict[str, Any]:
    return {key: _stats([r[f"{key}_ms"] for r in runs]) for key in ("wall", "cpu", "drained")}


def _compare(without: list[dict[str, float]], with_hook: list[dict[str, float]], goal: float) -> dict[str, Any]:
    a, b = _side(without), _side(with_hook)
    added = round(b["wall"]["median_ms"] - a["wall"]["median_ms"], 2)
    cpu_added = round(b["cpu"]["median_ms"] - a["cpu"]["median_ms"], 2)
    return {
        "without_hook": a,
        "with_hook": b,
        "added_ms": added,
        "ratio": round(b["wall"]["median_ms"] / a["wall"]["median_ms"], 3),
        "cpu_added_ms": cpu_added,
        "cpu_ratio": round(b["cpu"]["median_ms"] / a["cpu"]["median_ms"], 3) if a["cpu"]["median_ms"] else None,
        "goal_added_ms": goal,
    }


def run(rounds: int, with_daemon: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="orchestrator-bench-hook-", ignore_cleanup_errors=True) as tmp:
        root = Path(tmp)
        env = {**os.environ, "ORCHESTRATOR_HOME": str(root / "home")}
        env.pop("ORCHESTRATOR_SKIP", None)
        plain, hooked = _repo(root / "plain"), _repo(root / "hooked")
        hooks.install(hooked, home=env["ORCHESTRATOR_HOME"])
        daemon = None
        if with_daemon:
            daemon = subprocess.Popen(
                [sys.executable, "-m", "orchestrator", "daemon"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                stdin=subprocess.DEVNULL,
            )
            _wait_socket(root / "home" / "run" / "orchestrator.sock")
        load_before = os.getloadavg()[0]
        sides = [(trailer, hooked_side) for trailer in (False, True) for hooked_side in (False, True)]
        runs: dict[tuple[bool, bool], list[dict[str, float]]] = {side: [] for side in sides}
        try:
            for trailer in (False, True):
                for i in range(rounds):
                    # Alternate the order so neither side always runs second (warm caches).
                    for repo, hooked_side in ((plain, False), (hooked, True))[:: 1 if i % 2 else -1]:
                        runs[(trailer, hooked_side)].append(_measured_commit(repo, i, trailer, env))
        finally:
            if daemon is not None:
                daemon.terminate()
                daemon.wait(timeout=30)
        return {
            "rounds": rounds,
            "daemon": with_daemon,
            "load_1min": [round(load_before, 1), round(os.getloadavg()[0], 1)],
            "nothing_to_queue": _compare(runs[(False, False)], runs[(False, True)], GOAL_NOTHING_MS),
            "trailer": _compare(runs[(True, False)], runs[(True, True)], GOAL_TRAILER_MS),
        }


def _wait_socket(sock: Path, timeout: float = 30) -> None:
    from orchestrator.client import Client, Unreachable

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            Client(sock, timeout=2).health()
            return
        except (Unreachable, OSError):
            time.sleep(0.05)
    raise RuntimeError(f"the daemon did not answer on {sock} in {timeout} s")


def _print(name: str, r: dict[str, Any]) -> None:
    a, b = r["without_hook"], r["with_hook"]
    print(f"{name}")
    print("                wall median   wall p90    whole cpu median   all ended (median)")
    for label, side in (("without hook", a), ("with hook", b)):
        print(
            f"  {label:<12}  {side['wall']['median_ms']:8.2f} ms {side['wall']['p90_ms']:8.2f} ms "
            f"{side['cpu']['median_ms']:11.2f} ms {side['drained']['median_ms']:12.2f} ms"
        )
    print(
        f"  added         {r['added_ms']:8.2f} ms ({r['ratio']:.3f}×)      {r['cpu_added_ms']:8.2f} ms "
        f"({r['cpu_ratio']}×)   goal ≤ {r['goal_added_ms']:.0f} ms of wall"
    )


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="orchestrator bench hook", description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=20, help="commits per side and kind (default 20)")
    ap.add_argument("--daemon", action="store_true", help="a live daemon answers the hook (default: it spools)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(list(argv) if argv is not None else None)
    r = run(args.rounds, args.daemon)
    if args.json:
        print(json.dumps(r, indent=2))
        return
    mode = "daemon up" if r["daemon"] else "daemon down: spooled"
    load = " → ".join(map(str, r["load_1min"]))
    print(f"git commit, {r['rounds']} back-to-back rounds side by side ({mode}; load {load})")
    _print("a commit that names nothing (decided in sh, no Python)", r["nothing_to_queue"])
    _print("a commit with an Orchestrator: trailer (Python in the background, counted in whole cpu)", r["trailer"])


if __name__ == "__main__":
    main()
