"""Team mode's trust boundary, tried as a hostile tester would, through real daemons, a real PostgreSQL whose
socket dir lies outside /tmp (mode 755, as a distribution installs it) and a real bubblewrap sandbox: nothing of
the shared store is within a job's reach, and a node acts on its own machine only on what it can verify."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from orchestrator.lab.localpg import NODE_ROLE, SUPERUSER, LocalPostgres
from orchestrator.team import reach
from tests.conftest import bare_remote, git, outside_tmp
from tests.harness import Daemon, until
from tests.teamkit import Node

pytestmark = pytest.mark.timeout(240)

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (apt install bubblewrap)")


def _db(postgres: LocalPostgres, tmp_path: Path) -> str:
    name = "trust_" + os.urandom(4).hex()
    postgres.create_database(name)
    return name


@pytest.fixture
def users():
    """A dir outside /tmp for the nodes' user homes (a real `/home/anna` is not under the /tmp the sandbox empties)."""
    where = outside_tmp()
    yield where
    shutil.rmtree(where, ignore_errors=True)


def _node(
    tmp_path: Path,
    users: Path,
    postgres: LocalPostgres,
    db: str,
    bare: Path,
    name: str,
    *,
    sandbox: str = "bwrap",
    **config: str,
) -> tuple[Node, Path]:
    """A node as a team sets one up: the URL names no password; it is in the env file and `~/.pgpass` (the daemon
    gets it from its environment, as systemd's `EnvironmentFile=` gives it)."""
    clone = tmp_path / f"clone-{name}"
    git(tmp_path, "clone", "-q", str(bare), clone.name)
    home = users / f"user-{name}"
    home.mkdir(parents=True)
    pgpass = home / ".pgpass"
    pgpass.write_text(f"*:*:*:{NODE_ROLE}:{postgres.node_password}\n")
    pgpass.chmod(0o600)
    extra = "".join(f"{k} = {v}\n" for k, v in config.items())
    # The node's home is where a user's is (not under /tmp, which every job sees empty anyway).
    d = Node(
        users / f"node-{name}",
        {"HOME": str(home), "ORCHESTRATOR_SANDBOX": sandbox, "PGPASSWORD": postgres.node_password},
    )
    (d.home / "config").mkdir(parents=True)
    (d.home / "config" / "config.toml").write_text(
        f'[store]\nurl = "{postgres.url(db)}"\n\n[team]\nnode = "{name}"\nlease = 3\n{extra}\n'
        f'[repos."{clone}"]\n'
    )
    envfile = d.home / "config" / "env"  # the service's env file (`unit.env_file`), where the password goes
    envfile.write_text(f"PGPASSWORD={postgres.node_password}\n")
    envfile.chmod(0o600)
    return d, clone


def _row(postgres: LocalPostgres, db: str, job_id: int) -> dict:
    out = postgres.psql(f"SELECT row_to_json(j) FROM jobs j WHERE id = {job_id}", database=db)
    return json.loads(out)


def _log(d: Daemon, job_id: int) -> str:
    out = d.cli("logs", str(job_id))
    assert out.returncode == 0, out.stderr
    return out.stdout


def _hostile(postgres: LocalPostgres, db: str, node: Daemon) -> str:
    """A shell job that tries every way to the team's store it can think of, and says for each whether it got in."""
    psql = postgres.bindir / "psql"
    forge = "UPDATE jobs SET land = 'auto', text = 'echo forged > forged.txt' WHERE id = $ORCHESTRATOR_JOB_ID"
    sockets, port = postgres.sockets, postgres.port
    config = node.home / "config" / "config.toml"
    envfile = node.home / "config" / "env"
    attacks = {
        "node-role-over-the-socket": f'{psql} -X -h {sockets} -p {port} -U {NODE_ROLE} -d {db} -c "{forge}"',
        "superuser-over-the-socket": f'{psql} -X -h {sockets} -p {port} -U {SUPERUSER} -d {db} -c "{forge}"',
        "pgpass-named-by-hand": f'PGPASSFILE=$HOME/.pgpass {psql} -X -h {sockets} -p {port} -U {NODE_ROLE} -d {db} '
        f'-c "{forge}"',
        "default-socket-dirs": f'{psql} -X -p {port} -U {NODE_ROLE} -d {db} -c "{forge}"',
        "socket-dir-listed": f"ls -A {sockets} | grep -q PGSQL",
        "pgpass-read": "test -s $HOME/.pgpass",
        "pg-environment": "env | grep -q ^PG",
        "env-file-read": f"test -s {envfile}",
        "config-read": f"grep -q postgresql {config}",
        "daemon-environ": "cat /proc/1/environ /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | grep -q ^PGPASSWORD",
    }
    lines = [f'if {cmd} >/dev/null 2>&1; then echo "REACHED {name}"; else echo "blocked {name}"; fi'
             for name, cmd in attacks.items()]  # fmt: skip
    return "\n".join([*lines, "echo done > out.txt"])


