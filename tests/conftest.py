"""Shared fixtures: real git repositories in temp dirs, made with the real git CLI."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# Tests must not depend on the developer's or CI's global git identity or config.
os.environ.update(
    {
        "GIT_AUTHOR_NAME": "Test Author",
        "GIT_AUTHOR_EMAIL": "author@example.com",
        "GIT_COMMITTER_NAME": "Test Committer",
        "GIT_COMMITTER_EMAIL": "committer@example.com",
        "GIT_CONFIG_NOSYSTEM": "1",
    }
)
# Nor on a terminal's size: views break lines at COLUMNS (a test that wants a width says so). pytest-xdist's workers
# inherit COLUMNS and LINES that readline set in the main process's C environment.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)


PARALLEL = 4
"""Workers the whole suite runs on by default (pytest-xdist): its tests mostly wait on processes, git and sockets,
so four keep two cores busy. A file or test named on the command line runs in this process; `-n N` says otherwise
(`-n 0`: the whole suite here), and `-p no:xdist` runs without the plugin."""


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """`python -m pytest -q` runs the whole suite on `PARALLEL` workers, each test on one worker (`loadgroup`: tests
    marked `xdist_group` share one)."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    if hasattr(config, "workerinput"):
        # A worker's temp dirs hold daemons' sockets (at most 107 bytes): `.../pytest-N/gw1/` rather than xdist's
        # `.../pytest-N/popen-gw1/` keeps them near the length they have in one process.
        worker, given = config.workerinput["workerid"], config.option.basetemp
        if given and Path(given).name == f"popen-{worker}":
            config.option.basetemp = str(Path(given).with_name(worker))
        return
    whole_suite = config.args_source is pytest.Config.ArgsSource.TESTPATHS
    if config.option.numprocesses is None and whole_suite and not config.option.usepdb:
        config.option.numprocesses = PARALLEL
    if config.option.dist == "no" and config.option.numprocesses:
        config.option.dist = "loadgroup"


def pytest_configure(config: pytest.Config) -> None:
    # xdist's own mark, known without the plugin too (`-p no:xdist`), where warnings are errors.
    config.addinivalue_line("markers", "xdist_group(name): the tests of one group run on one worker")


def git(cwd: Path, *args: str) -> str:
    """Run the real git CLI in `cwd` and return its stdout (stripped)."""
    out = subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True)
    return out.stdout.strip()


def workspace(repo: Path, path: Path, base: str, branch: str | None = None) -> Path:
    """A job workspace of `repo` at `base` in `path` (its own git dir on `branch`), as the daemon makes them."""
    from orchestrator.git.workspace import Workspace

    Workspace(path).create(repo, base, branch)
    return path


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def bare_remote(root: Path, files: dict[str, str]) -> Path:
    """A bare repository `root/remote.git` with one commit on main holding `files`: a team's shared remote."""
    seed = root / "seed"
    seed.mkdir()
    git(seed, "init", "-q", "-b", "main")
    write(seed, files)
    git(seed, "add", "-A")
    git(seed, "commit", "-q", "-m", "initial")
    git(root, "clone", "-q", "--bare", str(seed), str(root / "remote.git"))
    return root / "remote.git"


DEFAULT_FILES = {"README.md": "hello\n", "src/a.py": "a = 1\n", "src/b.py": "b = 1\n", "docs/x.md": "x\n"}


@pytest.fixture(scope="session")
def repo_templates(tmp_path_factory: pytest.TempPathFactory) -> Callable[[dict[str, str], str], Path]:
    """One repository per (files, branch) made with the real git CLI once a session; `make_repo` copies it."""
    made: dict[tuple[frozenset[tuple[str, str]], str], Path] = {}

    def template(files: dict[str, str], branch: str) -> Path:
        key = (frozenset(files.items()), branch)
        if key not in made:
            root = tmp_path_factory.mktemp("template") / "repo"
            root.mkdir()
            git(root, "init", "-q", "-b", branch)
            git(root, "config", "user.name", "Repo User")
            git(root, "config", "user.email", "user@example.com")
            write(root, files)
            git(root, "add", "-A")
            git(root, "commit", "-q", "-m", "initial")
            made[key] = root
        return made[key]

    return template


@pytest.fixture
def make_repo(tmp_path: Path, repo_templates: Callable[[dict[str, str], str], Path]) -> Callable[..., Path]:
    """Make a real git repository with one commit on `main` holding `files` (a copy of the session's template
    of those files: the same commit in every test)."""

    def _make(name: str = "repo", files: dict[str, str] | None = None, branch: str = "main") -> Path:
        root = tmp_path / name
        shutil.copytree(repo_templates(files or DEFAULT_FILES, branch), root, symlinks=True)
        return root

    return _make


