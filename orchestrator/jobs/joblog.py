"""The per-job log's own lines: a header per attempt, and the runner's exit status at its end.

The runner writes its output between them. `orchestrator logs` shows the log as is; `logs -f` ends on
the exit line's outcome. The lines start with `==> ` so they stand out from the runner's output.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import BinaryIO

from orchestrator.core.job import Job
from orchestrator.paths import open_private

HEADER = "==> "


def _open_private(path: Path, flags: int, mode: str) -> BinaryIO:
    """Job logs hold the job's text and output: 0600 whatever the umask."""
    return os.fdopen(open_private(path, flags), mode)  # type: ignore[return-value]  # a binary mode


def attempt_header(path: Path, job: Job, resume: str = "") -> None:
    """Append the header of the job's current attempt (a retried job's log holds every attempt); a run that goes
    on from the last one (review feedback, a rate limit over) says so, with the first line of what it was told."""
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    told = f" (goes on: {resume.strip().splitlines()[0][:100]})" if resume.strip() else ""
    with _open_private(path, os.O_WRONLY | os.O_APPEND, "ab") as f:
        f.write(f"{HEADER}attempt {job.attempts + 1} of job {job.id}, {stamp}: {job.subject}{told}\n".encode())


def exit_line(path: Path, exit_code: int | None, summary: str) -> None:
    """Append the runner's exit status (None: it was killed or never exited)."""
    status = "killed" if exit_code is None else f"exit status {exit_code}"
    with _open_private(path, os.O_RDWR | os.O_APPEND, "a+b") as f:
        size = f.seek(0, 2)
        newline = b""
        if size:
            f.seek(size - 1)
            newline = b"" if f.read(1) == b"\n" else b"\n"
        f.write(newline + f"{HEADER}{status}: {summary}\n".encode())
