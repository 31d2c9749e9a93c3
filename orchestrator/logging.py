"""One log: structlog JSON lines on stdout (journald keeps them under systemd), a console renderer on a TTY.

Event names are a closed set (`Event`); `job_id` and `repo` are bound with contextvars inside each job's
task. Secrets never reach a log: keys that name one are masked, and so are values that look like one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
from collections.abc import Iterator, MutableMapping
from enum import StrEnum
from typing import Any, TextIO

import structlog


class Event(StrEnum):
    """Every event name the daemon logs."""

    DAEMON_STARTED = "daemon.started"
    DAEMON_RECOVERED = "daemon.recovered"
    DAEMON_STOPPING = "daemon.stopping"
    DAEMON_STOPPED = "daemon.stopped"
    DAEMON_CANCELLED = "daemon.cancelled"
    API_ERROR = "api.error"
    CONTROL_CHANGED = "control.changed"
    NOTIFY_RAN = "notify.ran"
    NOTIFY_FAILED = "notify.failed"
    SCHEDULER_ERROR = "scheduler.error"
    JOB_ENQUEUED = "job.enqueued"
    JOB_PLANNED = "job.planned"
    PLAN_STARTED = "plan.started"
    PLAN_NOTE = "plan.note"
    PLAN_HISTORY = "plan.history"
    PLAN_RECORD = "plan.record"
    PLAN_THRESHOLD = "plan.threshold"
    JOB_STARTED = "job.started"
    REPLAY_STARTED = "replay.started"
    """The replay runner began its job's work (its wait); with `replay.applied`, the benchmark's clock."""
    REPLAY_APPLIED = "replay.applied"
    JOB_FINISHED = "job.finished"
    JOB_FAILED = "job.failed"
    JOB_CANCELLED = "job.cancelled"
    JOB_RETRIED = "job.retried"
    JOB_CLEANED = "job.cleaned"
    JOB_REQUEUED = "job.requeued"
    JOB_CHANGED = "job.changed"
    JOB_OVERLAP = "job.overlap"
    ADMISSION_ADMITTED = "admission.admitted"
    ADMISSION_DEFERRED = "admission.deferred"
    ADMISSION_FAILED = "admission.failed"
    ADMISSION_REPLAN = "admission.replan"
    LANDING_STARTED = "landing.started"
    LANDING_LANDED = "landing.landed"
    LANDING_NOOP = "landing.noop"
    LANDING_CONFLICT = "landing.conflict"
    LANDING_WAITING = "landing.waiting"
    LANDING_WAIT_ENDED = "landing.wait_ended"
    LANDING_CHECK_FAILED = "landing.check_failed"
    WORKTREE_ERROR = "worktree.error"
    WORKTREE_ACQUIRED = "worktree.acquired"
    WORKTREE_POOLED_FAILED = "worktree.pooled_failed"
    WORKTREE_KEPT = "worktree.kept"
    WORKTREE_POOL_FILLED = "worktree.pool_filled"
    WORKTREE_RECOVERED = "worktree.recovered"
    WORKTREE_RECYCLE_FAILED = "worktree.recycle_failed"
    WORKTREE_RECYCLED = "worktree.recycled"
    WORKTREE_REMOVED = "worktree.removed"
    CHANGES_UNPARSABLE_DIFF = "changes.unparsable_diff"
    CHANGES_WATCH_STOP_TIMEOUT = "changes.watch_stop_timeout"
    CLAUDE_CALL = "claude.call"
    CLAUDE_RETRY = "claude.retry"
    JOB_OVERLAP_CHECKED = "job.overlap_checked"
    GATE_ADMITTED = "gate.admitted"
    GATE_REJECTED = "gate.rejected"
    OLLAMA_GATE_BUSY = "ollama.gate.busy"
    OLLAMA_GATE_PREEMPTED = "ollama.gate.preempted"
    OLLAMA_GATE_STATS = "ollama.gate.stats"
    OLLAMA_CALL_RETRY = "ollama.call.retry"
    OLLAMA_CALL_PREEMPTED = "ollama.call.preempted"
    OLLAMA_CALL_FAILED = "ollama.call.failed"
    CHAT_TURN_DONE = "chat.turn.done"
    CHAT_TURN_FAILED = "chat.turn.failed"
    CHAT_TURN_CANCELLED = "chat.turn.cancelled"
    CHAT_EXTRACTION_DONE = "chat.extraction.done"
    CHAT_EXTRACTION_FAILED = "chat.extraction.failed"
    PROCESS_SURVIVORS_ENDED = "process.survivors_ended"
    """A restarted daemon ended process groups its dead predecessor had started."""
    PROCESS_LINGERS = "process.lingers"
    """A killed process group still has members after the wait (uninterruptible sleep?)."""
    PROCESS_NOT_OURS = "process.not_ours"
    PROCESS_ESCAPEES_ENDED = "process.escapees_ended"
    """Processes that had left their command's group (setsid, a double fork) were found by their mark and ended."""
    ATTEMPT_KEPT = "job.attempt_kept"
    """A retired attempt's leftovers could not be committed: its worktree is kept as it is."""
    LANDING_RECOVERED = "landing.recovered"
    """On start, an interrupted landing's checkouts were brought level (finished or rolled back)."""
    DAEMON_REFUSED = "daemon.refused"
    STEP_FAILED = "step.failed"
    """A best-effort step (cleanup, cache fill) failed; the daemon carries on (`best_effort`)."""
    PROCESS_UNEXPECTED = "process.unexpected"
    """A cleanup step around a job's process or worktree failed in a way nobody expected; logged, not swallowed."""
    SERVICE_NOTIFY_FAILED = "service.notify_failed"
    SERVICE_WATCHDOG_STALLED = "service.watchdog_stalled"
    SPOOL_SUBMITTED = "spool.submitted"
    SPOOL_REJECTED = "spool.rejected"
    SPOOL_ERROR = "spool.error"
    TICKET_DUPLICATE = "ticket.duplicate"
    TICKET_SUPERSEDED = "ticket.superseded"
    AGENT_TOOL = "agent.tool"
    AGENT_DONE = "agent.done"
    AGENT_BUDGET = "agent.budget"
    """The built-in agent spent a budget (turns, tokens, time): the job fails with it."""
    AGENT_PATH_REFUSED = "agent.path_refused"
    """The agent named a path outside its worktree (`..`, absolute, a symlink out, `.git`): refused."""
    SANDBOX_READY = "sandbox.ready"
    SANDBOX_UNAVAILABLE = "sandbox.unavailable"
    """bubblewrap is missing or does not work here: said once at start, with the reason."""
    JOB_ESCAPED = "job.escaped"
    """Without a sandbox, a job changed the user's checkout of its repository: it fails with the paths."""
    JOB_READY = "job.ready"
    """Review mode: a finished job waits for `orchestrator land` or `reject`."""
    JOB_REJECTED = "job.rejected"


