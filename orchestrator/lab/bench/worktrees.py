"""Worktree readiness: how long until a job has a clean worktree at its base, fresh versus pooled.

Builds a repository of `files` small text files in nested dirs, then a chain of commits each changing a
dozen files (as landings do). Each round, side by side: (a) `git worktree add` with the real git CLI,
(b) a fresh worktree through libgit2 (pygit2), (c) `WorktreePool.acquire` with the pool warm at the
previous commit of the chain (where the last job's recycled worktree sits), and (d) `acquire` with
an empty pool (its fresh fallback). Also times the release that recycles (c) and `actual_paths` on
the 10k-file worktree with a few edits. Goal: pooled ≤ 0.2× fresh git.

    python -m orchestrator.lab.bench.worktrees [--files 10000] [--rounds 5] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pygit2

from orchestrator import logging as olog
from orchestrator.git.changes import actual_paths
from orchestrator.git.worktrees import WorktreePool

GOAL = 0.2
CHANGED_PER_COMMIT = 12


def _git(cwd: Path, *args: str) -> str:
    argv = ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.com", *args]
    return subprocess.run(argv, cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def _file(i: int) -> str:
    return f"pkg{i % 20:02d}/mod{(i // 20) % 25:02d}/part{(i // 500) % 4}/f{i:05d}.txt"


def build_repo(root: Path, files: int, commits: int) -> list[str]:
    """A repository of `files` small files, then `commits` commits changing a few each; their shas, oldest first."""
    root.mkdir(parents=True)
    _git(root, "init", "-q", "-b", "main")
    for i in range(files):
        p = root / _file(i)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"file {i}\n" * 4)
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "initial")
    shas = [_git(root, "rev-parse", "HEAD")]
    step = max(1, files // CHANGED_PER_COMMIT)
    for c in range(commits):
        for i in range(c, files, step):
            with (root / _file(i)).open("a") as f:
                f.write(f"change {c}\n")
        (root / f"added/c{c}.txt").parent.mkdir(exist_ok=True)
        (root / f"added/c{c}.txt").write_text(f"{c}\n")
        _git(root, "add", "-A")
        _git(root, "commit", "-q", "-m", f"change {c}")
        shas.append(_git(root, "rev-parse", "HEAD"))
    _git(root, "repack", "-adq")  # real repositories are packed; 10k loose objects would be an odd handicap
    return shas


def _timed(fn: Callable[..., None], *args: object) -> float:
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def _fresh_git(repo: Path, dest: Path, branch: str, base: str) -> None:
    _git(repo, "worktree", "add", "-q", "-b", branch, str(dest), base)


def _fresh_pygit2(repo: Path, dest: Path, branch: str, base: str) -> None:
    r = pygit2.Repository(str(repo))
    ref = r.branches.local.create(branch, r[base].peel(pygit2.Commit), force=True)
    r.add_worktree(dest.name, str(dest), ref)


def _drop(repo: Path, dest: Path, branch: str) -> None:
    shutil.rmtree(dest)
    _git(repo, "worktree", "prune")
    _git(repo, "branch", "-q", "-D", branch)


async def _pool_rounds(repo: Path, root: Path, chain: list[str], rounds: int) -> dict[str, list[float]]:
    pool = WorktreePool(root / "pool", warm=1)
    empty = WorktreePool(root / "empty", warm=0)
    out: dict[str, list[float]] = {"pooled": [], "release": [], "empty": [], "actual": []}
    await pool.fill(repo, chain[0])  # a landing at chain[0]; the next jobs start on later commits
    loop = asyncio.get_running_loop()
    for r in range(rounds):
        base = chain[r + 1]
        t = loop.time()
        wt = await pool.acquire(repo, 1000 + r, base)
        out["pooled"].append(loop.time() - t)
        for i in range(0, 40, 10):
            with (wt / _file(i)).open("a") as f:
                f.write("edit\n")
        (wt / "new-by-job.txt").write_text("n\n")
        t = loop.time()
        await asyncio.to_thread(actual_paths, wt, base)
        out["actual"].append(loop.time() - t)
        t = loop.time()
        await pool.release(repo, 1000 + r, delete_branch=True)  # recycled: sits at `base` for the next round
        out["release"].append(loop.time() - t)

        t = loop.time()
        await empty.acquire(repo, 2000 + r, base)
        out["empty"].append(loop.time() - t)
        await empty.release(repo, 2000 + r, delete_branch=True)
    return out


def run(files: int = 10_000, rounds: int = 5) -> dict[str, Any]:
    """Median ready times (ms) of the four ways to get a worktree, and pooled / fresh-git."""
    with tempfile.TemporaryDirectory(prefix="orchestrator-bench-wt-") as tmp:
        root = Path(tmp)
        repo = root / "repo"
        chain = build_repo(repo, files, rounds + 1)
        fresh_git: list[float] = []
        fresh_pygit2: list[float] = []
        for r in range(rounds):
            base = chain[r + 1]
            for kind, fn, sink in (("git", _fresh_git, fresh_git), ("pygit2", _fresh_pygit2, fresh_pygit2)):
                dest, branch = root / f"{kind}-{r}", f"bench/{kind}-{r}"
                sink.append(_timed(fn, repo, dest, branch, base))
                _drop(repo, dest, branch)
        pooled = asyncio.run(_pool_rounds(repo, root, chain, rounds))

    def med(xs: list[float]) -> float:
        return round(statistics.median(xs) * 1000, 1)

    result: dict[str, Any] = {
        "files": files,
        "rounds": rounds,
        "git_version": _git(Path.cwd(), "--version").removeprefix("git version "),
        "libgit2_version": pygit2.LIBGIT2_VERSION,
        "cpus": os.cpu_count(),
        "fresh_git_ms": med(fresh_git),
        "fresh_pygit2_ms": med(fresh_pygit2),
        "pooled_ms": med(pooled["pooled"]),
        "pool_empty_ms": med(pooled["empty"]),
        "release_recycle_ms": med(pooled["release"]),
        "actual_paths_ms": med(pooled["actual"]),
    }
    # Fresh creation writes every file and is bound by the disk; on a throttled or busy disk the
    # medians flatter the pool. The best fresh round against the worst pooled one is the strict test.
    result["fresh_git_min_ms"] = round(min(fresh_git) * 1000, 1)
    result["pooled_max_ms"] = round(max(pooled["pooled"]) * 1000, 1)
    result["pooled_over_fresh_git"] = round(result["pooled_ms"] / result["fresh_git_ms"], 3)
    result["worst_pooled_over_best_fresh_git"] = round(result["pooled_max_ms"] / result["fresh_git_min_ms"], 3)
    result["pygit2_over_fresh_git"] = round(result["fresh_pygit2_ms"] / result["fresh_git_ms"], 3)
    result["goal_met"] = result["pooled_over_fresh_git"] <= GOAL
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="orchestrator bench worktrees", description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    args = parser.parse_args(argv)
    olog.configure(sys.stderr, level="warning")  # the pool's info events would drown the table
    r = run(args.files, args.rounds)
    if args.json:
        print(json.dumps(r))
        return
    print(
        f"worktrees: {r['files']} files, {r['rounds']} rounds, medians; git {r['git_version']}, "
        f"libgit2 {r['libgit2_version']}, {r['cpus']} cpus"
    )
    rows = [
        ("(a) fresh: git worktree add", r["fresh_git_ms"], 1.0),
        ("(b) fresh: pygit2 add_worktree", r["fresh_pygit2_ms"], r["pygit2_over_fresh_git"]),
        ("(c) pooled acquire (pool 1 commit behind)", r["pooled_ms"], r["pooled_over_fresh_git"]),
        ("(d) acquire, pool empty", r["pool_empty_ms"], r["pool_empty_ms"] / r["fresh_git_ms"]),
    ]
    for label, ms, ratio in rows:
        print(f"  {label:<44} {ms:8.1f} ms  {ratio:5.2f}×")
    print(f"  {'release, recycled into the pool':<44} {r['release_recycle_ms']:8.1f} ms")
    print(f"  {'actual_paths, 5 changed files':<44} {r['actual_paths_ms']:8.1f} ms")
    verdict = "met" if r["goal_met"] else "NOT met"
    print(f"  pooled / fresh git = {r['pooled_over_fresh_git']:.3f} (goal ≤ {GOAL}: {verdict})")
    print(
        f"  worst pooled / best fresh git = {r['pooled_max_ms']:.1f} / {r['fresh_git_min_ms']:.1f} ms"
        f" = {r['worst_pooled_over_best_fresh_git']:.3f}"
    )


if __name__ == "__main__":
    main()
