"""Commands about one job: `enqueue`, `show`, `why`, `logs`, `plan`."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import click

from orchestrator import requests as rq
from orchestrator.client import Unreachable
from orchestrator.commands import fit, term
from orchestrator.commands.common import (
    FAILED,
    FAILED_STATES,
    REJECTED,
    UNCHANGED,
    api_call,
    client,
    emit,
    err,
    json_option,
    tell,
)
from orchestrator.core import claims, models

OPEN_STATES = ",".join(sorted(models.OPEN))


class ArgvCommand(click.Command):
    """A command whose words after `--` are kept apart, exactly, in `ctx.meta["argv"]`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            cut = args.index("--")
            ctx.meta["argv"] = args[cut + 1 :]
            args = args[:cut]
        return super().parse_args(ctx, args)


def job_words(ctx: click.Context, text: tuple[str, ...], *, join: bool = False) -> dict[str, Any]:
    """The job as the API takes it: `{"text": ...}` (one argument) or `{"argv": [...]}` (after `--`).

    `-- cmd arg "a b"` keeps the argv exactly; `-- "one text"` (a single word) is that text. With `join`
    (for `plan`, which never runs it) several words are simply the text.
    """
    argv = ctx.meta.get("argv")
    if argv is not None and text:
        raise click.UsageError("give the job either as one TEXT argument or as an argv after --, not both")
    words = list(argv if argv is not None else text)
    if not words:
        raise click.UsageError('say what the job does: enqueue "TEXT", or enqueue -- CMD ARG...')
    if len(words) == 1:
        return {"text": words[0]}
    if argv is not None and not join:
        return {"argv": words}
    if join:
        return {"text": shlex.join(words) if argv is not None else " ".join(words)}
    raise click.UsageError(
        f"the job text is one argument, got {len(words)} words: quote it "
        f'(enqueue "{" ".join(words)}") or give an exact argv after -- (enqueue -- {" ".join(words)})'
    )


@click.command(cls=ArgvCommand)
@click.option(
    "--repo",
    "repo",
    type=click.Path(path_type=Path),
    default=".",
    show_default=True,
    help="The repository the job works on.",
)
@click.option("--branch", help="Target branch (default: the branch the repository has checked out).")
@click.option("--path", "paths_", multiple=True, help="A path the job will touch (repo-relative; dirs end with /).")
@click.option("--runner", help="Runner name (default: shell for a command; a text in words goes to [jobs] agent).")
@click.option("--priority", type=int, help="Higher runs first (default 0).")
@click.option("--before", type=int, help="Queue it just before this waiting job (with that job's priority).")
@click.option("--after", type=int, multiple=True, help="Start only after this job has landed.")
@click.option("--label", "labels", multiple=True, help="Team mode: run only on a node that has this label.")
@click.option(
    "--land",
    type=click.Choice(["auto", "review"]),
    help="auto: land when finished; review: wait `ready` for `orchestrator land ID` (default from config).",
)
@json_option
@click.argument("text", nargs=-1)
@click.pass_context
@api_call
def enqueue(
    ctx: click.Context,
    repo: Path,
    branch: str | None,
    paths_: tuple[str, ...],
    runner: str | None,
    priority: int | None,
    before: int | None,
    after: tuple[int, ...],
    labels: tuple[str, ...],
    land: str | None,
    as_json: bool,
    text: tuple[str, ...],
) -> None:
    """Queue a job; prints its id.

    The job is one TEXT argument (for the shell runner, a shell command), or an exact argv after `--`
    (`enqueue -- printf '%s\\n' "a b"`), stored as a list and run without a shell.
    """
    if before is not None and priority is not None:
        raise click.UsageError(f"--before {before} gives the job that job's priority: leave out --priority")
    where = repo.expanduser().resolve()
    request = rq.Enqueue(
        repo=str(where), **job_words(ctx, text), branch=branch or None, paths=paths_,
        runner=runner or None, priority=priority, before=before, after=after, labels=labels, land=land or None,
        author=git_person(where),
    )  # fmt: skip
    c = client()
    job = c.enqueue(request)
    if as_json:
        emit(job)
        return
    click.echo(job["id"])
    term.echo(f"job {job['id']} queued on {job['branch']} of {job['repo']}", err=True)
    chosen = "" if runner or job["runner"] in ("shell", "replay") else " (the agent [jobs] names for a text in words)"
    term.echo(f"  runs with {job['runner']}{chosen}", err=True)
    term.echo(f"  {outlook(job, c.jobs(','.join(sorted(models.OPEN))))}", err=True)
    paused = [scope for scope, control in c.controls().items() if control["paused"] and scope in ("*", job["repo"])]
    if paused:
        scope = "the daemon" if "*" in paused else "its repository"
        term.echo(f"  but nothing new starts while {scope} is paused: `orchestrator resume` lifts it", err=True)