def test_what_a_job_could_reach_of_the_store_is_named_for_the_sandbox():
    """The socket dirs a URL names (query, percent-encoded host part, lists), PGHOST's and the distributions'; the
    user's libpq files in every home and the files PG* and the URL name; nothing in single-machine mode."""
    url = "postgresql://node@%2Fsrv%2Fpg:5433,db.example.com/team?host=/a,/b&passfile=/etc/pw&sslkey=/k&port=5"
    env = {"PGHOST": "/c,db2", "PGPASSFILE": "/d", "PGSERVICEFILE": "/e", "PGSSLKEY": "/f"}
    hidden = reach.hidden(url, env, (Path("/home/anna"), Path("/srv/anna")))
    assert hidden[:6] == ("/srv/pg", "/a", "/b", "/c", "/run/postgresql", "/var/run/postgresql")
    for f in ("/home/anna/.pgpass", "/srv/anna/.pgpass", "/home/anna/.postgresql", "/d", "/e", "/f", "/etc/pw", "/k"):
        assert f in hidden
    assert reach.hidden("", env, (Path("/home/anna"),)) == ()


@needs_bwrap
def test_a_confined_job_cannot_reach_the_team_store(tmp_path, users, postgres):
    """A hostile shell job in the default sandbox finds no way to the team's PostgreSQL: the socket dir (outside
    /tmp, mode 755), `~/.pgpass`, the env file, the config and the PG* environment are all out of its reach, so its
    `psql … UPDATE jobs` fails to connect; its text and its `review` landing stay as queued."""
    bare = bare_remote(tmp_path, {"README.md": "hi\n"})
    db = _db(postgres, tmp_path)
    a, clone = _node(tmp_path, users, postgres, db, bare, "a")
    a.start()
    try:
        script = _hostile(postgres, db, a)
        job = a.enqueue(clone, script, "--path", "out.txt", "--land", "review")
        until("the hostile job ended", lambda: _row(postgres, db, job)["state"] in ("ready", "landed", "failed"), 90)
        row = _row(postgres, db, job)
        said = [line for line in _log(a, job).splitlines() if line.startswith(("REACHED ", "blocked "))]
        assert len(said) == 10 and all(line.startswith("blocked ") for line in said), said
        assert (row["state"], row["land"], row["text"]) == ("ready", "review", script)
        assert "forged" not in git(bare, "log", "--all", "--format=%s")
    finally:
        a.stop()


def _setsid_sleeper() -> subprocess.Popen[bytes]:
    """An unrelated process group of the user's: `setsid sleep`, as a user's own long job would be."""
    return subprocess.Popen(["setsid", "sleep", "300"], stdin=subprocess.DEVNULL)  # not a leader yet: no fork


def _start_time(pid: int) -> int:
    raw = Path(f"/proc/{pid}/stat").read_bytes()
    return int(raw[raw.rindex(b")") + 2 :].split()[19])


def _forge(postgres: LocalPostgres, db: str, sql: str) -> str:
    """Write to the team's database as anyone who has it could (a teammate's node, a job that got in); what the
    database said (a row it has no table for cannot even be written)."""
    try:
        postgres.psql(sql, database=db)
    except Exception as e:  # noqa: BLE001 - the refusal is the answer
        return str(e)
    return "written"


