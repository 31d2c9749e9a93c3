"""Plain data shared by every layer: job states, claims, the admission snapshot and its decisions.

Nothing here does I/O. The scheduler gathers facts into a `Snapshot`; `admission.decide` reads it and
returns a `Decision`; the scheduler carries the decision out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum


class JobState(StrEnum):
    """Where a job is in its life (see DESIGN.md, "A job's life")."""

    QUEUED = "queued"
    """Accepted and stored; waits for its plan."""
    PLANNING = "planning"
    """Its claim (the paths it will touch) is being predicted."""
    PLANNED = "planned"
    """Has a claim and a base; waits for admission."""
    RUNNING = "running"
    """Admitted: its runner works in its own worktree."""
    LANDING = "landing"
    """Finished with changes; waits for, or is in, its branch's landing queue."""
    READY = "ready"
    """Review mode: finished with changes, its result commit on its branch; waits for `land` or `reject`."""
    LANDED = "landed"
    """Its changes are on the target branch."""
    UNCHANGED = "unchanged"
    """Its runner ended well but changed nothing (or every write it tried was refused): nothing landed."""
    CONFLICTED = "conflicted"
    """Its changes conflict with the target branch and it will not be retried automatically."""
    FAILED = "failed"
    """The runner, the landing check or the daemon failed it; its worktree is kept."""
    CANCELLED = "cancelled"
    """Cancelled by a person before it landed."""
    INTERRUPTED = "interrupted"
    """It was running when the daemon died; `retry` runs it again."""

    @property
    def terminal(self) -> bool:
        """Nothing happens to it without a person (see `ENDED`)."""
        return self in ENDED

    @property
    def active(self) -> bool:
        """Holds paths of its repo and a slot: admission must keep others away from them."""
        return self in ACTIVE


# The named groups of states: the one place they are spelled (the moves between states are `core.lifecycle`).
WAITING: frozenset[JobState] = frozenset({JobState.QUEUED, JobState.PLANNING, JobState.PLANNED})
"""Not started: queued, being planned, or planned and waiting for admission."""
ACTIVE: frozenset[JobState] = frozenset({JobState.RUNNING, JobState.LANDING, JobState.READY})
"""Admitted and not ended: they take a slot and hold their paths (a ready job until it lands or is rejected)."""
OPEN: frozenset[JobState] = WAITING | ACTIVE
"""Something happens to them without a person."""
HELD: frozenset[JobState] = frozenset({JobState.INTERRUPTED})
"""Stopped by a daemon stop: they keep their place and their claim (nothing overlapping overtakes them) until
retried or cancelled (`jobs.requeue_interrupted` retries them on start). They take no slot."""
DEAD: frozenset[JobState] = frozenset({JobState.FAILED, JobState.CANCELLED, JobState.CONFLICTED})
"""Ended without landing, for good: a job that runs `--after` one of them can never run."""
DONE: frozenset[JobState] = frozenset({JobState.LANDED, JobState.UNCHANGED})
"""Ended as asked (an unchanged one had nothing to land): a job `--after` it may start."""
ENDED: frozenset[JobState] = DEAD | HELD | DONE
"""Nothing happens to them without a person: `wait` returns, `clean` may forget them, `on_end` runs."""
ANY: frozenset[JobState] = frozenset(JobState)
"""Every state: for a write that only appends an event, whatever the job does meanwhile."""
RETRYABLE: frozenset[JobState] = DEAD | HELD | {JobState.UNCHANGED}
CANCELLABLE: frozenset[JobState] = OPEN | HELD
VIEW_ORDER: tuple[JobState, ...] = (
    JobState.READY, JobState.LANDING, JobState.RUNNING, JobState.PLANNED, JobState.PLANNING, JobState.QUEUED,
    JobState.INTERRUPTED,
)  # fmt: skip
"""How views list the jobs that are not over: what waits for a person's review first, then nearest to landing."""