def git_person(repo: Path) -> str:
    """You, as git names the author of a commit you make in `repo` (`Name <email>`), or "" when git cannot say:
    your jobs' commits are authored so when the daemon has no git identity of its own."""
    try:
        out = subprocess.run(["git", "-C", str(repo), "var", "GIT_AUTHOR_IDENT"], capture_output=True, text=True,
                             timeout=10, stdin=subprocess.DEVNULL)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return ""
    ident = out.stdout.strip().rpartition(">")[0]
    return f"{ident}>" if out.returncode == 0 and ident else ""


def outlook(job: dict[str, Any], others: list[dict[str, Any]]) -> str:
    """What a job just queued will meet, from what is open in its repository now: alone or beside whom."""
    mine = job["claim"]["paths"]
    peers = [o for o in others if o["id"] != job["id"] and o["repo"] == job["repo"] and o["branch"] == job["branch"]]
    if not mine:
        return (
            "no paths given: its claim is predicted from its text before it starts; one that names nothing of the "
            f"repository runs alone (`orchestrator why {job['id']}` says what it waits for)"
        )
    held = {}
    for o in peers:
        met = claims.overlapping(mine, [*o["claim"]["paths"], *(o.get("actual") or [])])
        if met and (o["id"] < job["id"] or o["state"] in ("running", "landing", "ready")):
            held[o["id"]] = sorted(met)
    if held:
        waits = "; ".join(f"job {i} ({claim_paths(ps[:3])}{', ...' if len(ps) > 3 else ''})" for i, ps in held.items())
        return f"claims {claim_paths(mine)}: waits for {waits}, which holds paths it claims"
    active = [o["id"] for o in peers if o["state"] in ("running", "landing", "ready")]
    beside = f"beside job{'s' if len(active) > 1 else ''} {', '.join(map(str, active))}" if active else "at once"
    return f"claims {claim_paths(mine)}: none of it is held, so it may start {beside} (when a slot is free)"


KEY = 12
"""The width of `show`'s field names: each value starts one column after it."""


def width() -> int | None:
    """The columns a view's lines are broken to: the terminal's, or `COLUMNS`; None (not broken) in a pipe."""
    if sys.stdout.isatty() or "COLUMNS" in os.environ:
        return max(shutil.get_terminal_size().columns - 1, 40)
    return None


def say(text: str, *, first: str = "", hang: int = 0, cols: int | None = None) -> None:
    """One thing on as many lines as it needs, every string from the job in it made visible: `first` (a field
    name) then `text`, broken between words at `cols`, its later lines indented by `hang`."""
    text = term.visible(text)
    if cols is None:
        term.echo(first + text)
        return
    for n, part in enumerate(fit.fill(text, max(cols - max(len(first), hang), 20))):
        term.echo((first if n == 0 else " " * hang) + part)


def block(first: str, text: str, *, hang: int, cols: int | None) -> None:
    """A many-line value (a job's text): each of its lines on lines of its own, indented under the first and made
    visible, so that no line of it can pass for a field of the view."""
    for n, line in enumerate(text.strip("\n").split("\n")):
        say(line.rstrip(), first=f"{first:<{hang}}" if n == 0 else " " * hang, hang=hang, cols=cols)


