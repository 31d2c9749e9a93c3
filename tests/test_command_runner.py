"""`command` runners from config templates: the prompt is one argument, only named variables pass."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from orchestrator.runners.command import expand
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
        "scratch_home = true\n"
        'home_files = [".fakerc"]\n'
    )
    d.start()
    job = d.enqueue(repo, PROMPT, "--runner", "fake", "--path", "agent-report.json")
    assert d.cli("wait", str(job), "--timeout", "60").returncode == 0, d.cli_json("show", str(job))["reason"]
    report = json.loads(git(repo, "show", "main:agent-report.json"))
    assert report["argv"] == ["--message", PROMPT, "--job", str(job)]
    assert report["env"] == {
        "FAKE_AGENT_KEY": "visible",
        "SECRET_TOKEN_X": None,
        "ANTHROPIC_API_KEY": None,
        "OPENAI_API_KEY": None,
    }
    assert Path(report["home"]) != real_home and report["home_files"] == [".fakerc"]
    assert report["rc"] == "token=from-real-home\n"
    assert (real_home / ".fakerc").read_text() == "token=from-real-home\n", "the real config is untouched"
    assert git(repo, "ls-tree", "-r", "--name-only", "main").count("PWNED") == 0
    assert not list(tmp_path.rglob("PWNED*")), "nothing in the prompt was executed"
    assert git(repo, "log", "--format=%s", "main").splitlines()[0].startswith("Fix \"it\" & 'that' in src/a.py")


def test_a_template_named_like_a_builtin_is_a_config_error(daemon_factory):
    """`[runners.shell]` is refused at start with exit 78 and the key named."""
    d = daemon_factory()
    (d.home / "config").mkdir(parents=True)
    (d.home / "config" / "config.toml").write_text('[runners.shell]\nargv = ["sh"]\n')
    d.start(wait=False)
    assert d.wait_exit(30) == 78
    assert "runners.shell" in d.log_path.read_text()
