"""Real agent CLIs through the real daemon, under bubblewrap, against local stand-ins of their model APIs.

Claude Code (npm) and aider (PyPI) run as `command` runners as a user configures them; the model is a
scripted protocol double (`orchestrator.lab.doubles`) speaking the Messages API or the OpenAI chat API, started
by the test. Each test asserts what landed on the branch, and nothing else of how the job's workspace is
made.
"""

from __future__ import annotations

import json
import os
import shlex
from datetime import datetime
from pathlib import Path
from typing import Any

from orchestrator.lab.doubles.anthropic import Reply, error_reply, text_message, tool_use_message
from orchestrator.lab.doubles.openai import chat_message
from orchestrator.lab.doubles.openai import error_reply as openai_error
from orchestrator.lab.doubles.responses import error_reply as responses_error
from orchestrator.lab.doubles.responses import exec_command, output_message
from orchestrator.lab.doubles.script import Conversations, Turn, text_of
from tests import clis
from tests.conftest import git
from tests.doubles import anthropic_double, openai_double, responses_double
from tests.harness import until
from tests.test_rate_limits import FORGED
from tests.test_sandbox import needs_bwrap

KEY = "sk-ant-test-key-for-the-stand-in"


def _daemon(daemon_factory, tmp_path: Path, tool: str, env: dict[str, str], config: str = ""):
    """A daemon with bwrap required, the CLI on its PATH, a user HOME of the test's own and local planning;
    the runners are the shipped profiles (plus `config`)."""
    home = tmp_path / "userhome"
    home.mkdir(exist_ok=True)
    path = f"{clis.bin_dir(tool)}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    env = {"ORCHESTRATOR_SANDBOX": "bwrap", "HOME": str(home), "PATH": path, "MAX_CONCURRENT_JOBS": "4", **env}
    d = daemon_factory(env=env)
    (d.home / "config").mkdir(parents=True, exist_ok=True)
    (d.home / "config" / "config.toml").write_text('[plan]\nplanner = "local"\n' + config)
    return d.start()


def _finish(d, *jobs: int) -> list[dict[str, Any]]:
    """Wait for the jobs; each must have landed (else the failure says why, with its log)."""
    out = d.cli("wait", *map(str, jobs), "--timeout", "120")
    shown = [d.cli_json("show", str(j)) for j in jobs]
    assert out.returncode == 0, [(j["state"], j["reason"], d.cli("logs", str(j["id"])).stdout[-3000:]) for j in shown]
    return shown


def _landed(repo: Path, job: dict[str, Any]) -> dict[str, str]:
    """What the job's landing changed on the branch (from the head before it): path → new content."""
    assert job["landed_sha"], job["reason"]
    names = git(repo, "diff", "--name-only", job["landed_sha"] + "^1", job["landed_sha"]).splitlines()
    return {n: git(repo, "show", f"{job['landed_sha']}:{n}") for n in sorted(names)}


def _write(rel: str, content: str) -> Any:
    return lambda t: tool_use_message("Write", {"file_path": t.path(rel), "content": content})


def _edit(rel: str, old: str, new: str) -> Any:
    return lambda t: tool_use_message("Edit", {"file_path": t.path(rel), "old_string": old, "new_string": new})


def _read(rel: str) -> Any:
    return lambda t: tool_use_message("Read", {"file_path": t.path(rel)})


