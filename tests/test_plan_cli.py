"""The CLI planner: real Claude Code in its read-only plan mode, against a local Messages API stand-in, plans
a job's paths through the real daemon; an answer without a plan falls back to local evidence, saying why."""

from __future__ import annotations

import json
import os

from orchestrator.lab.doubles.anthropic import text_message
from orchestrator.lab.doubles.script import Conversations
from tests import clis
from tests.conftest import git
from tests.doubles import anthropic_double


def test_claude_codes_plan_mode_names_the_paths_and_a_useless_answer_falls_back(make_repo, daemon_factory, tmp_path):
    """`plan.planner = "cli"`: Claude Code's plan (JSON in its answer) is the claim; prose falls back to local."""
    clis.need("claude")
    repo = make_repo(files={"README.md": "r\n", "src/login.py": "def login():\n    pass\n", "src/other.py": "x\n"})
    plan = {"paths": ["src/login.py", "tests/test_login.py"], "confidence": 0.7, "plan": "Remember the user."}
    conv = Conversations(
        {
            "remember the user": [text_message(f"Here is the plan:\n```json\n{json.dumps(plan)}\n```")],
            "something vague": [text_message("I would look around the code first.")],
        },
        side=text_message("ok"),
    )
    home = tmp_path / "userhome"
    home.mkdir()
    with anthropic_double(conv) as double:
        env = {"ANTHROPIC_API_KEY": "sk-ant-plan", "ANTHROPIC_BASE_URL": double.url, "HOME": str(home),
               "PATH": f"{clis.bin_dir('claude')}:{os.environ.get('PATH', '/usr/bin:/bin')}",
               "ORCHESTRATOR_SANDBOX": "bwrap"}  # fmt: skip
        d = daemon_factory(env=env)
        (d.home / "config").mkdir(parents=True)
        (d.home / "config" / "config.toml").write_text('[plan]\nplanner = "cli"\ndeadline = 60\n')
        d.start()
        good = d.cli_json("plan", "--repo", str(repo), "Make the login form remember the user")
        vague = d.cli_json("plan", "--repo", str(repo), "Do something vague to src/other.py")
    assert good["claim"]["source"] == "model" and good["plan_text"] == "Remember the user."
    assert {"src/login.py", "tests/test_login.py"} <= set(good["claim"]["paths"])
    assert any(e["kind"] == "model" and "claude-code" in e["why"] for e in good["evidence"])
    asked = conv.requests("remember the user")
    assert asked and "src/login.py" in json.dumps(asked[0]["messages"]), "the planning prompt lists the files"
    assert vague["claim"]["source"] != "model"
    assert [n["code"] for n in vague["notes"]][:1] == ["ModelMalformed"]
    assert git(repo, "status", "--porcelain") == "", "planning changed nothing"
