"""`orchestrator doctor`: every part a working setup needs, each line ok or what to do.

Levels: `ok`; `warn` (works without it, with less: no chat without Ollama, no Claude runner without a
key, no sandbox without bubblewrap, no boot start without linger, no agent CLI); `fail` (something is wrong:
exit 1, e.g. an agent CLI installed where a job's sandbox cannot see it).
In team mode also the shared PostgreSQL (reachable, the role's rights, the schema) and bubblewrap is a must.
Secrets are checked for presence only and never printed.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from orchestrator import config, paths
from orchestrator.client import ApiError, Client, Unreachable
from orchestrator.core import seal
from orchestrator.proc import visible
from orchestrator.runners import mcp, mcp_sight
from orchestrator.service import hooks, manager, spool, unit

OK, WARN, FAIL = "ok", "warn", "fail"


@dataclass(frozen=True)
class Check:
    name: str
    level: str
    detail: str

    def to_json(self) -> dict[str, str]:
        return asdict(self)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def check_config(p: paths.Paths) -> tuple[Check, config.Config | None]:
    try:
        cfg = config.load(p.config_file)
    except config.ConfigError as e:
        return Check("config", FAIL, f"{e}: fix that key (the defaults: orchestrator.config.DEFAULT_TOML)"), None
    where = p.config_file if p.config_file.exists() else "defaults (no config file)"
    return Check("config", OK, f"{where}"), cfg


def check_dirs(p: paths.Paths) -> Check:
    problems = []
    uid = os.getuid()
    for d, private in ((p.config_dir, False), (p.state_dir, True), (p.runtime_dir, True)):
        if not d.exists():
            continue  # the daemon makes them at start
        st = d.stat()
        if st.st_uid != uid:
            problems.append(f"{d} belongs to uid {st.st_uid}: chown it to yourself")
        elif private and _mode(d) & 0o077:
            problems.append(f"{d} is open to others (mode {_mode(d):o}): chmod 700 {d}")
        elif _mode(d) & 0o022:
            problems.append(f"{d} is writable by others (mode {_mode(d):o}): chmod go-w {d}")
    if p.db.exists() and _mode(p.db) & 0o077:
        problems.append(f"{p.db} is readable by others (mode {_mode(p.db):o}): chmod 600 {p.db}")
    if problems:
        return Check("dirs", FAIL, "; ".join(problems))
    return Check("dirs", OK, f"state {p.state_dir}, runtime {p.runtime_dir}: private")


def check_socket(p: paths.Paths) -> tuple[Check, Client | None]:
    c = Client(p.socket, timeout=2.0)
    try:
        h = c.health()
    except (Unreachable, ApiError, OSError) as e:
        return Check("socket", FAIL, f"{e}" if isinstance(e, Unreachable) else f"{p.socket}: {e}"), None
    return Check("socket", OK, f"daemon pid {h.get('pid')} (version {h.get('version')}) answers on {p.socket}"), c


def check_service() -> list[Check]:
    why = manager.no_user_manager()
    if why:
        return [Check("service", WARN, f"{why}; run `orchestrator daemon` under your own supervisor")]
    installed = manager.unit_path().exists()
    state = manager.systemctl("is-active", manager.SERVICE).stdout.strip() or "unknown"
    out = []
    if not installed:
        out.append(Check("service", WARN, "not installed: `orchestrator service install` runs it from login"))
    elif state != "active":
        out.append(
            Check("service", FAIL, f"{unit.NAME} is {state}: journalctl --user -u {manager.SERVICE} -n 50 -o cat")
        )
    else:
        out.append(Check("service", OK, f"{unit.NAME} active"))
    user = os.environ.get("USER") or str(os.getuid())
    linger = manager.run_tool("loginctl", "show-user", user, "--property=Linger", "--value", timeout=10).stdout.strip()
    if linger == "yes":
        out.append(Check("linger", OK, "on: the service starts at boot and outlives logout"))
    else:
        out.append(Check("linger", WARN, f"off: the service stops at logout; run: sudo loginctl enable-linger {user}"))
    return out


def known_repos(p: paths.Paths, client: Client | None) -> list[str]:
    """Repositories the hooks were installed in, and those the daemon has jobs for."""
    found: dict[str, None] = {}
    try:
        for line in (p.state_dir / "hooked-repos").read_text().splitlines():
            if line.strip():
                found[line.strip()] = None
    except FileNotFoundError:
        pass  # no hook installed yet
    if client is not None:
        try:
            for j in client.jobs():
                found[j["repo"]] = None
        except (Unreachable, ApiError, OSError):
            pass  # the socket check already said so
    return list(found)


def check_hooks(repos: list[str]) -> list[Check]:
    out = []
    for repo in repos:
        if not Path(repo).exists():
            continue
        try:
            states = hooks.status(Path(repo))
        except hooks.HookError as e:
            out.append(Check(f"hooks {repo}", WARN, str(e)))
            continue
        bad = [s for s in states if s.state == "installed" and not s.python_ok]
        missing = [s.hook for s in states if s.state != "installed"]
        if bad:
            out.append(Check(f"hooks {repo}", FAIL, bad[0].detail))
        elif missing:
            detail = states[0].detail if states[0].state == "elsewhere" else f"no {', '.join(missing)} hook"
            out.append(Check(f"hooks {repo}", WARN, f"{detail}: orchestrator hook install --repo {repo}"))
        else:
            out.append(Check(f"hooks {repo}", OK, "post-commit and post-rewrite installed"))
    return out


def check_spool(p: paths.Paths, daemon_up: bool) -> Check:
    waiting = spool.pending(p.spool)
    refused = list((p.spool / "rejected").glob("*.json")) if (p.spool / "rejected").exists() else []
    if refused:
        return Check("spool", WARN, f"{len(refused)} spooled requests were refused: see {p.spool / 'rejected'}")
    if waiting and not daemon_up:
        return Check("spool", WARN, f"{len(waiting)} requests wait in {p.spool} for the daemon to start")
    return Check("spool", OK, f"{len(waiting)} waiting")


def check_ollama(cfg: config.Config, timeout: float = 1.5) -> Check:
    url = cfg.ollama.host.rstrip("/") + "/api/tags"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            models = [m.get("name", "") for m in json.load(resp).get("models", [])]
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        return Check("ollama", WARN, f"{cfg.ollama.host} unreachable ({reason}): chat needs it; start `ollama serve`")
    want = cfg.ollama.model
    if not any(m == want or m.split(":")[0] == want for m in models):
        return Check("ollama", WARN, f"{len(models)} models, but not {want!r}: ollama pull {want}")
    return Check("ollama", OK, f"{cfg.ollama.host}: {len(models)} models, {want!r} present")


def check_claude(cfg: config.Config, env_file: Path | None = None) -> Check:
    """The Claude key: in this environment, or in the service's env file (which the daemon run by systemd reads)."""
    env_file = env_file or unit.env_file()
    in_file = bool(unit.read_env_file(env_file).get("ANTHROPIC_API_KEY"))
    if in_file and _mode(env_file) & 0o077:
        return Check("claude", WARN, f"ANTHROPIC_API_KEY is in {env_file}, which others can read: chmod 600 {env_file}")
    if in_file:
        return Check("claude", OK, f"ANTHROPIC_API_KEY is set in {env_file}, which the service reads")
    if cfg.anthropic.api_key:
        return Check(
            "claude", OK, f"ANTHROPIC_API_KEY is set in this shell (the service reads {env_file}, which lacks it)"
        )
    return Check(
        "claude",
        WARN,
        f"ANTHROPIC_API_KEY is not set: the Claude runner needs it; for the service put it in {env_file} (mode 600)",
    )