@needs_bwrap
def test_claude_code_lands_exactly_its_change_under_bwrap(make_repo, daemon_factory, tmp_path):
    """The shipped `claude-code` profile, as is: real Claude Code writes one file and edits another; exactly
    those land; its cost, tokens and transcript are kept on the job."""
    clis.need("claude")
    repo = make_repo()
    conv = Conversations(
        {
            "greet the world": [
                _write("hello.txt", "hello\n"),
                _read("src/a.py"),
                _edit("src/a.py", "a = 1", "a = 2"),
                text_message("Wrote hello.txt and set a to 2."),
            ]
        },
        side=text_message("ok"),
        tools_only=True,
    )
    with anthropic_double(conv) as double:
        d = _daemon(daemon_factory, tmp_path, "claude", {"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": double.url})
        job = d.enqueue(repo, "Please greet the world in hello.txt and set a to 2", "--runner", "claude-code",
                        "--path", "hello.txt", "--path", "src/a.py")  # fmt: skip
        (shown,) = _finish(d, job)
    assert _landed(repo, shown) == {"hello.txt": "hello", "src/a.py": "a = 2"}
    turns = conv.requests("greet the world")
    assert len(turns) == 4, "every scripted turn was asked for"
    assert {h["x-api-key"] for h in double.headers} == {KEY}, "the key reached it through pass_env"
    usage = shown["usage"]
    assert usage["source"] == "claude-code" and usage["calls"] == 4 and usage["session_id"]
    assert usage["input_tokens"] == 400 and usage["output_tokens"] == 80 and usage["cost_usd"] > 0
    transcript = d.cli("logs", "--transcript", str(shown["id"]))
    assert transcript.returncode == 0 and "greet the world" in transcript.stdout and "Write" in transcript.stdout
    # Nothing of the job is left under the state dir: its scratch HOME went when it landed, the rest with clean.
    state = d.home / "state"
    until("the landed job's private dir removed", lambda: not any((state / "private").glob("*")))
    assert d.cli("clean", "--all").returncode == 0
    assert not any((state / "jobs").glob("*")), list((state / "jobs").iterdir())
    assert not list(state.rglob("job-*")) and not any((state / "private").glob("*"))


@needs_bwrap
def test_two_claude_code_jobs_on_disjoint_claims_run_at_once(make_repo, daemon_factory, tmp_path):
    """Two real Claude Code jobs with disjoint claims run side by side; each lands only its own files; the one
    that also wrote outside its claim has that as an event, and `why` says so."""
    clis.need("claude")
    repo = make_repo()

    def slow(step: Any) -> Any:
        # The first turn of each takes 3 s at the "model": run one after the other, they could not overlap.
        return lambda t: Reply(**{**step(t).__dict__, "delay": 3.0})

    conv = Conversations(
        {
            "first job": [slow(_write("src/one.py", "one = 1\n")), _write("zeta.txt", "z\n"), text_message("done")],
            "second job": [slow(_write("docs/two.md", "two\n")), text_message("done")],
        },
        side=text_message("ok"),
        tools_only=True,
    )
    with anthropic_double(conv) as double:
        d = _daemon(daemon_factory, tmp_path, "claude", {"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": double.url})
        a = d.enqueue(repo, "The first job: add src/one.py", "--runner", "claude-code", "--path", "src/one.py")
        b = d.enqueue(repo, "The second job: add docs/two.md", "--runner", "claude-code", "--path", "docs/two.md")
        ja, jb = _finish(d, a, b)
    assert _landed(repo, ja) == {"src/one.py": "one = 1", "zeta.txt": "z"}
    assert _landed(repo, jb) == {"docs/two.md": "two"}
    # The write outside its claim is an event of the job, and `why` says so.
    outside = [e for e in ja["events"] if e["kind"] == "outside_claim"]
    assert [e["paths"] for e in outside] == [["zeta.txt"]], ja["events"]
    assert "outside its claim: zeta.txt" in d.cli("why", str(a)).stdout
    assert not [e for e in jb["events"] if e["kind"] == "outside_claim"]
    assert ja["started_at"] < jb["finished_at"] and jb["started_at"] < ja["finished_at"], "they overlapped"
    assert git(repo, "show", "main:src/one.py") == "one = 1" and git(repo, "show", "main:docs/two.md") == "two"


AIDER_EDIT = """I'll add the greeting and change the value.

hello.txt
```
<<<<<<< SEARCH
=======
hello
>>>>>>> REPLACE
```

src/a.py
```python
<<<<<<< SEARCH
a = 1
=======
a = 2
>>>>>>> REPLACE
```
"""


