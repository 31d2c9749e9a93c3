"""A job's private dir (its scratch HOME, TMPDIR, scripts) goes when the job no longer needs it.

A landed job needs it no more, nor one that ended before it ever ran; a job whose workspace is kept (failed,
cancelled while running, interrupted, conflicted, ready for review) keeps it too, so a retry or a revision
finds the CLI's session where it left it. `orchestrator clean` removes what is left (`remove`), with the
job's log and transcript: after `clean --all` no job leaves anything under the state dir.
"""

from __future__ import annotations

import asyncio
import shutil

from orchestrator import logging as olog
from orchestrator.core.job import Job
from orchestrator.core.models import JobState
from orchestrator.paths import Paths
from orchestrator.runners.command import transcript_path


def done_with(job: Job) -> bool:
    """The job ended and nothing of its attempt is kept for a person (its workspace went with it). Pure."""
    return job.state is JobState.LANDED or (job.state.terminal and job.started_at is None)


class PrivateDirs:
    """Removes private dirs in the background when jobs end (`board.on_end`); `close` awaits what is under way."""

    def __init__(self, paths: Paths) -> None:
        self.paths = paths
        self._tasks: set[asyncio.Task[None]] = set()

    def job_ended(self, job: Job) -> None:
        if done_with(job):
            task = asyncio.get_running_loop().create_task(asyncio.to_thread(self.remove, job.id, keep_record=True))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def remove(self, job_id: int, *, keep_record: bool = False) -> None:
        """The job's private dir; with the record gone too (`clean`), its log and transcript as well."""
        private = self.paths.job_private(job_id)
        if private.is_dir() and not private.is_symlink():
            try:
                shutil.rmtree(private)
            except OSError as e:  # said, not fatal: `clean` tries again
                olog.get(job_id=job_id).warning(olog.Event.JOB_CLEANED, path=str(private), reason=f"not removed: {e}")
        if not keep_record:
            for path in (self.paths.job_log(job_id), transcript_path(self.paths.job_log(job_id))):
                path.unlink(missing_ok=True)

    async def close(self) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
