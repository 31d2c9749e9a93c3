"""Land a job onto a shared remote: fetch the branch's tip, merge in memory, push with a lease as the CAS.

In team mode a repository is a remote URL and a target branch, not a local path: every node works in a clone
of its own, and the branch that counts is the remote's. One landing attempt (`land`):

1. fetch the remote branch's tip into a ref of the daemon's own in the node's clone
   (`refs/orchestrator/remotes/<digest>/<branch>`; the user's branches and remote-tracking refs stay as they
   are, and no FETCH_HEAD is written);
2. refuse a tip that no longer contains the job's base (the branch was rewritten: merging would bring back the
   history it dropped; the job is planned again);
3. merge in memory as a local landing does (`git.merging.merge_for_landing`): a conflict never lands, the job
   is re-queued; run the landing check on the result if there is one;
4. publish: `git push --force-with-lease=refs/heads/<branch>:<tip> URL <new>:refs/heads/<branch>`. The lease
   is the compare-and-swap: the remote moves only if it still points where this node fetched it, so a node
   that lost a race to another node's push fetches and tries again, and history someone else pushed meanwhile
   is never overwritten. A refusal by the remote (branch protection, a pre-receive hook) is a failure that
   quotes the remote's own message; an unreachable remote is reported, for the caller to wait and retry.

A node's own checkout is never touched unless the caller asks (`follow`): then a local branch whose head the
landing contains is fast-forwarded the way a local landing is, and a diverged one is left alone and reported.

How a merged result reaches the remote is one seam (`Publisher`, picked by name from `PUBLISHERS`): a direct
push today; opening a pull request instead fits the same place later.

Every git process goes through `repos.run_git` (the scrubbed environment: an ssh agent and the user's git
config for credentials, never the daemon's API keys; no hook of the user's runs). A URL's password is never
shown: messages and errors carry `shown(url)`.

Sync git and pygit2 code runs in threads (`asyncio.to_thread`); `land` itself is async because the landing
check and the caller's fence are.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

import pygit2

from orchestrator.git import landing, repos
from orchestrator.git.journal import Intent, Journal, NoJournal
from orchestrator.git.merging import LandStyle, Mergeable, merge_for_landing

NETWORK_TIMEOUT = 120.0
"""Seconds one fetch or push may take before it counts as the remote being unreachable."""
TRACKING_PREFIX = "refs/orchestrator/remotes"

__all__ = [
    "PUBLISHERS",
    "Publisher",
    "Pushed",
    "Remote",
    "RemoteError",
    "RemoteLanding",
    "RemoteOutcome",
    "fetch",
    "identity",
    "land",
    "landed",
    "push",
    "shown",
]


class RemoteError(RuntimeError):
    """The remote cannot be reached or read (network, authentication, no such repository); the message is git's,
    with any password in the URL hidden."""


# -- naming a remote -------------------------------------------------------------------------------------------

_SCP = re.compile(r"^(?:(?P<user>[^@/]+)@)?(?P<host>[^:/]+):(?P<path>(?!/).*)$")


def shown(url: str) -> str:
    """`url` with its password (if any) replaced by `***`: what messages and logs may carry."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def identity(url: str) -> str:
    """The remote's name for the team: the same repository however a node spells its URL.

    `git@host:org/repo.git`, `ssh://git@host/org/repo` and `https://user:token@Host/org/repo/` are all
    `host/org/repo`: no user, password, port, scheme or `.git`; the host in lower case. A local path (or
    `file://` URL) is the resolved absolute path.
    """
    url = url.strip()
    if "://" not in url:
        scp = _SCP.match(url)
        if scp and not Path(url).exists():
            return _hosted(scp["host"], scp["path"])
        return str(Path(url).expanduser().resolve())
    parts = urlsplit(url)
    if parts.scheme == "file":
        return str(Path(parts.path).resolve())
    if not parts.hostname:
        raise ValueError(f"{shown(url)} names no host: use host/path, a scp-like user@host:path or a local path")
    return _hosted(parts.hostname, parts.path)


def _hosted(host: str, path: str) -> str:
    path = path.strip("/")
    path = path.removesuffix(".git").rstrip("/")
    return f"{host.lower()}/{path}"


