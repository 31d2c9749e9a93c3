"""`orchestrator bench jobs`: replay a queue of real changes through the real daemon under several policies.

Each (policy, predictor) row runs on a fresh repository (see `replayrepo`: synthesised from a touch
pattern, or a real repository's range), with `replay` runner jobs that wait for the change's duration
(from its size, scaled) and then apply its recorded commit. The daemon runs in burst mode behind its real
socket. Rows, side by side in one run:

- `one-per-repo`  the seed's rule: one job at a time per repository
- `claims`        path claims from each `--predictor`: `declared` (top directories, as a person names them
                  with --path), `local` (no --path: the daemon's own planner claims from the change's
                  subject with local evidence), `oracle` (the real files)
- `oracle`        path claims that are exactly the files each change touched
- `unbounded`     no path constraint at all (every claim unique): overlaps, conflicts and redone work show

Per row: makespan, its ratio to one-per-repo, to the ideal (a makespan no schedule of the queue can beat) and
to the list schedule (list scheduling with the same durations, slots and claims, no overtaking on overlap, zero
overhead: the gap is the job plane's own overhead; see `schedule`), concurrency reached, queue wait,
overlaps seen while running, pairs that ran side by side and really touched a common file (`met`: what
`plan.risk` bounds; they cost nothing when their landings merge cleanly), landing conflicts, re-runs of jobs
that changed nothing on a base without an earlier-queued job's change (`rechecks`), redone attempts, lost
changes, over-serialised pairs (claims that overlap where the real files do not), and the overhead per job: slot
free → start, runner exit → landed, and landing hold time (p50/p95).
"""

from __future__ import annotations

import itertools
import json
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from orchestrator.config import PlanConfig
from orchestrator.core import claims
from orchestrator.core.models import CHANGELOGS, Claim, Policy
from orchestrator.core.models import ENDED as TERMINAL_STATES
from orchestrator.core.risk import Escapes, pair_risk
from orchestrator.lab.bench import history as hist
from orchestrator.lab.bench import replayrepo
from orchestrator.lab.bench import schedule as sched
from orchestrator.lab.bench.daemon import BenchDaemon, BenchError, epoch, machine
from orchestrator.lab.bench.report import plot, print_table, row_line

POLICIES = ("one-per-repo", "claims", "oracle", "unbounded")
PREDICTORS = ("declared", "local", "oracle")
MERGEABLE = CHANGELOGS
MIN_CONFIDENCE = 0.5
RISK = PlanConfig.risk
"""`plan.risk` of the rows' daemons (the default)."""
TERMINAL = tuple(sorted(str(s) for s in TERMINAL_STATES))
STALL_S = 180.0
"""A row with no job ending for this long (beyond its longest job) is stuck: it fails with its log's path."""

MakeRepo = Callable[[Path], replayrepo.ReplayRepo]
"""Builds a fresh replay repository at the given path (one per row)."""


@dataclass(frozen=True)
class Row:
    policy: str
    predictor: str
    risk: float = RISK
    """`plan.risk` of its daemon."""

    @property
    def label(self) -> str:
        """The predictor, with its `plan.risk` when not the default (`local@0.1`)."""
        return self.predictor if self.risk == RISK else f"{self.predictor}@{self.risk:g}"

    @property
    def name(self) -> str:
        return self.policy if self.policy != "claims" else f"claims/{self.label}"


def _rows(policies: list[str], predictors: list[str], risks: Sequence[float] = (RISK,)) -> list[Row]:
    out: list[Row] = []
    for p in policies:
        if p == "claims":
            out += [Row(p, pred, r) for pred in predictors for r in (risks if pred == "local" else (RISK,))]
        else:
            out.append(Row(p, "oracle" if p in ("oracle", "one-per-repo") else "none"))
    return out


def _declared(row: Row, change: hist.Change) -> list[str]:
    if row.policy == "unbounded":
        return [f".bench/unbounded-{change.index}"]  # unique: admission sees no overlap at all
    return hist.predict(change, row.predictor)