class JobEvent(StrEnum):
    """What happened to a job, as stored in its history (`job_events.kind`; `orchestrator logs --events` shows it).

    A closed set: every write of a job names one of these, and readers (calibration, views, tests) match on them.
    """

    ENQUEUED = "enqueued"
    """Queued by `enqueue`, the git hook or a ticket."""
    CLAIMED = "claimed"
    """Team mode: a node took it from the team's queue."""
    RELEASED = "released"
    """Team mode: put back in the team's queue, held by no node (its node's lease ended)."""
    PLANNING = "planning"
    """Its plan started."""
    PLANNED = "planned"
    """Its claim and base are stored: it waits for admission."""
    REPLAN = "replan"
    """Back to the queue to be planned again (its branch moved in its claim, or could not be read)."""
    DEFERRED = "deferred"
    """Admission made it wait; the reason says for what (stored when the reason changes)."""
    ADMITTED = "admitted"
    """Admission let it start: it runs."""
    RATE_LIMITED = "rate_limited"
    """Its runner met the model API's rate limit: it waits in its worktree for the limit to lift."""
    OUTSIDE_CLAIM = "outside_claim"
    """It wrote paths outside its claim (listed in the event)."""
    CLAIM_GROWN = "claim_grown"
    """Its claim grew to paths it touched outside it (no other active job held them)."""
    OVERLAP = "overlap"
    """It and another active job touched a common path (calibration counts these)."""
    OVERLAP_CHECKED = "overlap_checked"
    """The watch merged the two overlapping jobs' trees in memory: a real conflict, or disjoint hunks."""
    FINISHED = "finished"
    """Its runner ended well: it lands, waits for review, or changed nothing."""
    FAILED = "failed"
    """Its runner, its planning, admission or its landing failed it."""
    CHECK_FAILED = "check_failed"
    """The landing check failed on the merged result: not landed."""
    INTERRUPTED = "interrupted"
    """The daemon stopped (or its node was lost) while it ran."""
    CANCELLED = "cancelled"
    """A person cancelled it."""
    SUPERSEDED = "superseded"
    """Cancelled because a newer job of its ticket was queued."""
    REQUEUED = "requeued"
    """Back to the queue for a fresh attempt (a conflict, a rewritten branch, a restart, a taken-over node)."""
    RECHECK = "recheck"
    """It changed nothing on a base without the change of an earlier-queued job it went ahead of (or ran beside):
    back to the queue to run again once that job has ended, on a base with its change (`core.overtake`)."""
    RETRIED = "retried"
    """A person retried it: a fresh attempt from the queue."""
    REVISED = "revised"
    """A person sent it back to its agent with feedback."""
    EDITED = "edited"
    """A person changed its text, paths or priority while it waited (`orchestrator edit`)."""
    MOVED = "moved"
    """A person moved it in the queue (`move --before`, `switch`): its priority and place are in the event."""
    APPROVED = "approved"
    """Review mode: a person approved it for landing."""
    REJECTED = "rejected"
    """Review mode: a person rejected it; nothing landed."""
    LANDING_WAITS = "landing_waits"
    """Its landing waits (a person's uncommitted change in the way, a full disk, an unreachable remote)."""
    LANDING_RECOVERED = "landing_recovered"
    """After a restart: a landing the journal held was found finished or put back."""
    LANDED = "landed"
    """Its changes are on the target branch."""
    CONFLICTED = "conflicted"
    """Its changes conflict with the target branch, for good: left for a person."""


class ClaimSource(StrEnum):
    """Where a claim came from, strongest first."""

    DECLARED = "declared"
    """The person named the paths (`--path`)."""
    MODEL = "model"
    """A model's pre-plan (Claude, or Ollama through the gate)."""
    EVIDENCE = "evidence"
    """Local evidence: paths and identifiers named in the text, co-change history."""
    NONE = "none"
    """No prediction at all: the job is ambiguous and runs alone in its repo."""


ROOT = ""
"""The repository root as a claim path: a directory that contains every path (root-wide claims are ambiguous)."""