@click.command()
@click.argument("job_id", type=int)
@json_option
@api_call
def show(job_id: int, as_json: bool) -> None:
    """Show one job in full, with its history."""
    job = client().job(job_id)
    if as_json:
        emit(job)
        return
    cols = width()

    def put(key: str, text: str) -> None:
        say(text, first=f"{key:<{KEY}} ", hang=KEY + 1, cols=cols)

    for key in (
        "id",
        "state",
        "code",
        "repo",
        "branch",
        "runner",
        "node",
        "text",
        "argv",
        "base",
        "landed_sha",
        "exit_code",
        "reason",
        "attempts",
        "created_at",
        "started_at",
        "finished_at",
        "land",
    ):
        value = job.get(key)
        if value in (None, ""):  # a field that does not apply yet is left out, never "None"
            continue
        if key == "text":
            block(key, value, hang=KEY + 1, cols=cols)  # many lines, each its own
        else:
            put(key, json.dumps(value) if key == "argv" else str(value))
    claim = job["claim"]
    paths = claim_paths(claim["paths"])
    put("claim", f"{paths} (confidence {claim['confidence']}, {claim['source']})")
    for line in risk_lines(claim.get("risk"), (job.get("decision") or {}).get("risks", ())):
        put("risk", line)
    if claim.get("coined"):
        said = ", ".join(claim["coined"])
        put("new", f"{said} (named by its text, new to its base: it waits for an earlier job making one of them)")
    if job.get("grown"):
        put("grown", f"{', '.join(job['grown'])} (touched while it ran or by an earlier attempt, outside its claim)")
    put("actual", ", ".join(job["actual"]) or "-")
    if u := job.get("usage"):
        cost = "unknown cost" if u.get("cost_usd") is None else f"${u['cost_usd']:.4f}"
        said = (
            f"{u.get('model', '')}: {u.get('calls', 0)} calls, {u.get('input_tokens', 0)} in, "
            f"{u.get('output_tokens', 0)} out, {u.get('cache_read_tokens', 0)} cache read, "
            f"{u.get('cache_write_tokens', 0)} cache write tokens; {cost}"
        )
        put("usage", said)
    term.echo("events:")
    for ev in job["events"]:
        extra = {k: v for k, v in ev.items() if k not in ("at", "kind")}
        at = time.strftime("%H:%M:%S", time.localtime(ev["at"]))
        say(f"{ev['kind']} {json.dumps(extra)}", first=f"  {at} ", hang=11, cols=cols)


def claim_paths(paths: Iterable[str]) -> str:
    """A claim's paths for a person (`claims.describe`: the root as the whole repository, an addition as the new file
    it is), none as `-`."""
    return ", ".join(map(claims.describe, paths)) or "-"


def risk_lines(risk: dict[str, Any] | None, beside: Iterable[dict[str, Any]]) -> list[str]:
    """What a job's risk is: its claim's share of meetings that would not merge, and its risk beside each job it
    was weighed against (both factors and their product)."""
    out = []
    if risk:
        out.append(
            f"in {risk.get('area') or '/'}: where it meets another job, {risk.get('nonmerge', 1.0):.0%} "
            "would not merge (its repository's record)"
        )
    for r in beside:
        out.append(
            f"beside job {r['job']}: {r['risk']:.1%} = meets {r['meet']:.1%} \u00d7 would not merge {r['nonmerge']:.0%}"
        )
    return out


@click.command()
@click.argument("job_id", type=int)
@json_option
@api_call
def why(job_id: int, as_json: bool) -> None:
    """Why a job is where it is: its latest admission decision, every check."""
    data = client().why(job_id)
    if as_json:
        emit(data)
        return
    cols = width()
    code = f" ({data['code']})" if data.get("code") else ""
    where = f" on node {data['node']}" if data.get("node") else ""
    say(f"job {data['id']} is {data['state']}{where}{code}: {data['reason']}", hang=2, cols=cols)
    say(f"next: {data['next']}", hang=2, cols=cols)
    d = data.get("decision")
    if d and d.get("blocking") and (held := fit.review_holds(client().jobs(OPEN_STATES)).get(job_id)):
        who = f"job {held[0]}" if len(held) == 1 else f"jobs {', '.join(map(str, held))}"
        said = (
            f"held by {who} in review, which keeps its paths and its slot until a person lands or rejects it: "
            f"`orchestrator diff {held[0]}` shows it, `orchestrator land {held[0]}` lands it, "
            f"`orchestrator reject {held[0]}` drops it"
        )
        say(said, hang=2, cols=cols)
    if d:
        say(f"decision: {d['reason']} — {d['message']}", hang=2, cols=cols)
        if d.get("shared"):
            say(f"shared (union-merged): {', '.join(d['shared'])}", hang=2, cols=cols)
        for c in d.get("checks", []):
            say(f"[{'ok' if c['ok'] else 'no'}] {c['name']}: {c['detail']}", first="  ", hang=7, cols=cols)
        for line in risk_lines(None, d.get("risks", ())):
            say(f"risk {line}", hang=2, cols=cols)
    if data.get("land_after"):
        say(f"lands after: {', '.join(map(str, data['land_after']))}", hang=2, cols=cols)
    if data.get("outside_claim"):
        said = f"outside its claim: {', '.join(data['outside_claim'])} (touched, though its claim named them not)"
        say(said, hang=2, cols=cols)
    if data.get("grown"):
        said = f"claim grown by: {', '.join(data['grown'])} (admission keeps other jobs away from them)"
        say(said, hang=2, cols=cols)


