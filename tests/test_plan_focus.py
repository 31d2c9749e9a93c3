"""Focused claims on a crafted repository with a history: ranked by evidence, each path with its probability."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.core import claims
from orchestrator.core.models import ClaimSource
from orchestrator.plan import record
from orchestrator.plan.base import Plan
from orchestrator.plan.evidence import local_plan
from orchestrator.plan.focus import CLAIM_P
from orchestrator.plan.history import History, mine
from orchestrator.plan.score import Calibration
from orchestrator.plan.text import Where, mentions
from tests.conftest import git, write

MODULES = {
    "cart": "class Cart:\n    def total(self):\n        return sum(self.items)\n\n"
    "    def add_item(self, item):\n        pass\n",
    "pricing": "class PriceRule:\n    pass\n\n\ndef apply_discount(price, pct):\n    return price\n",
    "money": "ROUNDING = 2\n\n\ndef round_money(value):\n    return round(value, ROUNDING)\n",
    "inventory": "class Stock:\n    def reserve(self, sku, n):\n        raise ValueError('not enough stock left')\n",
    "shipping": "def shipping_cost(weight):\n    return weight * 2\n",
    "orders": "class Order:\n    def place(self):\n        pass\n",
    "users": "class Customer:\n    def rename(self, name):\n        pass\n",
    "reports": "def monthly_report(month):\n    return []\n",
    "search": "def find_products(query):\n    return []\n",
    "mail": "def send_receipt(order):\n    pass\n",
}
NAMES = {
    "cart": "Cart.total",
    "pricing": "apply_discount",
    "money": "round_money",
    "inventory": "Stock.reserve",
    "shipping": "shipping_cost",
    "orders": "Order.place",
    "users": "Customer.rename",
    "reports": "monthly_report",
    "search": "find_products",
    "mail": "send_receipt",
}
"""Past changes: four to each module (and its test), in the module's own words; one in four also names
another module's identifier, which that change does not touch."""


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A shop with ten modules, their tests and 40 past changes, each to one module and its test."""
    repo = tmp_path_factory.mktemp("focus") / "shop"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    files = {f"src/shop/{m}.py": body for m, body in MODULES.items()}
    files |= {f"tests/test_{m}.py": f"from shop.{m} import *\n" for m in MODULES}
    files |= {"README.md": "shop\n", "CHANGES.md": "# changes\n", "src/shop/__init__.py": ""}
    files |= {"src/shop/audit.py": "def audit_trail():\n    pass\n"}  # never changed since
    files |= {"src/shop/[legacy].py": "OLD = 1\n"}  # a file whose name has glob characters
    files |= {"tests/fakes.py": "class Stock:\n    def reserve(self, sku, n):\n        pass\n"}  # a test double
    write(repo, files)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "initial shop")
    modules = list(MODULES)
    for k, words in enumerate(("fix", "speed up", "document", "tidy")):
        for i, m in enumerate(modules):
            other = NAMES[modules[(i + 3) % len(modules)]]
            subject = f"{m}: {words} {NAMES[m]}" + (f" for {other}" if k == 3 else "")
            write(repo, {f"src/shop/{m}.py": files[f"src/shop/{m}.py"] + f"# {k}\n"})
            write(repo, {f"tests/test_{m}.py": files[f"tests/test_{m}.py"] + f"# {k}\n"})
            git(repo, "commit", "-qam", subject)
    return repo


_RECORDS: dict[Path, tuple[str, History, Calibration | None]] = {}


def plan(repo: Path, text: str, calibrated: bool = True) -> Plan:
    """Local evidence's plan at the head, with the repository's record (replayed once per repository)."""
    if repo not in _RECORDS:
        head = git(repo, "rev-parse", "HEAD")
        history = History(mine(repo, head)[0])
        _RECORDS[repo] = (head, history, record.fit(record.replay(repo, history.changes)))
    head, history, calibration = _RECORDS[repo]
    return local_plan(repo, head, text, history, ("CHANGES*",), calibration if calibrated else None)


def test_focused_claim_is_the_likely_file_and_its_test_each_with_a_probability(shop: Path) -> None:
    """A ticket about `Cart.total` claims cart.py and its test, not the whole package; every file of the
    ranking has its probability and why; the record (40 replayed changes) gives the claim a risk."""
    p = plan(shop, "Cart.total is wrong for a cart with a single item\n\nThe total comes out as zero.")
    assert p.claim.source is ClaimSource.EVIDENCE and p.claim.risk is not None
    assert "src/shop/cart.py" in p.claim.paths and "tests/test_cart.py" in p.claim.paths
    assert not p.claim.paths & {"src/shop/pricing.py", "src/shop/inventory.py", "src/shop/", "src/"}
    top = p.ranking[0]
    assert top["path"] == "src/shop/cart.py" and top["p"] >= CLAIM_P and top["claimed"]
    assert any("Cart.total" in w for w in top["why"])
    claimed = {r["path"] for r in p.ranking if r["claimed"]}
    assert claimed <= p.claim.paths and all(r["p"] < CLAIM_P for r in p.ranking if not r["claimed"])
    near = dict(p.claim.risk.near)
    assert all(q < CLAIM_P for q in near.values()) and not set(near) & p.claim.paths
    assert p.claim.risk.area == "src/shop" and dict(p.claim.risk.meets)["src/shop"] >= 0.0
    assert p.to_json()["ranking"][0]["path"] == "src/shop/cart.py"


def test_a_short_record_leaves_the_risk_unknown(shop: Path) -> None:
    """Without a calibration (a record too short), the claim is made but its risk is unknown (runs alone)."""
    p = plan(shop, "Cart.total is wrong for a cart with a single item", calibrated=False)
    assert "src/shop/cart.py" in p.claim.paths and p.claim.risk is None
    assert [c for c, _ in p.notes] == ["NoRecord"]
    assert record.fit([]) is None and Calibration().probability(0.0) == 0.5


def test_traceback_frames_and_links_lead_to_the_innermost_repository_file(shop: Path) -> None:
    """Absolute frame paths match by their longest suffix in the tree, the innermost in-repo frame ranks
    first; a GitHub blob link names its file."""
    text = (
        "Crash when reserving\n"
        "Traceback (most recent call last):\n"
        '  File "/home/me/app/views.py", line 3, in order\n'
        '  File "/usr/lib/python3/site-packages/shop/cart.py", line 2, in total\n'
        '  File "/usr/lib/python3/site-packages/shop/inventory.py", line 3, in reserve\n'
        "ValueError: not enough stock left\n"
        "See https://github.com/acme/shop/blob/main/src/shop/shipping.py#L1 too.\n"
    )
    p = plan(shop, text)
    ranked = [r["path"] for r in p.ranking]
    assert ranked[0] == "src/shop/inventory.py"
    assert ranked.index("src/shop/inventory.py") < ranked.index("src/shop/cart.py")
    assert "src/shop/shipping.py" in ranked
    why = " ".join(p.ranking[0]["why"])
    assert "innermost traceback frame" in why and "not enough stock left" in why


def test_glob_characters_in_prose_never_become_claim_paths(shop: Path) -> None:
    """`[dim.id for dim in qs]`, `**/***/x.py` and `[django.db.backends` in a ticket plan fine: every claim
    path is a real file of the tree, none a pattern."""
    text = "Stock.reserve fails on [dim.id for dim in qs] and **/***/x.py or [django.db.backends\n`src/shop/[a].py`"
    p = plan(shop, text)
    assert p.claim.paths and not any(claims.is_glob(c) for c in p.claim.paths)
    assert all(claims.normalize(c) == c for c in p.claim.paths)
    assert "src/shop/inventory.py" in p.claim.paths
    named = plan(shop, "remove OLD from src/shop/[legacy].py")  # a real file with brackets: quoted, exact
    assert "src/shop/[[]legacy].py" in named.claim.paths
    assert claims.overlaps("src/shop/[[]legacy].py", "src/shop/[legacy].py")
    assert not claims.overlaps("src/shop/[[]legacy].py", "src/shop/l.py")


def test_imports_and_sessions_count_little_tests_and_docs_definitions_not_at_all(shop: Path) -> None:
    """Names on import lines and in `>>>` sessions are what the reporter used, not what is broken: the
    file the prose names ranks first."""
    m = mentions("Stock.reserve double counts\nfrom shop.money import round_money\n>>> round_money(2)\n")
    assert m.weak("round_money") and Where.TITLE in m.where["Stock.reserve"]
    weak = plan(shop, "Stock.reserve double counts\nfrom shop.money import round_money\n>>> round_money(2)\n2")
    said = plan(shop, "Stock.reserve double counts\nand round_money rounds it down")
    assert weak.ranking[0]["path"] == said.ranking[0]["path"] == "src/shop/inventory.py"
    p_weak = next(r["p"] for r in weak.ranking if r["path"] == "src/shop/money.py")
    p_said = next(r["p"] for r in said.ranking if r["path"] == "src/shop/money.py")
    assert p_weak < 0.6 * p_said
    # A test double defining `Stock.reserve` too is no definition of what the ticket means.
    assert not any("defines" in w for r in said.ranking if r["path"] == "tests/fakes.py" for w in r["why"])


def test_confident_needs_two_independent_kinds_of_evidence(shop: Path) -> None:
    """A bare word matching a file's name is one kind of evidence: not confident. Its name and the past
    changes that said that word and touched it are two."""
    one = plan(shop, "an audit log for refunds")
    two = plan(shop, "shipping zones")
    assert one.ranking[0]["path"] == "src/shop/audit.py" and one.claim.confidence <= 0.3
    assert two.ranking[0]["path"] == "src/shop/shipping.py" and two.claim.confidence > 0.3
    assert {w.split(":")[0] for w in two.ranking[0]["why"]} >= {"named", "history"}


def test_area_rates_learn_from_the_pairs_their_files_would_let_run_together() -> None:
    """The record's area table counts the pairs of nearby changes with disjoint claims whose estimate by files
    was small, and how many still touched a common path; pairs their files keep apart say nothing of it."""
    from orchestrator.core.models import Risk
    from orchestrator.plan.focus import Focus

    def f(claim: str, near: dict[str, float], area: str) -> Focus:
        return Focus([], frozenset({claim}), Risk(tuple(near.items()), 0.0, area), 1.0, True)

    foci = [f("src/a.py", {"src/b.py": 0.5}, "src"), f("src/b.py", {}, "src"), f("docs/x.md", {}, "docs")]
    touched = [frozenset({"src/a.py", "docs/x.md"}), frozenset({"src/b.py"}), frozenset({"docs/x.md"})]
    table = {(x, y): (n, k) for x, y, n, k in record._areas(foci, touched)}
    assert table[("", "")] == (2, 1)  # a-b kept apart by files; a-c met in docs/x.md; b-c did not meet
    assert table[("src", "docs")] == (2, 1) and ("src", "src") not in table


def test_a_change_of_a_known_kind_counts_in_its_kinds_area_not_its_rankings() -> None:
    """In the record, a change of a known kind (a dependency bump) claims what its kind does and is in that
    claim's area: the pair is counted beside the workflows, not where its words pointed."""
    from orchestrator.core.models import Risk
    from orchestrator.plan.focus import Focus

    def f(claim: str, area: str) -> Focus:
        return Focus([], frozenset({claim}), Risk((), 0.0, area), 1.0, True)

    foci = [f("src/a.py", "src"), f("src/__init__.py", "src")]  # the bump's words pointed at src/__init__.py
    touched = [frozenset({"src/a.py"}), frozenset({".github/workflows/ci.yml"})]
    kinds = [frozenset(), frozenset({".github/workflows/ci.yml"})]
    table = {(x, y): (n, k) for x, y, n, k in record._areas(foci, touched, kinds)}
    assert table[("src", ".github")] == (1, 0) and ("src", "src") not in table


