"""Settings: TOML (tomllib) into frozen dataclasses, then environment overrides.

An invalid file is a `ConfigError` naming the key; the CLI exits 78 (EX_CONFIG) on it. So is a config dir,
config file or env file that another user could have written (ssh's rule, `paths.unsafe`): it is never read.
Environment overrides: `MAX_CONCURRENT_JOBS` (as in the seed), `OLLAMA_HOST`, `OLLAMA_NUM_PARALLEL`,
`ANTHROPIC_API_KEY`, `ANTHROPIC_BASE_URL`, `ORCHESTRATOR_SANDBOX` (jobs.sandbox).
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints
from urllib.parse import SplitResult, parse_qsl, unquote, urlsplit

from orchestrator.core import on_end
from orchestrator.core.models import CHANGELOGS, LAND_STYLES, Policy

EX_CONFIG = 78
BUILTIN_RUNNERS = ("shell", "replay", "claude")


class ConfigError(ValueError):
    """The config file or an environment override is invalid; the message names the key."""


class Secret(str):
    """A string that never shows itself in a repr or a log."""

    def __repr__(self) -> str:
        return "Secret('****')" if self else "Secret('')"


@dataclass(frozen=True)
class JobsConfig:
    max_concurrent: int = 2
    per_repo: int = 4
    min_confidence: float = 0.5
    mergeable: tuple[str, ...] = CHANGELOGS
    barriers: tuple[str, ...] = ()
    retry_on_conflict: bool = True
    max_attempts: int = 3
    timeout: float = 3600.0
    warm_worktrees: int = 2
    default_runner: str = "shell"
    agent: str = ""
    """The agent (`claude-code`, `codex`, `aider`, `claude`, or a `[runners.NAME]`) that a text in words queued with
    no runner goes to, when `default_runner` is `shell` (`core.prose`); "": such a text is refused, with the command
    to use."""
    on_end: tuple[str, ...] = ()
    """An argv template run when a job ends, e.g. ["notify-send", "{summary}"] (see jobs/notify.py)."""
    log_max_bytes: int = 50 * 1024 * 1024
    kill_grace: float = 5.0
    requeue_interrupted: bool = False
    sandbox: str = "auto"
    """`auto` | `bwrap` | `none`: confine shell and command jobs with bubblewrap (env ORCHESTRATOR_SANDBOX)."""
    land: str = "auto"
    """`auto` lands a finished job at once; `review` holds it `ready` until `orchestrator land` or `reject`."""
    land_style: str = "merge"
    """How a landing joins the branch: `merge` (a merge commit when the branch moved), `rebase` (the job's commits
    replayed on it: a linear history, no merge commit) or `squash` (one commit per job); a repository may differ."""
    rate_limit_wait: float = 60.0
    """Seconds a rate-limited job first waits when its model API (or CLI) names no time; doubles each time."""
    rate_limit_max_wait: float = 3600.0
    """The longest one wait, whatever the API asks for."""
    rate_limit_waits: int = 5
    """Waits one job may make; rate-limited once more, it fails with code RateLimited."""
    max_tracked_paths: int = 10_000
    """Paths a running job's actual set lists at most; past that it claims the whole repository until it ends."""
    max_bytes: int = 20 * 2**30
    """Disk a running job's workspace and scratch dirs may take (bytes, measured every few seconds); past it the job
    is stopped (code TooBig). 0: no limit."""
    min_free_bytes: int = 256 * 2**20
    """Free room a running job's disk keeps (bytes); under it every job writing there is stopped (code NoSpace)
    before the disk is full. 0: no floor."""
    max_result_bytes: int = 256 * 2**20
    """Bytes a job's result may add to the repository in all (its new and changed files); past it nothing is
    committed (code TooBig). 0: no limit."""
    pids_max: int = 1024
    """Processes and threads one command of a job may have at once (its cgroup's `pids.max`). 0: no limit."""
    memory_max: int = 0
    """Bytes of memory one command of a job may use (its cgroup's `memory.max`); 0: half the machine's memory."""


@dataclass(frozen=True)
class RepoConfig:
    check: str = ""
    check_timeout: float = 900.0
    mergeable: tuple[str, ...] = ()
    land_style: str = ""
    """`merge` | `rebase` | `squash` for this repository (empty: `jobs.land_style`)."""
    land: str = ""
    """`auto` | `review` for this repository (empty: `jobs.land`)."""


@dataclass(frozen=True)
class AgentConfig:
    """Budgets of the built-in `claude` runner, per job (its model is `anthropic.model`)."""

    max_turns: int = 60
    max_tokens: int = 2_000_000
    """Input, output and cache tokens together, across the job's turns."""
    max_seconds: float = 1800.0
    response_tokens: int = 8192
    """`max_tokens` of each model response."""
    run_timeout: float = 300.0
    """Longest a `run` tool command may take."""
    output_cap: int = 20_000
    """Characters of a tool's output the model sees."""