def check_bwrap(team: bool = False) -> Check:
    """bubblewrap works here. Without it a job runs unconfined: a warning on one machine, a failure in team mode,
    where an unconfined job can reach the team's store (and the daemon refuses to run jobs without it)."""
    level = FAIL if team else WARN
    why = " (team mode: an unconfined job could reach the team's store, so jobs refuse to run)" if team else ""
    exe = shutil.which("bwrap")
    if exe is None:
        return Check("bubblewrap", level, f"not installed: agents run unsandboxed{why}; apt install bubblewrap")
    probe = [exe, "--ro-bind", "/", "/", "--dev", "/dev", "--unshare-all", "true"]
    out = subprocess.run(probe, capture_output=True, text=True, timeout=10)
    if out.returncode != 0:
        return Check("bubblewrap", level, f"{exe} cannot make a sandbox here{why}: {out.stderr.strip()[:200]}")
    return Check("bubblewrap", OK, exe)


def check_runners(cfg: config.Config, p: paths.Paths) -> list[Check]:
    """Each agent CLI as a job would find it: on a job's PATH, from inside a job's sandbox (`proc.visible`). One
    that is installed but out of a job's sight fails; one not installed at all is only named."""
    named = {name: t.argv[0] for name, t in cfg.runners.items()}
    seen = visible.commands(named, cfg.jobs.sandbox, bool(cfg.store.url), (p.state_dir, p.config_dir, p.runtime_dir))
    out = [Check(f"runner {name}", FAIL, s.problem or "") for name, s in seen.items() if not s.ok and s.outside]
    told = [name for name, s in seen.items() if s.ok and cfg.runners[name].mcp]
    if told:
        out.append(check_mcp(cfg, p, told))
    ready = [f"{name} ({s.inside})" for name, s in seen.items() if s.ok]
    absent = [name for name, s in seen.items() if not s.ok and not s.outside]
    if ready:
        more = f"; not installed: {', '.join(absent)}" if absent else ""
        out.insert(0, Check("runners", OK, f"a job finds {', '.join(ready)}{more}"))
    elif not out:
        none = ", ".join(absent) or "none configured"
        out.append(Check("runners", WARN, f"no agent CLI a job can run ({none}): install Claude Code, codex or aider "
                         "for agent jobs; `orchestrator runners` lists them"))  # fmt: skip
    return out