def test_an_area_apart_from_the_jobs_is_judged_by_pairs_that_were_apart() -> None:
    """Two changes in sibling areas meet less often than two in one: an area the record does not list
    beside the job's gets the rate of the sibling pairs there (`*`, `src/*`), not the rate of all pairs."""
    from orchestrator.core.models import Risk
    from orchestrator.core.risk import Escapes
    from orchestrator.plan.score import Calibration

    areas = (
        ("", "", 100, 10),
        ("src", "src", 40, 10),
        ("src", "docs", 30, 0),
        ("docs", "src", 30, 0),
        ("src/a", "src/b", 20, 0),
        ("src/b", "src/a", 20, 0),
    )
    meets = dict(Calibration(areas=areas).meets("src/a"))
    root = 10.5 / 101
    assert meets[""] == root and meets["*"] < root / 3  # 60 pairs apart at the top, none of which met
    assert meets["src"] > root  # its own area: by its own pairs, pulled towards all pairs
    assert meets["docs"] < meets["*"] and meets["src/*"] < meets["src"]
    job = Escapes.of(Risk((), 0.0, "src/a", tuple(meets.items())))
    assert job is not None
    assert job.meeting("lib/x") == meets["*"]  # unlisted, apart at the top
    assert job.meeting("src/c") == meets["src/*"]  # unlisted sibling under src
    assert job.meeting("src/a/deep") == meets["src"]  # inside its own area: its own area's rate
    assert dict(Calibration(areas=areas).meets("")) == {"": root}  # a job in no area: all pairs