def _config(slots: int, row: Row) -> str:
    per_repo = 1 if row.policy == "one-per-repo" else slots
    return (
        "[jobs]\n"
        f"max_concurrent = {slots}\nper_repo = {per_repo}\nwarm_worktrees = {slots}\n"
        f"mergeable = {json.dumps(list(MERGEABLE))}\nretry_on_conflict = true\nmax_attempts = 6\n"
        f"min_confidence = {MIN_CONFIDENCE}\n"
        'sandbox = "none"\n'
        # Jobs without --path (the `local` predictor) are claimed by local evidence only: no model here.
        f'[plan]\nplanner = "local"\nrisk = {row.risk}\n'
    )


def _claims_of(row: Row, changes: list[hist.Change], jobs: list[dict]) -> list[frozenset[str] | None]:
    """The claims the row's jobs ran under, as the ideal schedule reads them (None: the job runs alone)."""
    if row.policy == "one-per-repo":
        return [None] * len(changes)  # per_repo = 1: every job runs alone in the repo
    if row.predictor == "local":
        out: list[frozenset[str] | None] = []
        policy = Policy(min_confidence=MIN_CONFIDENCE, mergeable=MERGEABLE, risk=row.risk)
        for j in jobs:
            c = j["claim"]
            ambiguous = claims.ambiguity(Claim.from_json(c), policy) is not None
            out.append(None if ambiguous else sched.counted(c["paths"], MERGEABLE))
        return out
    return [sched.counted(_declared(row, c), MERGEABLE) for c in changes]


def _fixed(row: Row) -> bool:
    """The row's claims are declared before the queue runs and only grow (no re-plan changes them)."""
    return row.policy in ("one-per-repo", "oracle") or (row.policy == "claims" and row.predictor != "local")


def _risky_pairs(row: Row, jobs: list[dict], claims_: list[frozenset[str] | None]) -> list[tuple[int, int]]:
    """The pairs of local-evidence jobs with disjoint claims that admission keeps apart on their risk."""
    if row.predictor != "local":
        return []
    escapes = [Escapes.of(Claim.from_json(j["claim"]).risk) for j in jobs]
    out = []
    for i, j in itertools.combinations(range(len(jobs)), 2):
        a, b = claims_[i], claims_[j]
        if a is not None and b is not None and pair_risk(escapes[j], b, escapes[i], a).risk > row.risk:
            out.append((i, j))
    return out


def run_row(
    row: Row,
    changes: list[hist.Change],
    make: MakeRepo,
    slots: int,
    scale: float,
    work: Path,
    progress: Any,
    write_at: float = 1.0,
) -> dict:
    """Replay `changes` under one policy on a fresh repository; the row's figures. `write_at`: the share of each
    job's duration after which its change is in its worktree (it runs on for the rest)."""
    root = work / row.name.replace("/", "-")
    root.mkdir(parents=True)
    replay = make(root / "repo")
    ends = replayrepo.newest(replay)
    durations = hist.durations(changes, scale)
    task = progress.add_task(row.name, total=len(changes)) if progress else None
    with BenchDaemon(root / "home", _config(slots, row)) as d:
        # The queue goes in paused and is released once every job is planned: the makespan is the schedule's,
        # not the first plan's one-time cost in a repository (its history mined, its record replayed).
        d.client.pause(str(replay.path))
        t_plan = time.time()
        ids = [
            d.client.enqueue(
                repo=str(replay.path),
                text=replayrepo.job_text(
                    c,
                    replay.commits[c.index],
                    durations[c.index] * write_at,
                    durations[c.index] * (1 - write_at),
                    end=ends[c.index],
                ),
                paths=_declared(row, c),
                runner="replay",
            )["id"]
            for c in changes
        ]
        _planned(d, ids, STALL_S + 600)
        planning = time.time() - t_plan
        t0 = time.time()
        d.client.resume(str(replay.path))
        done, moved = 0, time.monotonic()
        while done < len(ids):
            time.sleep(1.0)  # the makespan comes from the daemon's clock; a slow poll spares its loop
            now = len(d.client.jobs(",".join(TERMINAL)))
            if now != done:
                done, moved = now, time.monotonic()
                if progress:
                    progress.update(task, completed=done)
            elif time.monotonic() - moved > STALL_S + max(durations):
                raise BenchError(f"{row.name}: no job ended for {STALL_S:.0f} s ({done}/{len(ids)}); see {d.log_path}")
        jobs = [d.client.job(i) for i in ids]
        clock = _Clock.of(d)
    out = _figures(row, changes, jobs, clock, durations, slots, t0, replay)
    out["planning_s"] = round(planning, 2)
    return out