@dataclass(frozen=True, slots=True)
class Risk:
    """How likely a job is to touch paths outside its claim, estimated from its repository's record.

    `near` lists the paths evidence says it may touch beyond its claim, each with its probability; any
    other path has probability `rest`. `area` is the directory the job works in, and `meets` gives, per
    area of the repository (a directory, ROOT for any other), how often past changes in the job's area met
    one in that area although their claims were disjoint. Admission reads both pairwise (`core.risk`), and
    `nonmerge`: how often such a meeting would not merge.
    """

    near: tuple[tuple[str, float], ...] = ()
    rest: float = 0.0
    area: str = ""
    meets: tuple[tuple[str, float], ...] = ()
    nonmerge: float = 1.0
    """The chance that, where it meets another job, the landing cannot merge the two (measured on the record's
    past changes in its area; 1: every meeting counts)."""
    meet: tuple[float, float] = (1.0, 0.0)
    """(a, b): its repository's rescaling of the shipped model of a pair's chance of meeting (`core.risk`), checked
    against its record: the model's log-odds z says sigmoid(a z + b)."""
    kind: str = ""
    """What its claim is: the kind of its most likely file (`source`, `test`, `doc`, `config`), or `known` for a
    change of a known kind (a dependency update, a release)."""
    floor: float = 0.0
    """The least chance that it meets another job of its repository: how often the record's pairs that nothing
    connected met anyway (`score.Calibration.floor`; `core.risk.MEET_FLOOR` when higher)."""
    scale: tuple[tuple[float, float], ...] = ()
    """Its repository's map from the estimated risk to the share of such pairs that would not merge there (knots of a
    monotone step function, `plan.riskmap`), fitted on its record's later pairs; () where there is none."""

    def to_json(self) -> dict[str, object]:
        return {
            "near": [[p, round(v, 5)] for p, v in self.near],
            "rest": round(self.rest, 6),
            "area": self.area,
            "meets": [[a, round(v, 5)] for a, v in self.meets],
            "nonmerge": round(self.nonmerge, 5),
            "meet": [round(self.meet[0], 5), round(self.meet[1], 5)],
            "kind": self.kind,
            "floor": round(self.floor, 5),
            **({"scale": [[round(x, 6), round(y, 6)] for x, y in self.scale]} if self.scale else {}),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Risk:
        near, meets = data.get("near") or [], data.get("meets") or []
        rest, area = data.get("rest", 0.0), data.get("area", "")
        nonmerge, meet = data.get("nonmerge", 1.0), data.get("meet") or [1.0, 0.0]
        assert isinstance(near, list) and isinstance(meets, list) and isinstance(rest, int | float)
        floor = data.get("floor", 0.0)
        assert isinstance(nonmerge, int | float) and isinstance(meet, list) and len(meet) == 2
        scale = data.get("scale") or []
        assert isinstance(floor, int | float) and isinstance(scale, list)
        return cls(
            tuple((str(p), float(v)) for p, v in near),
            float(rest),
            str(area),
            tuple((str(a), float(v)) for a, v in meets),
            float(nonmerge),
            (float(meet[0]), float(meet[1])),
            str(data.get("kind", "")),
            float(floor),
            tuple((float(x), float(y)) for x, y in scale),
        )


@dataclass(frozen=True, slots=True)
class Claim:
    """The paths a job expects to touch.

    Paths are normalised repo-relative POSIX strings (see `claims.normalize`): a file is `src/a.py`, a
    directory ends with `/` (`src/`), and the root is `ROOT` (the empty string).
    """

    paths: frozenset[str] = frozenset()
    confidence: float = 0.0
    source: ClaimSource = ClaimSource.NONE
    risk: Risk | None = None
    """Local evidence's estimate of what the job touches beyond `paths` (None: unknown)."""
    coined: frozenset[str] = frozenset()
    """Terms of its text its base does not have (`core.chains`): an earlier job making one of them goes first."""

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "paths": sorted(self.paths),
            "confidence": self.confidence,
            "source": str(self.source),
        }
        if self.risk is not None:
            out["risk"] = self.risk.to_json()
        if self.coined:
            out["coined"] = sorted(self.coined)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, object] | None) -> Claim:
        if not data:
            return cls()
        paths = data.get("paths") or []
        confidence = data.get("confidence", 0.0)
        risk = data.get("risk")
        coined = data.get("coined") or []
        assert isinstance(paths, list) and isinstance(confidence, int | float) and isinstance(coined, list)
        return cls(
            frozenset(str(p) for p in paths),
            float(confidence),
            ClaimSource(str(data.get("source", "none"))),
            Risk.from_json(risk) if isinstance(risk, Mapping) else None,
            frozenset(str(t) for t in coined),
        )


