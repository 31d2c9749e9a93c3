"""One log: structlog JSON lines on stdout (journald keeps them under systemd), a console renderer on a TTY.

Event names are a closed set (`Event`); `job_id` and `repo` are bound with contextvars inside each job's
task. Secrets never reach a log (`mask`): the values of the environment's secret-named variables wherever
they appear, values shaped like a provider's key, and whatever a secret-named field, dict key, variable,
header or option holds — in every field, nested dicts and lists, and exception tracebacks.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import sys
from collections.abc import Iterator, Mapping, MutableMapping
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
    API_CONNECTIONS_CLOSED = "api.connections_closed"
    """The API socket's guard closed connections: headers too slow, or too many open (counts so far)."""
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
    JOB_OVER_QUOTA = "job.over_quota"
    """A running job's disk use passed `jobs.max_bytes`, or its disk's free room fell under `jobs.min_free_bytes`:
    it is stopped (code TooBig or NoSpace)."""
    JOB_OVERLAP = "job.overlap"
    ADMISSION_ADMITTED = "admission.admitted"
    ADMISSION_DEFERRED = "admission.deferred"
    ADMISSION_FAILED = "admission.failed"
    ADMISSION_REPLAN = "admission.replan"
    ADMISSION_STALE = "admission.stale"
    """An admitted job could not start: something moved it out of `planned` first (a cancel); nothing runs."""
    LANDING_STARTED = "landing.started"
    LANDING_LANDED = "landing.landed"
    LANDING_NOOP = "landing.noop"
    LANDING_CONFLICT = "landing.conflict"
    LANDING_WAITING = "landing.waiting"
    LANDING_WAIT_ENDED = "landing.wait_ended"
    LANDING_CHECK_FAILED = "landing.check_failed"
    LANDING_REWRITTEN = "landing.rewritten"
    """The target branch no longer contains the job's base: not merged; the job is planned again."""
    WORKTREE_ERROR = "worktree.error"
    WORKTREE_ACQUIRED = "worktree.acquired"
    WORKTREE_POOLED_FAILED = "worktree.pooled_failed"
    WORKTREE_KEPT = "worktree.kept"
    WORKTREE_POOL_FILLED = "worktree.pool_filled"
    WORKTREE_RECOVERED = "worktree.recovered"
    WORKTREE_RECYCLE_FAILED = "worktree.recycle_failed"
    WORKTREE_RECYCLED = "worktree.recycled"
    WORKTREE_REMOVED = "worktree.removed"
    BRANCH_LOCK_REMOVED = "git.branch_lock_removed"
    """A job branch's ref lock older than the daemon was removed: a daemon killed while it moved that branch left it
    (only the daemon writes its jobs' branches)."""
    STORE_FULL = "store.full"
    """A write could not be stored: the database's disk is full (the caller answers or ends the job with NoSpace)."""
    STORE_RESERVE_SPENT = "store.reserve_spent"
    """The room kept beside the database was given back, so a write that settles a job goes through a full disk."""
    STORE_RESERVE_MADE = "store.reserve_made"
    STORE_NO_RESERVE = "store.no_reserve"
    """No room could be kept beside the database (too little free space): a full disk may hold a job's end back."""
    CHANGES_WATCH_STOP_TIMEOUT = "changes.watch_stop_timeout"
    CHANGES_WATCH_RESTARTED = "changes.watch_restarted"
    """A job's watch failed (the error is logged with it) and starts again, comparing everything once more."""
    CHANGES_EVENTS_LOST = "changes.events_lost"
    """The kernel dropped file events of a job's workspace (its queue overflowed): everything is compared again."""
    CHANGES_TOO_MANY = "changes.too_many"
    """A job touched more paths than are listed, or its tree has more directories than can be watched: its paths
    are the whole repository until it ends."""
    CLAUDE_CALL = "claude.call"
    CLAUDE_RETRY = "claude.retry"
    JOB_OVERLAP_CHECKED = "job.overlap_checked"
    DOOR_REFUSED = "door.refused"
    """A job's door (its MCP server's way in) refused a request: a wrong token, a slow or malformed request."""
    JOB_MOVED_ON = "job.moved_on"
    """A job stopped on a real conflict goes on in its kept worktree from the new head: what moved is merged in."""
    JOB_STOPPED = "job.stopped"
    """A real conflict with another job (running, or just landed) was found while this one ran: it stops at once
    and runs again behind that job (`blocking`), or its landing settles it when its run had ended."""
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
    CHAT_EXTRACTION_RESUMED = "chat.extraction.resumed"
    PROCESS_SURVIVORS_ENDED = "process.survivors_ended"
    """A restarted daemon ended process groups its dead predecessor had started."""
    PROCESS_LINGERS = "process.lingers"
    """A killed process group still has members after the wait (uninterruptible sleep?)."""
    PROCESS_NOT_OURS = "process.not_ours"
    PROCESS_CGROUPS = "process.cgroups"
    """At start: whether each command gets a cgroup of its own (and why not)."""
    PROCESS_ESCAPEES_ENDED = "process.escapees_ended"
    """Processes that had left their command's group (setsid, a double fork) were found by their mark and ended."""
    ATTEMPT_KEPT = "job.attempt_kept"
    """A retired attempt's leftovers could not be committed: its worktree is kept as it is."""
    LANDING_RECOVERED = "landing.recovered"
    """On start, an interrupted landing's checkouts were brought level (finished or rolled back)."""
    DAEMON_REFUSED = "daemon.refused"
    DAEMON_EXPOSED = "daemon.exposed"
    """Core dumps or `/proc/<pid>/environ` could not be turned off for the daemon (`hardening.harden`)."""
    STEP_FAILED = "step.failed"
    """A best-effort step (cleanup, cache fill) failed; the daemon carries on (`best_effort`)."""
    PROCESS_UNEXPECTED = "process.unexpected"
    """A cleanup step around a job's process or worktree failed in a way nobody expected; logged, not swallowed."""
    TEAM_JOINED = "team.joined"
    """Team mode: this node registered with the shared store (its name, labels, lease, clones)."""
    TEAM_TAKEOVER = "team.takeover"
    """Team mode: a job of a node whose lease ended was taken over (re-queued, or found landed on the remote)."""
    TEAM_STORE_LOST = "team.store_lost"
    """Team mode: the shared PostgreSQL could not be reached; the node retries (nothing is lost)."""
    TEAM_CANCELLED_ELSEWHERE = "team.cancelled_elsewhere"
    """Team mode: a job this node runs was cancelled from another node: its runner is stopped here."""
    TEAM_UNVERIFIED = "team.unverified"
    """Team mode: a job's order does not verify with the team's secret (changed in the database outside the team's
    nodes): it is refused, never run."""
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
    JOB_PATH = "jobs.path"
    JOB_OUTSIDE_CLAIM = "job.outside_claim"
    """A finished job touched paths its claim did not hold (an event on the job too: `show`, `why`)."""
    JOB_CLAIM_GROWN = "job.claim_grown"
    """A running job touched paths outside its claim: they joined it (`core.growth`), or are held by others."""
    JOB_REVISED = "job.revised"
    """A ready job was sent back to its agent with review feedback (`orchestrator revise`)."""
    JOB_EDITED = "job.edited"
    """A person changed a waiting job's text, paths or priority (`orchestrator edit`)."""
    JOB_MOVED = "job.moved"
    """A person moved a waiting job in the queue (`orchestrator move --before`, `switch`)."""
    JOB_RATE_LIMITED = "job.rate_limited"
    """A job's model API said it is rate- or usage-limited: the job waits, then its runner goes on."""
    AGENT_HELD = "agent.held"
    """The built-in agent tried to write a path another active job holds: refused, it was told which."""
    SANDBOX_UNAVAILABLE = "sandbox.unavailable"
    """bubblewrap is missing or does not work here: said once at start, with the reason."""
    JOB_ESCAPED = "job.escaped"
    """Without a sandbox, a job changed the user's checkout of its repository: it fails with the paths."""
    JOB_READY = "job.ready"
    """Review mode: a finished job waits for `orchestrator land` or `reject`."""
    JOB_REJECTED = "job.rejected"


