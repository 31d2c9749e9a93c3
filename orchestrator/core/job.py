"""The job record: what the store keeps of one job, and its JSON form for the API and CLI.

`Job`'s fields are the one list of a job's fields: each carries its codec (`Codec`) in its metadata, and the
store derives its columns, its row decoding and its SQL-rendered JSON from them (`FIELDS`), as `to_json`
does here. A new field is one line below (and one migration adding its column).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from orchestrator.core.models import Claim, Code, JobState, JobView


def iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")


class Codec(StrEnum):
    """How a field is stored (a column value) and shown (its JSON value)."""

    PLAIN = "plain"
    """A number or text, stored and shown as it is."""
    STATE = "state"
    """A `JobState`: its name."""
    LIST = "list"
    """A tuple: a JSON list in its column."""
    SET = "set"
    """A frozenset of paths: a sorted JSON list in its column."""
    CLAIM = "claim"
    """A `Claim`: its JSON object in its column (NULL or empty: the empty claim)."""
    OBJECT = "object"
    """A JSON value or None: JSON text in its column, NULL for None."""
    ARGV = "argv"
    """An argv tuple or None: a JSON list in its column, NULL for None."""
    TIME = "time"
    """A UNIX time or None: stored as a number, shown as an ISO time (UTC, milliseconds)."""


def _codec(codec: Codec) -> Mapping[str, Codec]:
    return {"codec": codec}


PLAIN, STATE, LIST, SET, CLAIM, OBJECT, ARGV, TIME = map(_codec, Codec)
"""Field metadata: how each field is stored and shown."""


def encode(codec: Codec, value: Any) -> Any:
    """A field's value as its column holds it."""
    if codec is Codec.PLAIN:
        return value
    if codec is Codec.STATE:
        return str(value)
    if codec is Codec.SET:
        return json.dumps(sorted(value))
    if codec is Codec.LIST:
        return json.dumps(list(value))
    if codec is Codec.CLAIM:
        return json.dumps(value.to_json())
    if codec is Codec.ARGV:
        return None if value is None else json.dumps(list(value))
    if codec is Codec.OBJECT:
        return None if value is None else json.dumps(value)
    return value  # TIME


def decode(codec: Codec, raw: Any) -> Any:
    """A column's value as the field holds it."""
    if codec is Codec.PLAIN or codec is Codec.TIME:
        return raw
    if codec is Codec.STATE:
        return JobState(raw)
    if codec is Codec.SET:
        return frozenset(json.loads(raw))
    if codec is Codec.LIST:
        return tuple(json.loads(raw))
    if codec is Codec.CLAIM:
        return Claim.from_json(json.loads(raw) if raw else None)
    if codec is Codec.ARGV:
        return tuple(json.loads(raw)) if raw else None
    return json.loads(raw) if raw else None  # OBJECT


def shown(codec: Codec, value: Any) -> Any:
    """A field's value in the job's JSON."""
    if codec is Codec.PLAIN or codec is Codec.OBJECT:
        return value
    if codec is Codec.STATE:
        return str(value)
    if codec is Codec.SET:
        return sorted(value)
    if codec is Codec.LIST:
        return list(value)
    if codec is Codec.CLAIM:
        return value.to_json()
    if codec is Codec.ARGV:
        return None if value is None else list(value)
    return iso(value)  # TIME


