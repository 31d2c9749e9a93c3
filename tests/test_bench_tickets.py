"""`bench predict --tickets`: tickets planned at their base in a real repository, every pair put to admission."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
from pathlib import Path

import pytest

from orchestrator.core import claims
from orchestrator.core.models import Policy
from orchestrator.core.risk import Escapes, pair_risk
from orchestrator.lab.bench import tickets
from tests.conftest import git
from tests.test_plan_focus import shop  # noqa: F401  (the crafted repository with its 40 past changes)

TICKETS = [
    ("cart-1", "Cart.total is wrong for a cart with a single item\n\nThe total comes out as zero.", "cart"),
    ("cart-2", "Cart.total ignores the second item\n\nA cart of two items totals only the first.", "cart"),
    ("mail-1", "send_receipt sends every receipt twice\n\nCustomers get two mails per order.", "mail"),
    ("search-1", "find_products misses a product whose name has an accent\n\nSearching finds nothing.", "search"),
    ("ship-1", "shipping_cost is negative for a weight of zero\n\nThe cost should never be below zero.", "shipping"),
]


def _ticket_file(tmp_path: Path, base: str) -> Path:
    path = tmp_path / "tickets.jsonl"
    rows = [
        {"instance_id": i, "repo": "acme/shop", "base_commit": base, "problem_statement": text,
         "gold_files": [f"src/shop/{m}.py"], "test_files": [f"tests/test_{m}.py"]}
        for i, text, m in TICKETS
    ]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_every_pair_is_put_to_admission_and_the_estimates_are_shown_against_what_met(
    shop: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Five tickets: ten pairs, one truly overlapping (both fix cart.py) and held apart by their claims; every
    disjoint pair is admitted or held apart; the calibration table holds exactly the pairs whose claims are
    disjoint and estimated, none of which met."""
    base = git(shop, "rev-parse", "HEAD")
    r = tickets.run(_ticket_file(tmp_path, base), shop.parent, None, 0.03, "source")
    row = r["repos"]["acme/shop"]
    assert (row["tickets"], row["pairs"], row["overlapping"]) == (5, 10, 1)
    assert row["fn_pairs"] == 0, "the two cart tickets claim cart.py: never side by side"
    assert 0 <= row["held_apart"] <= 9 and row["over_serialisation"] == round(row["held_apart"] / 9, 4)
    per = {t["id"]: t for t in r["per_ticket"]}
    assert all(f"src/shop/{m}.py" in per[i]["claim"] and per[i]["risk_known"] for i, _, m in TICKETS)
    assert per["cart-1"]["gold_rank"] == 1
    table = r["calibration"]
    assert sum(b["pairs"] for b in table) == 9, "every pair of disjoint, estimated claims, binned once"
    assert all(b["happened"] == 0 and b["from"] <= b["estimated"] < b["to"] for b in table)
    assert r["frontier"] == []


