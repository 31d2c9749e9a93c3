"""What the git hook runs, in the background with its I/O closed: read the commit, send its tickets.

    python -m orchestrator.service.hookrun post-commit SHA [BRANCH [picked]]   (SHA: the commit that ran the
                                 hook, from HEAD's reflog; `picked`: a cherry-pick was under way)
    python -m orchestrator.service.hookrun post-rewrite rebase FILE   (FILE: git's "old new" lines; deleted)

It runs in the repository's work tree (git runs hooks there). Tickets go to the daemon with a short
timeout; when no daemon answers (down, or hung: accepting but not answering) they go to the spool,
which the daemon drains when it can. Every outcome is one line in `<state dir>/hook.log`.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

from orchestrator import paths
from orchestrator import requests as rq
from orchestrator.client import ApiError, Client, Unreachable
from orchestrator.service import spool, tickets

TIMEOUT = 2.0
"""Seconds the daemon has to answer before the request goes to the spool."""
LOG_CAP = 256 * 1024


def _git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=30, check=True)
    return out.stdout


def in_rebase(git_dir: Path) -> bool:
    """A rebase is under way: post-commit leaves it to post-rewrite, which sees the finished result once."""
    return (git_dir / "rebase-merge").is_dir() or (git_dir / "rebase-apply").is_dir()


def ticket_folder(repo: Path) -> str:
    """The repository's ticket folder: `git config orchestrator.tickets`, default `.orchestrator/tickets`."""
    try:
        return _git(repo, "config", "--get", "orchestrator.tickets").strip() or tickets.DEFAULT_DIR
    except subprocess.CalledProcessError:
        return tickets.DEFAULT_DIR


class Foreign(Exception):
    """The commit is not the user's own: its tickets are not queued (the message says whose it is)."""


def _foreign_ok(repo: Path) -> bool:
    try:
        return _git(repo, "config", "--bool", "--get", tickets.FOREIGN_KEY).strip() == "true"
    except subprocess.CalledProcessError:
        return False


def commit_tickets(repo: Path, sha: str, folder: str, picked: bool = False) -> list[rq.Ticket]:
    """The tickets commit `sha` names: its trailers, then ticket files it adds or changes under `folder`.

    Raises `Foreign` when the commit is not the user's own (see `tickets.not_own`) and the repository did
    not opt in."""
    head = _git(repo, "show", "-s", "--format=%ae%n%ce%n%B", sha)
    author, committer, message = [*head.split("\n", 2), "", ""][:3]
    if tickets.is_own_commit(message):
        return []
    if (why := tickets.not_own(author, committer, picked)) and not _foreign_ok(repo):
        raise Foreign(why)
    found = tickets.from_message(message)
    # --root: a first commit has no parent to compare with; -z: any file name, unquoted.
    raw = _git(repo, "diff-tree", "-r", "--root", "--no-commit-id", "--name-status", "-z", "--diff-filter=AM", sha)
    fields = raw.split("\0")
    for status, path in zip(fields[0::2], fields[1::2], strict=False):
        if status in ("A", "M") and tickets.is_ticket_file(path, folder):
            found.append(tickets.from_file(path, _git(repo, "show", f"{sha}:{path}")))
    return found


def _branch(repo: Path) -> str | None:
    try:
        return _git(repo, "symbolic-ref", "--quiet", "--short", "HEAD").strip() or None
    except subprocess.CalledProcessError:
        return None  # detached: the daemon targets the repository's default branch


def request(repo: Path, commit: str, found: list[rq.Ticket], branch: str | None = None) -> rq.Tickets:
    branch = branch or _branch(repo)
    author = _git(repo, "show", "-s", "--format=%an <%ae>", commit).strip()  # who queued the commit's jobs
    return rq.Tickets(str(repo), branch, commit, tuple(t.keyed(branch) for t in found), author)


def deliver(req: rq.Tickets, p: paths.Paths, timeout: float = TIMEOUT) -> str:
    """Send to the daemon; spool when it is down or does not answer in time. Returns what happened."""
    try:
        results = Client(p.socket, timeout=timeout).tickets(req)["results"]
    except (Unreachable, TimeoutError, ConnectionError, OSError) as e:
        where = spool.write(p.spool, req.to_json())
        return f"spooled {where.name} ({type(e).__name__}: {e})"
    except ApiError as e:
        if e.status >= 500:
            where = spool.write(p.spool, req.to_json())
            return f"spooled {where.name} (daemon error: {e.message})"
        return f"refused: {e.message}"
    return "sent: " + ", ".join(f"{r.get('status')} {r.get('job_id', '')}".strip() for r in results)