CHANGELOGS: tuple[str, ...] = (
    "CHANGES*",
    "CHANGELOG*",
    "NEWS*",
    "HISTORY*",
    "RELEASE[-_]NOTES*",
    "[Cc]hange[Ll]og.md",
    "[Cc]hange[Ll]og.rst",
    "change_log.md",
    "changes.md",
    "changes.rst",
    "history.md",
    "history.rst",
    "news.md",
    "news.rst",
    "release[-_]notes.md",
    "release[-_]notes.rst",
)
"""The union-mergeable files by default: changelogs by the names projects give them (`CHANGES.rst`,
`docs/changelog.rst`, `HISTORY.md`, `docs/release-notes.md`). Lower-case names are listed with their text
extensions only, so that a module such as `changes.py` is never union-merged."""


@dataclass(frozen=True, slots=True)
class Policy:
    """The knobs admission reads. Built from the config by the shell."""

    max_concurrent: int = 2
    """Global limit on active jobs (`MAX_CONCURRENT_JOBS`, as in the seed)."""
    per_repo: int = 4
    """Limit on active jobs of one repository."""
    min_confidence: float = 0.5
    """A claim below this confidence is ambiguous (claims judged by confidence: declared and model claims,
    and every claim when `risk` is 0)."""
    risk: float = 0.0
    """The highest estimated chance that two jobs touch a common path for them to run side by side
    (`plan.risk`); 0 judges local evidence by its confidence instead, and a claim without an estimate runs
    alone."""
    mergeable: tuple[str, ...] = CHANGELOGS
    """Glob patterns (matched on the path and on its base name) of union-mergeable files: never an overlap."""
    barriers: tuple[str, ...] = ()
    """Glob patterns of barrier paths: a job that claims or touches one runs alone in its repo."""
    raised: tuple[tuple[str, float], ...] = ()
    """(repo, threshold) pairs: repos whose confident claims kept missing get a higher `min_confidence`
    (set by calibration, see `plan.accuracy.thresholds`)."""

    def min_confidence_for(self, repo: str) -> float:
        return max([self.min_confidence, *(t for r, t in self.raised if r == repo)])


@dataclass(frozen=True, slots=True)
class JobView:
    """What admission needs to know of one job."""

    id: int
    repo: str
    """Canonical repository path (the key jobs of one repo share)."""
    branch: str
    """Target branch."""
    claim: Claim = field(default_factory=Claim)
    actual: frozenset[str] = frozenset()
    """Paths the job has really touched so far (its diff against its base, untracked files included)."""
    priority: int = 0
    """Higher runs first; ties go by place (`order_key`)."""
    after: tuple[int, ...] = ()
    """Jobs that must land before this one may start (`--after`)."""
    mergeable: frozenset[str] = frozenset()
    """Extra union-mergeable paths for this job's repo (from its `.gitattributes` `merge=union`)."""
    runner: str = ""
    """The runner it runs with (a rate limit its model API met holds back the jobs of that runner)."""
    kept: bool = False
    """A revision: it goes on in the worktree it kept, from its own base, whatever its branch did since."""
    resting: bool = False
    """An active job waiting for its model API's rate limit to end: it holds its paths but no slot."""
    land_after: tuple[int, ...] = ()
    """Jobs it lands after (their changes met its own). A waiting job starts only once they have ended: a job
    stopped on a real conflict with one runs again on a base that has its change."""
    place: float | None = None
    """Where it stands among the jobs of its priority once a person moved it; None: at its id (first queued, first
    served)."""

    @property
    def order_key(self) -> tuple[int, float, int]:
        """The queue's order: higher priority first, then the lower place (its id unless a person moved it)."""
        return (-self.priority, self.id if self.place is None else self.place, self.id)


