"""`bench predict` replays a history: each change planned on its parent, compared with what it touched."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.models import Policy
from orchestrator.git import repos
from orchestrator.lab.bench import predict
from orchestrator.plan import record
from orchestrator.plan.accuracy import Settled
from orchestrator.plan.history import Change, mine
from orchestrator.plan.score import Calibration
from tests.harness import cli

pytestmark = pytest.mark.timeout(120)


def test_history_replay_reports_pairs_admitted_on_risk(tmp_path: Path) -> None:
    """A touch-pattern history is synthesised into a repo and replayed, its first third the record the
    risk is estimated from: changes to one workflow (they all overlap) never run side by side, while
    changes to files of their own do, and none of those would have failed to merge; the record's own
    workflow changes, which met, would not have merged (each rewrites the line the one before wrote). The claims as
    walls: every pair whose claims meet met, on the workflow (the hub the report lists)."""
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
    walls = report["claim_pairs"]  # the claims as walls: the workflow's changes meet on it, and each really met
    assert walls["claims_meet"] == walls["really_met"] == walls["met"] == walls["claims_met"] > 100
    assert walls["precision"] == walls["recall"] == 1.0
    assert walls["hubs"] == [[".github/workflows/ci.yaml", walls["claims_meet"], walls["claims_meet"]]]


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


def test_the_replay_keeps_its_record_current_as_the_daemon_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replayed changes are planned as the daemon would plan them as jobs: the record is built again every
    `rebuild` changes from the changes before them only, and in between refitted on the pairs that would have run
    side by side once both landed; `--rebuild 0` builds it once, from the changes before the range."""
    rows = []
    for n in range(60):
        rows.append({"sha": f"{n}", "subject": f"bump ci workflow {n}", "files": [[".github/workflows/ci.yaml", 1, 1]]})
        rows.append({"sha": f"x{n}", "subject": f"tweak parser {n}", "files": [[f"src/mod{n}.py", 3, 0]]})
    history = tmp_path / "h.jsonl"
    history.write_text("".join(json.dumps(r) + "\n" for r in rows))
    repo = tmp_path / "repo"
    predict.synthesise(history, repo, None)
    changes, _ = mine(repo, repos.resolve_rev(repo, "HEAD"), None, 1000)
    built: list[int] = []
    refits: list[int] = []
    build, refit = record.build, record.refit

    def counting_build(repo: Path, past: Sequence[Change], *args: Any, **kwargs: Any) -> Calibration | None:
        built.append(len(past))
        return build(repo, past, *args, **kwargs)

    def counting_refit(calibration: Calibration, outcomes: Sequence[Settled]) -> Calibration:
        refits.append(len(outcomes))
        return refit(calibration, outcomes)

    monkeypatch.setattr(record, "build", counting_build)
    monkeypatch.setattr(record, "refit", counting_refit)
    out = predict.replay(repo, changes, 40, Policy(), rebuild=25, risk=0.2)
    assert len(out) == 80 and built == [40, 65, 90, 115]
    assert max(refits) > 0 and refits[-1] > 0  # pairs of src/modN.py settled and refit it
    built.clear()
    predict.replay(repo, changes, 40, Policy(), rebuild=0, risk=0.2)
    assert built == [40]