def _aider_turn(t: Turn) -> Any:
    return chat_message(AIDER_EDIT)


@needs_bwrap
def test_aider_lands_exactly_its_change_under_bwrap(make_repo, daemon_factory, tmp_path):
    """Real aider applies the stand-in model's SEARCH/REPLACE edits; exactly those land, none of its side files."""
    clis.need("aider")
    repo = make_repo()
    # aider first asks to add the files the edit names to its chat, then asks the model again: the same edit.
    conv = Conversations({"greet the world": [_aider_turn, _aider_turn]}, side=chat_message("ok"))
    # The model's limits and prices, as a user of a model aider does not know gives them (no fetch from the web).
    (tmp_path / "userhome").mkdir()
    metadata = tmp_path / "userhome" / ".aider.model.metadata.json"  # the scratch HOME gets a copy
    metadata.write_text(json.dumps({"openai/gpt-double": {
        "max_input_tokens": 128000, "max_output_tokens": 4096, "input_cost_per_token": 1e-6,
        "output_cost_per_token": 2e-6, "litellm_provider": "openai", "mode": "chat"}}))  # fmt: skip
    with openai_double(conv) as double:
        env = {
            "OPENAI_API_KEY": "sk-test-openai", "OPENAI_API_BASE": double.url + "/v1",
            "AIDER_MODEL": "openai/gpt-double", "AIDER_EDIT_FORMAT": "diff",
        }  # fmt: skip
        d = _daemon(daemon_factory, tmp_path, "aider", env)
        job = d.enqueue(repo, "Please greet the world in hello.txt and set a to 2", "--runner", "aider",
                        "--path", "hello.txt", "--path", "src/a.py")  # fmt: skip
        (shown,) = _finish(d, job)
    assert _landed(repo, shown) == {"hello.txt": "hello", "src/a.py": "a = 2"}
    asked = conv.requests("greet the world")
    assert 1 <= len(asked) <= 2
    sent = "\n".join(text_of(m.get("content")) for m in asked[0]["messages"])
    assert "src/a.py" in sent and "a = 1" in sent, "{paths}: the claimed file that exists was in aider's chat"


@needs_bwrap
def test_claude_code_revise_resumes_its_session_and_lands_a_second_round(make_repo, daemon_factory, tmp_path):
    """`revise` on a ready Claude Code job: real Claude Code goes on with its own session (`--continue`) in the
    job's worktree, told the feedback; the second round lands on top of the first, on the same job."""
    clis.need("claude")
    repo = make_repo()
    conv = Conversations(
        {"greet the world": [_write("hello.txt", "hello\n"), text_message("Wrote hello.txt."),
                             _edit("hello.txt", "hello", "hello, world"), text_message("Greeted the world.")]},
        side=text_message("ok"),
        tools_only=True,
    )  # fmt: skip
    with anthropic_double(conv) as double:
        d = _daemon(daemon_factory, tmp_path, "claude", {"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": double.url})
        job = d.enqueue(repo, "Please greet the world in hello.txt", "--runner", "claude-code",
                        "--path", "hello.txt", "--land", "review")  # fmt: skip
        until("ready", lambda: d.cli_json("show", str(job))["state"] == "ready", timeout=90)
        first = d.cli_json("show", str(job))
        assert d.cli("revise", str(job), "Say hello to the whole world, please").returncode == 0
        until("ready again", lambda: (s := d.cli_json("show", str(job)))["state"] == "ready" and s["revisions"], 90)
        assert d.cli("land", str(job)).returncode == 0
        (shown,) = _finish(d, job)
    assert _landed(repo, shown) == {"hello.txt": "hello, world"}
    turns = conv.requests("greet the world")
    assert len(turns) == 4, "the resumed session went on with the next steps of the same conversation"
    said = [text_of(m.get("content")) for m in turns[2]["messages"] if m.get("role") == "user"]
    assert "Say hello to the whole world, please" in said[-1] and "greet the world" in said[0]
    assert first["usage"]["session_id"] and shown["usage"]["runs"] == 2 and shown["usage"]["calls"] >= 4


