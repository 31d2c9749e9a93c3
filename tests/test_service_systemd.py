"""The systemd side: the rendered unit passes `systemd-analyze verify`, and the daemon speaks sd_notify."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.client import Client
from orchestrator.service import systemd, unit
from tests.conftest import git

ROOT = Path(__file__).resolve().parent.parent
needs_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed (.ci/run installs it)"
)


def _verify(path: Path, *scope: str, runtime: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "SYSTEMD_LOG_COLOR": "0"}
    return subprocess.run(
        ["systemd-analyze", *scope, "verify", str(path)], capture_output=True, text=True, timeout=60, env=env
    )


@needs_analyze
@pytest.mark.parametrize("scope", [(), ("--user",)], ids=["system", "user"])
def test_rendered_unit_verifies_clean(tmp_path: Path, scope: tuple[str, ...]) -> None:
    """The unit `service install` writes passes `systemd-analyze verify` with exit 0 and no output at all."""
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    path = tmp_path / unit.NAME
    path.write_text(
        unit.render(
            unit.entry_point(),
            environment={"ORCHESTRATOR_HOME": str(tmp_path / "home with space")},
            extra_path=[str(Path(sys.executable).parent)],
        )
    )
    out = _verify(path, *scope, runtime=runtime)
    assert (out.returncode, out.stdout + out.stderr) == (0, "")


def test_repository_unit_is_the_render():
    """`systemd/orchestrator.service` is the generic rendering, line for line: one source of truth."""
    shipped = (ROOT / "systemd" / unit.NAME).read_text()
    assert shipped == unit.render(), (
        "systemd/orchestrator.service is stale: python -m orchestrator.service.unit > systemd/orchestrator.service"
    )


@needs_analyze
def test_repository_unit_verifies(tmp_path: Path) -> None:
    """The shipped unit passes `systemd-analyze verify` (system and user scope) with no output at all."""
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    for scope in ((), ("--user",)):
        out = _verify(ROOT / "systemd" / unit.NAME, *scope, runtime=runtime)
        assert (out.returncode, out.stdout + out.stderr) == (0, "")


def test_a_node_waiting_for_its_database_is_restarted_and_never_trips_the_start_limit() -> None:
    """Exit 75 (the team's PostgreSQL not up) is restarted, 65 and 78 are not; a node that waits `start_wait` on
    each start before exiting 75 never starts more often than the start limit allows, so it comes up whenever
    the database does."""
    from orchestrator.config import TeamConfig

    lines = unit.render().splitlines()
    prevent = next(ln for ln in lines if ln.startswith("RestartPreventExitStatus=")).partition("=")[2].split()
    assert prevent == ["65", "78"] and "Restart=on-failure" in lines
    interval, burst = unit.START_LIMIT
    assert f"StartLimitIntervalSec={interval}" in lines and f"StartLimitBurst={burst}" in lines
    cycle = TeamConfig().start_wait + unit.RESTART_SEC
    assert f"RestartSec={unit.RESTART_SEC}" in lines
    starts = [i * cycle for i in range(50)]
    assert max(sum(1 for t in starts if end - interval < t <= end) for end in starts) <= burst
    timeout = int(next(ln for ln in lines if ln.startswith("TimeoutStartSec=")).partition("=")[2])
    assert TeamConfig().start_wait + 15 < timeout  # the wait and a last connect fit in a start


def test_unit_has_the_service_contract() -> None:
    """Type=notify, watchdog, restart on failure but never on a config error, mixed kill, optional env file."""
    text = unit.render(("/opt/venv/bin/python", "-m", "orchestrator"), no_restart=(78, 65))
    lines = set(text.splitlines())
    for line in (
        "Type=notify",
        "ExecStart=/opt/venv/bin/python -m orchestrator daemon",
        "Restart=on-failure",
        "RestartPreventExitStatus=78 65",
        "KillMode=mixed",
        "EnvironmentFile=-%E/orchestrator/env",
        f"WatchdogSec={unit.WATCHDOG_SEC}",
    ):
        assert line in lines
    assert "network-online" not in text.replace("No network-online.target", "")
    assert 78 in unit.no_restart_codes()


def test_the_env_file_honours_orchestrator_home(tmp_path) -> None:
    """With ORCHESTRATOR_HOME the unit reads the env file of that home's config dir, where doctor looks for it."""
    from orchestrator.service import manager

    env = {"ORCHESTRATOR_HOME": str(tmp_path / "orch%home"), "HOME": str(tmp_path)}
    assert unit.env_file(env) == tmp_path / "orch%home" / "config" / "env"
    lines = manager.unit_text(env).splitlines()
    assert f"EnvironmentFile=-{tmp_path}/orch%%home/config/env" in lines
    assert f'Environment="ORCHESTRATOR_HOME={tmp_path}/orch%home"' in lines
    plain = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    assert unit.env_file(plain) == tmp_path / "xdg" / "orchestrator" / "env"
    assert "EnvironmentFile=-%E/orchestrator/env" in manager.unit_text(plain).splitlines()


def test_notify_reaches_an_abstract_socket() -> None:
    """`NOTIFY_SOCKET=@name` is the abstract namespace: the datagram arrives there."""
    name = f"orchestrator-test-{os.getpid()}-{time.monotonic_ns()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind("\0" + name)
        s.settimeout(5)
        assert systemd.notify("STATUS=hello", {"NOTIFY_SOCKET": "@" + name})
        assert s.recv(4096) == b"STATUS=hello"
    assert not systemd.notify("READY=1", {})


def test_status_line_counts_running_and_waiting_reasons() -> None:
    """The STATUS= line says what runs and what waits, by admission reason, most common first."""
    jobs = [
        {"state": "running"},
        {"state": "running"},
        {"state": "planned", "decision": {"reason": "Overlap"}},
        {"state": "planned", "decision": {"reason": "Overlap"}},
        {"state": "planned", "decision": {"reason": "Overlap"}},
        {"state": "planned", "decision": {"reason": "Concurrency"}},
        {"state": "queued"},
        {"state": "landed"},
    ]
    assert systemd.status_line(jobs) == "2 running, 5 queued (3 Overlap, 1 Concurrency, 1 Planning)"
    assert systemd.status_line([]) == "0 running, 0 queued"
    assert systemd.status_line([{"state": "landing"}]) == "0 running, 1 landing, 0 queued"


def test_watchdog_interval_reads_systemd_variables() -> None:
    """WATCHDOG_USEC gives the interval; a WATCHDOG_PID of another process means the watchdog is not ours."""
    assert systemd.watchdog_interval({"WATCHDOG_USEC": "60000000"}) == 60.0
    assert systemd.watchdog_interval({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "1"}, pid=2) is None
    assert systemd.watchdog_interval({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "2"}, pid=2) == 60.0
    assert systemd.watchdog_interval({}) is None
    assert systemd.healthy(10.0, 9.0, 3.0) and not systemd.healthy(10.0, 7.0, 3.0)


async def test_watchdog_pings_stop_when_the_heartbeat_goes_stale(tmp_path: Path) -> None:
    """Pings flow while the heartbeat is fresh and stop once it is stale (a stuck scheduler gets restarted)."""
    path = tmp_path / "n.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(str(path))
        s.setblocking(False)
        beat = {"at": time.monotonic()}
        n = systemd.Notifier({"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "300000"})

        async def jobs() -> list[dict[str, str]]:
            return []

        n.start(jobs, lambda: beat["at"] if beat["at"] < 0 else time.monotonic())
        await asyncio.sleep(0.35)
        fresh = _drain(s)
        beat["at"] = -1e9  # the scheduler stops stamping
        await asyncio.sleep(0.1)
        _drain(s)
        await asyncio.sleep(0.35)
        stale = _drain(s)
        await n.close()
    assert b"WATCHDOG=1" in fresh
    assert b"WATCHDOG=1" not in stale


def _drain(s: socket.socket) -> list[bytes]:
    out = []
    while True:
        try:
            out.append(s.recv(4096))
        except BlockingIOError:
            return out


def _recv_until(s: socket.socket, want: str, deadline: float, seen: list[str]) -> str:
    while time.monotonic() < deadline:
        try:
            msg = s.recv(4096).decode()
        except TimeoutError:
            continue
        seen.append(msg)
        if want in msg:
            return msg
    raise AssertionError(f"no {want!r} in time; got {seen}")


def test_daemon_speaks_notify_protocol(tmp_path: Path, make_repo, daemon_factory) -> None:
    """READY=1 comes only once the socket answers; STATUS= follows the jobs; WATCHDOG=1 pings; STOPPING=1."""
    repo = make_repo()
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(str(path))
        s.settimeout(0.5)
        d = daemon_factory(env={"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "1500000"}, process=True)
        d.start(wait=False)
        seen: list[str] = []
        deadline = time.monotonic() + 30
        ready = _recv_until(s, "READY=1", deadline, seen)
        # The very moment READY=1 is read, the API must already answer.
        assert Client(d.socket, timeout=5).health()["ok"]
        assert seen == [ready], "nothing but READY=1 comes before readiness"
        assert "STATUS=0 running, 0 queued" in ready
        job = d.enqueue(repo, "sleep 2 && echo x > src/a.py", "--path", "src/a.py")
        status = _recv_until(s, "STATUS=1 running", deadline, seen)
        assert "0 queued" in status
        _recv_until(s, "WATCHDOG=1", deadline, seen)
        assert d.cli("wait", str(job), "--timeout", "30").returncode == 0
        _recv_until(s, "STATUS=0 running, 0 queued", deadline, seen)
        assert d.proc is not None
        d.proc.send_signal(signal.SIGTERM)
        _recv_until(s, "STOPPING=1", deadline, seen)
        assert d.wait_exit(30) == 0
    assert git(repo, "show", "HEAD:src/a.py") == "x"