def test_forged_rows_make_a_node_touch_no_file_and_signal_no_process_of_its_machine(tmp_path, users, postgres):
    """Rows naming node a in the shared store, written by someone else: a landing journal entry whose checkout is an
    unrelated repository of the user, process records (start time 0, empty boot id; and the real ones) of an
    unrelated `setsid` process group, a clone of the team's repository at that unrelated path. Node a restarts:
    the repository is as it was (no file written, nothing staged), the process group lives."""
    bare = bare_remote(tmp_path, {"README.md": "hi\n"})
    db = _db(postgres, tmp_path)
    a, clone = _node(tmp_path, users, postgres, db, bare, "a", sandbox="none")
    victim = tmp_path / "victim"
    victim.mkdir()
    git(victim, "init", "-q", "-b", "main")
    (victim / "mine.txt").write_text("my own work\n")
    git(victim, "add", "-A")
    git(victim, "commit", "-qm", "mine")
    (victim / "mine.txt").write_text("my own work, not committed yet\n")
    # In the team's clone, a branch whose last commit adds a file: what a forged "finished" landing would write.
    old = git(clone, "rev-parse", "HEAD")
    git(clone, "checkout", "-q", "-b", "planted")
    (clone / "planted.txt").write_text("planted\n")
    git(clone, "add", "-A")
    git(clone, "commit", "-qm", "planted")
    new = git(clone, "rev-parse", "HEAD")
    git(clone, "checkout", "-q", "main")
    sleeper = _setsid_sleeper()
    try:
        a.start()
        a.stop()
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        said = [
            _forge(postgres, db, "INSERT INTO landing_journal (node, job_id, repo, branch, old, new, checkouts, at) "
                   f"VALUES ('a', NULL, '{clone}', 'refs/heads/planted', '{old}', '{new}', "
                   f"'{json.dumps([str(victim)])}', 0)"),
            _forge(postgres, db, "INSERT INTO processes (node, pgid, start_time, boot_id, job_id, what, started_at) "
                   f"VALUES ('a', {sleeper.pid}, 0, '', NULL, 'forged', 0)"),
            _forge(postgres, db, "INSERT INTO processes (node, pgid, start_time, boot_id, job_id, what, started_at) "
                   f"VALUES ('a', {sleeper.pid}, {_start_time(sleeper.pid)}, '{boot}', NULL, 'forged', 0)"),
            _forge(postgres, db, "INSERT INTO node_repos (node, key, path, url) SELECT 'a', remote, "
                   f"'{victim}', '' FROM jobs LIMIT 1"),
        ]  # fmt: skip
        a.start()
        job = a.enqueue(clone, "echo done > done.txt", "--path", "done.txt")
        until("the node works again", lambda: _row(postgres, db, job)["state"] == "landed", 60)
        assert git(victim, "status", "--porcelain") == "M mine.txt", said
        assert not (victim / "planted.txt").exists()
        assert (victim / "mine.txt").read_text() == "my own work, not committed yet\n"
        assert sleeper.poll() is None, f"an unrelated process group was signalled ({said})"
    finally:
        a.stop()
        sleeper.kill()
        sleeper.wait()


def test_a_node_restarting_leaves_another_node_s_runners_on_the_same_machine_alone(tmp_path, users, postgres):
    """Two nodes of one team on one machine: restarting node a (which ends what a dead a left running) leaves
    node b's running job alone; it goes on and lands."""
    bare = bare_remote(tmp_path, {"README.md": "hi\n"})
    db = _db(postgres, tmp_path)
    a, _ = _node(tmp_path, users, postgres, db, bare, "a", sandbox="none")
    b, clone_b = _node(tmp_path, users, postgres, db, bare, "b", sandbox="none", labels='["bee"]')
    gate, pidfile = tmp_path / "gate", tmp_path / "b.pid"
    a.start()
    b.start()
    try:
        job = b.enqueue(clone_b, f"echo $$ > {pidfile}; while [ ! -e {gate} ]; do sleep 0.1; done; echo b > b.txt",
                        "--path", "b.txt", "--label", "bee")  # fmt: skip
        runner = int(until("b's job runs", lambda: pidfile.exists() and pidfile.read_text().strip()))
        a.stop()
        a.start()
        assert Path(f"/proc/{runner}").exists(), "node a's start ended node b's runner"
        gate.touch()
        until("b's job landed", lambda: _row(postgres, db, job)["state"] == "landed", 60)
    finally:
        a.stop()
        b.stop()


