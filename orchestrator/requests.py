"""What clients ask the daemon, typed once for both sides (as pueue shares its request structs).

A client builds a request and sends its `to_json()`: the CLI (`client.Client`), the git hook (`Tickets`, over the
API or through the spool). The daemon reads one back with `from_json`, which checks every field: a malformed one
is a BadRequest that says what to send instead, the same wherever the request came from. The checks here are the
ones a request makes on its own; what needs the daemon (does the runner exist, the branch, the job `--after`
names) the daemon checks. Standard library only: the CLI and the hook start fast.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from orchestrator.core import person
from orchestrator.validate import BadRequest, int_list, str_list, text
from orchestrator.validate import field as value

LAND_MODES = ("auto", "review")
"""`--land`: land when finished, or wait for `orchestrator land` (no value: the repository's configured mode)."""


def _json(obj: Any) -> dict[str, Any]:
    """A request's fields as JSON: lists for tuples, without the unset ones (None, empty)."""
    out: dict[str, Any] = {}
    for f in fields(obj):
        v = getattr(obj, f.name)
        if v is None or v == () or v == "":
            continue
        out[f.name] = list(v) if isinstance(v, tuple) else v
    return out


def _tuple(obj: Any, name: str, kind: type) -> None:
    """Coerce a list given for a tuple field (a frozen dataclass: set once, in `__post_init__`)."""
    v = getattr(obj, name)
    if v is not None and not isinstance(v, tuple):
        object.__setattr__(obj, name, tuple(v))
    if not all(isinstance(x, kind) and not isinstance(x, bool) for x in getattr(obj, name) or ()):
        raise BadRequest(f"field {name!r} must be a list of {'strings' if kind is str else 'job ids'}")


@dataclass(frozen=True, slots=True)
class Enqueue:
    """Queue a job (`orchestrator enqueue`, `POST /jobs`; the hook's tickets become these too)."""

    repo: str
    text: str = ""
    """What the job does (for the shell runner, a command); empty when `argv` is given."""
    argv: tuple[str, ...] = ()
    """An exact argv, run without a shell (its text is the argv quoted)."""
    branch: str | None = None
    """The target branch (none: the repository's default branch)."""
    paths: tuple[str, ...] = ()
    """The paths the job declares it will touch."""
    runner: str | None = None
    priority: int | None = None
    before: int | None = None
    """Queue it just before this waiting job (it takes that job's priority)."""
    after: tuple[int, ...] = ()
    """Jobs that must land first."""
    labels: tuple[str, ...] = ()
    """Team mode: the nodes it may run on."""
    land: str | None = None
    """`auto` or `review` (none: the repository's configured mode)."""
    author: str = ""
    """Who queues it, as git names a person (`Name <email>`); its commits' author when the daemon has no identity."""

    def __post_init__(self) -> None:
        if not person.valid(self.author):
            raise BadRequest(f"author {self.author[:80]!r}: name who queues the job as git names one, `Name <email>`")
        for name in ("argv", "paths", "labels"):
            _tuple(self, name, str)
        _tuple(self, "after", int)
        if not (self.argv or self.text.strip()):
            raise BadRequest("the job text is empty: say what the job should do (for the shell runner, a command)")
        if self.before is not None and self.priority is not None:
            raise BadRequest(f"--before {self.before} gives the job that job's priority: leave out --priority")
        if self.land is not None and self.land not in LAND_MODES:
            raise BadRequest(
                f"--land {self.land!r}: use auto (land when finished) or review (wait for `orchestrator land`)"
            )

    @property
    def command(self) -> str:
        """The job's text: its own, or its argv quoted for a shell."""
        import shlex

        return shlex.join(self.argv) if self.argv else self.text

    def to_json(self) -> dict[str, Any]:
        return _json(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Enqueue:
        argv = str_list(dict(data), "argv")
        return cls(
            repo=value(dict(data), "repo", str, required=True),
            text="" if argv else value(dict(data), "text", str, required=True),
            argv=tuple(argv),
            branch=value(dict(data), "branch", str) or None,
            paths=tuple(str_list(dict(data), "paths")),
            runner=value(dict(data), "runner", str) or None,
            priority=value(dict(data), "priority", int),
            before=value(dict(data), "before", int),
            after=tuple(int_list(dict(data), "after")),
            labels=tuple(str_list(dict(data), "labels")),
            land=value(dict(data), "land", str) or None,
            author=(value(dict(data), "author", str) or "").strip(),
        )


@dataclass(frozen=True, slots=True)
class Ticket:
    """One job a commit asks for (a trailer or a ticket file), as the git hook sends it."""

    text: str
    paths: tuple[str, ...] = ()
    runner: str | None = None
    priority: int = 0
    id: str | None = None
    """Same id, same repository: a newer ticket supersedes a queued job of an older one that has not started."""
    branch: str | None = None
    source: str = "trailer"
    """`trailer`, or the ticket file's path."""
    key: str = field(default="", compare=False)
    """Its idempotency key (`keyed`): one job per key, so a re-sent commit does not queue the same work twice."""

    def __post_init__(self) -> None:
        _tuple(self, "paths", str)

    def keyed(self, branch: str | None) -> Ticket:
        """This ticket with its target branch filled in and its idempotency key computed."""
        b = self.branch or branch
        what = [self.text, list(self.paths), self.runner, self.priority, self.id, b]
        key = hashlib.sha256(json.dumps(what).encode()).hexdigest()[:32]
        return Ticket(self.text, self.paths, self.runner, self.priority, self.id, b, self.source, key)

    @property
    def identity(self) -> tuple[object, ...]:
        """What the ticket asks, for telling a rewritten commit's new tickets from its old ones."""
        return (self.text, self.paths, self.runner, self.priority, self.id, self.branch)

    def to_json(self) -> dict[str, object]:
        out = asdict(self)
        out["paths"] = list(self.paths)
        return out

    @classmethod
    def from_json(cls, data: Any) -> Ticket:
        if not isinstance(data, dict):
            raise BadRequest("field 'tickets' must be a list of objects with 'text' and 'key'")
        if not isinstance(data.get("key"), str) or not data["key"] or not isinstance(data.get("text"), str):
            raise BadRequest("each ticket needs a 'key' and a 'text' (strings)")
        return cls(
            text=text(data["text"], "text"),
            paths=tuple(str_list(data, "paths")),
            runner=value(data, "runner", str) or None,
            priority=value(data, "priority", int, default=0),
            id=value(data, "id", str) or None,
            branch=value(data, "branch", str) or None,
            source=value(data, "source", str, default="trailer"),
            key=data["key"],
        )

    def enqueue(self, repo: str, branch: str | None, author: str = "") -> Enqueue:
        """The job this ticket queues in `repo` (its own branch, else the commit's), queued by `author`."""
        return Enqueue(repo=repo, text=self.text, branch=self.branch or branch, paths=self.paths,
                       runner=self.runner, priority=self.priority, author=author)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Tickets:
    """A commit's tickets (`POST /tickets`, or a spooled file when no daemon answered)."""

    repo: str
    branch: str | None
    commit: str | None
    tickets: tuple[Ticket, ...]
    author: str = ""
    """The commit's author (`Name <email>`): who queued its jobs."""

    def to_json(self) -> dict[str, Any]:
        return {"repo": self.repo, "branch": self.branch, "commit": self.commit, "author": self.author,
                "tickets": [t.to_json() for t in self.tickets]}  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Tickets:
        items = data.get("tickets")
        if not isinstance(items, list):
            raise BadRequest("field 'tickets' must be a list of objects with 'text' and 'key'")
        return cls(
            repo=value(dict(data), "repo", str, default=""),
            branch=value(dict(data), "branch", str) or None,
            commit=value(dict(data), "commit", str) or None,
            tickets=tuple(Ticket.from_json(t) for t in items),
            author=author if person.valid(author := (value(dict(data), "author", str) or "").strip()) else "",
        )


@dataclass(frozen=True, slots=True)
class Edit:
    """Change a waiting job (`orchestrator edit`): its text, its declared paths, its priority (None: unchanged)."""

    text: str | None = None
    paths: tuple[str, ...] | None = None
    """Its new declared paths (empty: none, it is planned from its text)."""
    priority: int | None = None

    def __post_init__(self) -> None:
        if self.paths is not None:
            _tuple(self, "paths", str)
        if self.text is not None and not self.text.strip():
            raise BadRequest("the new text is empty: say what the job should do")
        if self.text is None and self.paths is None and self.priority is None:
            raise BadRequest("nothing to edit: give a new text, paths or priority")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.text is not None:
            out["text"] = self.text
        if self.paths is not None:
            out["paths"] = list(self.paths)  # empty too: the job's declared paths are cleared
        if self.priority is not None:
            out["priority"] = self.priority
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Edit:
        d = dict(data)
        paths = tuple(str_list(d, "paths")) if "paths" in d else None
        return cls(value(d, "text", str), paths, value(d, "priority", int))


@dataclass(frozen=True, slots=True)
class Plan:
    """What the planner would claim for a text (`orchestrator plan`, `POST /plan`); nothing is queued."""

    repo: str
    text: str = ""
    branch: str | None = None
    base: str | None = None
    """The commit to plan on (none: the branch's head)."""
    paths: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _tuple(self, "paths", str)

    def to_json(self) -> dict[str, Any]:
        return _json(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Plan:
        d = dict(data)
        return cls(
            repo=value(d, "repo", str, required=True),
            text=value(d, "text", str, default=""),
            branch=value(d, "branch", str) or None,
            base=value(d, "base", str) or None,
            paths=tuple(str_list(d, "paths")),
        )


@dataclass(frozen=True, slots=True)
class Wait:
    """Wait until jobs end (`orchestrator wait`, `POST /wait`): these ids (none: every open job), at most
    `timeout` seconds (None: as long as it takes)."""

    ids: tuple[int, ...] = ()
    timeout: float | None = None

    def __post_init__(self) -> None:
        _tuple(self, "ids", int)
        if self.timeout is not None and not 0 <= self.timeout < 1e9:  # also NaN and Infinity, which JSON may carry
            raise BadRequest("field 'timeout' must be a number of seconds, 0 or more")

    def to_json(self) -> dict[str, Any]:
        return {"ids": list(self.ids), "timeout": self.timeout}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Wait:
        d = dict(data)
        return cls(tuple(int_list(d, "ids")), value(d, "timeout", (int, float)))


@dataclass(frozen=True, slots=True)
class Control:
    """Pause or resume (`orchestrator pause/resume`), or limit a repository's slots (`orchestrator limit`): the
    repository it is about (None: all), and for a limit the slots (None: no limit)."""

    repo: str | None = None
    slots: int | None = None

    def __post_init__(self) -> None:
        if self.slots is not None and self.slots < 0:
            raise BadRequest("slots must be 0 or more (0 holds every new job of the repo back)")

    def to_json(self) -> dict[str, Any]:
        return {"repo": self.repo, "slots": self.slots}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Control:
        d = dict(data)
        return cls(value(d, "repo", str), value(d, "slots", int))


@dataclass(frozen=True, slots=True)
class Revise:
    """Send a job back to its agent with a person's feedback (`orchestrator revise`)."""

    feedback: str

    def to_json(self) -> dict[str, Any]:
        return {"feedback": self.feedback}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Revise:
        return cls(value(dict(data), "feedback", str, required=True))


@dataclass(frozen=True, slots=True)
class Move:
    """Put a waiting job just before another waiting one (`orchestrator move --before`)."""

    before: int

    def to_json(self) -> dict[str, Any]:
        return {"before": self.before}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Move:
        return cls(value(dict(data), "before", int, required=True))


@dataclass(frozen=True, slots=True)
class Switch:
    """Swap two waiting jobs' places in the queue (`orchestrator switch`)."""

    other: int
    """The job it changes places with (`with` on the wire)."""

    def to_json(self) -> dict[str, Any]:
        return {"with": self.other}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Switch:
        return cls(value(dict(data), "with", int, required=True))


@dataclass(frozen=True, slots=True)
class ChatTurn:
    """A turn of a chat session (`orchestrator chat`, `POST /chat/{session}`): the person's text, and whether it is
    the session's last (its memories are extracted once the model server is free)."""

    text: str
    end: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "end": self.end}

    @classmethod
    def from_json(cls, data: Any) -> ChatTurn:
        said = data.get("text") if isinstance(data, Mapping) else None
        if not isinstance(said, str) or not said.strip():
            raise BadRequest('missing "text": send {"text": "your message"}')
        return cls(text(said, "text"), value(dict(data), "end", bool, default=False))