@dataclass(frozen=True, slots=True, weakref_slot=True)
class Snapshot:
    """Every fact admission reads, gathered by the scheduler at one instant.

    Treat it as immutable (including `moved`): admission caches indexes per snapshot object (hence the
    weakref slot), so build a new snapshot for new facts rather than mutating one.
    """

    active: tuple[JobView, ...] = ()
    """Running and landing jobs, all repos."""
    elsewhere: tuple[JobView, ...] = ()
    """Team mode: other nodes' running and landing jobs of this node's repositories. They hold what they claim and
    touched, and run alone, as active jobs do (Exclusive, Overlap), but take none of this node's slots."""
    waiting: tuple[JobView, ...] = ()
    """Planned jobs, all repos (any order; admission sorts them by `order_key`)."""
    held: tuple[JobView, ...] = ()
    """Jobs that keep their place in the order without waiting for admission now: interrupted ones (until
    retried or cancelled) and retried or re-queued ones being planned again. A later waiting job they overlap
    waits for them (Priority), as for an earlier waiting job; they take no slot and are not decided."""
    moved: Mapping[int, frozenset[str] | None] = field(default_factory=dict)
    """For a waiting job id: the paths its target branch changed since the job's base (empty: it has not
    moved; None: unknown, e.g. the base is gone). A job missing here has not moved."""
    landing: frozenset[tuple[str, str]] = frozenset()
    """(repo, branch) pairs with a landing in flight."""
    landed: frozenset[int] = frozenset()
    """Ids of landed jobs (for `after` dependencies)."""
    paused: frozenset[str] = frozenset()
    """Repos where nothing new starts (`orchestrator pause`); `ALL_REPOS` pauses every repo."""
    slots: Mapping[str, int] = field(default_factory=dict)
    """Per-repo slot limits set at run time (`orchestrator limit`); they override `policy.per_repo`."""
    dead: frozenset[int] = frozenset()
    """Ids of jobs that ended without landing (failed, cancelled, conflicted, interrupted)."""
    limited: Mapping[str, float] = field(default_factory=dict)
    """Runners whose model API is rate-limited, each with the UNIX time the limit ends (`jobs.limits`)."""
    disk_low: str = ""
    """Why no job may start for lack of disk (the workspaces' disk is under `jobs.min_free_bytes`); empty: room."""
    policy: Policy = field(default_factory=Policy)


LAND_STYLES = ("merge", "rebase", "squash")
"""How a job's work lands on its branch (`[repos."/path"] land_style`): a merge commit (or fast-forward),
its commits replayed onto the head (linear), or one squashed commit per job (linear)."""

ALL_REPOS = "*"
"""The scope of a pause (or a control) that covers every repository."""


