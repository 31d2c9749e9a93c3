"""Job lines that fit a terminal, and which job in review holds work back: pure functions over the API's job JSON."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.commands import fit


def job(i: int, state: str, code: str = "", *, blocking: tuple[int, ...] = (), nxt: str = "", **extra: Any) -> dict:
    decision = {"blocking": list(blocking), "next": nxt} if state in fit.WAITING else None
    return {
        "id": i, "state": state, "code": code, "repo": extra.pop("repo", "/src/project"), "text": f"job {i} text",
        "reason": extra.pop("reason", f"reason of {i}"), "decision": decision, "claim": {"paths": ["src/"]},
        "actual": [], "created_at": None, "started_at": None, "finished_at": None, **extra,
    }  # fmt: skip


def test_a_job_in_review_holds_back_the_jobs_waiting_on_it_and_on_them() -> None:
    """R in review blocks A (Overlap), A blocks B (Priority): both are held by R. A job waiting on a running job
    is not; a job of another repo waiting for a slot R takes is."""
    jobs = [
        job(1, "ready", "Ready"),
        job(2, "planned", "Overlap", blocking=(1,)),
        job(3, "planned", "Priority", blocking=(2,)),
        job(4, "running"),
        job(5, "planned", "Overlap", blocking=(4,)),
        job(6, "planned", "Concurrency", blocking=(1, 4), repo="/src/other"),
        job(7, "planned", "Priority", blocking=(5,)),
    ]
    assert fit.review_holds(jobs) == {2: [1], 3: [1], 6: [1]}


LONG = "claim meets 1 of 2 active jobs in repo: job 12 (src/orchestrator/commands/status.py)"


@pytest.mark.parametrize("width", [80, 120])
def test_every_line_fits_and_a_waiting_job_keeps_its_code_and_what_it_waits_for(width: int) -> None:
    """At 80 and 120 columns every line fits; a waiting job shows its code and what happens next whole (not a
    middle cut of its long reason), a held one says which job in review holds it."""
    jobs = [
        job(12, "running", actual=["src/orchestrator/commands/status.py", "docs/a-very-long-file-name.md"]),
        job(13, "planned", "Overlap", blocking=(12,), nxt="waits for job 12 to land", reason=LONG),
        job(14, "ready", "Ready", reason="ready for review: `orchestrator diff 14`, then `orchestrator land 14`, ..."),
        job(15, "planned", "Overlap", blocking=(14,), nxt="waits for job 14 to land", reason=LONG),
        job(16, "landed", "Landed", landed_sha="8e6ef766d43f0123", reason="landed job 16 on main: fast-forward a → b"),
        job(17, "failed", "RunnerFailed", reason="shell exited 3; worktree kept at /home/someone/.local/state/x"),
        job(18, "interrupted", "Interrupted", text="x" * 300, repo="/elsewhere/another-repository-name"),
    ]
    lay = fit.layout(jobs, width - 1)
    holds = fit.review_holds(jobs)
    lines = {j["id"]: " ".join(t for t, _ in fit.row(j, lay, now=0, held=holds.get(j["id"]))) for j in jobs}
    assert all(len(line) <= width - 1 for text in lines.values() for line in text.split(" \n")), lines
    assert "Overlap" in lines[13] and lines[13].endswith("waits for job 12 to land"), lines[13]
    assert "Overlap" in lines[15] and "held by job 14 in review" in lines[15], lines[15]
    assert "review it: `orchestrator diff 14`" in lines[14] or "`orchestrator diff 14`" in lines[14]
    assert "8e6ef766d43f" in lines[16] and "Landed" not in lines[16], "the code says nothing the state does not"
