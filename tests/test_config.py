"""Config: TOML into frozen dataclasses, env overrides, errors that name the key."""

from __future__ import annotations

import subprocess
import sys

import pytest

from orchestrator import config
from orchestrator.config import ConfigError


def test_defaults_without_a_file(tmp_path):
    """No config file means the embedded defaults."""
    cfg = config.load(tmp_path / "missing.toml", env={})
    assert cfg.jobs.max_concurrent == 2 and cfg.jobs.mergeable[0] == "CHANGES*" and cfg.jobs.barriers == ()


def test_default_toml_parses_to_the_defaults(tmp_path):
    """The documented default file is valid and equals the built-in defaults."""
    p = tmp_path / "c.toml"
    p.write_text(config.DEFAULT_TOML)
    assert config.load(p, env={}) == config.Config()


def test_env_overrides(tmp_path):
    """MAX_CONCURRENT_JOBS, OLLAMA_HOST and ANTHROPIC_* override the file."""
    p = tmp_path / "c.toml"
    p.write_text("[jobs]\nmax_concurrent = 3\n")
    cfg = config.load(
        p,
        env={
            "MAX_CONCURRENT_JOBS": "7",
            "OLLAMA_HOST": "127.0.0.1:9999",
            "ANTHROPIC_API_KEY": "sk-ant-secret-value",
            "ANTHROPIC_BASE_URL": "http://127.0.0.1:1",
        },
    )
    assert cfg.jobs.max_concurrent == 7
    assert cfg.ollama.host == "http://127.0.0.1:9999"
    assert cfg.anthropic.api_key == "sk-ant-secret-value" and "secret" not in repr(cfg)
    assert cfg.anthropic.base_url == "http://127.0.0.1:1"


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[jobs]\nmax_concurrent = 'two'\n", "jobs.max_concurrent"),
        ("[jobs]\nmax_concurent = 2\n", "jobs.max_concurent"),
        ("[jobs]\nmax_concurrent = 0\n", "jobs.max_concurrent"),
        ("[jobs]\nmergeable = 'CHANGES'\n", "jobs.mergeable"),
        ("[nope]\n", "nope"),
        ("[anthropic]\napi_key = 'x'\n", "anthropic.api_key"),
        ("[jobs\n", "not valid TOML"),
        ('[repos."/tmp"]\ncheck_timeout = -1\n', "check_timeout"),
        ('[jobs]\ndefault_runner = "nosuch"\n', "jobs.default_runner"),
        ("[daemon]\nheader_timeout = 0\n", "daemon.header_timeout"),
        ('[jobs]\non_end = ["notify-send", "{nope}"]\n', "jobs.on_end"),
        ('[runners.mine]\nargv = ["mine"]\nrate_limits = "nosuch"\n', "runners.mine.rate_limits"),
        ('[team]\npublish = "carrier-pigeon"\n', "team.publish"),
    ],
)
def test_invalid_config_names_the_key(tmp_path, text, key):
    """Every invalid setting is an error naming the key."""
    p = tmp_path / "c.toml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        config.load(p, env={})


def test_config_names_what_the_layers_implement():
    """The names config accepts are exactly those the layers it configures implement (config imports none)."""
    from orchestrator.core.models import LAND_STYLES
    from orchestrator.git.merging import LandStyle
    from orchestrator.git.remote import PUBLISHERS
    from orchestrator.runners.ratelimit import SIGNS

    assert set(config.RATE_LIMIT_SIGNS) == set(SIGNS)
    assert set(config.PUBLISH) == set(PUBLISHERS)
    assert set(LAND_STYLES) == set(LandStyle.__args__)
    assert all(t.rate_limits in config.RATE_LIMIT_SIGNS for t in config.PROFILES.values() if t.rate_limits)


def test_loading_config_imports_no_layer_it_configures(tmp_path):
    """Config validation reads only data: loading a full config imports no git, runners or jobs module."""
    p = tmp_path / "c.toml"
    p.write_text(
        '[jobs]\non_end = ["notify-send", "{summary}"]\n[runners.mine]\nargv = ["mine"]\nrate_limits = "aider"\n'
        '[team]\npublish = "push"\n'
    )
    code = (
        "import sys; from orchestrator import config; "
        f"config.load(__import__('pathlib').Path({str(p)!r}), env={{}}); "
        "print(sorted(m for m in sys.modules if m.startswith(('orchestrator.git', 'orchestrator.runners', "
        "'orchestrator.jobs'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_bad_env_override_is_an_error(tmp_path):
    """A non-numeric MAX_CONCURRENT_JOBS is an error naming the variable."""
    with pytest.raises(ConfigError, match="MAX_CONCURRENT_JOBS"):
        config.load(tmp_path / "none.toml", env={"MAX_CONCURRENT_JOBS": "many"})


def test_daemon_exits_78_on_invalid_config(tmp_path):
    """The daemon refuses an invalid config with exit 78 and the key on stderr."""
    home = tmp_path / "home"
    (home / "config").mkdir(parents=True)
    (home / "config" / "config.toml").write_text("[jobs]\nper_repo = -1\n")
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator", "daemon"],
        capture_output=True,
        text=True,
        env={"ORCHESTRATOR_HOME": str(home), "PATH": "/usr/bin:/bin"},
        timeout=30,
    )
    assert out.returncode == 78
    assert "jobs.per_repo" in out.stderr


def test_config_example_runners_and_a_changed_file_needing_a_restart(daemon_factory, tmp_path):
    """`config example` prints the commented defaults; `runners` lists built-in and configured runners with what
    they lack; after the file changes, `config show` and `status` say the running daemon needs a restart."""
    d = daemon_factory(env={"ORCH_TEST_KEY_SET": "x", "ORCH_TEST_KEY_UNSET": ""})
    example = d.cli("config", "example")
    assert example.returncode == 0 and example.stdout == config.DEFAULT_TOML
    (d.home / "config").mkdir(parents=True)
    cfg = d.home / "config" / "config.toml"
    cfg.write_text('[runners.fake-cli]\nargv = ["no-such-cli-here", "{prompt}"]\n'
                   'pass_env = ["ORCH_TEST_KEY_SET", "ORCH_TEST_KEY_UNSET"]\n')  # fmt: skip
    d.start()
    shown = d.cli("config", "show")
    assert shown.returncode == 0 and "restart" not in shown.stderr, shown.stderr
    listed = {r["name"]: r for r in d.cli_json("runners")}
    assert {"shell", "replay", "claude", "fake-cli"} <= set(listed) and listed["shell"]["default"]
    fake = listed["fake-cli"]
    assert fake["found"] is None and fake["loaded"] is True
    assert fake["env"] == {"ORCH_TEST_KEY_SET": True, "ORCH_TEST_KEY_UNSET": False}
    assert "no-such-cli-here is not on a job's PATH" in d.cli("runners").stdout

    cfg.write_text(cfg.read_text() + "\n[jobs]\nmax_attempts = 2\n")
    for command in (("config", "show"), ("status",)):
        out = d.cli(*command)
        assert out.returncode == 0 and "changed after the running daemon read it: restart" in out.stderr, out.stderr
    assert d.cli_json("config", "show")["restart_needed"] is True