def _limited_first(conv: Conversations, limited: int, reply: Any) -> Any:
    """A script that answers the first `limited` requests of a scripted conversation with `reply` (a 429), then
    goes on with the conversation."""
    seen = [0]

    def script(body: dict[str, Any]) -> Any:
        name, _ = conv.route(body)
        if name is not None and seen[0] < limited:
            seen[0] += 1
            return reply
        return conv(body)

    return script


@needs_bwrap
def test_aider_rate_limited_is_stopped_waits_and_goes_on(make_repo, daemon_factory, tmp_path):
    """Real aider meets a 429 ("try again in 20s"): the daemon stops it at its first RateLimitError line instead
    of letting it retry on its own, the job waits (capped by `rate_limit_max_wait`, code RateLimited meanwhile),
    runs aider again in the same worktree, and lands exactly the change."""
    clis.need("aider")
    repo = make_repo()
    conv = Conversations({"greet the world": [_aider_turn, _aider_turn]}, side=chat_message("ok"))
    # Its retry-after header only paces the OpenAI client's own quick retries; the message names the real wait.
    limit = openai_error(
        429, "Rate limit reached for gpt-double on tokens per min (TPM). Please try again in 20s.", retry_after=0.05
    )
    (tmp_path / "userhome").mkdir()
    (tmp_path / "userhome" / ".aider.model.metadata.json").write_text(json.dumps({"openai/gpt-double": {
        "max_input_tokens": 128000, "max_output_tokens": 4096, "input_cost_per_token": 1e-6,
        "output_cost_per_token": 2e-6, "litellm_provider": "openai", "mode": "chat"}}))  # fmt: skip
    # Three: the OpenAI client under aider retries a 429 twice by itself first (a short limit it rides out).
    with openai_double(_limited_first(conv, 3, limit)) as double:
        env = {
            "OPENAI_API_KEY": "sk-test-openai", "OPENAI_API_BASE": double.url + "/v1",
            "AIDER_MODEL": "openai/gpt-double", "AIDER_EDIT_FORMAT": "diff",
        }  # fmt: skip
        # The wait long enough that `why` (a CLI call in this process) still sees it.
        d = _daemon(daemon_factory, tmp_path, "aider", env, "[jobs]\nrate_limit_max_wait = 3\n")
        job = d.enqueue(repo, "Please greet the world in hello.txt and set a to 2", "--runner", "aider",
                        "--path", "hello.txt", "--path", "src/a.py")  # fmt: skip
        # aider (litellm) takes tens of seconds to start on a loaded machine, in its terminal as on a pipe.
        until("it waits", lambda: d.cli_json("show", str(job))["code"] == "RateLimited", timeout=90)
        assert "rate-limited by its model API" in d.cli("why", str(job)).stdout
        (shown,) = _finish(d, job)
    assert _landed(repo, shown) == {"hello.txt": "hello", "src/a.py": "a = 2"}
    waited = [e for e in shown["events"] if e["kind"] == "rate_limited"]
    assert [e["seconds"] for e in waited] == [3], "the 20 s asked for, capped by rate_limit_max_wait"
    log = d.cli("logs", str(job)).stdout
    assert "[stopped: its output says" in log and "Retrying in 0.5 seconds" not in log, "aider did not retry itself"


