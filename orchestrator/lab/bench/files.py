"""`orchestrator bench files`: what a job that writes many files costs everyone else, through the real daemon.

One daemon, two repositories. A sampler asks the API (`status`: every job; `show` of a small job and of the big
one) every `--every` seconds, and small jobs run one after another in the other repository, while:

1. `idle`: nothing else runs (the baseline);
2. `writing`: one job writes `--files` files (in directories of 1,000) into its workspace, then ends (it fails
   on purpose, so the figures are the watch's and not the commit of a million files); `--shape` makes it empty
   directories, directories nested that deep, or that many files renamed back and forth instead (`SHAPES`).

Each phase reports the API's p50 / p99 / max and the small jobs' mean time from enqueue to landed; the ratio of
the writing phase to the idle one is the figure (taken side by side, in one run). `--code DIR` runs the daemon from
another checkout (e.g. an older main), to compare two versions on the same machine.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import click

from orchestrator.client import ApiError, Unreachable
from orchestrator.lab.bench import schedule as sched
from orchestrator.lab.bench.daemon import BenchDaemon, BenchError, epoch, machine
from orchestrator.lab.bench.history import git

WRITER = (
    "import os, sys\n"
    "n = int(sys.argv[1])\n"
    "for d in range(0, n, 1000):\n"
    "    os.mkdir(f'gen/d{d // 1000}')\n"
    "    for i in range(d, min(d + 1000, n)):\n"
    "        with open(f'gen/d{d // 1000}/f{i}.txt', 'w') as f:\n"
    "            f.write(f'{i}\\n')\n"
)
"""The big job's writer (run with the job's own python3): distinct contents, so every file is a change."""
SHAPES: dict[str, str] = {
    "files": WRITER,
    "dirs": (
        "import os, sys\n"
        "n = int(sys.argv[1])\n"
        "for d in range(0, n, 1000):\n"
        "    os.mkdir(f'gen/d{d // 1000}')\n"
        "    for i in range(d, min(d + 1000, n)):\n"
        "        os.mkdir(f'gen/d{d // 1000}/e{i}')\n"
    ),
    "deep": (
        "import os, sys\n"
        "os.chdir('gen')\n"
        "for _ in range(int(sys.argv[1])):\n"
        "    os.mkdir('d'); os.chdir('d')\n"
        "open('f', 'w').write('deep\\n')\n"
    ),
    "renames": (
        "import os, sys, time\n"
        "n, seconds = int(sys.argv[1]), float(sys.argv[2])\n"
        "os.mkdir('gen/a')\n"
        "for i in range(n):\n"
        "    with open(f'gen/a/f{i}.txt', 'w') as f:\n"
        "        f.write(f'{i}\\n')\n"
        "end, k = time.monotonic() + seconds, 0\n"
        "while time.monotonic() < end:\n"
        "    os.rename('gen/a', 'gen/b'); os.rename('gen/b', 'gen/a'); k += 2\n"
        "print(f'renames: {k}')\n"
    ),
}
"""What the big job makes (`--shape`): `files` (distinct files, in directories of 1,000), `dirs` (empty directories,
in directories of 1,000), `deep` (directories nested `--files` deep, a file at the bottom), `renames` (`--files`
files in one directory, then that directory renamed back and forth for as long as the idle phase lasted)."""


def _repo(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "README.md").write_text("bench\n")
    git(path, "init", "-q", "-b", "main")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "base")
    return path


class _Daemon(BenchDaemon):
    ARGS = ("--grace", "3")
    """Not in burst mode: between two small jobs its queue is empty, and it must not exit."""


class _Sampler(threading.Thread):
    """Times `status` and `show` over the API until stopped."""

    def __init__(self, d: BenchDaemon, every: float, show: list[int]) -> None:
        super().__init__(daemon=True)
        self.d, self.every, self.show = d, every, show
        self.status: list[float] = []
        self.shown: list[float] = []
        self.failed: list[str] = []
        """Calls that got no answer (counted in the figures with the time they took)."""
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.every):
            self.status.append(self._timed(self.d.client.jobs))
            for job_id in list(self.show):
                self.shown.append(self._timed(functools.partial(self.d.client.job, job_id)))

    def _timed(self, call: Any) -> float:
        """How long one call took; one that failed (a client timeout: the API did not answer) counts what it
        took, and the sampler goes on."""
        t = time.perf_counter()
        try:
            call()
        except (Unreachable, ApiError, OSError) as e:
            self.failed.append(f"{type(e).__name__}: {e}")
        return time.perf_counter() - t


def _small_jobs(d: BenchDaemon, repo: Path, until: threading.Event, tag: str, show: list[int]) -> list[float]:
    """Small jobs one after another in `repo` until `until` is set: enqueue-to-landed seconds of each (the first
    one's `show` is sampled from then on)."""
    took = []
    i = 0
    while not until.is_set():
        job = d.client.enqueue(repo=str(repo), text=f"echo {i} > {tag}{i}.txt", paths=[f"{tag}{i}.txt"])
        if i == 0:
            show.append(job["id"])
        done = d.client.wait([job["id"]], timeout=600)["jobs"][0]
        if done["state"] == "landed":
            took.append(epoch(done["finished_at"]) - epoch(done["created_at"]))
        i += 1
    return took


def _phase(d: BenchDaemon, small: Path, every: float, name: str, run: Any) -> dict[str, Any]:
    """Sample the API and run small jobs while `run(show)` works (it returns the phase's own figures)."""
    show: list[int] = []
    sampler = _Sampler(d, every, show)
    done = threading.Event()
    took: list[float] = []
    worker = threading.Thread(target=lambda: took.extend(_small_jobs(d, small, done, name, show)), daemon=True)
    sampler.start()
    worker.start()
    started = time.perf_counter()
    try:
        extra = run(show)
    finally:
        done.set()
        worker.join(timeout=600)
        sampler.stop.set()
        sampler.join(timeout=120)
    calls = sampler.status + sampler.shown
    return {
        "phase": name,
        "seconds": round(time.perf_counter() - started, 1),
        "api_calls": len(calls),
        "api_p50_s": sched.fig(sched.pct(calls, 0.5), 4),
        "api_p99_s": sched.fig(sched.pct(calls, 0.99), 4),
        "api_max_s": sched.fig(sched.most(calls), 4),
        "status_p99_s": sched.fig(sched.pct(sampler.status, 0.99), 4),
        "show_p99_s": sched.fig(sched.pct(sampler.shown, 0.99), 4),
        "small_jobs": len(took),
        "small_job_mean_s": round(sum(took) / len(took), 3) if took else None,
        **extra,
    }


def run_bench(
    work: Path, files: int, idle: float, every: float, code: Path | None, shape: str = "files"
) -> list[dict[str, Any]]:
    big_repo = _repo(work / "big")
    small = _repo(work / "small")
    (work / "writer.py").write_text(SHAPES[shape])
    env = {"PYTHONPATH": str(code)} if code is not None else {}
    config = '[jobs]\nmax_concurrent = 3\nper_repo = 2\nsandbox = "none"\ntimeout = 7200\n'
    os.chdir(work)  # `python -m orchestrator` finds the package in its working dir first: none here, so `--code` holds
    with _Daemon(work / "home", config, env=env) as d:
        d.client.health()

        def wait(show: list[int]) -> dict[str, Any]:
            time.sleep(idle)
            return {}

        idle_row = _phase(d, small, every, "idle", wait)

        def write(show: list[int]) -> dict[str, Any]:
            text = f"mkdir gen && python3 {work / 'writer.py'} {files} {idle} && exit 3"
            job = d.client.enqueue(repo=str(big_repo), text=text, paths=["gen/"])
            show.append(job["id"])
            t = time.perf_counter()
            end = d.client.wait([job["id"]], timeout=7200)["jobs"][0]
            shown = d.client.job(job["id"])
            return {
                "shape": shape,
                "files": files,
                "big_job_s": round(time.perf_counter() - t, 1),
                "big_job_state": end["state"],
                "big_job_actual": len(shown.get("actual") or []),
            }

        writing = _phase(d, small, every, "writing", write)
    for key in ("api_p50_s", "api_p99_s", "small_job_mean_s"):
        base, now = idle_row.get(key), writing.get(key)
        if base and now:
            writing[f"{key[:-2]}_ratio"] = round(now / base, 2)
    return [idle_row, writing]


@click.command("files")
@click.option("--files", type=int, default=1_000_000, show_default=True, help="Files the big job writes.")
@click.option("--idle", type=float, default=20.0, show_default=True, help="Seconds of the idle (baseline) phase.")
@click.option("--every", type=float, default=0.1, show_default=True, help="Seconds between API samples.")
@click.option(
    "--code", type=click.Path(exists=True, file_okay=False, path_type=Path), help="Run the daemon from this checkout."
)
@click.option(
    "--shape", type=click.Choice(sorted(SHAPES)), default="files", show_default=True,
    help="What the big job makes: files, empty dirs, dirs nested --files deep, or --files files renamed in a loop.",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON on stdout.")
def main(files: int, idle: float, every: float, code: Path | None, shape: str, as_json: bool) -> None:
    """What a job writing many files costs the API and the other jobs: p50/p99 beside an idle baseline."""
    if files < 1 or idle <= 0 or every <= 0:
        raise click.UsageError("--files, --idle and --every must be positive")
    work = Path(tempfile.mkdtemp(prefix="orchestrator-files-"))
    try:
        click.echo(f"files: one job making {files} ({shape}), the API sampled every {every:g} s ...", err=True)
        rows = run_bench(work, files, idle, every, code.resolve() if code else None, shape)
        _report(rows, code, as_json)  # before the clean-up: a million files take a while to delete
    except BenchError as e:
        click.echo(f"orchestrator bench files: {e}", err=True)
        sys.exit(1)
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(work)], check=False)  # any depth (`--shape deep`)


def _report(rows: list[dict[str, Any]], code: Path | None, as_json: bool) -> None:
    m = machine()
    if as_json:
        click.echo(json.dumps({"machine": m, "code": str(code or os.path.dirname(__file__)), "rows": rows}, indent=2))
        sys.stdout.flush()
        return
    click.echo(f"files bench: {m['cores']} cores, {m['ram_mb']} MB RAM, Python {m['python']}, load {m['load_1m']}")
    for row in rows:
        click.echo(f"  {row['phase']}:")
        for k, v in row.items():
            if k != "phase":
                click.echo(f"    {k:<22} {'-' if v is None else v}")