def test_commits_that_landed_together_are_one_task_in_the_area_table(tmp_path: Path) -> None:
    """A pull request's commits each build on the one before and land as one merge: `history.landings` finds
    the merge for each (a commit made on the main line stands for itself), and the record's area table does
    not count a pair of them as two jobs queued side by side, however often they met."""
    from orchestrator.core.models import Risk
    from orchestrator.plan.focus import Focus
    from orchestrator.plan.history import landings

    repo = tmp_path / "r"
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    for k, v in (("user.name", "t"), ("user.email", "t@example.com")):
        git(repo, "config", k, v)

    def commit(path: str, text: str) -> str:
        write(repo, {path: text})
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", f"edit {path}")
        return git(repo, "rev-parse", "HEAD")

    first = commit("src/a.py", "a = 0\n")
    git(repo, "checkout", "-qb", "feature")
    steps = [commit("src/a.py", "a = 1\n"), commit("src/b.py", "b = 1\n")]
    git(repo, "checkout", "-q", "main")
    direct = commit("docs/x.md", "x\n")
    git(repo, "merge", "-q", "--no-ff", "-m", "Merge feature", "feature")
    merge = git(repo, "rev-parse", "HEAD")
    after = commit("src/c.py", "c = 1\n")
    assert landings(repo, after, [first, *steps, direct, after]) == {
        first: first, steps[0]: merge, steps[1]: merge, direct: direct, after: after
    }  # fmt: skip

    def f(claim: str) -> Focus:
        return Focus([], frozenset({claim}), Risk((), 0.0, "src"), 1.0, True)

    foci = [f("src/a.py"), f("src/b.py"), f("src/c.py")]
    touched = [frozenset({"src/a.py", "src/x.py"}), frozenset({"src/b.py", "src/x.py"}), frozenset({"src/x.py"})]
    apart = {(x, y): (n, k) for x, y, n, k in record._areas(foci, touched)}
    together = {(x, y): (n, k) for x, y, n, k in record._areas(foci, touched, landings=[merge, merge, after])}
    assert apart[("src", "src")] == (3, 3)
    assert together[("src", "src")] == (2, 2)  # the two steps of one pull request are not a pair


