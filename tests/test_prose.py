"""A text in words queued with no runner goes to the configured agent when a job can run it, and is refused with the
command to use otherwise; a shell command stays a shell job; `enqueue` says which runner and what the job meets."""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.core import prose
from orchestrator.requests import Enqueue
from orchestrator.validate import BadRequest
from tests.plane import plane

TICKET = "Fix the docstring of echo in src/click/utils.py"


def _programs(*names: str):
    return lambda word: word in names


@pytest.mark.parametrize(
    ("text", "is_prose"),
    [
        (TICKET, True),
        ("Make the login form remember the user", True),
        ("Paths: src/a.py\n\nAdd a test for the empty input", True),
        ("pytest -q tests/test_api.py", False),
        ("echo hi > a.txt", False),
        ("true", False),
        ("FOO=1 pytest", False),
        ("./run.sh --fast", False),
        ("# a comment first\nsed -i s/a/b/ x", False),
        ("(cd src && pytest)", False),
        ("for f in *.py; do black $f; done", False),
        ("echo>x", False),
    ],
)
def test_a_text_reads_as_words_or_as_a_command(text: str, is_prose: bool) -> None:
    """The first word the shell would run decides: a keyword, builtin, assignment, path or program is a command."""
    assert prose.read(text, _programs("pytest", "sed", "black")).prose is is_prose


@pytest.mark.parametrize(
    ("text", "missing"),
    [
        ("pytest -q tests/test_api.py", True),
        ("make test | tee out.txt", True),
        ("ruff check . > lint.txt", True),
        ("fix the login bug - it crashes", False),
        ("update deps; then run the tests", False),
        ("Fix the flaky test -k slow", False),
    ],
)
def test_a_command_line_whose_program_is_missing_is_not_words(text: str, missing: bool) -> None:
    """A lower-case program followed by an option or an operator is a command even when no job can find it."""
    reading = prose.read(text, _programs())
    assert reading.missing is missing and reading.prose is not missing


async def test_a_command_whose_program_a_job_cannot_find_is_refused_saying_so(make_repo, tmp_path, cli_dir) -> None:
    """`pytest -q ...` with no pytest on a job's PATH is refused as a missing program, never sent to an agent."""
    repo = make_repo()
    _fake(cli_dir, "claude")
    async with plane(tmp_path, agent="claude-code") as p:
        with pytest.raises(BadRequest) as refused:
            await p.enqueue(repo, "pytest -q tests/test_api.py", "tests/test_api.py")
        said = str(refused.value)
        assert "reads as a shell command, but `pytest` is no program on a job's PATH" in said, said
        assert "`.venv/bin/pytest`" in said and "exit 127" in said, said
        assert await p.jobs.store.jobs.all() == [], "nothing was queued"


@pytest.fixture
def cli_dir(monkeypatch) -> Iterator[Path]:
    """A dir on PATH (outside /tmp, where a job's sandbox would not see it) for stand-in agent CLIs."""
    where = Path(tempfile.mkdtemp(prefix="orchestrator-test-", dir="/var/tmp"))
    monkeypatch.setenv("PATH", f"{where}:/usr/bin:/bin")
    yield where
    shutil.rmtree(where)


def _fake(folder: Path, name: str) -> None:
    (folder / name).write_text("#!/bin/sh\necho \"$@\" > from-the-cli.txt\n")
    (folder / name).chmod(0o755)


async def test_words_with_no_agent_set_are_refused_with_the_command_to_use(make_repo, tmp_path, cli_dir) -> None:
    """No `[jobs] agent`: the refusal names the word, an agent a job can run here, the setting and `--runner shell`."""
    repo = make_repo()
    _fake(cli_dir, "codex")
    async with plane(tmp_path) as p:
        with pytest.raises(BadRequest) as refused:
            await p.enqueue(repo, TICKET)
        said = str(refused.value)
        assert "reads as a task in words" in said and "`Fix` is no command" in said, said
        assert "`orchestrator enqueue --runner codex ...`" in said and '`[jobs] agent = "codex"`' in said, said
        assert "`--runner shell` runs it as a shell script anyway" in said
        assert await p.jobs.store.jobs.all() == [], "nothing was queued"
        # A command, an exact argv, and a text that names its runner are queued as they are.
        shell = await p.jobs.submit(Enqueue(repo=str(repo), text="echo hi > a.txt", paths=("a.txt",)))
        argv = await p.jobs.submit(Enqueue(repo=str(repo), argv=("Fix", "it"), paths=("b.txt",)))
        named = await p.jobs.submit(Enqueue(repo=str(repo), text=TICKET, runner="shell", paths=("c.txt",)))
        assert (shell.runner, argv.runner, named.runner) == ("shell", "shell", "shell")


async def test_words_go_to_the_configured_agent_when_a_job_can_run_it(make_repo, tmp_path, cli_dir) -> None:
    """`[jobs] agent = "claude-code"` and its CLI on a job's PATH: the text goes to it; without the CLI, refused."""
    repo = make_repo()
    async with plane(tmp_path, agent="claude-code") as p:
        with pytest.raises(BadRequest) as refused:
            await p.enqueue(repo, TICKET, "src/a.py")
        said = str(refused.value)
        assert "the default agent claude-code cannot run here: claude is not on a job's PATH" in said, said
        assert re.search(r"no agent can run a job here \(.*claude-code.*\)", said), said
        _fake(cli_dir, "claude")
        job = await p.jobs.get(await p.enqueue(repo, TICKET, "src/a.py"))
        assert job.runner == "claude-code"
        command = await p.jobs.get(await p.enqueue(repo, "echo hi > b.txt", "b.txt"))
        assert command.runner == "shell", "a command still goes to the shell"


def test_enqueue_says_which_runner_and_what_the_job_meets(make_repo, daemon_factory, cli_dir, tmp_path) -> None:
    """The real CLI: a text in words runs with the configured agent, and each job's lines say whom it waits for, or
    beside whom it may start."""
    from tests.test_e2e_jobs import wait_for_file

    repo = make_repo()
    _fake(cli_dir, "claude")
    d = daemon_factory(env={"PATH": f"{cli_dir}:/usr/bin:/bin", "MAX_CONCURRENT_JOBS": "4"})
    (d.home / "config").mkdir(parents=True, exist_ok=True)
    (d.home / "config" / "config.toml").write_text('[jobs]\nagent = "claude-code"\n')
    d.start()
    gate = tmp_path / "gate"
    holder = d.enqueue(repo, f"{wait_for_file(gate, 600)}; echo a > src/a.py", "--path", "src/a.py")

    def said(*args: str) -> str:
        out = d.cli("enqueue", "--repo", str(repo), *args)
        assert out.returncode == 0, out.stderr
        return out.stderr

    waiting = said("--path", "src/a.py", "--", "echo again > src/a.py")
    assert "runs with shell" in waiting and f"waits for job {holder} (src/a.py)" in waiting, waiting
    beside = said("--path", "docs/x.md", "--", "echo b > docs/x.md")
    assert "none of it is held, so it may start" in beside, beside
    words = said("--", TICKET)
    assert "runs with claude-code (the agent [jobs] names for a text in words)" in words, words
    assert "its claim is predicted from its text" in words, words
    assert d.cli("pause", "--repo", str(repo)).returncode == 0
    paused = said("--path", "docs/y.md", "--", "echo y > docs/y.md")
    assert "nothing new starts while its repository is paused: `orchestrator resume` lifts it" in paused, paused
    gate.touch()