@click.command()
@click.argument("job_id", type=int, required=False)
@click.option("-f", "--follow", is_flag=True, help="Keep printing until the job ends.")
@click.option("--transcript", is_flag=True, help="The agent CLI's conversation (Claude Code's), turn by turn.")
@click.option("--raw", is_flag=True, help="On a terminal too, the bytes as they are (escape sequences obeyed).")
@json_option
@api_call
def logs(job_id: int | None, follow: bool, transcript: bool, raw: bool, as_json: bool) -> None:
    """Print a job's output (the runner's stdout and stderr); without ID, every job's.

    With -f, waits for a queued job to start, follows it to its end and exits with its outcome (0
    landed, 1 ended without landing). Each attempt starts with a `==> attempt N` line and ends with the
    runner's exit status. With --transcript, the conversation an agent CLI had (its prompts, answers and
    tool calls), kept on the job when its runner reads the CLI's output (`output = "claude-json"`).

    On a terminal, the output keeps its lines, tabs and colours, and every other control character is shown
    escaped (`\\x1b]0;...`): the job wrote it, so it must not set your window title, clipboard or screen.
    Piped to a file or a program, it is written as the job wrote it (as with --raw).
    """
    c = client()
    if transcript:
        if job_id is None or follow:
            raise click.UsageError("--transcript takes one job id (and no --follow)")
        lines = b"".join(c.stream(f"/jobs/{job_id}/log?transcript=1")).decode(errors="replace").splitlines()
        entries = [json.loads(ln) for ln in lines if ln.strip().startswith("{")]
        if as_json:
            emit(entries)
        else:
            for entry in entries:
                for line in transcript_lines(entry):
                    term.echo(line)
        return
    ids = [job_id] if job_id is not None else [j["id"] for j in c.jobs()]
    if follow and job_id is None:
        raise click.UsageError("--follow needs a job id")
    out: dict[str, str] = {}
    if follow and not as_json:
        job = c.job(ids[0])
        if job["state"] in models.WAITING:
            code = f" ({job['code']})" if job.get("code") else ""
            said = f"job {job['id']} is {job['state']}{code}: {job['reason'] or 'waits to start'}; its output follows"
            term.echo(said, err=True)
    shown = not raw and sys.stdout.isatty()
    for i in ids:
        stream = c.stream(f"/jobs/{i}/log?follow={'1' if follow else '0'}")
        if as_json:
            out[str(i)] = b"".join(stream).decode(errors="replace")
            continue
        if job_id is None:
            click.echo(f"==> job {i} <==")
        if shown:
            for text in term.chunks(stream):
                sys.stdout.write(text)
                sys.stdout.flush()
            continue
        for chunk in stream:
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
    if as_json:
        emit(out)
    if follow:
        # Followed to its end: exit with the job's outcome, and say it.
        job = c.job(ids[0])
        code = f" ({job['code']})" if job.get("code") else ""
        if not as_json:
            term.echo(f"job {job['id']}: {job['state']}{code} — {job['reason']}", err=True)
        if job["state"] in FAILED_STATES:
            sys.exit(FAILED)
        if job["state"] == "unchanged":
            sys.exit(UNCHANGED)


