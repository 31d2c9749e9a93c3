"""The job record: what the store keeps of one job, and its JSON form for the API and CLI."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from orchestrator.core.models import Claim, JobState, JobView


def iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")


@dataclass(frozen=True, slots=True)
class Job:
    id: int
    repo: str
    branch: str
    text: str
    runner: str
    state: JobState
    priority: int = 0
    after: tuple[int, ...] = ()
    declared: tuple[str, ...] = ()
    claim: Claim = field(default_factory=Claim)
    actual: frozenset[str] = frozenset()
    base: str | None = None
    result: str | None = None
    """The job's own result commit (its branch head after the runner), once it finished."""
    attempts: int = 0
    land_after: tuple[int, ...] = ()
    """Jobs it must land after: an overlap was seen while both ran."""
    worktree: str | None = None
    created_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    landed_sha: str | None = None
    reason: str = ""
    decision: dict[str, Any] | None = None
    exit_code: int | None = None
    argv: tuple[str, ...] | None = None
    """The exact argv to run (`enqueue -- cmd arg ...`), never re-split; None when `text` is the job."""
    code: str = ""
    """The closed code of `reason`: a `models.Code`, or the admission `Reason` while it waits."""
    plan_text: str = ""
    """The model's plan for the job ("" when no model planned it): the runner starts from it."""
    evidence: tuple[dict[str, str], ...] = ()
    """Why each claimed path is there: `{"path", "kind", "why"}` per entry (see `plan.base.Evidence`)."""
    usage: dict[str, Any] | None = None
    """Model usage and cost of its runner (tokens, calls, `cost_usd`), for runners that call a model."""
    land: str = "auto"
    """`auto`: lands when it finishes; `review`: waits `ready` for `orchestrator land` or `reject`."""

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
    def commit_text(self) -> str:
        """The job's commit message before its trailer: its subject, then its full text when that says more."""
        text = self.text.strip()
        return self.subject if text == self.subject else f"{self.subject}\n\n{text}"

    def view(self, mergeable: frozenset[str] = frozenset()) -> JobView:
        return JobView(
            id=self.id,
            repo=self.repo,
            branch=self.branch,
            claim=self.claim,
            actual=self.actual,
            priority=self.priority,
            after=self.after,
            mergeable=mergeable,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "repo": self.repo,
            "branch": self.branch,
            "text": self.text,
            "runner": self.runner,
            "state": str(self.state),
            "claim": self.claim.to_json(),
            "actual": sorted(self.actual),
            "base": self.base,
            "created_at": iso(self.created_at),
            "started_at": iso(self.started_at),
            "finished_at": iso(self.finished_at),
            "landed_sha": self.landed_sha,
            "reason": self.reason,
            "priority": self.priority,
            "after": list(self.after),
            "declared": list(self.declared),
            "attempts": self.attempts,
            "land_after": list(self.land_after),
            "result": self.result,
            "worktree": self.worktree,
            "exit_code": self.exit_code,
            "argv": None if self.argv is None else list(self.argv),
            "code": self.code,
            "usage": self.usage,
            "land": self.land,
            "decision": self.decision,
            "plan_text": self.plan_text,
            "evidence": list(self.evidence),
        }


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