def _planned(d: BenchDaemon, ids: list[int], limit: float) -> None:
    """Wait until every job has left queued and planning (they wait paused for admission)."""
    deadline = time.monotonic() + limit
    while True:
        waiting = len(d.client.jobs("queued,planning"))
        if not waiting:
            return
        if time.monotonic() > deadline:
            raise BenchError(f"{waiting} of {len(ids)} jobs still planning after {limit:.0f} s; see {d.log_path}")
        time.sleep(0.5)


@dataclass
class _Clock:
    """What the daemon's log says: when each job's work began and ended (every attempt), landing holds."""

    starts: dict[int, list[float]]
    exits: dict[int, list[float]]
    holds: list[float]
    waits: dict[int, dict[str, set[int]]] = field(default_factory=dict)
    """Per job, each reason admission kept it waiting for (its code, in the order first met), with the jobs it
    waited on; the queue's pause before the clock starts left out."""

    @classmethod
    def of(cls, d: BenchDaemon) -> _Clock:
        clock = cls({}, {}, [])
        landing: dict[int, float] = {}
        names = ("replay.started", "replay.applied", "landing.started", "landing.landed", "landing.noop",
                 "landing.conflict", "admission.deferred")  # fmt: skip
        for rec in d.log_events(*names):
            job, ev = int(rec.get("job_id") or 0), rec["event"]
            if ev == "admission.deferred":
                if rec.get("reason") != "Paused":
                    blocking = {int(b) for b in rec.get("blocking") or ()}
                    clock.waits.setdefault(job, {}).setdefault(str(rec.get("reason")), set()).update(blocking)
            elif ev == "replay.started":
                clock.starts.setdefault(job, []).append(rec["ts"])
            elif ev == "replay.applied":
                clock.exits.setdefault(job, []).append(rec["ts"])
            elif ev == "landing.started":
                landing[job] = rec["ts"]
            elif job in landing:
                clock.holds.append(rec["ts"] - landing.pop(job))
        return clock


