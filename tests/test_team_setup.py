"""Setting a team node up as the docs say: `doctor` checks the shared PostgreSQL (reachable with the password the
service gets, the role no more than a node needs, the schema), through the real CLI and a real server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.lab.localpg import NODE_ROLE, LocalPostgres
from tests.harness import Daemon, until

pytestmark = pytest.mark.timeout(120)


def _doctor(tmp_path: Path, url: str, env: dict[str, str], envfile: str | None = None, mode: int = 0o600) -> dict:
    """`orchestrator doctor --json` for a node whose config names `url`; its checks by name."""
    home, user = tmp_path / "home", tmp_path / "user"
    (home / "config").mkdir(parents=True, exist_ok=True)
    (home / "config" / "config.toml").write_text(f'[store]\nurl = "{url}"\n\n[team]\nnode = "a"\n')
    if envfile is not None:
        path = home / "config" / "env"  # the service's env file (`unit.env_file`) beside its config
        path.write_text(envfile)
        path.chmod(mode)
    base = {k: v for k, v in os.environ.items() if k != "PGPASSWORD"}
    run_env = {**base, "ORCHESTRATOR_HOME": str(home), "HOME": str(user), "XDG_CONFIG_HOME": "", **env}
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator", "doctor", "--json"], env=run_env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    return {c["name"]: c for c in json.loads(out.stdout)["checks"]}


@pytest.fixture
def db(postgres: LocalPostgres) -> str:
    name = "doctor_" + os.urandom(4).hex()
    postgres.create_database(name)
    return name


def test_doctor_passes_the_role_the_docs_make(tmp_path, postgres, db):
    """The node role (no superuser, owner of its database), its password only in the service's env file (mode 600):
    reachable, the role ok, an empty database ok (the first daemon makes the tables)."""
    checks = _doctor(tmp_path, postgres.url(db), {}, envfile=f"PGPASSWORD={postgres.node_password}\n")
    assert checks["postgresql"]["level"] == "ok", checks["postgresql"]
    assert "UNIX socket" in checks["postgresql"]["detail"]
    assert checks["postgresql role"]["level"] == "ok", checks["postgresql role"]
    assert checks["postgresql schema"]["level"] == "ok" and "empty" in checks["postgresql schema"]["detail"]
    assert checks["team secret"]["level"] == "ok"
    assert postgres.node_password not in json.dumps(checks)
    assert os.environ["ORCHESTRATOR_TEAM_SECRET"] not in json.dumps(checks)
    short = _doctor(tmp_path, postgres.url(db), {"ORCHESTRATOR_TEAM_SECRET": "short"})
    assert short["team secret"]["level"] == "fail" and "openssl rand -hex 32" in short["team secret"]["detail"]


@pytest.mark.parametrize(
    ("grant", "fix"),
    [
        ("SUPERUSER", "NOSUPERUSER"),
        ("CREATEROLE", "NOCREATEROLE"),
        ("IN ROLE pg_execute_server_program", "REVOKE pg_execute_server_program"),
        ("IN ROLE pg_write_server_files", "REVOKE pg_write_server_files"),
    ],
)
def test_doctor_fails_a_role_that_can_reach_the_server_s_machine(tmp_path, postgres, db, grant, fix):
    """A role that may run programs or touch files as the server's user (superuser, CREATEROLE, a server role) is
    a failure, with the SQL that takes the right away."""
    role = "risky_" + os.urandom(3).hex()
    postgres.psql(f"CREATE ROLE {role} LOGIN PASSWORD 'pw' {grant}")
    postgres.psql(f"GRANT ALL ON DATABASE {db} TO {role}")
    try:
        url = postgres.url(db).replace(f"//{NODE_ROLE}@", f"//{role}@")
        checks = _doctor(tmp_path, url, {"PGPASSWORD": "pw"})
        assert checks["postgresql role"]["level"] == "fail" and fix in checks["postgresql role"]["detail"]
    finally:
        postgres.psql(f"DROP OWNED BY {role}", database=db)
        postgres.psql(f"DROP ROLE {role}")


def test_doctor_says_what_is_wrong_with_the_connection(tmp_path, postgres, db):
    """No server at the URL, or a password file others can read: each a failure that says what to do."""
    gone = postgres.url(db).replace(str(postgres.sockets), str(tmp_path))
    checks = _doctor(tmp_path, gone, {"PGPASSWORD": postgres.node_password})
    assert checks["postgresql"]["level"] == "fail" and "start the server" in checks["postgresql"]["detail"]
    checks = _doctor(tmp_path, postgres.url(db), {}, envfile=f"PGPASSWORD={postgres.node_password}\n", mode=0o644)
    assert checks["config"]["level"] == "fail" and "chmod 600" in checks["config"]["detail"]


def test_the_schema_verdict_says_who_must_upgrade():
    """A schema newer than this orchestrator's is a failure (upgrade this node); an older one is migrated at start."""
    from orchestrator.store.pgaudit import RoleFacts, verdict

    facts = RoleFacts("node", "team", False, False, False, False, False, (), True, 5)
    assert verdict(facts, 4)[-1][1:] == ("fail", "version 5, newer than this orchestrator knows (4): upgrade "
                                         "orchestrator on this node")  # fmt: skip
    assert "migrates it to 6" in verdict(facts, 6)[-1][2]
    assert [v[1] for v in verdict(facts, 5)] == ["ok", "ok"]


def _node_config(home: Path, url: str, wait: float) -> None:
    (home / "config").mkdir(parents=True)
    (home / "config" / "config.toml").write_text(
        f'[store]\nurl = "{url}"\n\n[team]\nnode = "a"\nstart_wait = {wait}\n'
    )


def test_postgresql_down_at_start_is_waited_for_then_a_clear_error_and_exit_code(tmp_path):
    """A daemon whose PostgreSQL is not there asks again with a growing pause for `start_wait`, then exits 75 (try
    again later: the unit restarts it) saying which server and what to do."""
    home = tmp_path / "home"
    _node_config(home, f"postgresql://nobody@/x?host={tmp_path}&port=1", 2)
    env = {**os.environ, "ORCHESTRATOR_HOME": str(home), "ORCHESTRATOR_SANDBOX": "none",
           "ORCHESTRATOR_TEAM_SECRET": "s" * 64}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "daemon"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 75, done.stderr
    assert "cannot reach the team's PostgreSQL" in done.stderr and "Start it" in done.stderr
    waits = [json.loads(line) for line in done.stdout.splitlines() if '"team.store_lost"' in line]
    # 1 s, then what is left of the 2 s: the first attempt's own time comes off it (0.9 s on a busy machine)
    assert len(waits) == 2 and waits[0]["retry_in"] == 1.0 and 0.5 <= waits[1]["retry_in"] <= 1.0, waits


def test_a_node_started_before_its_postgresql_comes_up_with_it(tmp_path, postgres, db):
    """PostgreSQL down when the node starts, up 3 s later: the node waits (no exit, no restart needed) and
    answers once the database does."""
    d = Daemon(tmp_path / "home")
    _node_config(d.home, postgres.url(db), 60)
    postgres.stop()
    try:
        d.start(wait=False)
        until("the node waits for its database", lambda: any(e["event"] == "team.store_lost" for e in d.events()))
        assert d.proc is not None and d.proc.poll() is None
    finally:
        postgres.start()
    try:
        d.wait_ready(timeout=60)
        assert d.cli("status").returncode == 0
    finally:
        d.stop()
