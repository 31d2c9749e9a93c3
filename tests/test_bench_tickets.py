"""`bench predict --tickets`: tickets planned at their base in a real repository, every pair put to admission."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.core.models import Policy
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
    assert all(b["met_pairs"] == 0 and b["from"] <= b["estimated"] < b["to"] for b in table)
    assert r["frontier"] == []


def test_a_disjoint_pair_is_held_apart_exactly_when_its_estimate_is_above_plan_risk(
    shop: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The pure admission decision and the calibration table's estimates agree pair by pair, at any threshold."""
    base = git(shop, "rev-parse", "HEAD")
    ts = tickets.load(_ticket_file(tmp_path, base), None)
    tickets.plan_repo(shop, ts)
    points = tickets.estimates(ts, "source")
    assert len(points) == 9 and not any(met for _, met in points)
    for risk in (0.0001, 0.01, 0.03, 0.2):
        policy = Policy(max_concurrent=8, per_repo=8, mergeable=tickets.MERGEABLE, risk=risk)
        got = tickets.pairs(ts, policy, "source")
        assert got["held_apart"] == sum(r > risk for r, _ in points), risk


def test_a_base_the_clone_lacks_says_what_to_do(shop: Path, tmp_path: Path) -> None:  # noqa: F811
    with pytest.raises(tickets.TicketsError, match=r"is not in .*clone a fork with its full history"):
        tickets.run(_ticket_file(tmp_path, "0" * 40), shop.parent, None, 0.03, "source")