@dataclass(frozen=True, slots=True)
class Remote:
    """A shared repository: a remote URL and the branch jobs land on."""

    url: str
    """As configured (it may carry credentials: show `shown(url)`, never this)."""
    branch: str

    @property
    def identity(self) -> str:
        return identity(self.url)

    @property
    def key(self) -> str:
        """The team-wide name of this repository and branch: its claims, queue and landing lock hang on it."""
        return f"{self.identity}#{self.branch}"

    @property
    def refname(self) -> str:
        return f"refs/heads/{self.branch}"

    @property
    def tracking_ref(self) -> str:
        """Where the node's clone keeps the tip it last fetched (a ref of the daemon's own)."""
        digest = hashlib.sha256(self.identity.encode()).hexdigest()[:16]
        return f"{TRACKING_PREFIX}/{digest}/{self.branch}"

    def __str__(self) -> str:
        return f"{shown(self.url)} {self.branch}"


# -- fetch and push -------------------------------------------------------------------------------------------


def fetch(repo_path: Path, remote: Remote, *, timeout: float = NETWORK_TIMEOUT) -> str | None:
    """Fetch the remote branch into the clone at `repo_path`; the tip's sha, or None if the remote has no such
    branch. RemoteError when the remote cannot be reached or read."""
    done = repos.run_git(
        repo_path, "fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "--no-recurse-submodules",
        "--no-auto-maintenance", remote.url, f"+{remote.refname}:{remote.tracking_ref}", timeout=timeout,
    )  # fmt: skip
    if done.returncode != 0:
        if "couldn't find remote ref" in done.stderr:
            _delete_ref(repo_path, remote.tracking_ref)
            return None
        raise RemoteError(_git_says(remote, "fetch", done))
    return tracked(repo_path, remote)


def tracked(repo_path: Path, remote: Remote) -> str | None:
    """The tip this clone last fetched (or pushed) for `remote`, without asking the remote."""
    repo = repos.open_repo(repo_path)
    try:
        return str(repo.lookup_reference(remote.tracking_ref).target)
    except KeyError:
        return None


class PushOutcome(StrEnum):
    """What the remote did with one push."""

    PUSHED = "pushed"
    """The branch now points at the pushed commit."""
    STALE = "stale"
    """The branch no longer pointed where the lease expected: another push won the race; nothing moved."""
    REFUSED = "refused"
    """The remote refused the update itself (branch protection, a pre-receive or update hook); nothing moved."""
    UNREACHABLE = "unreachable"
    """The push could not be made (network, authentication, timeout); nothing is known to have moved."""


@dataclass(frozen=True, slots=True)
class Pushed:
    outcome: PushOutcome
    message: str
    """For a person: what happened, with the remote's own words when it refused."""


def push(
    repo_path: Path, remote: Remote, expected: str | None, new: str, *, timeout: float = NETWORK_TIMEOUT
) -> Pushed:
    """Move the remote branch from `expected` (None: it must not exist yet) to `new`, or not at all."""
    lease = f"--force-with-lease={remote.refname}:{expected or ''}"
    done = repos.run_git(
        repo_path, "push", "--porcelain", "--no-verify", lease, remote.url, f"{new}:{remote.refname}", timeout=timeout
    )
    return push_outcome(remote, new, done.returncode, done.stdout, done.stderr) or Pushed(
        PushOutcome.UNREACHABLE, _git_says(remote, "push", done)
    )


_LOST_RACE = re.compile(r"cannot lock ref '[^']+': is at [0-9a-f]+ but expected [0-9a-f]+")
"""What the remote says when another push moved the branch between its own check of our lease and its update."""