@dataclass(frozen=True)
class RunnerTemplate:
    """A `command` runner: an agent CLI run with the job's prompt as one argument (`[runners.NAME]`)."""

    argv: tuple[str, ...] = ()
    """The command; `{prompt}`, `{plan}`, `{worktree}`, `{job_id}` in an argument are replaced (never a shell),
    and an argument that is exactly `{paths}` becomes one argument per claimed file that exists at the base."""
    pass_env: tuple[str, ...] = ()
    """Variables of the daemon's environment the command may see beyond the basic ones (PATH, HOME, ...)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Fixed values the command gets whatever the daemon's environment says (placeholders as in `argv`)."""
    scratch_home: bool = False
    """Give each job its own HOME (a copy of `home_files`), for CLIs whose config breaks under concurrency."""
    home_files: tuple[str, ...] = ()
    """Entries of the real HOME copied into a scratch HOME: what the CLI needs to sign in, not its history."""
    ignore: tuple[str, ...] = ()
    """Globs (on the path and its base name) of the CLI's own side files: new ones never land."""
    output: str = ""
    """How to read the CLI's output: "claude-json" (Claude Code's `--output-format json`: cost, session)."""
    rate_limits: str = ""
    """How the CLI says its model API limited it: a sign set of `runners.ratelimit.SIGNS` ("claude-code",
    "aider", "codex"), read where that CLI prints it. "": none, its output never rests a job as rate-limited."""
    plan_argv: tuple[str, ...] = ()
    """A read-only plan command (`plan.planner = "cli"`): given the planning prompt as `{prompt}`."""
    resume_argv: tuple[str, ...] = ()
    """How the CLI goes on with its last session in the same worktree, told `{feedback}` (review feedback, or
    that a rate limit is over). Empty: `argv` runs again with the feedback after the job's text in `{prompt}`."""
    timeout: float = 0.0
    """Seconds the command may take (0: `jobs.timeout`)."""
    terminal: str = "auto"
    """Where the command runs: "tmux" in a terminal of the job's own that `orchestrator attach ID` joins (a person
    sees the CLI as it draws itself and can type to it); "auto": tmux when it is installed; "none": its output on
    a pipe, nothing to attach to."""
    mcp: str = ""
    """How the CLI is told of the job's MCP server (`orchestrator mcp`: the paths other running jobs hold, its
    claim grown before it writes), written into its scratch HOME: "claude-code" (its user config and settings),
    "codex" (`[mcp_servers]` in its config.toml). "": not told."""


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


_QUIET_CLAUDE_CODE = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",  # no telemetry, error reports or update checks
    "DISABLE_AUTOUPDATER": "1",
}

PROFILES: Mapping[str, RunnerTemplate] = {
    "claude-code": RunnerTemplate(
        argv=("claude", "-p", "{prompt}", "--permission-mode", "acceptEdits", "--output-format", "json"),
        pass_env=_words(
            "ANTHROPIC_API_KEY ANTHROPIC_AUTH_TOKEN ANTHROPIC_BASE_URL ANTHROPIC_MODEL ANTHROPIC_SMALL_FAST_MODEL "
            "ANTHROPIC_CUSTOM_HEADERS CLAUDE_CODE_* HTTPS_PROXY HTTP_PROXY NO_PROXY"
        ),
        env=_QUIET_CLAUDE_CODE,
        scratch_home=True,
        home_files=(".claude/.credentials.json",),
        output="claude-json",
        rate_limits="claude-code",
        mcp="claude-code",
        plan_argv=("claude", "-p", "{prompt}", "--permission-mode", "plan", "--output-format", "json"),
        resume_argv=_words("claude -p {feedback} --continue --permission-mode acceptEdits --output-format json"),
    ),
    "aider": RunnerTemplate(
        argv=_words(
            "aider --yes-always --no-auto-commits --no-gitignore --map-tokens 0 --no-check-update --analytics-disable "
            "--no-show-model-warnings --no-pretty --no-fancy-input --chat-history-file /dev/null "
            "--input-history-file /dev/null --message {prompt} {paths}"
        ),
        pass_env=_words(
            "OPENAI_API_KEY OPENAI_API_BASE ANTHROPIC_API_KEY GEMINI_API_KEY OPENROUTER_API_KEY DEEPSEEK_API_KEY "
            "AIDER_* HTTPS_PROXY HTTP_PROXY NO_PROXY"
        ),
        env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"},  # litellm's price list from the package, not the web
        scratch_home=True,
        home_files=(".aider.conf.yml", ".aider.model.settings.yml", ".aider.model.metadata.json"),
        ignore=(".aider*",),
        rate_limits="aider",
    ),
    "codex": RunnerTemplate(
        # Its own sandbox (bubblewrap) cannot start inside the daemon's: the daemon's confines it (`jobs.sandbox`).
        # No plugin or app sync with the network; its retry warnings on (a 429's wait is in them: `ratelimit`).
        argv=_words(
            "codex exec -c sandbox_mode=danger-full-access --disable plugins --disable apps --skip-git-repo-check "
            "{prompt}"
        ),
        resume_argv=_words(
            "codex exec resume --last -c sandbox_mode=danger-full-access --disable plugins --disable apps "
            "--skip-git-repo-check {feedback}"
        ),
        pass_env=("OPENAI_API_KEY", "CODEX_API_KEY", "HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY"),
        env={"RUST_LOG": "codex_core::responses_retry=warn"},
        scratch_home=True,
        home_files=(".codex/auth.json", ".codex/config.toml"),
        rate_limits="codex",
        mcp="codex",
    ),
}
"""Agent CLIs that work as shipped (`--runner claude-code`); `[runners.NAME]` changes a profile key by key."""

OUTPUTS = ("", "claude-json")
TERMINALS = ("auto", "tmux", "none")