@pytest.fixture
def daemon_factory(tmp_path: Path):
    """Make real daemons on temp homes: `daemon_factory(name, env)` runs one in this process (`InProcessDaemon`),
    `process=True` as a process of its own, the CLI as processes too (`Daemon`); all are stopped at the end."""
    from tests.harness import daemons

    with daemons(tmp_path) as make:
        yield make


FOUR_SLOTS = {"MAX_CONCURRENT_JOBS": "4"}


@pytest.fixture
def started(make_repo, daemon_factory):
    """A repository and a running daemon with 4 slots."""
    repo = make_repo()
    d = daemon_factory(env=FOUR_SLOTS).start()
    return repo, d


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A private temp dir with a short path (`/tmp/orch-XXXXXXXX`), removed at the end: for a UNIX socket deep inside
    (at most 107 bytes), which a parallel worker's `tmp_path` (`.../pytest-N/gwK/test_name0/`) leaves little room."""
    import tempfile

    made = Path(tempfile.mkdtemp(prefix="orch-"))
    yield made
    shutil.rmtree(made, ignore_errors=True)


def outside_tmp() -> Path:
    """A private temp dir that is not under /tmp (which the sandbox empties), for what must stay where a sandboxed
    job could see it unless the daemon hides it: a PostgreSQL socket dir laid out as a distribution installs one."""
    import tempfile

    for base in (Path("/var/tmp"), Path.home() / ".cache"):
        real = Path(os.path.realpath(base))
        if real.is_dir() and os.access(real, os.W_OK) and not real.is_relative_to("/tmp"):
            made = Path(tempfile.mkdtemp(prefix="orch-test-", dir=real))
            made.chmod(0o755)  # others may pass through, as through /run: what lies within says who may read it
            return made
    pytest.skip("no writable temp dir outside /tmp (/var/tmp, ~/.cache) for the PostgreSQL socket dir")


@pytest.fixture(scope="session")
def postgres():
    """A real PostgreSQL server for the session (initdb + pg_ctl in a dir outside /tmp, its socket dir mode 755 as
    a distribution's, as an unprivileged user when root runs the tests); skipped, saying what to install, where
    the server programs or the driver are missing."""
    from orchestrator.lab.localpg import INSTALL_HINT, LocalPostgres, find_bindir

    if find_bindir() is None:
        pytest.skip(f"PostgreSQL tests need the server: {INSTALL_HINT}")
    pytest.importorskip("asyncpg", reason="PostgreSQL tests need the driver: pip install -e '.[team]'")
    # One server per worker (xdist's `gwN`), each in a dir of its own: its port only names its socket, kept apart
    # anyway so that two servers never share one name.
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    server = LocalPostgres(outside_tmp() / "pg", port=55432 + int(worker or 0)).start()
    # The node role's password as a node gets it (from its environment): for the daemons the tests start and the
    # stores they open in-process. Never in a URL: the config refuses a URL with a password.
    # And the team's secret (`core.seal`), the same on every node, as each node's env file gives it.
    import secrets

    given = {**server.env(), "ORCHESTRATOR_TEAM_SECRET": secrets.token_hex(32)}
    before = {k: os.environ.get(k) for k in given}
    os.environ.update(given)
    yield server
    for k, v in before.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    server.remove()
    os.rmdir(server.root.parent)


@pytest.fixture
def pg_url(postgres, request) -> str:
    """The URL of a new, empty database on the session's PostgreSQL server."""
    import re
    import uuid

    name = re.sub(r"[^a-z0-9_]", "_", request.node.name.lower())[:40] + "_" + uuid.uuid4().hex[:8]
    return postgres.create_database(name)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """`small_fs("2m")`: a fresh tmpfs of that size under `tmp_path` (or `at` a given dir) for tests of a full disk,
    unmounted at the end (mounting needs root: the test is skipped, saying so, without it)."""
    made: list[Path] = []

    def mount(size: str, at: Path | None = None) -> Path:
        where = at or tmp_path / f"fs{len(made)}"
        where.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"mounting a small tmpfs needs root (mount: {done.stderr.decode().strip()})")
        made.append(where)
        return where

    yield mount
    for where in made:
        subprocess.run(["umount", "-l", str(where)], check=False)
