"""`command` runners from config templates: the prompt is one argument, only named variables pass."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from orchestrator import config
from orchestrator.proc import jobpath
from orchestrator.runners.command import claimed_files, expand, remove_side_files
from tests.conftest import git

FAKE_AGENT = """\
import json, os, sys
names = ["FAKE_AGENT_KEY", "SECRET_TOKEN_X", "ANTHROPIC_API_KEY", "OPENAI_API_KEY"]
home = os.environ["HOME"]
report = {
    "argv": sys.argv[1:],
    "env": {k: os.environ.get(k) for k in names},
    "home": home,
    "home_files": sorted(os.listdir(home)),
    "rc": open(os.path.join(home, ".fakerc")).read(),
    "cwd": os.getcwd(),
    "path": os.environ["PATH"],
    "claim": os.environ["ORCHESTRATOR_CLAIM"],
    "fixed": os.environ.get("FIXED_VALUE"),
}
with open(os.path.join(home, ".fakerc"), "w") as f:
    f.write("changed by job\\n")  # a CLI rewriting its config: only the job's copy changes
open("agent-report.json", "w").write(json.dumps(report))
"""

PROMPT = """Fix "it" & 'that' in src/a.py
second line $(touch PWNED) `touch PWNED2`; rm -rf src \\ {braces} $HOME"""


def test_placeholders_are_replaced_inside_one_argument_only():
    """`{prompt}` becomes exactly one argument; unknown braces stay as written."""
    assert expand(("cli", "--message", "{prompt}", "x{job_id}", "{other}"), {"prompt": "a b\nc", "job_id": "7"}) == [
        "cli", "--message", "a b\nc", "x7", "{other}"
    ]  # fmt: skip


def test_a_command_runner_gets_the_prompt_as_one_argument_and_only_named_variables(
    make_repo, daemon_factory, tmp_path
):
    """Quotes, newlines and `$(...)` arrive intact and unexecuted; secrets not named stay out; HOME is a copy."""
    repo = make_repo()
    agent = tmp_path / "fake-agent.py"
    agent.write_text(FAKE_AGENT)
    real_home = tmp_path / "realhome"
    real_home.mkdir()
    (real_home / ".fakerc").write_text("token=from-real-home\n")
    d = daemon_factory(
        env={
            "HOME": str(real_home),
            "FAKE_AGENT_KEY": "visible",
            "SECRET_TOKEN_X": "hidden",
            "ANTHROPIC_API_KEY": "sk-ant-hidden-from-the-agent",
            "OPENAI_API_KEY": "sk-hiddenhiddenhiddenhidden",
        }
    )
    (d.home / "config").mkdir(parents=True)
    (d.home / "config" / "config.toml").write_text(
        "[runners.fake]\n"
        f'argv = ["{sys.executable}", "{agent}", "--message", "{{prompt}}", "--job", "{{job_id}}"]\n'
        'pass_env = ["FAKE_AGENT_KEY"]\n'
        'env = { FIXED_VALUE = "job {job_id}", FAKE_AGENT_KEY = "fixed wins" }\n'
        "scratch_home = true\n"
        'home_files = [".fakerc"]\n'
    )
    d.start()
    job = d.enqueue(repo, PROMPT, "--runner", "fake", "--path", "agent-report.json")
    assert d.cli("wait", str(job), "--timeout", "60").returncode == 0, d.cli_json("show", str(job))["reason"]
    report = json.loads(git(repo, "show", "main:agent-report.json"))
    assert report["argv"] == ["--message", PROMPT, "--job", str(job)]
    assert report["env"] == {
        "FAKE_AGENT_KEY": "fixed wins",
        "SECRET_TOKEN_X": None,
        "ANTHROPIC_API_KEY": None,
        "OPENAI_API_KEY": None,
    }
    assert report["fixed"] == f"job {job}" and report["claim"] == "agent-report.json"
    assert Path(report["home"]) != real_home and report["home_files"] == [".fakerc"]
    venv_bin = str(Path(sys.prefix) / "bin")
    assert venv_bin not in report["path"].split(":"), "never the daemon's own venv on a job's PATH"
    assert report["rc"] == "token=from-real-home\n"
    assert (real_home / ".fakerc").read_text() == "token=from-real-home\n", "the real config is untouched"
    assert git(repo, "ls-tree", "-r", "--name-only", "main").count("PWNED") == 0
    d.stop()  # its warm worktrees come and go while it runs: the scan below needs a still tree
    assert not list(tmp_path.rglob("PWNED*")), "nothing in the prompt was executed"
    assert git(repo, "log", "--format=%s", "main").splitlines()[0].startswith("Fix \"it\" & 'that' in src/a.py")


def test_paths_placeholder_is_the_claimed_files_there_at_the_start(tmp_path):
    """`{paths}` alone in an argument: one argument per claimed file that exists (no dirs, no files to come)."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("a\n")
    files = claimed_files(tmp_path, frozenset({"src/a.py", "src/", "new.py", "src/*.py"}))
    assert files == ["src/a.py"]
    assert expand(("aider", "--message", "{prompt}", "{paths}", "x{paths}"), {"prompt": "p"}, files) == [
        "aider", "--message", "p", "src/a.py", "x{paths}"
    ]  # fmt: skip