def _log(p: paths.Paths, line: str) -> None:
    paths.private_dir(p.state_dir)  # 0700 whatever the umask: the daemon reads its spool from there
    log = p.hook_log
    if log.exists() and log.stat().st_size > LOG_CAP:
        log.replace(log.with_suffix(".log.1"))
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "a") as f:
        f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}\n")


def picking(git_dir: Path) -> bool:
    """A cherry-pick (or a revert, or a sequence of them) is under way."""
    return (git_dir / "CHERRY_PICK_HEAD").exists() or (git_dir / "sequencer").is_dir()


def _not_queued(sha: str, why: Foreign) -> str:
    return f"{sha[:12]}: not queued: {why}; `git config {tickets.FOREIGN_KEY} true` queues such commits' tickets"


def post_commit(
    repo: Path, git_dir: Path, sha: str, branch: str | None, picked: bool = False
) -> tuple[str, rq.Tickets | None]:
    if in_rebase(git_dir):
        return "skipped: rebase under way (post-rewrite takes it)", None
    # Another tool's hook found no reflog entry to name the commit (core.logAllRefUpdates off): HEAD now.
    sha = sha or _git(repo, "rev-parse", "--verify", "HEAD").strip()
    try:
        found = commit_tickets(repo, sha, ticket_folder(repo), picked or picking(git_dir))
    except Foreign as why:
        return _not_queued(sha, why), None
    return (f"{sha[:12]}: no tickets", None) if not found else (sha[:12], request(repo, sha, found, branch))


def post_rewrite(repo: Path, kind: str, pairs_file: Path) -> tuple[str, rq.Tickets | None]:
    """After a rebase: only tickets a rewritten commit has and its original had not (e.g. a reword)."""
    try:
        lines = pairs_file.read_text().splitlines()
    finally:
        pairs_file.unlink(missing_ok=True)
    if kind != "rebase":
        return f"skipped: {kind} (post-commit took it)", None
    folder = ticket_folder(repo)
    found: list[rq.Ticket] = []
    last = ""
    refused: list[str] = []
    for line in lines:
        old, _, rest = line.partition(" ")
        new = rest.split(" ")[0]
        if not old or not new:
            continue
        try:
            after = commit_tickets(repo, new, folder)
        except Foreign as why:
            refused.append(_not_queued(new, why))
            continue
        try:
            before = commit_tickets(repo, old, folder)
        except (subprocess.CalledProcessError, Foreign):
            before = []  # the original is gone: every ticket of the new commit is new
        found += tickets.new_since(before, after)
        last = new
    note = "".join(f"; {r}" for r in refused)
    if not found:
        return f"rebase of {len(lines)} commits: no new tickets{note}", None
    return f"rebase of {len(lines)} commits{note}", request(repo, last, found)


def main(argv: list[str]) -> int:
    # Out of the terminal's process group: a Ctrl-C after the commit does not cut us off (EPERM: already a leader).
    with contextlib.suppress(PermissionError):
        os.setsid()
    p = paths.resolve()
    repo = Path.cwd()
    try:
        git_dir = Path(_git(repo, "rev-parse", "--absolute-git-dir").strip())
        if argv[:1] == ["post-commit"] and len(argv) in (2, 3, 4) and argv[3:] in ([], ["picked"]):
            what, req = post_commit(repo, git_dir, argv[1], (argv[2:] or [""])[0] or None, argv[3:] == ["picked"])
        elif argv[:1] == ["post-rewrite"] and len(argv) == 3:
            what, req = post_rewrite(repo, argv[1], Path(argv[2]))
        else:
            _log(p, f"{repo}: usage: hookrun post-commit SHA [BRANCH [picked]] | post-rewrite KIND FILE (got {argv})")
            return 2
        if req is not None:
            what += ": " + deliver(req, p)
        _log(p, f"{repo}: {argv[0]}: {what}")
    except (OSError, subprocess.SubprocessError, tickets.TicketError, ValueError) as e:
        _log(p, f"{repo}: {argv[:1]}: failed: {type(e).__name__}: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