EVENTS = frozenset(e.value for e in Event)

_SECRET_KEY = re.compile(r"(api[_-]?key|token|secret|password|authorization)", re.I)
_SECRET_VALUE = re.compile(r"(sk-ant-[A-Za-z0-9_\-]{8,}|sk-[A-Za-z0-9]{20,})")


def _redact(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key, value in list(event_dict.items()):
        if _SECRET_KEY.search(key) and value:
            event_dict[key] = "****"
        elif isinstance(value, str) and _SECRET_VALUE.search(value):
            event_dict[key] = _SECRET_VALUE.sub("****", value)
    return event_dict


def _closed_set(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    event = event_dict.get("event")
    if isinstance(event, Event):
        event_dict["event"] = event.value
    elif event not in EVENTS:
        event_dict["unregistered_event"] = True
    return event_dict


_PRIORITY = {"critical": 2, "error": 3, "warning": 4, "info": 6, "debug": 7}


class _JournalPrefix:
    """Prefix each line with its syslog priority (`<6>`) so journald files it at the right level."""

    def __init__(self, renderer: Any) -> None:
        self._renderer = renderer

    def __call__(self, logger: Any, name: str, event_dict: MutableMapping[str, Any]) -> str:
        level = str(event_dict.get("level", "info"))
        return f"<{_PRIORITY.get(level, 6)}>{self._renderer(logger, name, event_dict)}"


def stdout_is_journal(stream: TextIO, env: dict[str, str] | None = None) -> bool:
    """True when `$JOURNAL_STREAM` names the device and inode of `stream` (systemd's contract)."""
    env = dict(os.environ) if env is None else env
    value = env.get("JOURNAL_STREAM", "")
    if ":" not in value:
        return False
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError):
        return False
    dev, _, ino = value.partition(":")
    return f"{st.st_dev}:{st.st_ino}" == f"{dev}:{ino}"


def configure(stream: TextIO | None = None, *, level: str = "info", force_json: bool = False) -> None:
    """Set structlog up once for the daemon's process."""
    stream = stream or sys.stdout
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _closed_set,
        _redact,
        structlog.processors.format_exc_info,
    ]
    renderer: Any
    if not force_json and stream.isatty():
        renderer = structlog.dev.ConsoleRenderer(colors=True)
    else:
        renderer = structlog.processors.JSONRenderer(sort_keys=False)
        if stdout_is_journal(stream):
            renderer = _JournalPrefix(renderer)
    structlog.configure(
        processors=[*processors, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )


def get(**bound: Any) -> Any:
    return structlog.get_logger("orchestrator").bind(**bound)


@contextlib.contextmanager
def best_effort(step: str, *expected: type[BaseException], **bound: Any) -> Iterator[None]:
    """Carry on past a failed best-effort step, never silently: an expected failure is a warning, anything
    else an error with its traceback. Cancellation is never caught."""
    try:
        yield
    except expected as e:
        get(**bound).warning(Event.STEP_FAILED, step=step, error=f"{type(e).__name__}: {e}")
    except Exception as e:  # noqa: BLE001 - logged with its traceback, not swallowed
        get(**bound).error(Event.STEP_FAILED, step=step, error=f"{type(e).__name__}: {e}", exc_info=True)