def test_a_frame_that_raises_on_purpose_passes_the_innermost_place_to_its_caller(shop: Path) -> None:
    """The innermost frame's line is a `raise` (a check refusing what it was handed): the innermost frame that
    did not raise is the one weighed most; the raising frame is still a frame of the traceback."""
    frames = (
        "Traceback (most recent call last):\n"
        '  File "/usr/lib/python3/site-packages/shop/cart.py", line 2, in total\n'
        "    return sum(self.items)\n"
        '  File "/usr/lib/python3/site-packages/shop/inventory.py", line 3, in reserve\n'
        "    {}\n"
        "ValueError: stock\n"
    )
    raising = mentions("Crash in the cart\n" + frames.format("raise ValueError('stock')"))
    assert [(f.func, f.raises) for f in raising.frames] == [("total", False), ("reserve", True)]
    assert not any(f.raises for f in mentions("Crash\n" + frames.format("return self.left[sku] - n")).frames)

    def why(p: Plan, path: str) -> str:
        return " ".join(next(r["why"] for r in p.ranking if r["path"] == path))

    p = plan(shop, "Crash in the cart\n" + frames.format("raise ValueError('stock')"))
    assert "did not raise the error itself" in why(p, "src/shop/cart.py")
    assert "innermost" not in why(p, "src/shop/inventory.py") and "a traceback frame" in why(p, "src/shop/inventory.py")
    q = plan(shop, "Crash in the cart\n" + frames.format("return self.left[sku] - n"))
    assert "innermost traceback frame" in why(q, "src/shop/inventory.py")
    assert "innermost" not in why(q, "src/shop/cart.py")