@needs_bwrap
def test_claude_code_rate_limited_waits_and_holds_back_its_runners_new_jobs(make_repo, daemon_factory, tmp_path):
    """Real Claude Code gives up on a 429 with an hour's retry-after: its job is not failed but waits (code
    RateLimited); a new claude-code job waits too, with the time it starts; both then land by themselves."""
    clis.need("claude")
    repo = make_repo()
    conv = Conversations(
        {"first job": [_write("src/one.py", "one = 1\n"), text_message("done")],
         "second job": [_write("docs/two.md", "two\n"), text_message("done")]},
        side=text_message("ok"),
        tools_only=True,
    )  # fmt: skip
    limit = error_reply(429, "Number of request tokens has exceeded your per-minute rate limit", retry_after=3600)
    with anthropic_double(_limited_first(conv, 1, limit)) as double:
        # The wait outlasts the few in-process CLI calls that look at b while it lasts.
        d = _daemon(daemon_factory, tmp_path, "claude", {"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": double.url},
                    "[jobs]\nrate_limit_wait = 6\n")  # fmt: skip
        a = d.enqueue(repo, "The first job: add src/one.py", "--runner", "claude-code", "--path", "src/one.py")
        until("a waits", lambda: d.cli_json("show", str(a))["code"] == "RateLimited", timeout=60)
        b = d.enqueue(repo, "The second job: add docs/two.md", "--runner", "claude-code", "--path", "docs/two.md")
        until("b held back", lambda: d.cli_json("show", str(b))["code"] == "RateLimited", timeout=10)
        assert "rate-limited until" in d.cli_json("why", str(b))["decision"]["message"]
        ja, jb = _finish(d, a, b)
    assert _landed(repo, ja) == {"src/one.py": "one = 1"} and _landed(repo, jb) == {"docs/two.md": "two"}
    [waited] = [e for e in ja["events"] if e["kind"] == "rate_limited"]
    assert datetime.fromisoformat(jb["started_at"]).timestamp() >= waited["until"] - 0.5, "b started once it ended"


@needs_bwrap
def test_claude_code_whose_agent_says_a_limits_words_is_not_rate_limited(make_repo, daemon_factory, tmp_path):
    """Real Claude Code whose agent ends its turn with every form a limit's words ever took (a whole forged result
    object, a reset time, aider's and codex's lines) is not rate-limited: its words are inside its result's
    `result` string. It lands, and the runner's next job starts and lands as well (nothing held back)."""
    clis.need("claude")
    repo = make_repo()
    # The phrases are on the texts' second lines: Claude Code shows the repository's last commit subjects.
    conv = Conversations(
        {"(the first job)": [_write("src/one.py", "one = 1\n"), text_message("\n".join(FORGED))],
         "(the second job)": [_write("docs/two.md", "two\n"), text_message("done")]},
        side=text_message("ok"),
        tools_only=True,
    )  # fmt: skip
    with anthropic_double(conv) as double:
        d = _daemon(daemon_factory, tmp_path, "claude", {"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": double.url},
                    "[jobs]\nrate_limit_max_wait = 3600\n")  # fmt: skip
        a = d.enqueue(repo, "Add src/one.py\n(the first job)", "--runner", "claude-code", "--path", "src/one.py")
        (ja,) = _finish(d, a)
        assert "usage limit reached|9999999999" in d.cli("logs", str(a)).stdout, "the words were in its output"
        b = d.enqueue(repo, "Add docs/two.md\n(the second job)", "--runner", "claude-code", "--path", "docs/two.md")
        (jb,) = _finish(d, b)
    assert _landed(repo, ja) == {"src/one.py": "one = 1"} and _landed(repo, jb) == {"docs/two.md": "two"}
    assert not [e for j in (ja, jb) for e in j["events"] if e["kind"] == "rate_limited"]


def _codex_home(home: Path, url: str) -> None:
    """The user's codex config, as one with a gateway writes it: a model provider of the Responses API at `url`
    (the job's scratch HOME gets a copy, as the profile's `home_files` say)."""
    (home / ".codex").mkdir(parents=True, exist_ok=True)
    (home / ".codex" / "config.toml").write_text(
        'model = "gpt-double"\nmodel_provider = "double"\n\n[model_providers.double]\nname = "double"\n'
        f'base_url = "{url}/v1"\nenv_key = "OPENAI_API_KEY"\nwire_api = "responses"\n'
    )