class Reason(StrEnum):
    """Why admission admitted or deferred a job: a closed set, stable for logs and `why`."""

    ADMITTED = "Admitted"
    """Every check passed; the job starts now."""
    AMBIGUOUS = "Ambiguous"
    """Its claim is empty, root-wide or low-confidence: it waits to run alone in its repo."""
    BARRIER = "Barrier"
    """It claims or touches a barrier path: it waits to run alone in its repo."""
    EXCLUSIVE = "Exclusive"
    """An active job of its repo runs alone (ambiguous or barrier): it waits for that job to end."""
    OVERLAP = "Overlap"
    """Its claim meets an active job's claim or actual paths."""
    RISK = "Risk"
    """Its claim is disjoint from an active job's, but the chance that they touch a common path is above
    `plan.risk`."""
    BASE_MOVED = "BaseMoved"
    """Its target branch changed in paths it claims since it was planned: re-plan on the new head first."""
    LANDING = "Landing"
    """A landing into its target branch is in flight."""
    CONCURRENCY = "Concurrency"
    """The global or per-repo limit of active jobs is reached."""
    PRIORITY = "Priority"
    """An earlier (or higher-priority) waiting job it overlaps goes first, so that nobody starves."""
    DEPENDENCY = "Dependency"
    """A job it must run after has not landed yet, or one it lands after (their changes met) has not ended."""
    DEPENDENCY_FAILED = "DependencyFailed"
    """A job it must run after ended without landing: it cannot run."""
    PAUSED = "Paused"
    """Its repo (or the whole daemon) is paused: nothing new starts until `orchestrator resume`."""
    RATE_LIMITED = "RateLimited"
    """Its runner's model API is rate- or usage-limited (a job of that runner met the limit): it starts when the
    limit ends."""
    NO_SPACE = "NoSpace"
    """The disk that holds the workspaces has less free room than `jobs.min_free_bytes`: nothing new starts until
    there is room."""


class Code(StrEnum):
    """Why a job is where it is outside admission (runs, landings, ends): a closed set, stable for logs.

    A job's `code` is one of these or, while it waits for admission, its admission `Reason`.
    """

    REPO_ERROR = "RepoError"
    """Its repository or target branch could not be read when it was planned."""
    RUNNER_FAILED = "RunnerFailed"
    """The runner exited non-zero."""
    TIMED_OUT = "TimedOut"
    """The runner took longer than `jobs.timeout` and was killed."""
    RUNNER_ERROR = "RunnerError"
    """The runner or the job's worktree could not be set up."""
    CANCELLED = "Cancelled"
    """A person cancelled it."""
    INTERRUPTED = "Interrupted"
    """The daemon stopped while it ran."""
    NO_CHANGES = "NoChanges"
    """It finished without changing anything: nothing to land."""
    OVERTOOK = "Overtook"
    """It changed nothing on a base without an earlier-queued job's change: it runs again once that job has ended."""
    FINISHED = "Finished"
    """It finished with changes and waits for its landing."""
    LAND_AFTER = "LandAfter"
    """Its landing waits for jobs it overlapped to land first."""
    USER_DIRTY = "UserDirty"
    """Its landing waits: the person's uncommitted changes are in the way."""
    HEAD_MOVED = "HeadMoved"
    """Its landing raced a move of the target branch and tries again."""
    LANDED = "Landed"
    """Its changes are on the target branch."""
    CHECK_FAILED = "CheckFailed"
    """The repo's landing check failed on the merged result."""
    LANDING_FAILED = "LandingFailed"
    """The landing itself failed (an error, not a conflict)."""
    CONFLICT = "Conflict"
    """Its changes conflict with the target branch (re-queued, or left for a person)."""
    RETRIED = "Retried"
    """A person queued it again."""
    NOTIFY_FAILED = "NotifyFailed"
    """The `on_end` command failed or timed out (the job itself is not affected)."""
    BUDGET_SPENT = "BudgetSpent"
    """The built-in agent spent its turn, token or time budget before it was done."""
    MODEL_UNAVAILABLE = "ModelUnavailable"
    """Claude could not be reached (or refused) after the shared client's retries."""
    WROTE_OUTSIDE = "WroteOutside"
    """Without a sandbox, the user's checkout changed while the job ran: it is not landed."""
    SANDBOX_UNAVAILABLE = "SandboxUnavailable"
    """`jobs.sandbox = "bwrap"` but bubblewrap does not work here."""
    READY = "Ready"
    """Review mode: it finished with changes and waits for `orchestrator land` or `reject`."""
    REJECTED = "Rejected"
    """A person rejected it in review; its branch is kept."""
    NO_SPACE = "NoSpace"
    """A disk is full: its landing waits for free space in a checkout of its branch; or, while it ran, the
    daemon's state could not be written (it stopped, its paths and slot free)."""
    TOO_BIG = "TooBig"
    """It grew past a size limit: its workspace past `jobs.max_bytes` (stopped), or a file or its whole result
    past what a job may commit (nothing committed)."""
    BAD_NAMES = "BadNames"
    """It left files whose names cannot be committed (`.GIT`, `git~1`, not UTF-8): nothing committed."""
    REWRITTEN = "Rewritten"
    """Its target branch was rewritten (its base dropped): it was re-queued to be planned on the new head."""
    REMOTE_UNREACHABLE = "RemoteUnreachable"
    """Team mode: the shared remote could not be reached to land it; the landing waits and tries again."""
    REVISED = "Revised"
    """A person sent it back to its agent with review feedback: it runs again in its worktree (`revise`)."""
    RATE_LIMITED = "RateLimited"
    """Its runner's model API said it is rate- or usage-limited: it waits, then goes on by itself (bounded)."""
    EDITED = "Edited"
    """A person changed its text or paths while it waited (`orchestrator edit`): it is planned again."""
    UNVERIFIED = "Unverified"
    """Team mode: its order (text, runner, landing, branch, feedback) does not verify with the team's secret: it
    was changed in the database outside the team's nodes, and no node runs it."""