EVENTS = frozenset(e.value for e in Event)

_SECRET_NAME = (
    r"(?:api[_-]?key|access[_-]?key|private[_-]?key|token|secret|passw(?:or)?d|authorization|credential|cookie)"
)
_SECRET_KEY = re.compile(_SECRET_NAME, re.I)
"""A field, dict key, variable, header or option with such a name holds a secret: its value is masked."""
_SECRET_SHAPES = (
    r"sk-ant-[A-Za-z0-9_\-]{8,}",  # Anthropic
    r"sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}",  # OpenAI
    r"(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})",  # GitHub
    r"(?:AKIA|ASIA)[0-9A-Z]{16}",  # AWS access key ids
    r"hf_[A-Za-z0-9]{30,}",  # Hugging Face
    r"xox[abprs]-[A-Za-z0-9\-]{10,}",  # Slack
    r"eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",  # a JWT
)
_SECRET_VALUE = re.compile("|".join(_SECRET_SHAPES))
_NAME_RUN = re.compile(r"[\w\-]+")
"""A name as a whole run of word characters and dashes (`x-api-key`, `GITHUB_TOKEN`)."""
_SET_TO = re.compile(r"""(["']?\s*[:=]\s*["']?)(?!\d+\b)([^\s"',;}\]\)]+)""")
"""What follows a name set to a value: NAME=value, NAME: value, "name": "value" (env dumps, headers, dict and JSON)."""
_OPTION = re.compile(r"""(?:(?<=\s)|(?<=^)|(?<=[\[,'"]))--?[\w\-]*""")
_OPTION_VALUE = re.compile(r"""(=|\s+)(?!\d+\b)([^\s"',;]+)""")
"""--api-key VALUE, --token=VALUE (argv of a command)."""
_BEARER = re.compile(r"(?i)(\b(?:bearer|basic)\s+)([A-Za-z0-9._~+/=\-]{8,})")
"""Authorization: Bearer VALUE / Basic VALUE."""
_HINTS = ("key", "token", "secret", "passw", "authoriz", "credential", "cookie", "bearer", "basic", "sk-", "ghp_",
          "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "akia", "asia", "hf_", "xox", "eyj")  # fmt: skip
"""Substrings (any case) one of which every pattern's match contains: a string without any is left as it is."""
_FLAG = re.compile(r"--?[\w\-]*")
"""An option's shape (`--api-key`): one whose name holds a secret's (`_SECRET_KEY`) is followed by a secret."""
_known: set[str] = set()
_known_rx: re.Pattern[str] | None = None
KNOWN_MIN = 8
"""Values shorter than this are not registered as secrets (masking `1` or `test` everywhere helps nobody)."""


def register_secret(value: str) -> None:
    """Mask `value` wherever it appears in a log line, whatever its shape (a key of an unknown provider)."""
    global _known_rx
    if not isinstance(value, str) or len(value) < KNOWN_MIN or value in _known:
        return
    _known.add(value)
    known = "|".join(re.escape(v) for v in sorted(_known, key=len, reverse=True))
    _known_rx = re.compile(known)
    mask.cache_clear()


def register_environment(env: Mapping[str, str] | None = None) -> None:
    """Register the values of the environment's secret-named variables (ANTHROPIC_API_KEY, *_TOKEN, ...)."""
    for name, value in (os.environ if env is None else env).items():
        if _SECRET_KEY.search(name):
            register_secret(value)


def _hinted(text: str) -> bool:
    low = text.lower()
    for hint in _HINTS:  # a plain loop of `in`: several times faster here than a regex alternation
        if hint in low:
            return True
    return any(k in text for k in _known)


@functools.lru_cache(maxsize=4096)
def mask(text: str) -> str:
    """`text` with every secret it shows replaced by `****`: known values, key shapes, and the values of
    secret-named variables, headers and options. Cached: a log repeats its repos, paths and reasons."""
    if not _hinted(text):
        return text  # the common case: nothing a secret could start with, so no pattern can match
    if _known_rx is not None:
        text = _known_rx.sub("****", text)
    text = _SECRET_VALUE.sub("****", text)
    text = _set_to_masked(text, _NAME_RUN, _SET_TO)
    text = _set_to_masked(text, _OPTION, _OPTION_VALUE)
    return _BEARER.sub(lambda m: m.group(1) + "****" if m.group(2) != "****" else m.group(0), text)


def _set_to_masked(text: str, names: re.Pattern[str], value: re.Pattern[str]) -> str:
    """`text` with the value masked after each name (`names`, whole runs) holding a secret's name (`_SECRET_KEY`) that
    `value` follows (its group 2), left to right, none looked for inside a value masked already. Linear in the text:
    a pattern with the secret's name inside the run went over every offset and back (a line of `token` and 40,000
    letters took 83 s, on the event loop)."""
    out: list[str] = []
    done = 0
    for run in names.finditer(text):
        if run.start() < done or _SECRET_KEY.search(run.group()) is None:
            continue
        m = value.match(text, run.end())
        if m is None or m.group(2) == "****":
            continue
        out += [text[done : m.start(2)], "****"]
        done = m.end()
    return "".join(out) + text[done:] if out else text


def _masked(value: Any, depth: int = 0) -> Any:
    if isinstance(value, str):
        return mask(value)
    if value is None or isinstance(value, bool | int | float) or depth > 8:
        return value
    if isinstance(value, dict):
        return {k: _named(k, v, depth) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = list(value)
        # An argv: the word after `--api-key` / `--token` is the secret, whatever it looks like.
        return [
            "****" if i and _secret_flag(items[i - 1]) and isinstance(v, str) and not v.isdigit() else
            _masked(v, depth + 1)
            for i, v in enumerate(items)
        ]  # fmt: skip
    if isinstance(value, bytes):
        text = value.decode(errors="backslashreplace")
        return value if mask(text) == text else mask(text)
    shown = repr(value)  # what the renderer would print (its fallback is repr): masked if it shows a secret
    masked = mask(shown)
    return value if masked == shown else masked


@functools.lru_cache(maxsize=1024)
def _secret_name(key: str) -> bool:
    return _SECRET_KEY.search(key) is not None


def _secret_flag(word: object) -> bool:
    return (
        isinstance(word, str)
        and word.startswith("-")
        and _FLAG.fullmatch(word) is not None
        and _SECRET_KEY.search(word) is not None
    )


def _named(key: Any, value: Any, depth: int) -> Any:
    if isinstance(key, str) and _secret_name(key) and value and not isinstance(value, bool | int | float):
        return "****"  # a secret's name: its value whatever it looks like (counts like `tokens=5` stay)
    return _masked(value, depth + 1)


def _redact(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key, value in list(event_dict.items()):
        if key in ("event", "level", "timestamp"):
            continue
        event_dict[key] = _named(key, value, 0)
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
    register_environment()
    stream = stream or sys.stdout
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _closed_set,
        structlog.processors.format_exc_info,
        _redact,  # after the traceback is text: an exception's message is masked too
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