def test_a_disjoint_pair_is_held_apart_exactly_when_its_estimate_is_above_plan_risk(
    shop: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The pure admission decision and the pairs' risks agree pair by pair, at any threshold: a disjoint pair is held
    apart when its chance of meeting (the calibration table's estimate) times its chance of not merging is above
    `plan.risk`."""
    base = git(shop, "rev-parse", "HEAD")
    ts = tickets.load(_ticket_file(tmp_path, base), None)
    tickets.plan_repo(shop, ts)
    points = tickets.estimates(ts, "source")
    assert len(points) == 9 and not any(met for _, met in points)
    scoped = [tickets.scoped(t.claim, "source") for t in ts]
    risks = [
        pair_risk(Escapes.of(b.risk), b.paths, Escapes.of(a.risk), a.paths)
        for a, b in itertools.combinations(scoped, 2)
        if not claims.PathIndex(a.paths).meeting(b.paths)
    ]
    assert sorted(r.meet for r in risks) == sorted(m for m, _ in points), "the table's estimates are the first factor"
    for risk in (0.0001, 0.01, 0.03, 0.2):
        policy = Policy(max_concurrent=8, per_repo=8, mergeable=tickets.MERGEABLE, risk=risk)
        got = tickets.pairs(ts, policy, "source")
        assert got["held_apart"] == sum(r.risk > risk for r in risks), risk


def test_a_base_the_clone_lacks_says_what_to_do(shop: Path, tmp_path: Path) -> None:  # noqa: F811
    with pytest.raises(tickets.TicketsError, match=r"is not in .*clone a fork with its full history"):
        tickets.run(_ticket_file(tmp_path, "0" * 40), shop.parent, None, 0.03, "source")


def test_pairs_run_at_once_whose_fixes_would_not_merge_are_counted_from_the_fixes_in_the_history(
    shop: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Two tickets claim different modules but were both fixed in cart.py, one fix on top of the other (found by
    the pull request number in their messages): admitted at once, their fixes meet and would not merge; a ticket
    whose fix named no request and touched exactly its gold files is found by its files."""
    repo = tmp_path / "shop"
    git(tmp_path, "clone", "-q", str(shop), str(repo))
    cart = (shop / "src/shop/cart.py").read_text()
    for n in range(3):  # past changes that meet: the record merges them
        (repo / "src/shop/cart.py").write_text(cart + f"y = {n}\n")
        git(repo, "commit", "-qam", f"cart: tidy Cart.total {n}")
    base = git(repo, "rev-parse", "HEAD")
    when = int(git(repo, "show", "-s", "--format=%ct", base))

    def commit(path: str, text: str, message: str, after: int) -> None:
        (repo / path).write_text(text)
        at = f"{when + after} +0000"
        env = {**os.environ, "GIT_AUTHOR_DATE": at, "GIT_COMMITTER_DATE": at}
        subprocess.run(["git", "commit", "-qam", message], cwd=repo, check=True, env=env)

    commit("src/shop/cart.py", cart + "x = 1\n", "Fix receipts (#101)", 60)
    commit("src/shop/cart.py", cart + "x = 2\n", "Fix totals (#102)", 120)
    commit("src/shop/search.py", "def find_products(query):\n    return [query]\n", "Search finds accents", 300)
    rows = [
        ("shop__shop-101", "send_receipt sends every receipt twice\n\nCustomers get two mails.", ["src/shop/cart.py"]),
        ("shop__shop-102", TICKETS[0][1], ["src/shop/cart.py"]),
        ("shop__shop-7", TICKETS[3][1], ["src/shop/search.py"]),
    ]
    path = tmp_path / "tickets.jsonl"
    path.write_text(
        "".join(
            json.dumps({"instance_id": i, "repo": "acme/shop", "base_commit": base, "problem_statement": text,
                        "gold_files": gold, "test_files": []}) + "\n"
            for i, text, gold in rows
        )
    )  # fmt: skip
    r = tickets.run(path, tmp_path, None, 0.99, "source")
    fixes = {t["id"]: t["fix"] for t in r["per_ticket"]}
    log = git(repo, "log", "--format=%H %s").splitlines()
    by_subject = {line.split(" ", 1)[1]: line.split(" ", 1)[0] for line in log}
    assert fixes == {
        "shop__shop-101": by_subject["Fix receipts (#101)"],
        "shop__shop-102": by_subject["Fix totals (#102)"],
        "shop__shop-7": by_subject["Search finds accents"],
    }
    o = r["overall"]
    assert r["repos"]["acme/shop"]["record"]["calibration"]["merges"] > 0, "the record merged its past pairs"
    assert (o["fn_pairs"], o["run_and_met_fixes_known"], o["run_and_not_merged"]) == (1, 1, 1)
    assert o["run_and_not_merged_share"] == round(1 / 3, 4) and o["fixes_known"] == 3


def test_a_swe_bench_row_reads_as_the_files_its_fix_and_test_patches_change(tmp_path: Path) -> None:
    """A row of SWE-bench itself (its `patch` and `test_patch`, no file lists) is a ticket whose gold files are
    those its fix's diff changes and whose test files its test diff's; a row with neither says what it needs."""
    fix = (
        "diff --git a/src/shop/cart.py b/src/shop/cart.py\n--- a/src/shop/cart.py\n+++ b/src/shop/cart.py\n"
        "@@ -1 +1 @@\n-a\n+b\n"
        "diff --git a/src/shop/money.py b/src/shop/money.py\nnew file mode 100644\n--- /dev/null\n"
        "+++ b/src/shop/money.py\n@@ -0,0 +1 @@\n+c\n"
    )
    test = "diff --git a/tests/test_cart.py b/tests/test_cart.py\n--- a/tests/test_cart.py\n+++ b/tests/test_cart.py\n"
    row = {"instance_id": "acme__shop-1", "repo": "acme/shop", "base_commit": "0" * 40,
           "problem_statement": "Cart.total is wrong", "patch": fix, "test_patch": test}  # fmt: skip
    path = tmp_path / "swe.jsonl"
    path.write_text(json.dumps(row) + "\n")
    (ticket,) = tickets.load(path)
    assert ticket.gold == {"src/shop/cart.py", "src/shop/money.py"}
    assert ticket.tests == {"tests/test_cart.py"}
    del row["patch"]
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(tickets.TicketsError, match=r"swe.jsonl:1: not a ticket .*gold_files \(or the fix's patch\)"):
        tickets.load(path)


def test_the_bound_is_the_least_over_serialisation_a_claim_threshold_gives_within_the_fn_floor() -> None:
    """What the plans' probabilities allow: a pair scores the most the less likely of its two tickets gives a source
    file both list (claiming every file at least that likely would make their claims meet); the threshold that lets
    at most 5% of the meeting pairs through holds apart the pairs scoring at least it. Tests and docs are left out
    as the gold files leave them out."""
    from orchestrator.lab.bench.tickets import Ticket, bound, pair_scores

    def ticket(name: str, gold: str, probs: dict[str, float]) -> Ticket:
        return Ticket(name, "acme/shop", "HEAD", "", frozenset({gold}), frozenset(), probs=probs)

    ts = [
        ticket("a", "src/x.py", {"src/x.py": 0.6, "src/busy.py": 0.1, "tests/test_x.py": 0.9}),
        ticket("b", "src/x.py", {"src/x.py": 0.3, "src/busy.py": 0.12, "tests/test_x.py": 0.9}),
        ticket("c", "src/y.py", {"src/y.py": 0.8, "src/busy.py": 0.2}),
    ]
    scores = dict(zip(("ab", "ac", "bc"), pair_scores(ts, "source"), strict=True))
    assert scores == {"ab": (0.3, True), "ac": (0.1, False), "bc": (0.12, False)}
    assert pair_scores(ts, "all")[0] == (0.9, True), "the test file counts with --scope all"
    assert bound(list(scores.values())) == {"threshold": 0.3, "fn_concurrency": 0.0, "over_serialisation": 0.0}
    # Twenty meeting pairs: one (5%) may run at once; the second lowest sets the threshold.
    met = [(0.01, True), (0.05, True)] + [(0.5, True)] * 18
    b = bound([*met, (0.04, False), (0.05, False), (0.2, False), (0.6, False)])
    assert b == {"threshold": 0.05, "fn_concurrency": 0.05, "over_serialisation": 0.75}
    assert bound([(0.2, False)])["over_serialisation"] == 0.0, "nothing met: nothing need be held apart"


def test_a_repository_whose_clone_fails_is_reported_failed_and_the_others_still_count(
    shop: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A clone that lacks objects (a partial one) raises GitError while its tickets are planned: that repository
    is reported failed with what to do, and the other repositories' figures (and the overall) still come."""
    import shutil

    import pygit2

    base = git(shop, "rev-parse", "HEAD")
    shutil.copytree(shop, tmp_path / "broken", symlinks=True)
    path = _ticket_file(tmp_path, base)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    extra = [{**r, "instance_id": r["instance_id"] + "-b", "repo": "acme/broken"} for r in rows[:2]]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows + extra))
    real = tickets.plan_repo

    def plan_repo(clone: Path, ts, scope="source", replay=50):
        if clone.name == "broken":
            raise pygit2.GitError("failed to insert entry: invalid object specified - logo.gif")
        return real(clone, ts, scope)

    monkeypatch.setattr(tickets, "plan_repo", plan_repo)
    shutil.copytree(shop, tmp_path / "shop", symlinks=True)
    r = tickets.run(path, tmp_path, None, 0.03, "source")
    assert r["repos"]["acme/broken"]["failed"].startswith("GitError: failed to insert entry")
    assert "fetch it whole" in r["repos"]["acme/broken"]["failed"]
    assert r["repos"]["acme/shop"]["pairs"] == 10 and r["overall"]["pairs"] == 10
    assert r["overall"]["failed"] == ["acme/broken"] and r["overall"]["tickets"] == 5
    tickets.print_report(r)
