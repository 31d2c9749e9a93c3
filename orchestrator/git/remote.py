"""Land a job onto a shared remote: fetch the branch's tip, merge in memory, push with a lease as the CAS.

In team mode a repository is a remote URL and a target branch, not a local path: every node works in a clone
of its own, and the branch that counts is the remote's. A landing (`land`) is the loop every landing runs
(`git.landing.land_on`: refuse a rewritten head, merge in memory, run the landing check, swap; the same
outcomes and words, `git.outcomes`) on the remote branch as its target (`Tip`), whose own parts are:

1. its head: the remote branch's tip fetched into a ref of the daemon's own in the node's clone
   (`refs/orchestrator/remotes/<digest>/<branch>`; the user's branches and remote-tracking refs stay as they
   are, and no FETCH_HEAD is written); an unreachable remote (UNREACHABLE) or one without the branch
   (NO_BRANCH) ends it;
2. its swap: `git push --force-with-lease=refs/heads/<branch>:<tip> URL <new>:refs/heads/<branch>`, fenced
   (FENCED once this node no longer holds the job) and journaled. The lease is the compare-and-swap: the
   remote moves only if it still points where this node fetched it, so a node that lost a race to another
   node's push (HEAD_MOVED) fetches and tries again, and history someone else pushed meanwhile is never
   overwritten. A refusal by the remote (branch protection, a pre-receive hook) is REFUSED, quoting the
   remote's own message; an unreachable remote is reported, for the caller to wait and retry.

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
import hashlib
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Protocol, Unpack
from urllib.parse import urlsplit

import pygit2

from orchestrator import testhook
from orchestrator.core.urls import shown
from orchestrator.git import landing, repos
from orchestrator.git.journal import Intent, Journal, NoJournal
from orchestrator.git.outcomes import LandOutcome, LandResult

NETWORK_TIMEOUT = 120.0
"""Seconds one fetch or push may take before it counts as the remote being unreachable."""
TRACKING_PREFIX = "refs/orchestrator/remotes"

__all__ = [
    "PUBLISHERS",
    "Publisher",
    "Pushed",
    "Remote",
    "RemoteError",
    "Tip",
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


Fence = Callable[[], Awaitable[bool]]
"""True while this node still holds the job (asked right before each push)."""


@dataclass(frozen=True, slots=True)
class Tip:
    """The remote branch as a landing target (`landing.Target`): its tip fetched, swapped by a journaled push."""

    repo_path: Path
    remote: Remote
    job_id: int
    publisher: Publisher
    journal: Journal
    fence: Fence | None = None
    timeout: float = NETWORK_TIMEOUT

    @property
    def where(self) -> str:
        return str(self.remote)

    async def head(self) -> str | LandResult:
        remote = self.remote
        try:
            tip = await asyncio.to_thread(fetch, self.repo_path, remote, timeout=self.timeout)
        except RemoteError as e:
            return LandResult(LandOutcome.UNREACHABLE, None, "", (), (), str(e))
        if tip is None:
            said = f"{shown(remote.url)} has no branch {remote.branch}: push it once (git push URL {remote.branch})"
            return LandResult(LandOutcome.NO_BRANCH, None, "", (), (), said)
        return tip

    async def swap(self, head: str, new: str) -> LandResult:
        if self.fence is not None and not await self.fence():
            said = f"job {self.job_id} is no longer this node's (its lease ended): not pushed; its new holder lands it"
            return LandResult(LandOutcome.FENCED, head, head, (), (), said)
        await testhook.reach("landing.move", self.job_id)
        pushed = await asyncio.to_thread(
            _publish, self.publisher, self.journal, self.repo_path, self.remote, head, new, self.job_id
        )
        if pushed.outcome is PushOutcome.PUSHED:
            await asyncio.to_thread(_set_tracked, self.repo_path, self.remote, new)
            return LandResult(LandOutcome.LANDED, new, head, (), (), pushed.message)
        if pushed.outcome is PushOutcome.REFUSED:
            return LandResult(LandOutcome.REFUSED, head, head, (), (), pushed.message)
        # STALE: another node pushed between our fetch and our push (fetch, merge and try again); UNREACHABLE:
        # where the remote is now is not known.
        outcome = LandOutcome.HEAD_MOVED if pushed.outcome is PushOutcome.STALE else LandOutcome.UNREACHABLE
        return LandResult(outcome, None, head, (), (), pushed.message)


async def land(
    repo_path: Path,
    remote: Remote,
    job_commit: str,
    *,
    retries: int = 5,
    fence: Fence | None = None,
    publisher: Publisher | None = None,
    journal: Journal | None = None,
    follow: bool = False,
    checkout_journal: Journal | None = None,
    timeout: float = NETWORK_TIMEOUT,
    **job: Unpack[landing.Landing],
) -> LandResult:
    """Land `job_commit` (an object in the clone at `repo_path`) on the remote branch: fetch, merge, check,
    push with a lease (`landing.land_on`, on `Tip`); a lost race fetches and tries again, up to `retries` more
    times.

    `journal` gets the intent (remote key, tip → new) before each push and its end once the remote answered,
    so a node that dies in between can tell, on restart or when another node takes the job over, whether the
    push happened (`landed`). `follow`: fast-forward the clone's own branch of that name once landed (a
    checkout of it is updated as a local landing does, its intent in `checkout_journal`); what happened to it
    ends the message.
    """
    job_id = job["job_id"]
    tip = Tip(repo_path, remote, job_id, publisher or PushPublisher(timeout), journal or NoJournal(), fence, timeout)
    result = await landing.land_on(tip, repo_path, job_commit, retries=retries, **job)
    if follow and result.sha is not None and result.outcome in (LandOutcome.LANDED, LandOutcome.NOOP):
        followed = await _follow(repo_path, remote, result.sha, job_id, checkout_journal)
        return replace(result, message=f"{result.message}; {followed}")
    return result


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
    if result.outcome is LandOutcome.LANDED:
        return f"your {remote.branch} followed: {head[:12]} → {new[:12]}"
    return f"your {remote.branch} was not updated: {result.message}"