@needs_bwrap
def test_codex_lands_exactly_its_change_and_a_revised_second_round_under_bwrap(make_repo, daemon_factory, tmp_path):
    """The shipped `codex` profile, as is: real codex runs the stand-in model's shell commands in the job's worktree,
    writing one file and editing another; `revise` resumes its session (`codex exec resume --last`) told the
    feedback, and exactly both rounds' changes land."""
    clis.need("codex")
    repo = make_repo()
    before = git(repo, "rev-parse", "main")
    conv = Conversations(
        {"greet the world": [exec_command("printf 'hello\\n' > hello.txt"),
                             exec_command("sed -i 's/a = 1/a = 2/' src/a.py"),
                             output_message("Wrote hello.txt and set a to 2."),
                             exec_command("printf 'bye\\n' > bye.txt"),
                             output_message("Said bye too.")]},
        side=output_message("ok"),
    )  # fmt: skip
    with responses_double(conv) as double:
        _codex_home(tmp_path / "userhome", double.url)
        d = _daemon(daemon_factory, tmp_path, "codex", {"OPENAI_API_KEY": "sk-test-openai"})
        job = d.enqueue(repo, "Please greet the world in hello.txt and set a to 2", "--runner", "codex",
                        "--path", "hello.txt", "--path", "src/a.py", "--land", "review")  # fmt: skip
        until("ready", lambda: d.cli_json("show", str(job))["state"] == "ready", timeout=90)
        assert d.cli("revise", str(job), "Please say bye in bye.txt as well").returncode == 0
        until("ready again", lambda: (s := d.cli_json("show", str(job)))["state"] == "ready" and s["revisions"], 90)
        assert d.cli("land", str(job)).returncode == 0
        (shown,) = _finish(d, job)
    names = git(repo, "diff", "--name-only", before, shown["landed_sha"]).splitlines()  # both rounds
    landed = {n: git(repo, "show", f"main:{n}") for n in names}
    assert landed == {"bye.txt": "bye", "hello.txt": "hello", "src/a.py": "a = 2"}
    turns = conv.requests("greet the world")
    assert len(turns) == 5, "every scripted turn was asked for; the resumed session went on with the same one"
    ran = [i["output"] for i in turns[-1]["input"] if i.get("type") == "function_call_output"]
    assert len(ran) == 3 and all("exited with code 0" in r for r in ran), ran
    said = [m["content"] for m in turns[3]["messages"] if m["role"] == "user"]
    assert "Please say bye in bye.txt as well" in said[-1]
    assert {h["authorization"] for h in double.headers} == {"Bearer sk-test-openai"}, "the key came through pass_env"


@needs_bwrap
def test_codex_whose_commands_print_a_limits_words_is_not_rate_limited(make_repo, daemon_factory, tmp_path):
    """Real codex running a command that prints the words of a limit in every form but codex's own warning line
    (codex echoes the command and its output): the job is not rate-limited and lands."""
    clis.need("codex")
    repo = make_repo()
    printing = "printf '%s\\n' " + " ".join(shlex.quote(line) for line in FORGED[:-1])
    conv = Conversations({"greet the world": [exec_command(printing + " && printf 'hello\\n' > hello.txt"),
                                              output_message("done: 429 Too Many Requests")]},
                         side=output_message("ok"))  # fmt: skip
    with responses_double(conv) as double:
        _codex_home(tmp_path / "userhome", double.url)
        d = _daemon(daemon_factory, tmp_path, "codex", {"OPENAI_API_KEY": "sk-test-openai"})
        job = d.enqueue(repo, "Please greet the world in hello.txt", "--runner", "codex", "--path", "hello.txt")
        (shown,) = _finish(d, job)
    assert _landed(repo, shown) == {"hello.txt": "hello"}
    assert not [e for e in shown["events"] if e["kind"] == "rate_limited"]
    assert "usage limit reached|9999999999" in d.cli("logs", str(job)).stdout, "the words were in its output"


