"""Notifications: run the configured `on_end` command when a job ends (landed, failed, cancelled, ...).

`[jobs] on_end = ["notify-send", "orchestrator: {summary}"]` is an argv template, never a shell line:
each word is formatted with the job's fields (`core.on_end`), and the command also finds them in its
environment (`ORCHESTRATOR_JOB_ID`, `ORCHESTRATOR_JOB_STATE`, `ORCHESTRATOR_REPO`, `ORCHESTRATOR_BRANCH`,
`ORCHESTRATOR_CODE`, `ORCHESTRATOR_REASON`, `ORCHESTRATOR_SUMMARY`, `ORCHESTRATOR_SUBJECT`). It runs
through `process.run` (owned, bounded by `NOTIFY_TIMEOUT`, killed as a group), off the job's own path:
a slow or failing notifier never holds a job or the scheduler back; its failure is logged with a code.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from orchestrator import logging as olog
from orchestrator.core.job import Job
from orchestrator.core.models import Code
from orchestrator.core.on_end import render
from orchestrator.proc import process

NOTIFY_TIMEOUT = 30.0
"""Seconds an `on_end` command may take before its group is killed."""
PASS_ENV = ("DISPLAY", "WAYLAND_DISPLAY", "DBUS_SESSION_BUS_ADDRESS", "XDG_RUNTIME_DIR")
"""What a desktop notifier needs from the daemon's environment, beyond `process.BASE_ENV`."""


def fields(job: Job) -> dict[str, str]:
    """The values an `on_end` template and environment get for `job`."""
    name = Path(job.repo).name
    code = f" ({job.code})" if job.code else ""
    return {
        "id": str(job.id),
        "state": str(job.state),
        "repo": job.repo,
        "repo_name": name,
        "branch": job.branch,
        "code": job.code,
        "reason": job.reason,
        "subject": job.subject,
        "summary": f"job {job.id} {job.state}{code} in {name}: {job.subject}",
    }


def environment(job: Job) -> dict[str, str]:
    values = fields(job)
    extra = {
        "ORCHESTRATOR_JOB_ID": values["id"],
        "ORCHESTRATOR_JOB_STATE": values["state"],
        "ORCHESTRATOR_REPO": values["repo"],
        "ORCHESTRATOR_BRANCH": values["branch"],
        "ORCHESTRATOR_CODE": values["code"],
        "ORCHESTRATOR_REASON": values["reason"],
        "ORCHESTRATOR_SUMMARY": values["summary"],
        "ORCHESTRATOR_SUBJECT": values["subject"],
    }
    return process.environment(PASS_ENV, extra)


class Notifier:
    """Runs `on_end` for each ended job in a task it owns; `drain` waits for (then cancels) the rest."""

    def __init__(self, template: Sequence[str], owner: process.Owner | None = None) -> None:
        self.template = tuple(template)
        self.owner = owner
        self._tasks: set[asyncio.Task[None]] = set()

    def job_ended(self, job: Job) -> None:
        if not self.template:
            return
        task = asyncio.get_running_loop().create_task(self._run(job), name=f"on-end-{job.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, job: Job) -> None:
        log = olog.get(job_id=job.id, repo=job.repo)
        argv = render(self.template, fields(job))
        cwd = Path(job.repo) if await asyncio.to_thread(Path(job.repo).is_dir) else Path("/")
        try:
            result = await process.run(
                argv, cwd=cwd, env=environment(job), timeout=NOTIFY_TIMEOUT, owner=self.owner, what="on_end"
            )
        except OSError as e:
            log.warning(olog.Event.NOTIFY_FAILED, code=Code.NOTIFY_FAILED, argv=argv, error=str(e))
            return
        if result.ok:
            log.info(olog.Event.NOTIFY_RAN, argv=argv)
        else:
            log.warning(
                olog.Event.NOTIFY_FAILED,
                code=Code.NOTIFY_FAILED,
                argv=argv,
                status=result.status,
                output=result.output_tail,
            )

    async def drain(self, timeout: float) -> None:
        if not self._tasks:
            return
        _, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
