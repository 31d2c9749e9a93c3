"""`service install/status`, `hook status` and `doctor` as a user runs them: real CLI, real daemon."""

from __future__ import annotations

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from orchestrator.service import manager

SECRET = "sk-ant-api03-doctorsecretvalue-0123456789"


class _OllamaTags(BaseHTTPRequestHandler):
    """Ollama's `GET /api/tags` as the real server answers it (other paths: 404, as Ollama does)."""

    def do_GET(self) -> None:
        if self.path != "/api/tags":
            self.send_error(404)
            return
        body = json.dumps(
            {"models": [{"name": "hermes3:latest", "model": "hermes3:latest", "size": 4661224676, "digest": "4f6b"}]}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass  # keep the test output clean


@pytest.fixture
def ollama():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OllamaTags)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    t.join(timeout=5)


def test_dry_run_prints_the_unit_for_this_interpreter(daemon_factory) -> None:
    """`service install --dry-run` prints the unit that runs this very interpreter, with ORCHESTRATOR_HOME."""
    d = daemon_factory()
    out = d.cli("service", "install", "--dry-run")
    assert out.returncode == 0, out.stderr
    (start,) = (ln.removeprefix("ExecStart=") for ln in out.stdout.splitlines() if ln.startswith("ExecStart="))
    python, rest = start.split(" ", 1)
    # The same file, however this interpreter was named (pytest started through `../.venv/bin/python`).
    assert Path(python).resolve() == Path(sys.executable).resolve() and rest == "-m orchestrator daemon"
    assert f'Environment="ORCHESTRATOR_HOME={d.home}"' in out.stdout.splitlines()
    assert "Type=notify" in out.stdout


@pytest.mark.skipif(manager.no_user_manager() is None, reason="a real systemd user manager is here: not touching it")
def test_install_without_a_user_manager_says_so_and_fails(daemon_factory) -> None:
    """Where no systemd user manager runs (containers, CI), install fails clearly and writes nothing."""
    d = daemon_factory()
    out = d.cli("service", "install")
    assert out.returncode == 1
    assert "no systemd user manager" in out.stderr or "systemctl is not installed" in out.stderr
    assert "orchestrator daemon" in out.stderr
    status = d.cli("service", "status", "--json")
    assert status.returncode == 1 and json.loads(status.stdout)["ok"] is False


def test_doctor_all_ok_with_daemon_ollama_and_key(make_repo, daemon_factory, ollama) -> None:
    """With the daemon up, Ollama answering and a key set, doctor passes and never prints the key."""
    repo = make_repo()
    old = os.umask(0o077)  # as the unit's UMask=0077 runs it
    try:
        d = daemon_factory(env={"OLLAMA_HOST": ollama, "ANTHROPIC_API_KEY": SECRET}).start()
    finally:
        os.umask(old)
    assert d.cli("hook", "install", "--repo", str(repo)).returncode == 0
    assert d.cli("hook", "status", "--repo", str(repo)).returncode == 0
    out = d.cli("doctor", "--json")
    assert SECRET not in out.stdout + out.stderr
    assert out.returncode == 0, out.stdout
    checks = {c["name"]: c for c in json.loads(out.stdout)["checks"]}
    for name in ("config", "dirs", "socket", "ollama", "claude", f"hooks {repo}"):
        assert checks[name]["level"] == "ok", checks[name]
    assert "hermes3" in checks["ollama"]["detail"]
    assert {"service", "spool", "bubblewrap"} <= set(checks)


def test_doctor_fails_and_says_what_to_do(make_repo, daemon_factory) -> None:
    """No daemon and no Ollama: doctor exits 1, the socket line says how to start it, Ollama is a warning."""
    repo = make_repo()
    d = daemon_factory(env={"OLLAMA_HOST": "127.0.0.1:9", "ANTHROPIC_API_KEY": ""})
    assert d.cli("hook", "status", "--repo", str(repo)).returncode == 1
    out = d.cli("doctor")
    assert out.returncode == 1
    lines = {ln.split()[1]: ln for ln in out.stdout.splitlines()}
    assert lines["socket"].startswith("fail") and "orchestrator daemon" in lines["socket"]
    assert lines["ollama"].startswith("warn") and lines["claude"].startswith("warn")
    # The key in the service's env file (which systemd gives the daemon) is found there, never printed: in the
    # config dir of ORCHESTRATOR_HOME, which the unit names when it runs with one.
    d.env["XDG_CONFIG_HOME"] = str(d.home / "xdg")
    env_file = d.home / "config" / "env"
    env_file.parent.mkdir(parents=True, exist_ok=True)
    env_file.write_text(f"# for the service\nANTHROPIC_API_KEY='{SECRET}'\n")
    env_file.chmod(0o644)
    checks = json.loads(d.cli("doctor", "--json").stdout)["checks"]
    assert any(c["level"] != "ok" and f"chmod 600 {env_file}" in c["detail"] for c in checks), checks
    env_file.chmod(0o600)
    out = d.cli("doctor", "--json")
    claude = next(c for c in json.loads(out.stdout)["checks"] if c["name"] == "claude")
    assert claude["level"] == "ok" and str(env_file) in claude["detail"] and SECRET not in out.stdout
    state = Path(d.home / "state")
    state.mkdir(parents=True, exist_ok=True)
    state.chmod(0o755)
    assert "chmod 700" in d.cli("doctor").stdout