def transcript_lines(entry: dict[str, Any], width: int = 200) -> list[str]:
    """One transcript entry (a line of Claude Code's session JSONL) as what a person reads: who said what,
    which tool was called with what, what the tool answered (cut to `width`)."""
    message = entry.get("message") if isinstance(entry.get("message"), dict) else None
    if entry.get("type") not in ("user", "assistant") or message is None:
        return []
    who = message.get("role") or entry["type"]
    content = message.get("content")
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
    out = []
    for b in blocks:
        if not isinstance(b, dict):
            continue
        if b.get("type") == "text" and str(b.get("text", "")).strip():
            text = " ".join(str(b["text"]).split())
            out.append(f"{who}: {text[:width]}" + ("…" if len(text) > width else ""))
        elif b.get("type") == "tool_use":
            args = json.dumps(b.get("input"), ensure_ascii=False)
            out.append(f"{who} → {b.get('name')} {args[:width]}" + ("…" if len(args) > width else ""))
        elif b.get("type") == "tool_result":
            raw = b.get("content")
            items = raw if isinstance(raw, list) else []
            parts = [raw] if isinstance(raw, str) else [str(x.get("text", "")) for x in items if isinstance(x, dict)]
            text = " ".join(" ".join(parts).split())
            flag = " (error)" if b.get("is_error") else ""
            out.append(f"  tool result{flag}: {text[:width]}" + ("…" if len(text) > width else ""))
    return out


@click.command(cls=ArgvCommand, context_settings={"ignore_unknown_options": True})
@click.option("--repo", type=click.Path(path_type=Path), default=".", show_default=True)
@click.option("--branch")
@click.option("--base", help="Plan against this revision (default: the branch head).")
@click.option("--path", "paths_", multiple=True)
@json_option
@click.argument("text", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
@api_call
def plan(
    ctx: click.Context,
    repo: Path,
    branch: str | None,
    base: str | None,
    paths_: tuple[str, ...],
    as_json: bool,
    text: tuple[str, ...],
) -> None:
    """Print the claim the daemon would make for a job, without queueing it (`plan pytest -q` is fine).

    Without a running daemon, the same planner plans here, from the config (without the daemon's record of its
    jobs' outcomes)."""
    words = job_words(ctx, text, join=True) if text or ctx.meta.get("argv") else {"text": ""}
    request = rq.Plan(str(repo.expanduser().resolve()), words["text"], branch or None, base or None, paths_)
    try:
        data = client().plan(request)
    except Unreachable:
        data = _plan_here(request)
    if as_json:
        emit(data)
        return
    claim = data["claim"]
    cols = width()
    say(f"{data['base']} ({data['branch']})", first="base        ", hang=12, cols=cols)
    say(claim_paths(claim["paths"]), first="claim       ", hang=12, cols=cols)
    say(f"{claim['confidence']} ({claim['source']}, from {data.get('basis', 'none')})", first="confidence  ", hang=12,
        cols=cols)  # fmt: skip
    evidence = data.get("evidence", [])
    room = min(max((len(term.visible(e["path"])) for e in evidence), default=0), 32)
    for e in evidence:
        path = f"{fit.cut_middle(term.visible(e['path']), room):<{room}}"
        say(f"{e['kind']:<9} {e['why']}", first=f"  {path} ", hang=room + 3, cols=cols)
    tell(*(f"note: {n['code']}: {n['reason']}" for n in data.get("notes", [])))
    if data.get("plan_text"):
        term.echo("plan:")
        click.echo(term.output(data["plan_text"], colours=False))
    if not claim["paths"]:
        tell("no paths predicted: this job would run alone in its repo")


def _plan_here(request: rq.Plan) -> dict[str, Any]:
    """`plan` with no daemon to ask: the planner the config names, built and run in this process."""
    import asyncio

    from orchestrator import config, paths
    from orchestrator import logging as olog
    from orchestrator.core import claims
    from orchestrator.git import repos
    from orchestrator.jobs.service import plan_for
    from orchestrator.plan import composite
    from orchestrator.validate import BadRequest

    try:
        cfg = config.load(paths.resolve().config_file)
    except config.ConfigError as e:
        err(f"orchestrator: invalid config: {e}")
        sys.exit(config.EX_CONFIG)
    olog.configure(sys.stderr, level="warning")  # stdout is the plan (or its JSON)
    err("note: no daemon running: planned here (its record of earlier jobs' outcomes is not consulted)")
    try:
        return asyncio.run(plan_for(composite.build(cfg, None), request))
    except (BadRequest, repos.RepoError, claims.ClaimError) as e:
        err(f"orchestrator: {e}")
        sys.exit(REJECTED)