def _figures(
    row: Row,
    changes: list[hist.Change],
    jobs: list[dict],
    clock: _Clock,
    durations: list[float],
    slots: int,
    t0: float,
    replay: replayrepo.ReplayRepo,
) -> dict:
    landed_at = [epoch(j["finished_at"]) if j["state"] == "landed" else 0.0 for j in jobs]
    runs: list[sched.Interval] = []
    per_job: list[list[sched.Interval]] = []
    waits, starts, created, releases = [], [], [], [t0]
    overlap_pairs: set[tuple[int, int]] = set()
    conflicts = 0
    for j in jobs:
        per_job.append(sched.runs_of(j["events"]))
        runs += per_job[-1]
        releases += [iv.end for iv in per_job[-1]]
        if per_job[-1]:
            waits.append(per_job[-1][0].start - epoch(j["created_at"]))
        for e in j["events"]:
            if e["kind"] == "overlap":
                overlap_pairs.add((min(j["id"], e["other"]), max(j["id"], e["other"])))
            conflicts += e["kind"] in ("requeued", "conflicted")
        for s in clock.starts.get(j["id"], []):
            starts.append(s)
            created.append(epoch(j["created_at"]))
    exit_to_land = [
        landed - clock.exits[j["id"]][-1] for j, landed in zip(jobs, landed_at, strict=True)
        if landed and clock.exits.get(j["id"])
    ]  # fmt: skip
    releases += [t for t in landed_at if t]
    slot_to_start = sched.start_latency(starts, created, releases)
    real = [sched.counted(c.files, MERGEABLE) for c in changes]
    claims_ = _claims_of(row, changes, jobs)
    apart = _risky_pairs(row, jobs, claims_)
    makespan = max(landed_at) - t0 if any(landed_at) else 0.0
    unlandable: list[int] = []
    if replay.start:  # a real repository: main must be the landed changes applied in landing order
        lost, broken, reordered = replayrepo.serial(replay, changes, landed_at, MERGEABLE)
        unlandable = replayrepo.unreplayable(replay, changes, MERGEABLE)
        lost = [i for i in lost if i not in unlandable]
    else:
        (lost, reordered), broken = replayrepo.lost(replay, changes, landed_at, MERGEABLE), []
    width = 1 if row.policy == "one-per-repo" else slots
    ideal = sched.lower_bound(durations, width, claims_ if _fixed(row) else None)
    listed = sched.list_makespan(durations, claims_, width, apart)
    out = {
        "policy": row.policy,
        "predictor": row.label,
        "plan_risk": row.risk,
        "slots": slots,
        "jobs": len(jobs),
        "makespan_s": round(makespan, 2),
        "ideal_s": round(ideal, 2),
        "ratio_ideal": round(makespan / ideal, 3) if ideal else None,
        "list_s": round(listed, 2),
        "ratio_list": round(makespan / listed, 3) if listed else None,
        "max_concurrency": sched.max_concurrency(runs),
        "wait_p50_s": sched.fig(sched.pct(waits, 0.5), 2),
        "wait_p95_s": sched.fig(sched.pct(waits, 0.95), 2),
        "overlaps": len(overlap_pairs),
        "met_side_by_side": sched.met_side_by_side(per_job, real),
        "conflicts": conflicts,
        "stopped": sum(e["kind"] == "requeued" and "ran_s" in e for j in jobs for e in j["events"]),
        "rechecks": sum(e["kind"] == "recheck" for j in jobs for e in j["events"]),
        "saved_s": round(_saved(jobs, durations), 2),
        "redone": sum(j["attempts"] for j in jobs),
        "thrown_s": round(sched.thrown_away(per_job, [bool(t) for t in landed_at]), 2),
        "lost": len(lost),
        "unreplayable": len(unlandable),
        "broken": len(broken),
        "broken_files": broken,
        "reordered_pairs": reordered,
        "over_serialized_pairs": sched.over_serialized_pairs(claims_, real, apart),
        **_claim_quality(row, claims_, real),
    }
    for key, values in (
        ("slot_to_start", slot_to_start),
        ("exit_to_landed", exit_to_land),
        ("landing_hold", clock.holds),
    ):
        out[f"{key}_p50_s"] = sched.fig(sched.pct(values, 0.5), 3)
        out[f"{key}_p95_s"] = sched.fig(sched.pct(values, 0.95), 3)
    out["per_job"] = _per_job(changes, jobs, per_job, real, clock, durations, t0)
    return out


def _per_job(
    changes: list[hist.Change],
    jobs: list[dict],
    runs: list[list[sched.Interval]],
    real: list[frozenset[str]],
    clock: _Clock,
    durations: list[float],
    t0: float,
) -> list[dict[str, Any]]:
    """Each job of a row: how it ended, its runs, whom it ran beside (none: it ran alone), which of those really
    touched a common file with it (met), its landing conflicts, and what it waited for before its first start."""
    near, meets = sched.beside(runs), sched.met(runs, real)
    ids = [j["id"] for j in jobs]
    out = []
    for n, (c, j) in enumerate(zip(changes, jobs, strict=True)):
        admitted = [e["at"] for e in j["events"] if e["kind"] == "admitted"]
        out.append(
            {
                "job": j["id"],
                "sha": c.sha,
                "subject": c.subject,
                "state": j["state"],
                "why": None if j["state"] == "landed" else f"{j.get('code') or ''} {j.get('reason') or ''}".strip(),
                "runs": len(runs[n]),
                "duration_s": durations[n],
                "wait_s": round(admitted[0] - t0, 2) if admitted else None,
                "beside": sorted(ids[k] for k in near[n]),
                "met": sorted(ids[k] for k in meets[n]),
                "conflicts": sum(e["kind"] in ("requeued", "conflicted") for e in j["events"]),
                "rechecks": sum(e["kind"] == "recheck" for e in j["events"]),
                "thrown_s": round(sched.thrown_away([runs[n]], [j["state"] == "landed"]), 2),
                "waited_for": {reason: sorted(on) for reason, on in clock.waits.get(j["id"], {}).items()},
            }
        )
    return out