MCP_STYLES = ("claude-code", "codex")
"""How an agent CLI is told of its job's MCP server (`[runners.NAME] mcp`): the CLIs whose config is known."""
RATE_LIMIT_SIGNS = ("claude-code", "aider", "codex")
"""The agent CLIs whose printed signs of a rate limit are known (`[runners.NAME] rate_limits`); each is one of
`runners.ratelimit.SIGNS` (the names are the config's, so loading it needs no runner)."""

PUBLISH = ("push",)
"""How a landing may reach a team's shared remote (`[team] publish`); each is one of `git.remote.PUBLISHERS`."""


@dataclass(frozen=True)
class OllamaConfig:
    host: str = "http://127.0.0.1:11434"
    parallel: int = 1
    model: str = "hermes3"
    max_queue: int = 256
    """Calls waiting at the gate beyond this are answered "busy, retry after" at once."""
    turn_slots: int = 0
    """Chat turns answered at once (0: one per slot); fewer for a server whose batched decoding does not pay."""
    first_token_timeout: float = 120.0
    total_timeout: float = 600.0


@dataclass(frozen=True)
class ChatConfig:
    policy: str = "gate"
    """`gate` (turns hold a slot, extraction deferred) or `naive` (every call straight to the server)."""
    extract_every: int = 3
    """Turns of one session coalesced into one memory-extraction call."""
    extract_idle: float = 30.0
    """Seconds of quiet in a session after which its pending extraction runs."""
    history: int = 12
    """Messages of the session's history in each prompt."""
    classify: str = "rules"
    """When the model classifies a turn the local rules cannot: `model` (always, before the reply: the seed's
    order), `idle` (only while no other turn waits for the server), `rules` (never: the reply starts at once)."""


@dataclass(frozen=True)
class AnthropicConfig:
    base_url: str = ""
    model: str = "claude-sonnet-4-5"
    """The model coding agents use."""
    plan_model: str = "claude-haiku-4-5"
    """A small, fast model for the pre-plan pass."""
    concurrency: int = 4
    """Claude calls in flight at once, planning and agents together (one bound for the whole daemon)."""
    timeout: float = 120.0
    """Seconds one request may take before it counts as failed (and is retried)."""
    max_retries: int = 5
    """Retries of a transient failure (429, 529, 5xx, connection, timeout) before the call gives up."""
    max_retry_wait: float = 60.0
    """Longest single wait between retries, whatever `retry-after` asks for."""
    api_key: Secret = field(default_factory=lambda: Secret(""))


@dataclass(frozen=True)
class PlanConfig:
    planner: str = "auto"
    """"auto" (a model when one is configured and reachable, else local evidence), "local", "claude", "ollama"."""
    concurrency: int = 4
    """Plans running at once (planning is read-only; this bounds threads and model calls)."""
    deadline: float = 60.0
    """Seconds a plan may take; after it the job goes on with what local evidence gave."""
    prompt_tokens: int = 6000
    """Budget for the file list and snippets in a model's planning prompt."""
    calibrate_after: int = 5
    """Ended jobs with a confident predicted claim a repo needs before its threshold may be raised."""
    risk: float = 0.12
    """The highest estimated chance that two jobs make a conflict the landing cannot merge (they touch a common
    path, and that meeting would not merge) for them to run side by side (0: judge local evidence by
    confidence, as `jobs.min_confidence` does; an estimate that cannot be made runs alone)."""
    cli: str = "claude-code"
    """With `planner = "cli"`: the runner whose read-only `plan_argv` plans (an agent CLI's plan mode)."""


@dataclass(frozen=True)
class DaemonConfig:
    shutdown_timeout: float = 10.0
    header_timeout: float = 10.0
    """Seconds a connection to the API socket has to send a request's headers (after it opens, or after its
    previous answer): a client that trickles them is cut off, as is one that stays idle that long."""
    max_connections: int = 256
    """Connections the API socket serves at once; more are closed at once."""


@dataclass(frozen=True)
class StoreConfig:
    url: str = ""
    """Empty: the embedded SQLite file in the state dir. `postgresql://user@host/db`: a PostgreSQL database that
    several daemons (a team's nodes) share; its password comes from PGPASSWORD or ~/.pgpass, never this file."""


@dataclass(frozen=True)
class TeamConfig:
    """This daemon as a node of a team sharing one PostgreSQL store (see `orchestrator.team`)."""

    node: str = ""
    """The node's name in the team (empty: the host name). Unique per daemon sharing the store."""
    labels: tuple[str, ...] = ()
    """What this node offers; a job pinned with `--label X` runs only on a node that has label X."""
    lease: float = 30.0
    """Seconds the node's hold on its jobs lasts without a renewal; after it another node takes them over."""
    publish: str = "push"
    """How a landing reaches the shared remote (`push`: a push with --force-with-lease as the compare-and-swap)."""
    follow: bool = False
    """After a landing, fast-forward this node's own clone's branch too (its checkout, when that is clean)."""
    git_timeout: float = 120.0
    """Seconds one fetch or push to the shared remote may take."""
    start_wait: float = 60.0
    """Seconds a node that starts before its PostgreSQL waits for it (asking again after 1, 2, 4 … 15 s) before it
    exits 75 for the service manager to start it again: a bounded back-off, below the unit's start limit."""

    def node_name(self) -> str:
        return self.node or _host_name()


def _host_name() -> str:
    import socket

    return socket.gethostname().split(".")[0] or "node"


