"""The risk in the job plane: two jobs admitted side by side on both factors, the record kept, their pair learnt."""

from __future__ import annotations

from pathlib import Path

from orchestrator.commands.jobs import risk_lines
from orchestrator.config import PlanConfig
from orchestrator.core.models import JobState
from orchestrator.plan.accuracy import Settled
from tests.conftest import git, write
from tests.plane import plane
from tests.test_plan_focus import shop  # noqa: F401  (the crafted repository with its 40 past changes)

CART = "Cart.total is wrong for a cart with a single item\n\nThe total comes out as zero."
SHIPPING = "shipping_cost is negative for a weight of zero\n\nThe cost should never be below zero."


def _recorded(repo: Path, base: str, path: str, text: str, message: str) -> str:
    """A commit on a ref of its own from `base`, changing `path`: what a replay job applies."""
    git(repo, "checkout", "-q", "--detach", base)
    write(repo, {path: text})
    git(repo, "commit", "-qam", message)
    sha = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    return sha


async def test_two_jobs_run_side_by_side_on_both_factors_and_their_pair_is_learnt(
    shop: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """In a repository whose record is long enough, a job about the cart and one about shipping start together
    (their risk within plan.risk): the later one's admission event keeps its risk beside the earlier (the chance
    they meet, the chance that would not merge, their product and the model's log-odds, and the product before the
    repository's map), the repository's record
    is kept in the store, and once both landed the pair is a settled outcome (they met nowhere) that the planner
    is handed."""
    repo = tmp_path / "shop"
    git(tmp_path, "clone", "-q", str(shop), str(repo))
    git(repo, "config", "user.name", "Repo User")
    git(repo, "config", "user.email", "user@example.com")
    base = git(repo, "rev-parse", "HEAD")
    cart = _recorded(repo, base, "src/shop/cart.py", "class Cart:\n    def total(self):\n        return 1\n", "cart")
    ship = _recorded(repo, base, "src/shop/shipping.py", "def shipping_cost(weight):\n    return 0\n", "ship")
    async with plane(tmp_path, plan=PlanConfig(planner="local", risk=0.5), max_concurrent=4) as p:
        await p.jobs.control(str(repo), paused=True)
        a = await p.enqueue(repo, f"{CART}\ncommit: {cart}", runner="replay")
        b = await p.enqueue(repo, f"{SHIPPING}\ncommit: {ship}", runner="replay")
        for job_id in (a, b):
            await p.reach(job_id, JobState.PLANNED, timeout=60)
        await p.jobs.control(str(repo), paused=False)
        for job_id in (a, b):
            await p.reach(job_id, JobState.LANDED, timeout=60)
        events = await p.store.events.of_job(b)
        admitted = next(e for e in events if e["kind"] == "admitted")
        (risk,) = admitted["risks"]
        assert risk["job"] == a and 0 < risk["meet"] < 1 and 0 < risk["nonmerge"] <= 1
        assert abs(risk["risk"] - risk["meet"] * risk["nonmerge"]) < 1e-4 and risk["risk"] <= 0.5
        assert isinstance(risk["logit"], float) and isinstance(risk["raw"], float)  # before its repository's map
        job = await p.store.jobs.get(b)
        assert job is not None and job.claim.risk is not None and "src/shop/shipping.py" in job.claim.paths
        lines = risk_lines(job.claim.risk.to_json(), [risk])
        assert lines[0].startswith("in src/shop: where it meets another job, ") and f"beside job {a}: " in lines[1]
        row = await p.store.plans.record(str(repo))
        assert row is not None and row[1] is not None and row[1]["points"]
        settled = await p.parts.planning.outcomes()
        estimate = risk["meet"] * risk["nonmerge"]
        assert settled == {str(repo): [Settled(risk["logit"], False, True, estimate, risk["raw"])]}