def test_a_clis_new_side_files_are_removed_but_tracked_ones_stay(tmp_path):
    """`ignore` globs remove what the CLI added (files and dirs, at any depth), never a file the base has."""
    for rel in (".aider.chat.history.md", ".aider.tags.cache.v4/cache.db", "sub/.aider.input.history",
                ".aider.conf.yml", "keep.txt"):  # fmt: skip
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    gone = remove_side_files(tmp_path, (".aider*",), tracked={".aider.conf.yml", "keep.txt"})
    assert gone == [".aider.chat.history.md", ".aider.tags.cache.v4", "sub/.aider.input.history"]
    left = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    assert left == [".aider.conf.yml", "keep.txt", "sub"]


def test_profiles_copy_only_sign_in_files_and_config_changes_them_key_by_key(tmp_path):
    """The shipped profiles' scratch HOME copies sign-in files, never a CLI's history; `[runners.NAME]` of a
    profile changes the keys it names (its `env` merged)."""
    from orchestrator.core.job import Job
    from orchestrator.core.models import JobState
    from orchestrator.runners.base import RunContext
    from orchestrator.runners.confined import private_home

    real = tmp_path / "real"
    (real / ".claude" / "projects" / "-other").mkdir(parents=True)
    (real / ".claude" / "projects" / "-other" / "s.jsonl").write_text("history")
    (real / ".claude" / ".credentials.json").write_text("{}")
    (real / ".claude.json").write_text('{"projects": {"/other": {}}}')
    job = Job(id=1, repo=str(tmp_path), branch="main", text="t", runner="claude-code", state=JobState.RUNNING)
    ctx = RunContext(job=job, worktree=tmp_path, log_path=tmp_path / "1.log", timeout=1, private_dir=tmp_path / "p")
    home = private_home(ctx, config.PROFILES["claude-code"].home_files, source=real)
    copied = sorted(p.relative_to(home).as_posix() for p in home.rglob("*") if p.is_file())
    assert copied == [".claude/.credentials.json"]
    cfg = config.parse({"runners": {"aider": {"env": {"AIDER_MODEL": "m"}, "timeout": 5}}}, {})
    aider = cfg.runners["aider"]
    assert aider.env == {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "AIDER_MODEL": "m"} and aider.timeout == 5
    assert aider.argv == config.PROFILES["aider"].argv and cfg.runners["claude-code"] == config.PROFILES["claude-code"]


def test_a_jobs_path_is_the_login_path_first_without_the_daemons_venv():
    """Login entries first, then the daemon's others without its venv bin (unless the login path has it)."""
    assert jobpath.merged(["/usr/local/bin", "/usr/bin"], ["/venv/bin", "/opt/x/bin", "/usr/bin"], "/venv/bin") == (
        "/usr/local/bin:/usr/bin:/opt/x/bin"
    )
    assert jobpath.merged(["/venv/bin", "/usr/bin"], ["/venv/bin"], "/venv/bin") == "/venv/bin:/usr/bin"


def test_a_template_named_like_a_builtin_is_a_config_error(daemon_factory):
    """`[runners.shell]` is refused at start with exit 78 and the key named."""
    d = daemon_factory(process=True)
    (d.home / "config").mkdir(parents=True)
    (d.home / "config" / "config.toml").write_text('[runners.shell]\nargv = ["sh"]\n')
    d.start(wait=False)
    assert d.wait_exit(30) == 78
    assert "runners.shell" in d.log_path.read_text()


def test_a_jobs_private_dir_goes_when_nothing_of_its_attempt_is_kept():
    """Landed, or ended before it ran: its scratch HOME goes; failed, cancelled running, ready: kept for a retry."""
    from orchestrator.core.job import Job
    from orchestrator.core.models import JobState
    from orchestrator.jobs.privatedirs import done_with

    def job(state: JobState, started: float | None = 1.0) -> Job:
        return Job(id=1, repo="/r", branch="main", text="t", runner="shell", state=state, started_at=started)

    assert done_with(job(JobState.LANDED)) and done_with(job(JobState.CANCELLED, None))
    assert not any(done_with(job(s)) for s in (JobState.FAILED, JobState.CANCELLED, JobState.READY,
                                               JobState.INTERRUPTED, JobState.CONFLICTED))  # fmt: skip