@dataclass(frozen=True)
class Config:
    jobs: JobsConfig = field(default_factory=JobsConfig)
    ollama: OllamaConfig = field(default_factory=OllamaConfig)
    anthropic: AnthropicConfig = field(default_factory=AnthropicConfig)
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)
    chat: ChatConfig = field(default_factory=ChatConfig)
    repos: Mapping[str, RepoConfig] = field(default_factory=dict)
    agent: AgentConfig = field(default_factory=AgentConfig)
    runners: Mapping[str, RunnerTemplate] = field(default_factory=lambda: dict(PROFILES))
    """Command runners by name: the shipped `PROFILES`, changed or joined by `[runners.NAME]`."""
    store: StoreConfig = field(default_factory=StoreConfig)
    team: TeamConfig = field(default_factory=TeamConfig)

    def repo(self, path: str) -> RepoConfig:
        return self.repos.get(path, RepoConfig())

    def mergeable(self, repo: str) -> tuple[str, ...]:
        """Path patterns union-merged in `repo` (changelogs): `jobs.mergeable` and the repo's own."""
        return (*self.jobs.mergeable, *self.repo(repo).mergeable)

    def land_style(self, repo: str) -> str:
        """`merge`, `rebase` or `squash` for jobs of `repo` (the repo's setting, else `jobs.land_style`)."""
        return self.repo(repo).land_style or self.jobs.land_style

    def land_mode(self, repo: str) -> str:
        """`auto` or `review` for jobs of `repo` (the repo's setting, else `jobs.land`)."""
        return self.repo(repo).land or self.jobs.land

    def policy(self) -> Policy:
        j = self.jobs
        return Policy(
            max_concurrent=j.max_concurrent,
            per_repo=j.per_repo,
            min_confidence=j.min_confidence,
            mergeable=j.mergeable,
            barriers=j.barriers,
            risk=self.plan.risk,
        )