def check_mcp(cfg: config.Config, p: paths.Paths, told: list[str]) -> Check:
    """The MCP server the runners in `told` tell their CLI of: a job can start it, from inside its sandbox, with a
    job's environment (`runners.mcp_sight`); else their jobs do not start."""
    hide = (p.state_dir, p.config_dir, p.runtime_dir)
    why = mcp_sight.asked(cfg.jobs.sandbox, bool(cfg.store.url), hide, told[0] if len(told) == 1 else "")
    if why is not None:
        return Check("mcp server", FAIL, f"{', '.join(told)}: {why}")
    return Check("mcp server", OK, f"a job starts `{' '.join(mcp.command())}` ({', '.join(told)} get claim tools)")


def check_store(cfg: config.Config, env_file: Path | None = None) -> list[Check]:
    """Team mode's PostgreSQL: reachable with the password the service gets, the role no more than a node needs,
    the schema this orchestrator's (`store.pgaudit`). Nothing in single-machine mode."""
    url = cfg.store.url
    if not url:
        return []
    from orchestrator.core.urls import shown

    env_file = env_file or unit.env_file()
    service_env = unit.read_env_file(env_file)  # its mode is the config check's (never open)
    in_file = service_env.get("PGPASSWORD")
    out: list[Check] = []
    secret = os.environ.get(seal.SECRET_ENV) or service_env.get(seal.SECRET_ENV)
    why = seal.problem(secret)
    out.append(Check("team secret", FAIL if why else OK, why or f"{seal.SECRET_ENV} is set (never printed)"))
    if cfg.jobs.sandbox == "none":
        out.append(Check("team sandbox", FAIL, 'jobs.sandbox = "none": every job runs unconfined, as you, and reaches '
                         "the team's database (its socket, PGPASSWORD in the env file), the team's secret and what "
                         'you push to the team\'s remote with; set jobs.sandbox = "auto" (bubblewrap)'))  # fmt: skip
    try:
        from orchestrator.store import pgaudit, schema

        facts = asyncio.run(pgaudit.inspect(url, password=os.environ.get("PGPASSWORD") or in_file))
    except ImportError as e:
        return [*out, Check("postgresql", FAIL, f"the driver cannot be loaded ({e}): in the orchestrator checkout, "
                            "pip install -e '.[team]'")]  # fmt: skip
    except Exception as e:  # noqa: BLE001 - any failure to connect is this check's answer, said with its cause
        return [*out, Check("postgresql", FAIL, f"cannot reach {shown(url)} as the daemon would ({type(e).__name__}: "
                            f"{e}): start the server, fix [store] url, or put PGPASSWORD in {env_file}")]  # fmt: skip
    where = "over its UNIX socket (hidden from jobs)" if _socket_only(url) else (
        "over TCP, which a job's network reaches too: it needs the password (hidden from jobs); docs/team.md says "
        "how to close the port to jobs")  # fmt: skip
    out.append(Check("postgresql", OK, f"{shown(url)} answers as {facts.role}, {where}"))
    out += [Check(name, level, detail) for name, level, detail in pgaudit.verdict(facts, len(schema.POSTGRES))]
    return out


def _socket_only(url: str) -> bool:
    from urllib.parse import parse_qsl, unquote, urlsplit

    parts = urlsplit(url)
    hosts = [unquote(h) for h in parts.netloc.rpartition("@")[2].split(",") if h]
    hosts += [h for k, v in parse_qsl(parts.query) if k == "host" for h in v.split(",")]
    return bool(hosts) and all(h.startswith("/") for h in hosts)


def run(p: paths.Paths | None = None) -> list[Check]:
    p = p or paths.resolve()
    checks: list[Check] = []
    cfg_check, cfg = check_config(p)
    checks.append(cfg_check)
    checks.append(check_dirs(p))
    sock, client = check_socket(p)
    checks.append(sock)
    checks += check_service()
    checks += check_hooks(known_repos(p, client))
    checks.append(check_spool(p, client is not None))
    team = cfg is not None and bool(cfg.store.url)
    steps: list[Callable[[], Check]] = [lambda: check_bwrap(team)]
    if cfg is not None:
        steps = [lambda: check_ollama(cfg), lambda: check_claude(cfg), *steps]
    checks += [step() for step in steps]
    if cfg is not None:
        checks += check_runners(cfg, p)
        checks += check_store(cfg)
    return checks