class Outcome(StrEnum):
    """What the scheduler does with a decision."""

    ADMIT = "admit"
    DEFER = "defer"
    REPLAN = "replan"
    FAIL = "fail"


@dataclass(frozen=True, slots=True)
class Check:
    """One admission check as `orchestrator why` prints it."""

    name: str
    ok: bool
    detail: str


@dataclass(frozen=True, slots=True)
class Decision:
    """The result of `admission.decide`: plain data, logged once per change of reason."""

    job_id: int
    outcome: Outcome
    reason: Reason
    message: str
    """One human line with counts, e.g. "0/2 slots free: 2 active jobs (MAX_CONCURRENT_JOBS=2)"."""
    blocking: tuple[int, ...] = ()
    """Ids of the jobs that hold it back."""
    paths: tuple[str, ...] = ()
    """The paths in question (overlapping, moved, or barrier paths)."""
    shared: tuple[str, ...] = ()
    """Union-mergeable paths it shares with active jobs (not counted as overlap)."""
    next: str = ""
    """What happens next, e.g. "waits for job 12 to land"."""
    checks: tuple[Check, ...] = ()
    risks: tuple[tuple[int, float, float, float, float], ...] = ()
    """(active job, logit, meet, no merge, raw): its estimated risk beside each active job it was weighed against: the
    chance they touch a common path, and that such a meeting would not merge (`core.risk`; the risk is their
    product), with the shipped model's log-odds of the first before its repository's rescaling, and the product
    before its repository's map (`Risk.scale`)."""

    @property
    def admitted(self) -> bool:
        return self.outcome is Outcome.ADMIT

    def to_json(self) -> dict[str, object]:
        return {
            "job_id": self.job_id,
            "outcome": str(self.outcome),
            "reason": str(self.reason),
            "message": self.message,
            "blocking": list(self.blocking),
            "paths": list(self.paths),
            "shared": list(self.shared),
            "next": self.next,
            "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in self.checks],
            **({"risks": [risk_json(*r) for r in self.risks]} if self.risks else {}),
        }


def risk_json(job: int, logit: float, meet: float, nonmerge: float, raw: float | None = None) -> dict[str, object]:
    """A pair's risk as `Decision.to_json` and the admission log give it."""
    return {
        "job": job,
        "meet": round(meet, 5),
        "nonmerge": round(nonmerge, 5),
        "risk": round(meet * nonmerge, 5),
        "logit": round(logit, 4),
        **({"raw": round(raw, 6)} if raw is not None else {}),
    }