DEFAULT_TOML = """\
# orchestrator config. Every key is optional; these are the defaults.

[jobs]
max_concurrent = 2        # active jobs across all repos (env MAX_CONCURRENT_JOBS)
per_repo = 4              # active jobs in one repo
min_confidence = 0.5      # a claim below this runs alone in its repo
# Union-mergeable files (changelogs): never an overlap, merged line-wise on landing. [] turns it off.
mergeable = [
  "CHANGES*", "CHANGELOG*", "NEWS*", "HISTORY*", "RELEASE[-_]NOTES*",
  "[Cc]hange[Ll]og.md", "[Cc]hange[Ll]og.rst", "change_log.md", "changes.md", "changes.rst",
  "history.md", "history.rst", "news.md", "news.rst", "release[-_]notes.md", "release[-_]notes.rst",
]
# Barrier paths: a job that claims or touches one runs alone in its repo.
# e.g. ["uv.lock", "poetry.lock", "package-lock.json", ".github/workflows/*"]
barriers = []
retry_on_conflict = true  # re-queue a conflicted landing on the new head
max_attempts = 3
timeout = 3600            # seconds a runner may take
warm_worktrees = 2        # pooled worktrees per repo (raised to min(per_repo, max_concurrent))
default_runner = "shell"
# A text in words queued with no --runner ("Fix the docstring of echo") goes to this agent when a job can run it:
# claude-code | codex | aider | claude | a [runners.NAME]. "" refuses such a text, saying which --runner to give.
agent = ""
# Run when a job ends: an argv (no shell); words may name {id} {state} {repo} {repo_name} {branch} {code}
# {reason} {subject} {summary}; the same values are in its environment (ORCHESTRATOR_JOB_ID, ...).
# on_end = ["notify-send", "orchestrator", "{summary}"]
log_max_bytes = 52428800  # a job's log stops growing here (the log says so)
kill_grace = 5            # seconds between SIGTERM and SIGKILL for a job on timeout or daemon stop
requeue_interrupted = false  # on start, re-queue jobs a stopped daemon interrupted (runners safe to re-run)
sandbox = "auto"          # auto | bwrap | none: bubblewrap for shell and command jobs (env ORCHESTRATOR_SANDBOX)
land = "auto"             # auto | review: review holds finished jobs `ready` for `orchestrator land ID`
land_style = "merge"      # merge | rebase (linear: no merge commits) | squash (one commit per job)
rate_limit_wait = 60      # a rate-limited job's first wait when the API names no time (doubles each time)
rate_limit_max_wait = 3600  # the longest one wait, whatever the API asks
rate_limit_waits = 5      # waits per job; limited once more, it fails (code RateLimited)
max_tracked_paths = 10000  # a running job's touched paths listed at most; past that it claims the whole repo
max_bytes = 21474836480   # disk one running job's workspace and scratch dirs may take (20 GiB); past it: TooBig
min_free_bytes = 268435456  # free room kept on a running job's disk (256 MiB); under it jobs stop: NoSpace
max_result_bytes = 268435456  # bytes a job's result may add to your repository (256 MiB); past it: TooBig
pids_max = 1024           # processes and threads one command of a job may have (its cgroup's pids.max; 0: none)
memory_max = 0            # bytes one command of a job may use (its cgroup's memory.max); 0: half the machine's RAM

[ollama]
host = "http://127.0.0.1:11434"   # env OLLAMA_HOST
parallel = 1                       # match the server's OLLAMA_NUM_PARALLEL
model = "hermes3"
max_queue = 256                    # gate queue bound per class (turns, background): past it, "busy, retry after N s"
turn_slots = 0                     # turns answered at once (0: one per slot; bench chat --turn-slots 1 tells)
first_token_timeout = 120
total_timeout = 600

[chat]
policy = "gate"           # or "naive": every call straight to the server (for comparison)
extract_every = 3         # turns per memory-extraction call
extract_idle = 30         # seconds of quiet before a session's pending extraction runs
history = 12              # messages of history in each prompt
classify = "rules"        # rules | idle | model: when the model classifies what the local rules cannot

[anthropic]
model = "claude-sonnet-4-5"        # coding agents; key from env ANTHROPIC_API_KEY only
plan_model = "claude-haiku-4-5"    # the pre-plan pass
concurrency = 4                    # Claude calls in flight at once, planning and agents together
timeout = 120                      # seconds per request
max_retries = 5                    # transient errors (429, 529, 5xx, connection) retried with backoff
max_retry_wait = 60                # cap on one wait, whatever retry-after says

[daemon]
shutdown_timeout = 10
header_timeout = 10       # seconds an API connection has to send a request's headers (then it is closed)
max_connections = 256     # API connections served at once

[plan]
planner = "auto"          # auto | local | claude | ollama | cli (auto: a configured model, else local evidence)
concurrency = 4           # plans at once
deadline = 60             # seconds; then the job goes on with local evidence
prompt_tokens = 6000      # file list and snippets in a model's planning prompt
calibrate_after = 5       # ended confident jobs before a repo's threshold may rise
risk = 0.12               # two jobs run side by side when the chance of a conflict that will not merge is at most this
cli = "claude-code"       # planner = "cli": the runner whose read-only plan_argv plans (Claude Code's plan mode)

[agent]                   # the built-in `claude` runner's budgets, per job (model: anthropic.model)
max_turns = 60
max_tokens = 2000000      # input + output + cache tokens across the job
max_seconds = 1800
response_tokens = 8192
run_timeout = 300         # its `run` tool, per command
output_cap = 20000        # characters of tool output the model sees

[store]
url = ""                  # "": SQLite in the state dir; "postgresql://user@host/db": shared by a team's daemons
                          # (pip install -e '.[team]' in the checkout; the password from PGPASSWORD in the
                          # env file, or ~/.pgpass: never in this file)

[team]                    # with a PostgreSQL store: this daemon as one node of the team
node = ""                 # its name (default: the host name)
labels = []               # what it offers; `enqueue --label X` runs a job only on nodes with label X
lease = 30                # seconds its hold on its jobs lasts unrenewed; then other nodes take them over
publish = "push"          # landing onto the shared remote: a push with --force-with-lease as the compare-and-swap
follow = false            # also fast-forward this node's own clone (and its clean checkout) after a landing
git_timeout = 120         # seconds one fetch or push may take
start_wait = 60           # seconds a start waits for PostgreSQL (retrying) before it exits 75 to be restarted

# Agent CLIs as `command` runners (`--runner NAME`). Three profiles are shipped and work as they are:
# `claude-code`, `aider` and `codex` (`orchestrator runners` lists them and what each still lacks here).
# The prompt is ONE argument, never through a shell; only the variables in pass_env (plus PATH, HOME, LANG,
# ...) and the fixed `env` values reach the command. A [runners.NAME] table of a profile's name changes
# just the keys it gives (`env` is merged); any other name is a runner of its own, e.g.:
# [runners.claude-code]
# env = { ANTHROPIC_MODEL = "claude-sonnet-4-5" }   # added to the profile's fixed values
#
# [runners.aider]
# env = { AIDER_MODEL = "openai/gpt-4o-mini" }       # or pass AIDER_* from the daemon's environment
#
# [runners.my-cli]
# argv = ["my-cli", "--message", "{prompt}", "{paths}"]  # {paths}: the claimed files that exist, one argument each
# pass_env = ["MY_CLI_API_KEY"]             # names or patterns (MY_CLI_*) taken from the daemon's environment
# env = { MY_CLI_TELEMETRY = "off" }        # fixed values ({job_id}, {worktree} replaced)
# scratch_home = true                      # a HOME of its own per job ...
# home_files = [".my-cli/auth.json"]       # ... with copies of these (what it needs to sign in)
# ignore = [".my-cli-cache*"]              # its side files: new ones never land
# rate_limits = "claude-code"              # a profile's signs of a rate limit in its output ("": none, the default)
# mcp = "claude-code"                      # tell it of the job's MCP server (claude-code or codex config; "": none)
# resume_argv = ["my-cli", "--continue", "--message", "{feedback}"]  # goes on with its session (`revise`)
# timeout = 1800                           # seconds (0: jobs.timeout)
# terminal = "auto"                        # in a tmux of the job's own (`orchestrator attach ID`) when tmux is
#                                          # installed; "tmux" requires it, "none": output on a pipe only

# Per repository (its absolute path):
# [repos."/home/me/src/project"]
# check = "pytest -q"      # run on the merged result before the branch moves
# check_timeout = 900
# mergeable = ["docs/changelog/*"]   # more union-mergeable files for this repo
# land = "review"          # hold finished jobs for `orchestrator diff` / `land` / `reject`
# land_style = "rebase"   # this repo's own: "merge", "rebase" (replayed: linear) or "squash" (one commit per job)
"""