def _saved(jobs: list[dict], durations: list[float]) -> float:
    """Job-seconds the stops on a real conflict saved: each stopped attempt would have run its whole duration and
    then conflicted at its landing (the rest of its duration, past what it ran, was not spent)."""
    return sum(
        max(0.0, d - e["ran_s"])
        for j, d in zip(jobs, durations, strict=True)
        for e in j["events"]
        if e["kind"] == "requeued" and "ran_s" in e
    )


def _claim_quality(
    row: Row, claims_: Sequence[frozenset[str] | None], real: Sequence[frozenset[str] | None]
) -> dict[str, Any]:
    """For path-claim rows: jobs whose claim let them run beside others, and of those, claims that did not
    cover every file the change really touched (a directory covers the files under it)."""
    if row.policy not in ("claims", "oracle"):
        return {"confident_claims": None, "missed_claims": None}
    missed = 0
    for c, r in zip(claims_, real, strict=True):
        if c is not None and r is not None:
            index = claims.PathIndex(c)
            missed += not all(index.meets(p) for p in r)
    return {"confident_claims": sum(c is not None for c in claims_), "missed_claims": missed}


def _ratios(rows: list[dict]) -> None:
    base = next((r["makespan_s"] for r in rows if r["policy"] == "one-per-repo" and not r.get("failed")), None)
    for r in rows:
        if not r.get("failed"):
            r["ratio_one_per_repo"] = round(r["makespan_s"] / base, 3) if base else None


@click.command("jobs")
@click.option("--history", "history_file", type=click.Path(path_type=Path), help="A touch-pattern history (JSONL).")
@click.option("--repo", type=click.Path(path_type=Path), help="Replay a range of this repository's own commits ...")
@click.option("--range", "rev_range", help="... this range of its first-parent history (A..B).")
@click.option("--last", type=int, default=30, show_default=True, help="Replay the last N changes of the history.")
@click.option("--slots", type=int, default=4, show_default=True)
@click.option("--policy", default=",".join(POLICIES), show_default=True)
@click.option(
    "--predictor", default="declared,local", show_default=True, help="Predictors for the claims policy (or oracle)."
)
@click.option(
    "--scale", type=float, default=0.3, show_default=True, help="Seconds per unit of change size (1 + log2(1 + lines))."
)
@click.option(
    "--risk",
    "risks",
    default=str(RISK),
    show_default=True,
    help="plan.risk for the claims/local rows (comma-separated: one row each).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON on stdout.")
