"""`bench predict` replays a history: each change planned on its parent, compared with what it touched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.harness import cli

pytestmark = pytest.mark.timeout(120)


def test_history_replay_reports_pairs_admitted_on_risk(tmp_path: Path) -> None:
    """A touch-pattern history is synthesised into a repo and replayed, its first third the record the
    risk is estimated from: changes to one workflow (they all overlap) never run side by side, while
    changes to files of their own do, and none of those would have failed to merge; the record's own
    workflow changes, which met, would not have merged (each rewrites the line the one before wrote)."""
    rows = []
    for n in range(90):
        rows.append({"sha": f"{n}", "subject": f"bump ci workflow {n}", "files": [[".github/workflows/ci.yaml", 1, 1]]})
        rows.append({"sha": f"x{n}", "subject": f"tweak parser {n}", "files": [[f"src/mod{n}.py", 3, 0]]})
    history = tmp_path / "h.jsonl"
    history.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = cli("bench", "predict", "--history", str(history), "--risk", "0.2", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["replayed"] == 120
    risk = report["risk"]
    assert risk["plan_risk"] == 0.2 and risk["concurrent"] >= 100 and risk["really_overlapped"] == 0
    conflicts = report["conflicts"]
    assert conflicts["plan_risk"] == 0.2 and conflicts["pairs"] >= 100 and conflicts["met"] == 0
    assert conflicts["admitted"] >= 100 and conflicts["admitted_not_merged"] == 0 and conflicts["holds"]
    assert sum(b["pairs"] for b in conflicts["calibration"]) == conflicts["pairs"]


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    """Neither --repo nor --history, or a repo that is not one: exit 2 with a message."""
    out = cli("bench", "predict")
    assert out.returncode == 2 and "--repo" in out.stderr
    out = cli("bench", "predict", "--repo", str(tmp_path))
    assert out.returncode == 2 and "not inside a git repository" in out.stderr


def test_history_alone_replays_the_shipped_history() -> None:
    """`--history` without a file replays the history that ships with the package, and says what a history
    without file contents cannot measure."""
    out = cli("bench", "predict", "--history", "--limit", "30", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["repo"].endswith("flask-history.jsonl (synthesised)") and report["replayed"] == 30
    assert any("definitions" in m for m in report["synthesised"]["not_measured"])