@needs_bwrap
def test_codex_rate_limited_is_stopped_at_its_retry_warning_waits_and_goes_on(make_repo, daemon_factory, tmp_path):
    """Real codex meets a 429 with an hour's retry-after, which it would sleep out by itself: the daemon stops it at
    its retry warning, the job waits (capped by `rate_limit_max_wait`), runs codex again, and lands its change."""
    clis.need("codex")
    repo = make_repo()
    conv = Conversations({"greet the world": [exec_command("printf 'hello\\n' > hello.txt"), output_message("done")]},
                         side=output_message("ok"))  # fmt: skip
    limit = responses_error(429, "Rate limit reached for gpt-double on tokens per min (TPM).", retry_after=3600)
    with responses_double(_limited_first(conv, 1, limit)) as double:
        _codex_home(tmp_path / "userhome", double.url)
        d = _daemon(daemon_factory, tmp_path, "codex", {"OPENAI_API_KEY": "sk-test-openai"},
                    "[jobs]\nrate_limit_max_wait = 1\n")  # fmt: skip
        job = d.enqueue(repo, "Please greet the world in hello.txt", "--runner", "codex", "--path", "hello.txt")
        (shown,) = _finish(d, job)
    assert _landed(repo, shown) == {"hello.txt": "hello"}
    [waited] = [e for e in shown["events"] if e["kind"] == "rate_limited"]
    assert waited["seconds"] == 1, "the hour its retry warning named, capped by rate_limit_max_wait"
    assert "429 Too Many Requests" in d.cli("logs", str(job)).stdout


@needs_bwrap
def test_claude_code_asks_its_mcp_server_which_paths_are_held_and_claims_before_it_writes(
    make_repo, daemon_factory, tmp_path
):
    """Real Claude Code in a job finds the job's MCP server in its scratch config, lists its tools, asks which paths
    are held (the other running job's, by id), is refused a held path and granted a free one, which joins its claim
    before it writes it; both jobs land."""
    clis.need("claude")
    repo = make_repo()
    conv = Conversations(
        {
            "keep clear of the others": [
                # Claude Code loads an MCP server's tools on demand: the model asks ToolSearch for them first.
                lambda t: tool_use_message("ToolSearch", {"query": f"select:{HELD_TOOL},{CLAIM_TOOL}"}),
                lambda t: tool_use_message("mcp__orchestrator__held_paths", {}),
                lambda t: tool_use_message("mcp__orchestrator__claim_paths", {"paths": ["src/b.py"]}),
                lambda t: tool_use_message("mcp__orchestrator__claim_paths", {"paths": ["notes/new.md"]}),
                _write("notes/new.md", "new\n"),
                text_message("Claimed notes/new.md and wrote it; src/b.py is held."),
            ]
        },
        side=text_message("ok"),
        tools_only=True,
    )
    with anthropic_double(conv) as double:
        d = _daemon(daemon_factory, tmp_path, "claude", {"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": double.url})
        # The holder runs until the agent's job landed (the repository is all a confined job sees of the test).
        landed = f"git -C {repo} cat-file -e main:notes/new.md 2>/dev/null"
        holder = d.enqueue(repo, f"n=0; until {landed} || [ $n -gt 1200 ]; do sleep 0.1; n=$((n+1)); done; "
                           "echo 'b = 2' > src/b.py", "--path", "src/b.py")  # fmt: skip
        until("the holder running", lambda: d.cli_json("show", str(holder))["state"] == "running")
        job = d.enqueue(repo, "Please keep clear of the others and add notes/new.md", "--runner", "claude-code",
                        "--path", "README.md")  # fmt: skip
        _, shown = _finish(d, holder, job)
    turns = conv.requests("keep clear of the others")
    # Once the model asked for them, Claude Code offers the server's tools as tools/list described them.
    offered = {t["name"]: t for t in turns[1]["tools"]}
    assert "other running jobs hold" in offered[HELD_TOOL]["description"]
    assert offered[CLAIM_TOOL]["input_schema"]["required"] == ["paths"]
    held, refused, granted = (_tool_result(turns[n]) for n in (2, 3, 4))
    assert "Your claim: README.md" in held and f"Job {holder} (running) holds: src/b.py" in held, held
    assert "Refused: src/b.py" in refused and f"job {holder}" in refused, refused
    assert "Granted: notes/new.md" in granted, granted
    assert "notes/new.md" in shown["grown"], "claimed before it was written"
    grown = [e for e in shown["events"] if e["kind"] == "claim_grown"]
    assert grown and grown[0]["asked"] is True and grown[0]["paths"] == ["notes/new.md"]
    assert git(repo, "show", "main:notes/new.md") == "new" and git(repo, "show", "main:src/b.py") == "b = 2"
    assert not (d.home / "state" / "private" / str(job) / "door.sock").exists(), "the door is gone with the run"