def _coerce(key: str, value: Any, typ: Any) -> Any:
    origin = getattr(typ, "__origin__", None)
    if typ is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if typ is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if typ is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if typ in (str, Secret):
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return typ(value)
    if origin is Mapping:
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise ConfigError(f'{key}: expected a table of strings, e.g. {{ NAME = "value" }}, got {value!r}')
        return dict(value)
    if origin is tuple:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{key}: expected a list of strings, got {value!r}")
        return tuple(value)
    raise ConfigError(f"{key}: unsupported setting")  # pragma: no cover - schema bug


def _section(cls: type[Any], prefix: str, data: Any) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix}: expected a table, got {data!r}")
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in names:
            raise ConfigError(f"{prefix}.{key}: unknown key (known: {', '.join(sorted(names))})")
        kwargs[key] = _coerce(f"{prefix}.{key}", value, hints[key])
    return cls(**kwargs)


def _validate(cfg: Config) -> None:
    """Every section's checks, in order: the first setting that is wrong raises a ConfigError naming it."""
    for check in CHECKS:
        check(cfg)


def _check_jobs(cfg: Config) -> None:
    if cfg.jobs.max_concurrent < 1:
        raise ConfigError("jobs.max_concurrent: must be at least 1")
    if cfg.jobs.per_repo < 1:
        raise ConfigError("jobs.per_repo: must be at least 1")
    if not 0.0 <= cfg.jobs.min_confidence <= 1.0:
        raise ConfigError("jobs.min_confidence: must be between 0 and 1")
    if cfg.jobs.max_attempts < 1:
        raise ConfigError("jobs.max_attempts: must be at least 1")
    if cfg.jobs.timeout <= 0:
        raise ConfigError("jobs.timeout: must be positive")
    known = sorted({*BUILTIN_RUNNERS, *cfg.runners})
    if cfg.jobs.default_runner not in known:
        raise ConfigError(
            f"jobs.default_runner: {cfg.jobs.default_runner!r} is no runner; use one of {', '.join(known)} "
            "(or define it as [runners.NAME])"
        )
    if cfg.jobs.agent and (cfg.jobs.agent not in known or cfg.jobs.agent in ("shell", "replay")):
        agents = ", ".join(n for n in known if n not in ("shell", "replay"))
        raise ConfigError(f"jobs.agent: {cfg.jobs.agent!r} is no agent; use one of {agents} (or define [runners.NAME])")
    if cfg.jobs.on_end:
        try:
            on_end.check(cfg.jobs.on_end)
        except on_end.TemplateError as e:
            raise ConfigError(f"jobs.{e}") from None
    if cfg.jobs.land_style not in LAND_STYLES:
        raise ConfigError(f"jobs.land_style: {cfg.jobs.land_style!r} is not one of {', '.join(LAND_STYLES)}")
    if cfg.jobs.log_max_bytes < 4096:
        raise ConfigError("jobs.log_max_bytes: must be at least 4096")
    if cfg.jobs.kill_grace < 0:
        raise ConfigError("jobs.kill_grace: must not be negative")
    if cfg.jobs.max_tracked_paths < 1:
        raise ConfigError("jobs.max_tracked_paths: must be at least 1")
    for name in ("max_bytes", "min_free_bytes", "max_result_bytes", "pids_max", "memory_max"):
        if getattr(cfg.jobs, name) < 0:
            raise ConfigError(f"jobs.{name}: must be 0 (no limit) or a number of bytes")
    if not (cfg.jobs.rate_limit_wait > 0 and cfg.jobs.rate_limit_max_wait > 0):
        raise ConfigError("jobs.rate_limit_wait, jobs.rate_limit_max_wait: must be positive (seconds)")
    if cfg.jobs.rate_limit_waits < 0:
        raise ConfigError("jobs.rate_limit_waits: must be 0 or more")
    if cfg.jobs.sandbox not in ("auto", "bwrap", "none"):
        raise ConfigError(f"jobs.sandbox: {cfg.jobs.sandbox!r}; use auto, bwrap or none")


def _check_daemon(cfg: Config) -> None:
    if cfg.daemon.shutdown_timeout < 0:
        raise ConfigError("daemon.shutdown_timeout: must not be negative")
    if cfg.daemon.header_timeout <= 0:
        raise ConfigError("daemon.header_timeout: must be positive")
    if cfg.daemon.max_connections < 1:
        raise ConfigError("daemon.max_connections: must be at least 1")


def _check_repos(cfg: Config) -> None:
    for path, rc in cfg.repos.items():
        if rc.land_style and rc.land_style not in LAND_STYLES:
            raise ConfigError(f'repos."{path}".land_style: {rc.land_style!r} is not one of {", ".join(LAND_STYLES)}')
        if rc.check_timeout <= 0:
            raise ConfigError(f'repos."{path}".check_timeout: must be positive (seconds the landing check may take)')
    for key, land in [("jobs.land", cfg.jobs.land), *((f'repos."{p}".land', r.land) for p, r in cfg.repos.items())]:
        if land not in ("auto", "review") and not (land == "" and key != "jobs.land"):
            raise ConfigError(f"{key}: {land!r}; use auto or review")