def push_outcome(remote: Remote, new: str, returncode: int, stdout: str, stderr: str) -> Pushed | None:
    """What one `git push --porcelain` did, from its exit status and output; None when it could not be made."""
    status = _porcelain_status(stdout, remote.refname)
    said = _remote_lines(stderr)
    if returncode == 0 and status is not None and status[0] in " +*=":
        return Pushed(PushOutcome.PUSHED, f"pushed {new[:12]} to {remote}")
    if status is not None and status[0] == "!":
        summary = status[1]
        if lost := _LOST_RACE.search(stderr):
            return Pushed(PushOutcome.STALE, f"{remote} moved while the push was made ({lost[0]}); fetch, merge again")
        if "remote rejected" in summary or said:
            why = "; ".join(said) or summary
            return Pushed(PushOutcome.REFUSED, f"the remote {remote} refused the push: {why} ({summary})")
        return Pushed(PushOutcome.STALE, f"{remote} moved since it was fetched ({summary}); fetch and merge again")
    return None


def landed(repo_path: Path, remote: Remote, sha: str, *, timeout: float = NETWORK_TIMEOUT) -> bool:
    """Whether the remote branch contains `sha` now (after a crash between a push and its record). RemoteError
    when the remote cannot be asked."""
    tip = fetch(repo_path, remote, timeout=timeout)
    return tip is not None and landing.contains(repo_path, tip, sha)


def _porcelain_status(stdout: str, refname: str) -> tuple[str, str] | None:
    """(flag, summary) of `refname`'s line in `git push --porcelain` output: `<flag>\\t<from>:<to>\\t<summary>`."""
    for line in stdout.splitlines():
        fields = line.split("\t")
        if len(fields) >= 3 and fields[1].endswith(f":{refname}") and fields[0]:
            return fields[0][0], fields[2]
    return None


def _remote_lines(stderr: str) -> list[str]:
    """What the remote itself said (`remote: ...` lines), blank ones left out."""
    out = []
    for line in stderr.splitlines():
        if line.startswith("remote:"):
            text = line.removeprefix("remote:").strip()
            if text:
                out.append(text)
    return out


def _git_says(remote: Remote, verb: str, done: object) -> str:
    stderr = getattr(done, "stderr", "") or ""
    code = getattr(done, "returncode", None)
    lines = [line.strip() for line in stderr.replace(remote.url, shown(remote.url)).splitlines() if line.strip()]
    text = "; ".join(lines[-4:]) or f"git {verb} exited {code}"
    return f"cannot {verb} {remote}: {text}"


def _delete_ref(repo_path: Path, refname: str) -> None:
    repo = repos.open_repo(repo_path)
    ref = repo.references.get(refname)
    if ref is not None:
        ref.delete()


def _set_tracked(repo_path: Path, remote: Remote, sha: str) -> None:
    repo = repos.open_repo(repo_path)
    repo.references.create(remote.tracking_ref, pygit2.Oid(hex=sha), force=True)


# -- the seam: how a merged result reaches the remote -------------------------------------------------------------


class Publisher(Protocol):
    """Make the remote branch point at `new` if it still points at `expected` (sync: called in a thread)."""

    def publish(self, repo_path: Path, remote: Remote, expected: str | None, new: str, *, job_id: int) -> Pushed: ...


class PushPublisher:
    """A direct push with `--force-with-lease` (the compare-and-swap)."""

    def __init__(self, timeout: float = NETWORK_TIMEOUT) -> None:
        self.timeout = timeout

    def publish(self, repo_path: Path, remote: Remote, expected: str | None, new: str, *, job_id: int) -> Pushed:
        return push(repo_path, remote, expected, new, timeout=self.timeout)


PUBLISHERS: dict[str, Callable[[float], Publisher]] = {"push": PushPublisher}
"""Landing styles onto a remote by name (`[team] publish`); a pull-request publisher fits here later."""


# -- one landing -----------------------------------------------------------------------------------------------


class RemoteOutcome(StrEnum):
    """How a landing onto the remote ended."""

    LANDED = "landed"
    """The remote branch now holds the job's work."""
    NOOP = "noop"
    """The job's commits were already on the remote branch; nothing moved."""
    CONFLICT = "conflict"
    """The job conflicts with the remote tip in `conflicts`; nothing moved (re-queue it on the new tip)."""
    REWRITTEN = "rewritten"
    """The remote branch no longer contains the job's base (force-pushed): nothing moved; plan it again."""
    CHECK_FAILED = "check-failed"
    """The landing check failed on the merged result; nothing moved."""
    REFUSED = "refused"
    """The remote refused the push (branch protection, a hook): `message` has its words; nothing moved."""
    NO_BRANCH = "no-branch"
    """The remote has no such branch; nothing moved (push it once by hand)."""
    KEPT_MOVING = "kept-moving"
    """Every attempt lost the race to another push; nothing moved (try again later)."""
    UNREACHABLE = "unreachable"
    """The remote could not be reached; nothing is known to have moved (try again later)."""
    FENCED = "fenced"
    """The caller's fence said this node no longer holds the job (another node took it over); nothing pushed."""