HELD_TOOL, CLAIM_TOOL = "mcp__orchestrator__held_paths", "mcp__orchestrator__claim_paths"


def _tool_result(body: dict[str, Any]) -> str:
    """The text of the last tool result a request sends back to the model."""
    last = body["messages"][-1]
    blocks = [b for b in last["content"] if isinstance(b, dict) and b.get("type") == "tool_result"]
    assert blocks, last
    return text_of(blocks[-1].get("content"))


@needs_bwrap
def test_claude_code_stopped_on_a_real_conflict_resumes_its_session_on_the_new_head(
    make_repo, daemon_factory, tmp_path
):
    """Real Claude Code writes a file another running job wrote differently: it is stopped at once, waits with its
    worktree and session kept, and once the other job landed resumes its own session (`--continue`), told what
    moved and where its version of the conflicting file is; its change on top of the landed one lands."""
    clis.need("claude")
    repo = make_repo()
    released = repo / ".git" / "release-the-holder"  # what a confined job sees of the test: the repository
    conv = Conversations(
        {
            "set a to its new value": [
                _write("src/a.py", "a = 3\n"),
                lambda t: Reply(**{**text_message("still thinking").__dict__, "delay": 8.0}),  # stopped meanwhile
                lambda t: _edit("src/a.py", "a = 2", "a = 2  # and 3")(t),  # resumed: on the landed file
                text_message("Done, on top of the landed change."),
            ]
        },
        side=text_message("ok"),
        tools_only=True,
    )
    with anthropic_double(conv) as double:
        d = _daemon(daemon_factory, tmp_path, "claude", {"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": double.url})
        holder = d.enqueue(repo, f"echo 'a = 2' > src/a.py; n=0; until [ -e {released} ] || [ $n -gt 1800 ]; "
                           "do sleep 0.1; n=$((n+1)); done", "--path", "src/a.py")  # fmt: skip
        until("the holder running", lambda: d.cli_json("show", str(holder))["state"] == "running")
        job = d.enqueue(repo, "Please set a to its new value", "--runner", "claude-code", "--path", "README.md")

        def stopped() -> dict[str, Any] | None:
            return next((e for e in d.cli_json("show", str(job))["events"] if e["kind"] == "requeued"), None)

        until("the agent stopped on the conflict", lambda: stopped() is not None, timeout=120)
        event = stopped()
        assert event is not None and event["resume"] is True and event["behind"] == [holder], event
        released.touch()
        holder_shown, shown = _finish(d, holder, job)
    turns = conv.requests("set a to its new value")
    resumed = turns[-2]  # the resumed session's first request: the whole session, then what it is told now
    told = "\n".join(text_of(m.get("content")) for m in resumed["messages"] if m.get("role") == "user")
    assert "You were stopped while you worked" in told and "yours" in told, told
    assert "Your edits to src/a.py conflicted with it" in told, told
    assert git(repo, "show", f"{holder_shown['landed_sha']}:src/a.py") == "a = 2"
    assert git(repo, "show", "main:src/a.py") == "a = 2  # and 3" and shown["attempts"] == 1