def test_a_package_named_by_its_dotted_tail_brings_its_namesake_module(make_repo) -> None:
    """`printing.pretty` names the package `pkg/printing/pretty/`: its `__init__.py` and the module of its own
    name that holds its code; a package without one is its `__init__.py` alone."""
    repo = make_repo(
        "pkgs",
        {
            "pkg/printing/pretty/__init__.py": "from .pretty import pprint\n",
            "pkg/printing/pretty/pretty.py": "def pprint(x):\n    return x\n",
            "pkg/printing/pretty/stringpict.py": "class Pict:\n    pass\n",
            "pkg/core/__init__.py": "",
            "pkg/core/basic.py": "class Basic:\n    pass\n",
        },
    )
    pretty = plan(repo, "wrong output\n\nI did not see this bug among others in printing.pretty, it seems.")
    ranked = [r["path"] for r in pretty.ranking]
    assert {"pkg/printing/pretty/pretty.py", "pkg/printing/pretty/__init__.py"} <= set(ranked[:2])
    core = plan(repo, "slow\n\nsomething in core.basic is slow, and pkg.core too")
    assert "pkg/core/__init__.py" in [r["path"] for r in core.ranking]
    assert not any(r["path"].endswith("core/core.py") for r in core.ranking)


def test_a_tickets_claim_its_words_alone_found_is_a_guess() -> None:
    """A long text whose most likely claimed file is reached only by its words (content retrieval, and a
    co-change from a file a past change in similar words touched) is a guess: `grounded` is False (its plan says
    so). The same words in a short text, or a ticket whose best file it names, are judged as before."""
    from orchestrator.plan.base import Kind
    from orchestrator.plan.focus import Spread, focus

    def spread(long: float, named_best: bool) -> Spread:
        reasons = {
            "src/a.py": [(Kind.CONTENT, "its words are among the text's best matches")],
            "src/b.py": [(Kind.HISTORY, "touched by a past change in similar words")],
        }
        if named_best:
            reasons["src/a.py"].append((Kind.NAMED, "the text names src/a.py"))
        edges = {"src/b.py": [("src/a.py", 0.5, "changed with src/b.py in 2 of its 4 past changes")]}
        return Spread({"src/a.py": 1.0, "src/b.py": -1.0}, reasons, edges, True, long)

    guess = focus(spread(1.0, False), Calibration())
    assert sorted(guess.claim)[0] == "src/a.py" and not guess.grounded
    assert focus(spread(1.0, True), Calibration()).grounded
    assert focus(spread(0.0, False), Calibration()).grounded


def test_a_long_texts_risk_expects_at_most_budget_files_beyond_its_claim() -> None:
    """A ticket's candidates are alternatives for where its fix is: however many of them there are, the
    chances its risk lists beyond the claim add up to at most `BUDGET` files, each scaled alike (their order
    kept), and the ranking shows the same figures. A short text's are its own: no budget applies."""
    from orchestrator.plan.base import Kind
    from orchestrator.plan.focus import BUDGET, Spread, focus

    def spread(long: float) -> Spread:
        logits = {"src/a.py": 3.0} | {f"src/m{i}.py": -3.0 - i / 1000 for i in range(100)}
        reasons = {p: [(Kind.SYMBOL, "defines a name the text uses")] for p in logits}
        return Spread(logits, reasons, {}, True, long)

    long, short = focus(spread(1.0), Calibration()), focus(spread(0.0), Calibration())
    assert long.claim == short.claim == {"src/a.py"}
    raw = dict(short.risk.near)
    assert sum(raw.values()) > BUDGET, "the case: more expected than the budget"
    near = dict(long.risk.near)
    assert sum(near.values()) == pytest.approx(BUDGET)
    ratios = {p: near[p] / raw[p] for p in near}
    assert max(ratios.values()) == pytest.approx(min(ratios.values())), "scaled alike"
    shown = {r.path: r.p for r in long.ranked if r.path not in long.claim}
    assert all(shown[p] == pytest.approx(q) for p, q in near.items())


