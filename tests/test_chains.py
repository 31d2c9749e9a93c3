"""Jobs made on top of one another (`core.chains`): a job whose text names what its base lacks and an earlier job is
making waits for that job, and says so; unrelated jobs do not wait."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from orchestrator.config import PlanConfig
from orchestrator.core import chains
from orchestrator.core.admission import decide, decide_all
from orchestrator.core.job import Job
from orchestrator.core.models import Claim, ClaimSource, JobState, JobView, Outcome, Policy, Reason, Snapshot
from orchestrator.plan import coined
from orchestrator.plan.base import Plan
from tests.conftest import git, write
from tests.plane import plane
from tests.test_plan_focus import shop  # noqa: F401  (the crafted repository with its 40 past changes)

POLICY = Policy(max_concurrent=8, per_repo=8)


def job(id: int, *paths: str, coined: tuple[str, ...] = (), actual: tuple[str, ...] = (), branch: str = "main"):
    claim = Claim(frozenset(paths), 0.9, ClaimSource.MODEL, coined=frozenset(coined))
    return JobView(id, "r", branch, claim, frozenset(actual))


def test_words_split_code_and_leave_common_words_out():
    """A text's terms: words lower-cased, the parts of snake_case, CamelCase, hyphenated and path names; the words
    every change's text uses are no terms."""
    assert chains.words("http2: add the InvalidH2CPreface error") >= {
        "http2",
        "invalidh2cpreface",
        "invalid",
        "preface",
    }
    assert "add" not in chains.words("add the parser") and "the" not in chains.words("add the parser")
    assert chains.words("prior-knowledge h2c") == {"prior-knowledge", "prior", "knowledge", "h2c"}
    assert chains.path_words(["tests/_plugins/_coverage/piptools_coverage.py"]) >= {"plugins", "piptools_coverage"}


def test_what_a_text_names_is_its_subject_and_the_code_of_its_body():
    """Of a body only what is written as code names things (prose shares rare words by chance); links, addresses and
    trailers name nothing."""
    text = (
        "h2c: flow control\n\nThe window stays open while `send_data` waits, see gunicorn/http2/negotiation.py and\n"
        "https://example.org/rfc9113.\n\nSigned-off-by: Ann <ann@example.org>\n"
    )
    named = chains.words(chains.naming(text))
    assert {"h2c", "flow", "control", "send_data", "negotiation"} <= named
    assert not named & {"window", "stays", "rfc9113", "ann", "signed"}


def test_coined_terms_are_those_the_base_uses_rarely():
    """A term at most `RARE` files of the base use, and at most `SAID` subjects of its history, is new to it; one
    many use is not."""
    used = {"h2c": 1, "worker": 40}.get
    assert chains.coined("h2c on the gevent worker", lambda t: used(t, 0)) == {"h2c", "gevent"}
    assert chains.coined("h2c on the gevent worker", lambda t: used(t, 0) or 9) == {"h2c"}
    said = {"gevent": 3}.get
    assert chains.coined("h2c on the gevent worker", lambda t: used(t, 0), lambda t: said(t, 0)) == {"h2c"}, (
        "a word three past subjects named is a topic of the repository, though its files seldom spell it"
    )


def test_a_job_needs_the_earlier_jobs_making_what_it_names():
    """A later job naming a new term waits for the earlier unfinished jobs whose text or paths make it, in queue
    order only, on its own branch; a job naming nothing new needs nothing."""
    first = job(1, "src/a.py", coined=("h2c",))
    maker = job(2, "docs/x.md", actual=("src/h2c_negotiation.py",))
    later = job(3, "src/b.py", coined=("negotiation", "h2c"))
    other_branch = job(4, "src/c.py", coined=("h2c",), branch="dev")
    plain = job(5, "src/d.py")
    links = chains.links([later, plain, other_branch, maker, first])
    assert links[3] == chains.Link((1, 2), ("h2c", "negotiation"))
    assert 1 not in links and 2 not in links and 4 not in links and 5 not in links
    assert links[3].message() == (
        "needs what jobs 1, 2 are making (h2c, negotiation: its text names them, its base has no such thing yet)"
    )


def test_admission_holds_a_job_for_the_job_making_what_it_needs():
    """Disjoint claims, no other reason to wait: the later job of a series waits (Dependency) for the earlier one,
    running or waiting, and names it; an unrelated job beside them starts; once the earlier one has ended (it is no
    longer in the snapshot) the later one starts."""
    parser = job(1, "src/h2/parser.py", coined=("h2c",))
    flow = job(2, "src/h2/flow.py", coined=("h2c",))
    docs = job(3, "docs/intro.md", coined=("tutorial",))
    d = decide(flow, Snapshot(active=(parser,), waiting=(flow, docs), policy=POLICY))
    assert (d.outcome, d.reason, d.blocking) == (Outcome.DEFER, Reason.DEPENDENCY, (1,))
    assert "needs what job 1 is making (h2c" in d.message and d.next == "starts once job 1 ended"
    assert decide(docs, Snapshot(active=(parser,), waiting=(flow, docs), policy=POLICY)).admitted
    both_waiting = {x.job_id: x for x in decide_all(Snapshot(waiting=(parser, flow, docs), policy=POLICY))}
    assert both_waiting[1].admitted and both_waiting[3].admitted and both_waiting[2].reason is Reason.DEPENDENCY
    assert decide(flow, Snapshot(waiting=(flow,), policy=POLICY, landed=frozenset({1}))).admitted