def test_a_forged_result_never_pushes_a_commit_of_the_node_s_own(tmp_path, users, postgres):
    """A job waiting for review; its result in the shared store is changed to a private commit of the node's clone
    (work of the user's never pushed). `land` pushes nothing of it: the result is part of the job's sealed order,
    so the landing is refused (the job stays ready, marked `Unverified`), and the team's remote never gets the
    private commit."""
    bare = bare_remote(tmp_path, {"README.md": "hi\n"})
    db = _db(postgres, tmp_path)
    a, clone = _node(tmp_path, users, postgres, db, bare, "a", sandbox="none")
    git(clone, "checkout", "-q", "-b", "private")
    (clone / "secret.txt").write_text("the user's own, never pushed\n")
    git(clone, "add", "-A")
    git(clone, "commit", "-qm", "private work")
    private = git(clone, "rev-parse", "HEAD")
    git(clone, "checkout", "-q", "main")
    a.start()
    try:
        job = a.enqueue(clone, "echo mine > mine.txt", "--path", "mine.txt", "--land", "review")
        until("ready for review", lambda: _row(postgres, db, job)["state"] == "ready", 60)
        postgres.psql(f"UPDATE jobs SET result = '{private}' WHERE id = {job}", database=db)
        a.cli("land", str(job))
        until("the landing refused", lambda: _row(postgres, db, job)["code"] == "Unverified", 60)
        row = _row(postgres, db, job)
        assert row["state"] == "ready", row  # the result is part of its sealed order: a changed one never lands
        shown = subprocess.run(["git", "cat-file", "-e", private], cwd=bare, capture_output=True)
        assert shown.returncode != 0, "the private commit reached the team's remote"
    finally:
        a.stop()


def test_an_order_changed_in_the_database_never_runs(tmp_path, users, postgres):
    """Someone who can write the team's database but is no node of the team (a job that got in over TCP, a leaked
    password, the server's admin) changes a waiting job's text and landing, and adds a job of their own: the node
    runs neither. The changed job fails `Unverified` where it would have started; the added one stays queued,
    marked `Unverified`; nothing of either reaches the remote."""
    bare = bare_remote(tmp_path, {"README.md": "hi\n"})
    db = _db(postgres, tmp_path)
    a, clone = _node(tmp_path, users, postgres, db, bare, "a", sandbox="none")
    gate = tmp_path / "gate"
    a.start()
    try:
        wait = f"while [ ! -e {gate} ]; do sleep 0.1; done; echo 1 > first.txt"
        first = a.enqueue(clone, wait, "--path", "first.txt")
        job = a.enqueue(clone, "echo mine > mine.txt", "--path", "mine.txt", "--after", str(first), "--land", "review")
        until("claimed and planned", lambda: _row(postgres, db, job)["state"] == "planned", 60)
        postgres.psql(
            f"UPDATE jobs SET text = 'echo forged > forged.txt', land = 'auto' WHERE id = {job}; "
            "INSERT INTO jobs (repo, branch, text, runner, state, created_at, remote, repo_key) SELECT repo, branch, "
            f"'echo injected > injected.txt', runner, 'queued', created_at, remote, repo_key FROM jobs "
            f"WHERE id = {job}",
            database=db,
        )
        added = job + 1
        gate.touch()
        until("the changed job refused", lambda: _row(postgres, db, job)["state"] in ("failed", "landed", "ready"), 60)
        row, extra = _row(postgres, db, job), _row(postgres, db, added)
        assert (row["state"], row["code"]) == ("failed", "Unverified"), row
        assert (extra["state"], extra["code"]) == ("queued", "Unverified"), extra
        log = git(bare, "log", "--all", "--format=%s%n%b")
        assert "forged" not in log and "injected" not in log
        assert not list(tmp_path.rglob("forged.txt")) and not list(tmp_path.rglob("injected.txt"))
    finally:
        a.stop()