def test_a_ticket_claims_every_file_it_is_at_least_near_claim_likely_to_touch() -> None:
    """A ticket's candidates are alternatives for where its fix is: beside its most likely file it claims each one
    at least `NEAR_CLAIM` likely (so two tickets that may fix one file wait for each other), and its risk lists the
    rest. A short text claims its likely files only, and lists the others in its risk."""
    from orchestrator.plan.base import Kind
    from orchestrator.plan.focus import NEAR_CLAIM, Spread, focus

    def spread(long: float) -> Spread:
        logits = {"src/a.py": 3.0, "src/b.py": -2.2, "src/c.py": -4.0}
        reasons = {p: [(Kind.SYMBOL, "defines a name the text uses")] for p in logits}
        return Spread(logits, reasons, {}, True, long)

    long, short = focus(spread(1.0), Calibration()), focus(spread(0.0), Calibration())
    near = dict(short.risk.near)
    assert near["src/c.py"] < NEAR_CLAIM <= near["src/b.py"] < 0.4, "the case: b is an alternative, c is not"
    assert short.claim == {"src/a.py"}
    assert long.claim == {"src/a.py", "src/b.py"}
    assert dict(long.risk.near) == {"src/c.py": pytest.approx(near["src/c.py"])}
    assert [r.path for r in long.ranked[:2]] == ["src/a.py", "src/b.py"], "claimed files first"
    assert long.coverage == pytest.approx(1 - near["src/c.py"])


def test_a_tickets_claim_less_likely_than_ground_p_is_a_guess() -> None:
    """A long text whose best file a past change in similar words touched, but which is still less than
    `GROUND_P` likely, says nowhere where it works: its claim is a guess. The same file made likely by a name the
    text uses is grounded."""
    from orchestrator.plan.base import Kind
    from orchestrator.plan.focus import GROUND_P, Spread, focus

    def spread(z: float) -> Spread:
        reasons = {"src/a.py": [(Kind.HISTORY, "touched by a past change in similar words")]}
        return Spread({"src/a.py": z, "src/b.py": z - 4.0}, reasons, {}, True, 1.0)

    weak, strong = focus(spread(-4.0), Calibration()), focus(spread(0.5), Calibration())
    assert weak.claim == strong.claim == {"src/a.py"}
    assert weak.ranked[0].p < GROUND_P <= strong.ranked[0].p
    assert not weak.grounded and strong.grounded


def test_a_guessed_ticket_runs_beside_others_on_its_claim_of_alternatives() -> None:
    """A ticket whose claim is a guess claims its alternatives as any ticket does and keeps its risk estimate:
    admission runs it beside others on that claim (running every guess alone held apart 5.5 points more of the
    tuning tickets' pairs that did not meet, for one point fewer of those that did). Its plan says it is a
    guess."""
    from orchestrator.plan.base import Kind, Note
    from orchestrator.plan.evidence import Files, focused_plan
    from orchestrator.plan.focus import NEAR_CLAIM, Spread, focus

    reasons = {"src/a.py": [(Kind.HISTORY, "touched by a past change in similar words")]}
    reasons["src/b.py"] = [(Kind.SYMBOL, "defines a name the text uses")]
    guess = focus(Spread({"src/a.py": -3.0, "src/b.py": -3.2}, reasons, {}, True, 1.0), Calibration())
    assert not guess.grounded and guess.claim == {"src/a.py", "src/b.py"}
    assert min(r.p for r in guess.ranked) >= NEAR_CLAIM, "the case: b is an alternative"
    plan = focused_plan(guess, Files.of(["src/a.py", "src/b.py", "src/c.py"]), Calibration())
    assert plan.claim.paths == {"src/a.py", "src/b.py"}
    assert plan.claim.risk is not None, "judged beside others, not alone"
    assert [n for n, _ in plan.notes] == [Note.GUESSED]


def test_a_short_ticket_claims_its_alternatives_a_commit_subject_does_not() -> None:
    """A ticket of forty-odd words is a ticket as far as its alternatives go (`WIDE_FROM`): it claims each one at
    least `NEAR_CLAIM` likely, as a long one does; a commit subject claims only its likely files."""
    from orchestrator.plan.base import Kind
    from orchestrator.plan.focus import LONG, NEAR_CLAIM, WIDE_FROM, Spread, focus
    from orchestrator.plan.rank import length

    def spread(long: float) -> Spread:
        logits = {"src/a.py": 3.0, "src/b.py": -2.2}
        reasons = {p: [(Kind.SYMBOL, "defines a name the text uses")] for p in logits}
        return Spread(logits, reasons, {}, True, long)

    words = length(" ".join(["word"] * 45))
    assert WIDE_FROM <= words < LONG, "the case: a short ticket"
    short_ticket, subject = focus(spread(words), Calibration()), focus(spread(length("Fix the parser")), Calibration())
    assert dict(subject.risk.near)["src/b.py"] >= NEAR_CLAIM
    assert short_ticket.claim == {"src/a.py", "src/b.py"}
    assert subject.claim == {"src/a.py"}