@dataclass(frozen=True, slots=True)
class Job:
    id: int
    repo: str = field(metadata=PLAIN)
    branch: str = field(metadata=PLAIN)
    text: str = field(metadata=PLAIN)
    runner: str = field(metadata=PLAIN)
    state: JobState = field(metadata=STATE)
    priority: int = field(default=0, metadata=PLAIN)
    after: tuple[int, ...] = field(default=(), metadata=LIST)
    declared: tuple[str, ...] = field(default=(), metadata=LIST)
    claim: Claim = field(default=Claim(), metadata=CLAIM)
    actual: frozenset[str] = field(default=frozenset(), metadata=SET)
    base: str | None = field(default=None, metadata=PLAIN)
    result: str | None = field(default=None, metadata=PLAIN)
    """The job's own result commit (its branch head after the runner), once it finished."""
    attempts: int = field(default=0, metadata=PLAIN)
    land_after: tuple[int, ...] = field(default=(), metadata=LIST)
    """Jobs it must land after: an overlap was seen while both ran, or a real conflict with one stopped its last
    attempt (then it also starts only once they have ended)."""
    worktree: str | None = field(default=None, metadata=PLAIN)
    created_at: float = field(default=0.0, metadata=TIME)
    started_at: float | None = field(default=None, metadata=TIME)
    finished_at: float | None = field(default=None, metadata=TIME)
    landed_sha: str | None = field(default=None, metadata=PLAIN)
    reason: str = field(default="", metadata=PLAIN)
    decision: dict[str, Any] | None = field(default=None, metadata=OBJECT)
    exit_code: int | None = field(default=None, metadata=PLAIN)
    argv: tuple[str, ...] | None = field(default=None, metadata=ARGV)
    """The exact argv to run (`enqueue -- cmd arg ...`), never re-split; None when `text` is the job."""
    code: str = field(default="", metadata=PLAIN)
    """The closed code of `reason`: a `models.Code`, or the admission `Reason` while it waits."""
    plan_text: str = field(default="", metadata=PLAIN)
    """The model's plan for the job ("" when no model planned it): the runner starts from it."""
    evidence: tuple[dict[str, str], ...] = field(default=(), metadata=LIST)
    """Why each claimed path is there: `{"path", "kind", "why"}` per entry (see `plan.base.Evidence`)."""
    usage: dict[str, Any] | None = field(default=None, metadata=OBJECT)
    """Model usage and cost of its runner (tokens, calls, `cost_usd`), for runners that call a model."""
    land: str = field(default="auto", metadata=PLAIN)
    """`auto`: lands when it finishes; `review`: waits `ready` for `orchestrator land` or `reject`."""
    node: str = field(default="", metadata=PLAIN)
    """Team mode: the node that holds the job (claimed it from the shared queue), "" while no node does."""
    labels: tuple[str, ...] = field(default=(), metadata=LIST)
    """Team mode: the job runs only on a node that has every one of these labels (`enqueue --label`)."""
    grown: frozenset[str] = field(default=frozenset(), metadata=SET)
    """Paths it touched outside its claim while it ran, and every path an earlier attempt touched (`fresh_attempt`),
    added to what admission holds for it (`core.growth`); `claim` stays the plan's prediction, which calibration
    measures."""
    revisions: int = field(default=0, metadata=PLAIN)
    """Rounds of review feedback it was sent back with (`orchestrator revise`)."""
    feedback: str = field(default="", metadata=PLAIN)
    """The feedback of the revision under way ("" when none): stored with the move that starts it and kept until
    its round ends, so a revision waiting for admission (of a failed job) or cut by a crash keeps what it was told."""
    place: float | None = field(default=None, metadata=PLAIN)
    """Its place among the waiting jobs of its priority once a person moved it (`switch`, `move --before`,
    `enqueue --before`); None: its id, the order jobs were queued in (`JobView.order_key`)."""
    author: str = field(default="", metadata=PLAIN)
    """Who queued it, as git names a person (`Name <email>`: the queuing user's git identity, or the author of the
    commit whose ticket it is); the author of its commits when the daemon has no git identity of its own."""
    moved_from: str = field(default="", metadata=PLAIN)
    """A job stopped on a real conflict to go on in its kept worktree (an agent CLI that resumes): the base that
    worktree was made at. Admitted again, it starts on the branch head, and what landed since is merged into its
    files before its agent goes on, told what moved. "": it goes on from its own base, or starts afresh."""
    approved: str = field(default="", metadata=PLAIN)
    """The result a person approved for landing (`orchestrator land` of a job under review): in team mode part of its
    sealed order, so a review job lands only with a node's approval of that very result ("": none)."""

    @property
    def subject(self) -> str:
        """The commit subject: the first line of a ticket's text; for a script (the `shell` runner, or an
        exact argv) its leading `# comment`, else `Run `its first line``; cut to a subject's length."""
        lines = [ln.strip() for ln in self.text.strip().splitlines() if ln.strip()]
        if not lines:
            return f"job {self.id}"
        first = lines[0]
        if self.runner == "shell" or self.argv is not None:
            script = lines[1:] if first.startswith("#!") else lines
            said = script[0].lstrip("#").strip() if script and script[0].startswith("#") else ""
            first = said or f"Run `{_cut(script[0] if script else first, 64)}`"
        return _cut(first, 72)

    @property
    def resting(self) -> bool:
        """It runs, but waits for its model API's rate limit to end (code RateLimited): it holds no slot."""
        return self.state is JobState.RUNNING and self.code == Code.RATE_LIMITED

    @property
    def commit_text(self) -> str:
        """The job's commit message before its trailer: its subject, then its full text when that says more."""
        text = self.text.strip()
        return self.subject if text == self.subject else f"{self.subject}\n\n{text}"

    def revision_text(self, feedback: str) -> str:
        """A revision's commit message before its trailer: a subject of its own (the feedback's first line, not the
        job's again), which job it revises, then the whole feedback when that says more."""
        lines = [ln.strip() for ln in feedback.strip().splitlines() if ln.strip()]
        subject = _cut(lines[0], 72) if lines else f"Revise job {self.id}"
        said = "\n".join(lines)
        return f"{subject}\n\nRevises job {self.id}: {self.subject}" + (f"\n\n{said}" if said != subject else "")

    def view(self, mergeable: frozenset[str] = frozenset()) -> JobView:
        return JobView(
            id=self.id,
            repo=self.repo,
            branch=self.branch,
            claim=replace(self.claim, paths=self.claim.paths | self.grown) if self.grown else self.claim,
            actual=self.actual,
            priority=self.priority,
            after=self.after,
            land_after=self.land_after,
            mergeable=mergeable,
            runner=self.runner,
            kept=bool(self.feedback),
            resting=self.resting,
            place=self.place,
        )

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, **{name: shown(codec, getattr(self, name)) for name, codec in FIELDS.items()}}


FIELDS: Mapping[str, Codec] = {f.name: f.metadata["codec"] for f in fields(Job) if f.name != "id"}
"""Every stored field of a job but its id, in column order, with its codec."""


def from_row(row: Any) -> Job:
    """The job a stored row holds (an `sqlite3.Row` or an `asyncpg.Record`: one column per field, and `id`)."""
    return Job(id=int(row["id"]), **{name: decode(codec, row[name]) for name, codec in FIELDS.items()})


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def fresh_attempt(job: Job) -> dict[str, Any]:
    """The fields of a job moved back to the queue for a fresh attempt, planned anew on the current head (its
    claim stays until then: it keeps the job's place, see `rounds.keeps_place`). What the attempt touched joins
    `grown`: a new plan replaces the claim, and a job that conflicted on a file it touched and its new plan did not
    name would otherwise be admitted beside the next job that writes there, and conflict again."""
    return {
        "attempts": job.attempts + 1,
        "grown": job.grown | job.actual,
        "base": None,
        "result": None,
        "actual": frozenset(),
        "worktree": None,
        "started_at": None,
        "finished_at": None,
        "exit_code": None,
        "land_after": (),
        "decision": None,
        "feedback": "",
        "moved_from": "",
        "approved": "",
    }