def _check_models(cfg: Config) -> None:
    """The model servers, the planner and the chat plane."""
    if cfg.ollama.parallel < 1:
        raise ConfigError("ollama.parallel: must be at least 1")
    if not 0 <= cfg.ollama.turn_slots <= cfg.ollama.parallel:
        raise ConfigError(
            f"ollama.turn_slots: between 0 (one turn per slot) and parallel ({cfg.ollama.parallel}), "
            f"got {cfg.ollama.turn_slots}"
        )
    if cfg.plan.planner not in ("auto", "local", "claude", "ollama", "cli"):
        raise ConfigError(
            f"plan.planner: unknown planner {cfg.plan.planner!r} (use auto, local, claude, ollama or cli)"
        )
    if cfg.plan.planner == "cli" and not getattr(cfg.runners.get(cfg.plan.cli), "plan_argv", ()):
        raise ConfigError(f"plan.cli: runner {cfg.plan.cli!r} has no plan_argv (claude-code has one)")
    if cfg.plan.concurrency < 1:
        raise ConfigError("plan.concurrency: must be at least 1")
    if cfg.plan.deadline <= 0:
        raise ConfigError("plan.deadline: must be positive")
    if not 0 <= cfg.plan.risk < 1:
        raise ConfigError("plan.risk: must be a probability from 0 (strict) up to, not including, 1 (e.g. 0.08)")
    if cfg.chat.policy not in ("gate", "naive"):
        raise ConfigError(f"chat.policy: expected 'gate' or 'naive', got {cfg.chat.policy!r}")
    if cfg.chat.classify not in ("model", "idle", "rules"):
        raise ConfigError(f"chat.classify: expected 'model', 'idle' or 'rules', got {cfg.chat.classify!r}")
    if cfg.anthropic.concurrency < 1:
        raise ConfigError("anthropic.concurrency: must be at least 1")
    if cfg.anthropic.timeout <= 0:
        raise ConfigError("anthropic.timeout: must be positive")
    if cfg.anthropic.max_retries < 0:
        raise ConfigError("anthropic.max_retries: must be 0 or more")


def _check_team(cfg: Config) -> None:
    _validate_team(cfg.store, cfg.team)


def _check_runners(cfg: Config) -> None:
    for name, t in cfg.runners.items():
        if not t.argv or not t.argv[0]:
            raise ConfigError(f'runners.{name}.argv: name the command, e.g. ["claude", "-p", "{{prompt}}"]')
        if name in BUILTIN_RUNNERS:
            raise ConfigError(f"runners.{name}: {name!r} is a built-in runner; give the template another name")
        if t.output not in OUTPUTS:
            raise ConfigError(f"runners.{name}.output: {t.output!r}; use one of {', '.join(map(repr, OUTPUTS))}")
        if t.terminal not in TERMINALS:
            raise ConfigError(f"runners.{name}.terminal: {t.terminal!r}; use one of {', '.join(TERMINALS)}")
        if t.mcp and t.mcp not in MCP_STYLES:
            raise ConfigError(f'runners.{name}.mcp: {t.mcp!r}; use one of {", ".join(map(repr, MCP_STYLES))} or ""')
        if t.mcp and not t.scratch_home:
            raise ConfigError(f"runners.{name}.mcp: the MCP server is written into a scratch HOME: set scratch_home")
        if t.rate_limits and t.rate_limits not in RATE_LIMIT_SIGNS:
            raise ConfigError(
                f"runners.{name}.rate_limits: {t.rate_limits!r}; use one of {', '.join(map(repr, RATE_LIMIT_SIGNS))}"
            )


CHECKS: tuple[Callable[[Config], None], ...] = (
    _check_jobs, _check_daemon, _check_repos, _check_models, _check_team, _check_runners,
)  # fmt: skip
"""The config's checks, by section; each reads only the config (the layers it configures are not imported)."""


def _runner(name: str, data: Any) -> RunnerTemplate:
    """`[runners.NAME]`: a template of its own, or a shipped profile with the keys it gives changed (`env`
    merged into the profile's)."""
    given = _section(RunnerTemplate, f"runners.{name}", data)
    base = PROFILES.get(name)
    if base is None:
        return given
    changed = {k: getattr(given, k) for k in data}
    if "env" in changed:
        changed["env"] = {**base.env, **changed["env"]}
    return dataclasses.replace(base, **changed)


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def _abstract_sockets(parts: SplitResult) -> list[str]:
    """The hosts of a store URL that name an abstract UNIX socket (`@name`, in its host part or its `host=`)."""
    hosts = [unquote(h) for h in parts.netloc.rpartition("@")[2].split(",")]
    hosts += [h for k, v in parse_qsl(parts.query, keep_blank_values=True) if k == "host" for h in v.split(",")]
    return [h for h in hosts if h.startswith("@")]


def _validate_team(store: StoreConfig, team: TeamConfig) -> None:
    if store.url:
        parts = urlsplit(store.url)
        if parts.scheme not in ("postgresql", "postgres"):
            raise ConfigError(
                f"store.url: {parts.scheme or store.url!r} is not a database this store knows; use "
                '"postgresql://user@host/db" (or "" for the embedded SQLite file)'
            )
        if parts.password:
            raise ConfigError(
                "store.url: keep the password out of the config file; put PGPASSWORD in the env file beside it, "
                "or use ~/.pgpass, and write the URL without it"
            )
        if abstract := _abstract_sockets(parts):
            raise ConfigError(
                f"store.url: {abstract[0]!r} is an abstract UNIX socket, which every job reaches (it shares the "
                "machine's network) and the sandbox cannot hide; give the server a socket dir (unix_socket_directories"
                " = '/run/postgresql') and name that dir (host=/run/postgresql)"
            )
    if not _NAME.fullmatch(team.node_name()):
        raise ConfigError(f"team.node: {team.node_name()!r}: a node's name is 1–63 letters, digits, '.', '_' or '-'")
    for label in team.labels:
        if not _NAME.fullmatch(label):
            raise ConfigError(f"team.labels: {label!r}: a label is 1–63 letters, digits, '.', '_' or '-'")
    if team.lease < 2:
        raise ConfigError("team.lease: must be at least 2 seconds (nodes renew it every third of it)")
    if team.git_timeout <= 0:
        raise ConfigError("team.git_timeout: must be positive")
    if team.start_wait < 0:
        raise ConfigError("team.start_wait: must be 0 (exit at once) or more seconds")
    if team.publish not in PUBLISH:
        raise ConfigError(f"team.publish: {team.publish!r}; use one of {', '.join(PUBLISH)}")