def test_the_same_text_at_the_same_base_plans_alike_whatever_the_hash_seed(shop: Path) -> None:
    """Admission decisions and their logged figures are reproducible: two processes with different string
    hash seeds plan texts that tie between files (several definers, past changes in equal words) alike, to
    the last digit of every probability and the order of every reason."""
    import json
    import subprocess
    import sys

    texts = [
        "tidy Cart.total and apply_discount for Order.place",
        "fix speed up document tidy round_money monthly_report find_products send_receipt shipping_cost",
        "Stock.reserve raises ValueError('not enough stock left') " + "while the cart and the orders wait " * 40,
    ]
    program = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from orchestrator.plan import record\n"
        "from orchestrator.plan.evidence import local_plan\n"
        "from orchestrator.plan.history import History, mine\n"
        "repo = Path(sys.argv[1]); texts = json.loads(sys.argv[2])\n"
        "head = mine(repo, 'HEAD')[0][-1].sha\n"
        "history = History(mine(repo, head)[0])\n"
        "calibration = record.fit(record.replay(repo, history.changes))\n"
        "print(json.dumps([local_plan(repo, head, t, history, ('CHANGES*',), calibration).to_json() for t in texts]))\n"
    )
    runs = []
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", program, str(shop), json.dumps(texts)],
            capture_output=True, text=True, env=env, timeout=120, check=True,
        )  # fmt: skip
        runs.append(json.loads(out.stdout))
    assert runs[0] == runs[1] == runs[2]
    assert all(plan["ranking"] for plan in runs[0]), "the texts name files: each plan ranks some"


def test_a_short_ticket_whose_claim_is_a_doc_claims_its_most_likely_source_file_too() -> None:
    """A ticket of forty-odd words (`WIDE_FROM`) is fixed in code as a long one is: when all it would claim is a doc
    (a past change in similar words touched it), its most likely source file is claimed beside it, so that another
    ticket working there waits for it (sympy's `Rational calc value error` claimed a guide only, and ran beside every
    other ticket). A commit subject claims what it names."""
    from orchestrator.plan.base import Kind
    from orchestrator.plan.focus import LONG, NEAR_CLAIM, WIDE_FROM, Spread, focus
    from orchestrator.plan.rank import length

    def spread(long: float) -> Spread:
        logits = {"doc/guide.md": -2.5, "src/numbers.py": -3.7, "src/other.py": -5.0}
        reasons = {"doc/guide.md": [(Kind.HISTORY, "touched by a past change in similar words")]}
        reasons["src/numbers.py"] = [(Kind.SYMBOL, "defines Rational")]
        return Spread(logits, reasons, {}, True, long)

    words = length(" ".join(["word"] * 45))
    assert WIDE_FROM <= words < LONG, "the case: a short ticket"
    ticket, subject = focus(spread(words), Calibration()), focus(spread(length("Fix the guide")), Calibration())
    assert dict(subject.risk.near)["src/numbers.py"] < NEAR_CLAIM, "the case: no alternative claims it"
    assert ticket.claim == {"doc/guide.md", "src/numbers.py"}
    assert subject.claim == {"doc/guide.md"}