@dataclass(frozen=True, slots=True)
class RemoteLanding:
    outcome: RemoteOutcome
    sha: str | None
    """The remote tip after this landing (the new one when LANDED); None when unknown."""
    old_head: str | None
    """The tip the last attempt merged onto."""
    message: str
    conflicts: tuple[str, ...] = ()
    check_output: str = ""
    attempts: int = 1
    followed: str = ""
    """With `follow`: what happened to the node's own checkout ("" when not asked)."""


Check = Callable[[str], Awaitable[landing.CheckResult]]
"""The landing check on a merged commit's sha (`git.landing.run_check` bound to its command)."""
Fence = Callable[[], Awaitable[bool]]
"""True while this node still holds the job (asked right before each push)."""


async def land(
    repo_path: Path,
    remote: Remote,
    job_commit: str,
    *,
    job_id: int,
    message: str,
    base: str | None = None,
    mergeable: Mergeable | None = None,
    style: LandStyle = "merge",
    retries: int = 5,
    check: Check | None = None,
    fence: Fence | None = None,
    publisher: Publisher | None = None,
    journal: Journal | None = None,
    follow: bool = False,
    checkout_journal: Journal | None = None,
    timeout: float = NETWORK_TIMEOUT,
) -> RemoteLanding:
    """Land `job_commit` (an object in the clone at `repo_path`) on the remote branch: fetch, merge, check,
    push with a lease; a lost race fetches and tries again, up to `retries` more times.

    `journal` gets the intent (remote key, tip → new) before each push and its end once the remote answered,
    so a node that dies in between can tell, on restart or when another node takes the job over, whether the
    push happened (`landed`). `follow`: fast-forward the clone's own branch of that name once landed (a
    checkout of it is updated as a local landing does, its intent in `checkout_journal`).
    """
    publisher = publisher or PushPublisher(timeout)
    journal = journal or NoJournal()
    tip: str | None = None
    for attempt in range(1, retries + 2):
        try:
            tip = await asyncio.to_thread(fetch, repo_path, remote, timeout=timeout)
        except RemoteError as e:
            return RemoteLanding(RemoteOutcome.UNREACHABLE, None, tip, str(e), attempts=attempt)
        if tip is None:
            return RemoteLanding(
                RemoteOutcome.NO_BRANCH,
                None,
                None,
                f"{shown(remote.url)} has no branch {remote.branch}: push it once (git push URL {remote.branch})",
                attempts=attempt,
            )
        if base is not None and not await asyncio.to_thread(landing.contains, repo_path, tip, base):
            return RemoteLanding(
                RemoteOutcome.REWRITTEN,
                tip,
                tip,
                f"{remote} at {tip[:12]} no longer contains job {job_id}'s base {base[:12]} (rewritten): "
                "not landed; the job is planned again on the new tip",
                attempts=attempt,
            )
        merged = await asyncio.to_thread(
            functools.partial(merge_for_landing, message=message, style=style), repo_path, tip, job_commit, mergeable
        )
        if merged.kind == "conflict":
            n = len(merged.conflicts)
            return RemoteLanding(
                RemoteOutcome.CONFLICT,
                tip,
                tip,
                f"job {job_id} conflicts with {remote} at {tip[:12]} in {n} path{'s' * (n != 1)}: "
                f"{', '.join(merged.conflicts[:5])}; not landed",
                conflicts=merged.conflicts,
                attempts=attempt,
            )
        if merged.kind == "noop":
            followed = await _follow(repo_path, remote, tip, job_id, checkout_journal) if follow else ""
            return RemoteLanding(
                RemoteOutcome.NOOP, tip, tip, f"job {job_id} is already on {remote} at {tip[:12]}",
                attempts=attempt, followed=followed,
            )  # fmt: skip
        assert merged.sha is not None
        if check is not None:
            result = await check(merged.sha)
            if not result.ok:
                return RemoteLanding(
                    RemoteOutcome.CHECK_FAILED,
                    tip,
                    tip,
                    f"the landing check failed on {merged.sha[:12]} (exit {result.returncode}); {remote} not moved",
                    check_output=result.output_tail,
                    attempts=attempt,
                )
        if fence is not None and not await fence():
            return RemoteLanding(
                RemoteOutcome.FENCED,
                tip,
                tip,
                f"job {job_id} is no longer this node's (its lease ended): not pushed; its new holder lands it",
                attempts=attempt,
            )
        pushed = await asyncio.to_thread(_publish, publisher, journal, repo_path, remote, tip, merged.sha, job_id)
        if pushed.outcome is PushOutcome.PUSHED:
            await asyncio.to_thread(_set_tracked, repo_path, remote, merged.sha)
            followed = await _follow(repo_path, remote, merged.sha, job_id, checkout_journal) if follow else ""
            how = {"fast-forward": "fast-forward", "rebase": "rebased", "squash": "squashed"}.get(merged.kind, "merge")
            return RemoteLanding(
                RemoteOutcome.LANDED,
                merged.sha,
                tip,
                f"landed job {job_id} on {remote}: {how} {tip[:12]} → {merged.sha[:12]}",
                attempts=attempt,
                followed=followed,
            )
        if pushed.outcome is PushOutcome.REFUSED:
            return RemoteLanding(RemoteOutcome.REFUSED, tip, tip, pushed.message, attempts=attempt)
        if pushed.outcome is PushOutcome.UNREACHABLE:
            return RemoteLanding(RemoteOutcome.UNREACHABLE, None, tip, pushed.message, attempts=attempt)
        # STALE: another node pushed between our fetch and our push. Fetch, merge and try again.
    return RemoteLanding(
        RemoteOutcome.KEPT_MOVING,
        None,
        tip,
        f"{remote} kept moving: {retries + 1} attempts to land job {job_id} lost the race; trying again later",
        attempts=retries + 1,
    )