def parse(data: Mapping[str, Any], env: Mapping[str, str]) -> Config:
    """Build a `Config` from parsed TOML and environment overrides."""
    sections = {
        "jobs": JobsConfig, "ollama": OllamaConfig, "anthropic": AnthropicConfig, "daemon": DaemonConfig,
        "chat": ChatConfig, "plan": PlanConfig, "agent": AgentConfig, "store": StoreConfig, "team": TeamConfig,
    }  # fmt: skip
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key == "repos":
            if not isinstance(value, dict):
                raise ConfigError("repos: expected a table of repository paths")
            kwargs["repos"] = {
                str(Path(p).expanduser().resolve()): _section(RepoConfig, f'repos."{p}"', v) for p, v in value.items()
            }
        elif key == "runners":
            if not isinstance(value, dict):
                raise ConfigError("runners: expected tables [runners.NAME] with argv = [...]")
            kwargs["runners"] = {n: _runner(n, v) for n, v in value.items()}
        elif key in sections:
            if key == "anthropic" and isinstance(value, dict) and "api_key" in value:
                raise ConfigError("anthropic.api_key: keep secrets out of the config file; set ANTHROPIC_API_KEY")
            kwargs[key] = _section(sections[key], key, value)
        else:
            raise ConfigError(f"{key}: unknown section (known: {', '.join(sorted([*sections, 'repos', 'runners']))})")
    kwargs["runners"] = {**PROFILES, **kwargs.get("runners", {})}
    cfg = Config(**kwargs)
    cfg = _apply_env(cfg, env)
    _validate(cfg)
    return cfg


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}: expected an integer, got {raw!r}") from None


def _apply_env(cfg: Config, env: Mapping[str, str]) -> Config:
    jobs, ollama, anthropic = cfg.jobs, cfg.ollama, cfg.anthropic
    if (n := _env_int(env, "MAX_CONCURRENT_JOBS")) is not None:
        jobs = dataclasses.replace(jobs, max_concurrent=n)
    if host := env.get("OLLAMA_HOST"):
        ollama = dataclasses.replace(ollama, host=host if "://" in host else f"http://{host}")
    if (n := _env_int(env, "OLLAMA_NUM_PARALLEL")) is not None:
        ollama = dataclasses.replace(ollama, parallel=n)
    if key := env.get("ANTHROPIC_API_KEY"):
        anthropic = dataclasses.replace(anthropic, api_key=Secret(key))
    if url := env.get("ANTHROPIC_BASE_URL"):
        anthropic = dataclasses.replace(anthropic, base_url=url)
    if sandbox := env.get("ORCHESTRATOR_SANDBOX"):
        jobs = dataclasses.replace(jobs, sandbox=sandbox)
    return dataclasses.replace(cfg, jobs=jobs, ollama=ollama, anthropic=anthropic)


def stamp(path: Path) -> list[int] | None:
    """What tells one version of the config file from another: [mtime_ns, size], or None when it is absent.

    Taken before the file is read, so a daemon whose stamp differs from the file's has not read what the
    file now says."""
    try:
        st = path.stat()
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_size]


def trusted(path: Path) -> None:
    """Raise ConfigError when another user could have written the config file `path`, its dir (or one above)
    or the env file beside it (which must not be readable by others either): its settings name commands the
    daemon runs (`on_end`, `check`, runners) and whether jobs are confined, so only its owner may set them."""
    from orchestrator.paths import unsafe

    for p, secret in ((path.parent, False), (path, False), (path.with_name("env"), True)):
        if not os.path.lexists(p):
            continue
        try:
            problem = unsafe(p, secret=secret)
        except OSError as e:
            problem = f"{p}: cannot check who may write it ({e.strerror}): fix its permissions or move it aside"
        if problem is not None:
            raise ConfigError(f"refused: {problem}")


def load(path: Path, env: Mapping[str, str] | None = None) -> Config:
    """Read `path` (missing means all defaults) and apply the environment; a file another user could have
    written is refused unread (`trusted`)."""
    env = os.environ if env is None else env
    trusted(path)
    data: dict[str, Any] = {}
    if path.exists() or path.is_symlink():
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: not valid TOML: {e}") from None
        except UnicodeDecodeError as e:
            raise ConfigError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start}): save it as UTF-8") from None
        except IsADirectoryError:
            raise ConfigError(f"{path}: is a directory, not a file: move it aside and write the config there") from None
        except OSError as e:
            raise ConfigError(f"{path}: cannot be read ({e.strerror}): fix its permissions or move it aside") from None
    try:
        return parse(data, env)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