def test_a_busy_file_only_spill_points_at_stays_in_the_risk_not_the_claim() -> None:
    """A ticket's alternatives (`NEAR_CLAIM`) are where its fix may be: a file some evidence points at (here a co-change
    with its likely file) is claimed, but the directory's busiest file, reached only because it changes often there,
    is no such alternative (django's ORM hub files held apart a third of the pairs of tickets that worked near them):
    it stays in the claim's risk with its chance, for admission to weigh."""
    from orchestrator.plan.base import Kind
    from orchestrator.plan.focus import NEAR_CLAIM, Spread, focus

    logits = {"pkg/fix.py": 1.0, "pkg/other.py": -2.5}
    reasons = {
        "pkg/fix.py": [(Kind.SYMBOL, "defines Thing")],
        "pkg/other.py": [(Kind.COCHANGE, "changed with pkg/fix.py in 3 of its 10 past changes")],
    }
    ticket = focus(Spread(logits, reasons, {}, True, 1.0, {"pkg": (20, [("pkg/hub.py", 4, 0)])}), Calibration())
    near = dict(ticket.risk.near)
    assert near["pkg/hub.py"] >= NEAR_CLAIM, "the case: the hub is likelier than an alternative the ticket claims"
    spill = [(Kind.SPILL, "changes often where the job likely works")]
    assert next(r for r in ticket.ranked if r.path == "pkg/hub.py").reasons == spill, "spill alone points at it"
    assert ticket.claim == {"pkg/fix.py", "pkg/other.py"}
    # What a reason is of is its kind, not its words: a co-change that reads like spill is still evidence.
    reasons["pkg/other.py"] = [(Kind.COCHANGE, "changes often where the job likely works")]
    ticket = focus(Spread(logits, reasons, {}, True, 1.0, {"pkg": (20, [("pkg/hub.py", 4, 0)])}), Calibration())
    assert ticket.claim == {"pkg/fix.py", "pkg/other.py"}


def test_a_short_report_naming_what_one_source_file_alone_defines_runs_beside_others(shop: Path) -> None:
    """`floatformat() crashes on "0.00".` and a line of description names no file, but the one source file defining
    `floatformat` is where the work is, as a file name would say (SWE-bench Verified: four short reports of this kind
    ran apart, each fixed in the file defining what it named, and held 342 pairs apart that did not meet). A title
    alone still runs apart (SWE-bench-Live's: 9 of 26 such titles were fixed elsewhere), and so does a report naming
    nothing one file alone defines."""
    from orchestrator.core.models import Policy
    from orchestrator.plan.base import Note

    body = "\n\nA zero discount raises instead of leaving the price."
    report = plan(shop, "apply_discount() crashes when the percentage is zero" + body)
    assert "src/shop/pricing.py" in report.claim.paths and claims.ROOT not in report.claim.paths
    assert Note.APART not in [code for code, _ in report.notes]
    assert claims.ambiguity(report.claim, Policy(risk=0.08)) is None, "it runs beside others"
    title = plan(shop, "apply_discount() crashes when the percentage is zero")
    vague = plan(shop, "The discount crashes when the percentage is zero" + body)
    assert title.claim.paths == vague.claim.paths == {claims.ROOT}, "a title alone, or naming nothing: apart"


def test_a_short_report_that_names_no_file_runs_apart_and_says_why(shop: Path) -> None:
    """An issue's title (`Cart total is wrong when ...`) says what is wrong, not what to change: planned as a commit
    subject it claimed its one likely file and ran beside others, and 70% of SWE-bench-Live's title pairs whose fixes
    met ran at once. Such a text, naming no file by its path nor a frame, claims the whole repository and says why;
    the same request phrased as a change, or naming its file, is planned as before."""
    from orchestrator.core.models import Policy
    from orchestrator.plan.base import Note

    report = plan(shop, "Cart total is wrong when the cart holds a single item")
    assert report.claim.paths == {claims.ROOT}
    assert claims.ambiguity(report.claim, Policy(risk=0.08)) is not None, "it runs alone in its repository"
    assert [code for code, _ in report.notes] == [Note.APART]
    assert "src/shop/cart.py" in report.notes[0][1], "the note names the file it most likely is in"
    assert report.ranking and report.ranking[0]["path"] == "src/shop/cart.py", "`plan --json` still ranks the files"
    change = plan(shop, "Fix Cart total for a cart holding a single item")
    named = plan(shop, "src/shop/cart.py: the total is wrong when the cart holds a single item")
    by_name = plan(shop, "The total of cart.py is wrong when the cart holds a single item")
    for p in (change, named, by_name):
        assert "src/shop/cart.py" in p.claim.paths and claims.ROOT not in p.claim.paths
        assert Note.APART not in [code for code, _ in p.notes]
        assert claims.ambiguity(p.claim, Policy(risk=0.08)) is None
    body = "The total comes out as zero. " * 12
    long = plan(shop, "Cart total is wrong when the cart holds a single item\n\n" + body)
    assert claims.ROOT not in long.claim.paths, "a ticket with a body is planned as a ticket"