def test_the_claims_json_keeps_the_coined_terms():
    """A stored claim keeps its coined terms (a restarted daemon holds the same jobs back)."""
    claim = Claim(frozenset({"a.py"}), 0.5, ClaimSource.MODEL, coined=frozenset({"h2c"}))
    assert Claim.from_json(claim.to_json()) == claim
    assert "coined" not in replace(claim, coined=frozenset()).to_json()


CART = "Cart.total ignores a coupon_code\n\nThe total comes out without the coupon."
SHIPPING = "shipping_cost is negative with a coupon_code\n\nThe cost should never be below zero."


async def test_the_job_made_on_the_one_before_waits_for_it_in_the_plane(shop: Path, tmp_path: Path) -> None:  # noqa: F811
    """Two replayed jobs whose claims are disjoint and risk within plan.risk: the second edits the module the first
    creates (coupons.py, which its base has not got) and its text names what the first's does (coupon_code). It waits
    for the first, saying so in its decision, starts once that one landed and lands in one attempt (side by side, it
    conflicted and ran again)."""
    repo = tmp_path / "shop"
    git(tmp_path, "clone", "-q", str(shop), str(repo))
    git(repo, "config", "user.name", "Repo User")
    git(repo, "config", "user.email", "user@example.com")
    base = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "--detach", base)
    write(repo, {"src/shop/coupons.py": "def coupon_code(cart):\n    return None\n"})
    write(repo, {"src/shop/cart.py": "from shop.coupons import coupon_code\n"})
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "coupons")
    first = git(repo, "rev-parse", "HEAD")
    write(repo, {"src/shop/coupons.py": "def coupon_code(cart):\n    return cart.code\n"})
    write(repo, {"src/shop/shipping.py": "from shop.coupons import coupon_code\n"})
    git(repo, "commit", "-qam", "shipping with coupons")
    second = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    async with plane(tmp_path, plan=PlanConfig(planner="local", risk=0.5), max_concurrent=4) as p:
        await p.jobs.control(str(repo), paused=True)
        a = await p.enqueue(repo, f"{CART}\ncommit: {first}\nafter: 1", runner="replay")
        b = await p.enqueue(repo, f"{SHIPPING}\ncommit: {second}", runner="replay")
        for job_id in (a, b):
            await p.reach(job_id, JobState.PLANNED, timeout=60)
        planned = await p.store.jobs.get(b)
        assert planned is not None and "coupon_code" in planned.claim.coined
        assert "src/shop/shipping.py" in planned.claim.paths and "src/shop/coupons.py" not in planned.claim.paths
        await p.jobs.control(str(repo), paused=False)

        async def waiting() -> str:
            job = await p.store.jobs.get(b)
            return job.reason if job is not None and job.code == "Dependency" else ""

        reason = await p.until(f"job {b} to wait for job {a}", waiting)
        assert reason.startswith(f"needs what job {a} is making (") and "coupon_code" in reason
        for job_id in (a, b):
            await p.reach(job_id, JobState.LANDED, timeout=60)
        events = await p.store.events.of_job(b)
        assert [e for e in events if e["kind"] == "deferred" and e.get("code") == "Dependency"], events
        done = await p.store.jobs.get(b)
        assert done is not None and done.attempts == 0
    assert git(repo, "show", "main:src/shop/coupons.py").endswith("return cart.code")


async def test_a_job_planned_again_keeps_what_was_new_to_the_base_it_was_queued_on(make_repo) -> None:
    """The first jobs of a series land and make its word known (five files use h2c now): planned again on that head, a
    later job still names it as new, so it keeps waiting for the job of the series still to come."""
    repo = make_repo(files={"src/app.py": "def main():\n    pass\n"})
    job = Job(7, str(repo), "main", "h2c: flow control", "replay", JobState.PLANNING)
    first = await coined.plan_with(job, git(repo, "rev-parse", "HEAD"), Plan())
    assert {"h2c", "flow", "control"} <= first.claim.coined
    write(repo, {f"src/h2c_{n}.py": "H2C = 'h2c'\n" for n in range(6)})
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "h2c everywhere")
    head = git(repo, "rev-parse", "HEAD")
    assert "h2c" not in (await coined.plan_with(job, head, Plan())).claim.coined, "new to this base it is not"
    again = await coined.plan_with(replace(job, claim=first.claim), head, Plan())
    assert "h2c" in again.claim.coined


def test_a_job_is_planned_again_once_what_it_named_as_new_has_landed():
    """Its branch moved in a path whose name says a word its text named as new (the job it waited for landed it): it
    plans again on the new head, so that its claim can name that file; a move elsewhere leaves its plan standing."""
    flow = job(2, "src/h2/flow.py", coined=("h2c",))
    landed = Snapshot(waiting=(flow,), policy=POLICY, moved={2: frozenset({"tests/test_http2_h2c.py", "README.md"})})
    d = decide(flow, landed)
    assert (d.outcome, d.reason, d.paths) == (Outcome.REPLAN, Reason.BASE_MOVED, ("tests/test_http2_h2c.py",))
    assert "1 path its text names as new" in d.message
    elsewhere = Snapshot(waiting=(flow,), policy=POLICY, moved={2: frozenset({"docs/other.md"})})
    assert decide(flow, elsewhere).admitted
