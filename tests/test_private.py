"""Private by construction: what the daemon makes is its owner's alone whatever the umask, a config another
user could have written is never obeyed, and the daemon's memory (core, environ) is closed to others."""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import config, paths
from orchestrator.service import spool
from tests.harness import Daemon

OTHER = 65534
"""Another local user's uid (nobody): the kernel needs no passwd entry to run a process as it."""


@pytest.fixture
def base() -> Iterator[Path]:
    """A dir others may enter (0755, like a home dir), outside pytest's private temp root."""
    d = Path(tempfile.mkdtemp(prefix="orch-private-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def umask_000() -> Iterator[None]:
    old = os.umask(0)
    yield
    os.umask(old)


def _daemon(base: Path, home: Path, env: dict[str, str] | None = None) -> Daemon:
    d = Daemon(base / "log", env)
    d.env["ORCHESTRATOR_HOME"] = str(home)
    d.socket = home / "run" / "orchestrator.sock"
    return d


def _as_other(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), user=OTHER, group=OTHER, extra_groups=[], capture_output=True, text=True, timeout=30, cwd="/"
    )


def _modes(root: Path) -> dict[str, str]:
    """Every entry under `root` but a worktree's contents (the job's files), with its mode."""
    out: dict[str, str] = {}
    for dirpath, dirs, files in os.walk(root):
        here = Path(dirpath)
        if here.parent.name == "worktrees" or here.parent.parent.name == "worktrees":
            dirs[:] = []  # a repository's worktrees: the job's files and git's, private through the dirs above
        for name in [*dirs, *files]:
            st = os.lstat(here / name)
            out[str((here / name).relative_to(root))] = f"{stat.S_IMODE(st.st_mode):04o}"
    return out


def test_under_umask_000_everything_is_private_and_another_user_can_do_nothing(base, umask_000, make_repo):
    """A daemon started under umask 000 in a home that did not exist, running a job long enough to need a
    script file, and the git hook's spool: dirs 0700, files (DB, -wal, -shm, logs, lock, socket) 0600; and
    another local user can then write no config, spool no request, read no database or log."""
    repo = make_repo()
    home = base / "made" / "by" / "daemon"
    d = _daemon(base, home).start()
    try:
        job = d.enqueue(repo, "echo x > x.txt\n# " + "y" * 40_000, "--path", "x.txt")
        assert d.cli("wait", str(job), "--timeout", "60").returncode == 0
        spool.write(paths.resolve({"ORCHESTRATOR_HOME": str(home)}).spool, {"repo": str(repo), "tickets": []})
        modes = _modes(base / "made")
    finally:
        d.stop()
    for rel in ("by", "by/daemon", "by/daemon/config", "by/daemon/state", "by/daemon/state/jobs",
                "by/daemon/state/private", "by/daemon/state/spool", "by/daemon/run"):  # fmt: skip
        assert modes.pop(rel) == "0700", rel
    for rel in ("orchestrator.db", "orchestrator.db-wal", "orchestrator.db-shm", "daemon.lock", f"jobs/{job}.log"):
        assert modes.pop(f"by/daemon/state/{rel}") == "0600", rel
    assert modes.pop("by/daemon/run/orchestrator.sock") == "0600"
    loose = {rel: mode for rel, mode in modes.items() if mode not in ("0700", "0600")}
    assert not loose, loose
    assert (base / "made").stat().st_mode & 0o777 == 0o700
    if os.geteuid() != 0:
        pytest.skip("the rest acts as another local user, which needs root")
    (base / "open").mkdir(mode=0o777)
    assert _as_other("sh", "-c", f"echo x > {base}/open/x").returncode == 0  # the other user can act
    for attempt in (
        f"echo '[jobs]' > {home}/config/config.toml",
        f"echo '{{}}' > {home}/state/spool/0-planted.json",
        f"cat {home}/state/orchestrator.db",
        f"cat {home}/state/jobs/{job}.log",
        f"ls {home}/state",
    ):
        out = _as_other("sh", "-c", attempt)
        assert out.returncode != 0 and "Permission denied" in out.stderr, (attempt, out)
    assert not (home / "config" / "config.toml").exists()


def test_a_config_others_could_write_is_refused_and_never_obeyed(base, umask_000):
    """A config dir left writable by others (an old install under umask 000) holding a config.toml with
    `on_end` and `sandbox = "none"`: the daemon exits 78 saying what to chmod, and runs nothing."""
    home = base / "home"
    home.mkdir(mode=0o777)
    (home / "config").mkdir(mode=0o777)
    marker = base / "ran"
    text = f'[jobs]\non_end = ["touch", "{marker}"]\nsandbox = "none"\n'
    if os.geteuid() == 0:  # written by another user, as it would be
        planted = _as_other("sh", "-c", f"printf '%s' '{text}' > {home}/config/config.toml")
        assert planted.returncode == 0, planted.stderr
    else:
        (home / "config" / "config.toml").write_text(text)
    d = _daemon(base, home)
    started = d.start("--burst", "--grace", "0", wait=False)
    assert started.wait_exit(60) == 78
    said = d.log_path.read_text()
    assert f"chmod go-w {home / 'config'}" in said and "Traceback" not in said, said
    assert not marker.exists() and not (home / "state").exists()


def test_config_checks_follow_ssh(tmp_path):
    """config.load refuses a group- or other-writable config file or dir above it, and an env file others
    can read; a private one (or one only readable by others) is read."""
    cfg = tmp_path / "conf" / "config.toml"
    cfg.parent.mkdir(mode=0o755)
    cfg.write_text("[jobs]\nmax_concurrent = 3\n")
    cfg.chmod(0o644)
    assert config.load(cfg, {}).jobs.max_concurrent == 3
    for target, mode, says in ((cfg, 0o664, "writable by group"), (cfg.parent, 0o757, "writable by others"),
                               (tmp_path, 0o777, "writable by group and others")):  # fmt: skip
        before = stat.S_IMODE(target.stat().st_mode)
        target.chmod(mode)
        with pytest.raises(config.ConfigError, match=f"{target}.*{says}.*chmod go-w {target}"):
            config.load(cfg, {})
        target.chmod(before)
    env = cfg.with_name("env")
    env.write_text("ANTHROPIC_API_KEY=sk-ant-xxxxxxxxxxxx\n")
    env.chmod(0o644)
    with pytest.raises(config.ConfigError, match=f"holds secrets but others can read it.*chmod 600 {env}"):
        config.load(cfg, {})
    env.chmod(0o600)
    assert config.load(cfg, {}).jobs.max_concurrent == 3
    if os.geteuid() == 0:  # a file of another user's in a private dir: refused, saying what to chown
        os.chown(cfg, OTHER, OTHER)
        with pytest.raises(config.ConfigError, match=f"{cfg} belongs to (nobody|uid {OTHER}).*sudo chown root {cfg}"):
            config.load(cfg, {})


def _capless() -> None:
    """Before exec, as root: no capabilities and none regained by exec (a root that is a plain user)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in range(64):
        libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP; EINVAL past the last capability
    libc.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL
    if libc.prctl(28, 0x2F, 0, 0, 0) != 0:  # PR_SET_SECUREBITS: NOROOT, NO_SETUID_FIXUP, KEEP_CAPS, locked
        os._exit(99)


PLAIN = {"preexec_fn": _capless} if os.geteuid() == 0 else {}
"""How the test starts a process of the same uid without privileges: as root, capless; else as it is."""

PROBE = "grep CapEff /proc/self/status | cut -f2; cat /proc/$0/environ >/dev/null 2>&1 && echo read || echo denied"


def _probe(pid: int) -> list[str]:
    """[its capabilities, "read" or "denied"] of a plain process reading /proc/<pid>/environ."""
    out = subprocess.run(["sh", "-c", PROBE, str(pid)], capture_output=True, text=True, timeout=30, **PLAIN)
    if out.returncode == 99:
        pytest.skip("cannot drop root's capabilities here (needs CAP_SETPCAP): run the test as a plain user")
    assert out.returncode == 0, out.stderr
    words = out.stdout.split()
    if int(words[0], 16) != 0:
        pytest.skip(f"the probe still has capabilities ({words[0]}): it could read anything; run as a plain user")
    return words


def test_the_daemon_dumps_no_core_and_no_process_can_read_its_environ(tmp_path):
    """A running daemon has RLIMIT_CORE 0 (soft and hard), and its /proc/<pid>/environ, holding the key, is
    refused to a plain process of the same uid, which reads a plain process's environ of the same uid."""
    key = "sk-ant-api03-" + "s" * 40
    d = Daemon(tmp_path / "home", {"ANTHROPIC_API_KEY": key})
    d.home.mkdir()
    with d.log_path.open("ab") as log:  # the daemon a plain user runs: as root, without capabilities
        d.proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "daemon"], env=d.env, stdout=log,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, **PLAIN)  # fmt: skip
    ordinary = subprocess.Popen(["sleep", "30"], env={"ANTHROPIC_API_KEY": key}, **PLAIN)
    try:
        d.wait_ready()
        limits = Path(f"/proc/{d.proc.pid}/limits").read_text()
        core = next(line for line in limits.splitlines() if line.startswith("Max core file size")).split()
        assert core[4:6] == ["0", "0"], core
        assert _probe(ordinary.pid)[1] == "read"  # the probe can read what it may
        assert _probe(d.proc.pid)[1] == "denied"
    finally:
        ordinary.send_signal(signal.SIGKILL)
        ordinary.wait()
        d.stop()