@click.option("--plot", "plot_file", type=click.Path(path_type=Path), help="Write a PNG chart (needs matplotlib).")
@click.option("--keep", type=click.Path(path_type=Path), help="Keep the repositories and daemon logs here.")
@click.option(
    "--write-at",
    type=float,
    default=1.0,
    show_default=True,
    help="Share of a job's duration after which its change is in its worktree (it runs on for the rest): below 1, "
    "jobs side by side meet while they run, where a real conflict stops the later one.",
)
@click.option(
    "--per-job", is_flag=True, help="Also print, per row, each job: beside whom it ran, met, conflicts, waits."
)
def main(
    history_file: Path | None,
    repo: Path | None,
    rev_range: str | None,
    last: int,
    slots: int,
    policy: str,
    predictor: str,
    scale: float,
    risks: str,
    as_json: bool,
    plot_file: Path | None,
    keep: Path | None,
    write_at: float,
    per_job: bool,
) -> None:
    """Replay a queue of real changes through the real daemon under several policies, beside the ideal schedule."""
    policies = [p.strip() for p in policy.split(",") if p.strip()]
    predictors = [p.strip() for p in predictor.split(",") if p.strip()]
    bad = [p for p in policies if p not in POLICIES] + [p for p in predictors if p not in PREDICTORS]
    try:
        risk_values = [float(r) for r in risks.split(",") if r.strip()]
    except ValueError:
        risk_values = []
    if (
        bad or slots < 1 or last < 1 or scale <= 0 or not risk_values or not all(0 <= r < 1 for r in risk_values)
        or not 0 < write_at <= 1
    ):  # fmt: skip
        raise click.UsageError(
            f"use --policy from {', '.join(POLICIES)}, --predictor from {', '.join(PREDICTORS)}, "
            "--slots and --last of 1 or more, --scale above 0, --risk probabilities from 0 up to 1 (0.03,0.1), "
            "--write-at above 0 and at most 1" + (f" (got {', '.join(bad)})" if bad else "")
        )
    if (repo is None) != (rev_range is None) or (repo is not None and history_file is not None):
        raise click.UsageError("pass --history FILE, or --repo PATH with --range A..B (or neither: the bundled one)")
    try:
        if repo is not None and rev_range is not None:
            recorded = hist.from_repo(repo, rev_range)
        else:
            recorded = hist.from_file(history_file or hist.bundled())
    except hist.HistoryError as e:
        raise click.UsageError(str(e)) from None
    past = recorded[:-last]
    changes = [hist.Change(n, c.sha, c.subject, c.files, c.lines) for n, c in enumerate(recorded[-last:])]
    if repo is not None:
        source = repo
        try:
            replayrepo.check_objects(source, changes)
        except hist.HistoryError as e:
            raise click.UsageError(str(e)) from None

        def make(root: Path) -> replayrepo.ReplayRepo:
            return replayrepo.clone(source, changes, root)
    else:
        template: list[replayrepo.ReplayRepo] = []

        def make(root: Path) -> replayrepo.ReplayRepo:
            if not template:
                template.append(replayrepo.synthesise(past, changes, work / "template", MERGEABLE))
            return replayrepo.copy(template[0], root)

    if plot_file is not None:
        plot.check()
    work = Path(tempfile.mkdtemp(prefix="orchestrator-bench-")) if keep is None else keep
    work.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    with Progress(
        TextColumn("{task.description:<16}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, transient=as_json,
    ) as progress:  # fmt: skip
        for row in _rows(policies, predictors, risk_values):
            rows.append(_one_row(row, changes, make, slots, scale, work, progress, write_at))
            # Each row as it finishes (on stderr, stdout stays the tables or the JSON), and kept in the work
            # dir: a run cut short still shows the rows it finished.
            progress.console.print(row_line(rows[-1]), highlight=False)
            with (work / "rows.jsonl").open("a") as f:
                f.write(json.dumps(rows[-1]) + "\n")
    failed = [r for r in rows if r.get("failed")]
    if keep is None and not failed:
        shutil.rmtree(work, ignore_errors=True)
    _ratios(rows)
    info = {
        "machine": machine(),
        "history": str(history_file or (repo or hist.bundled())),
        "changes": len(changes),
        "write_at": write_at,
    }
    if as_json:
        click.echo(json.dumps({**info, "rows": rows}, indent=2))
    else:
        print_table(rows, info, per_job=per_job)
    if plot_file is not None:
        plot.write([r for r in rows if not r.get("failed")], plot_file, info)
        click.echo(f"plot written to {plot_file}", err=True)
    if failed:
        names = ", ".join(f"{r['policy']}/{r['predictor']}" for r in failed)
        click.echo(
            f"orchestrator bench jobs: {len(failed)} row(s) failed ({names}); repositories and logs kept in {work}",
            err=True,
        )
        sys.exit(1)


def _one_row(
    row: Row,
    changes: list[hist.Change],
    make: MakeRepo,
    slots: int,
    scale: float,
    work: Path,
    progress: Any,
    write_at: float,
) -> dict:
    """A row's figures, or the row marked failed with why: one row's failure (a stuck daemon, a replay the
    lost check cannot read) must not take the rows before and after it down with it."""
    try:
        return run_row(row, changes, make, slots, scale, work, progress, write_at)
    except (BenchError, hist.HistoryError) as e:
        why = str(e)
    except Exception as e:  # noqa: BLE001 - any failure of one row is reported as that row's, with its type
        why = f"{type(e).__name__}: {e}"
        traceback.print_exc()
    return {"policy": row.policy, "predictor": row.label, "plan_risk": row.risk, "slots": slots, "failed": why}