def _publish(
    publisher: Publisher, journal: Journal, repo_path: Path, remote: Remote, tip: str, new: str, job_id: int
) -> Pushed:
    """One push, journaled: the intent is stored before it and cleared once the remote has answered (a refusal
    or a lost race moved nothing; an unreachable remote leaves the intent open, since the push may have gone
    through before the connection broke)."""
    token = journal.begin(Intent(remote.key, remote.refname, tip, new, (), job_id, time.time()))
    pushed = publisher.publish(repo_path, remote, tip, new, job_id=job_id)
    if pushed.outcome is not PushOutcome.UNREACHABLE:
        journal.end(token)
    return pushed


async def _follow(repo_path: Path, remote: Remote, new: str, job_id: int, journal: Journal | None) -> str:
    """Bring the clone's own branch `remote.branch` to `new` where that is a fast-forward; what happened."""
    return await asyncio.to_thread(_follow_sync, repo_path, remote, new, job_id, journal)


def _follow_sync(repo_path: Path, remote: Remote, new: str, job_id: int, journal: Journal | None) -> str:
    repo = repos.open_repo(repo_path)
    ref = repo.branches.local.get(remote.branch)
    if ref is None:
        return f"your clone has no branch {remote.branch}: nothing to update"
    head = str(ref.target)
    if head == new:
        return f"your {remote.branch} is at {new[:12]} already"
    if not landing.contains(repo_path, new, head):
        return (
            f"your {remote.branch} at {head[:12]} has commits {remote} does not: left as it is "
            f"(`git pull` merges {new[:12]} into it)"
        )
    result = landing.advance(repo_path, remote.branch, head, new, job_id=job_id, journal=journal)
    if result.outcome is landing.LandOutcome.LANDED:
        return f"your {remote.branch} followed: {head[:12]} → {new[:12]}"
    return f"your {remote.branch} was not updated: {result.message}"
