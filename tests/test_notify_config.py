"""`on_end` notifications with the job's variables, `config show` with each value's source, demo guards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.test_e2e_jobs import until

RECORD = (
    "import json, os, sys; "
    "env = dict((k, v) for k, v in os.environ.items() if k.startswith('ORCHESTRATOR_')); "
    "open(sys.argv[1], 'a').write(json.dumps(dict(argv=sys.argv[2:], env=env)) + '\\n')"
)


def run_cli(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "ORCHESTRATOR_HOME": str(home), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args], env=full, capture_output=True, text=True, timeout=60
    )


def test_on_end_runs_with_the_jobs_variables(make_repo, daemon_factory, tmp_path):
    """When a job ends, the on_end argv runs (no shell) with id, state, repo, code and reason in its env."""
    repo = make_repo()
    out = tmp_path / "notified.jsonl"
    home = tmp_path / "home-notify"
    (home / "config").mkdir(parents=True)
    template = [sys.executable, "-c", RECORD, str(out), "{summary}", "{code}", "$(not a shell)"]
    (home / "config" / "config.toml").write_text(f"[jobs]\non_end = {json.dumps(template)}\n")
    d = daemon_factory("home-notify").start()
    failed = d.enqueue(repo, "exit 3", "--path", "a.txt")
    landed = d.enqueue(repo, "echo ok > b.txt", "--path", "b.txt")
    d.cli("wait", str(failed), str(landed), "--timeout", "60")
    until(lambda: out.exists() and len(out.read_text().splitlines()) == 2, what="two notifications")
    seen = {int(r["env"]["ORCHESTRATOR_JOB_ID"]): r for r in map(json.loads, out.read_text().splitlines())}
    f, ok = seen[failed], seen[landed]
    assert f["env"]["ORCHESTRATOR_JOB_STATE"] == "failed" and f["env"]["ORCHESTRATOR_CODE"] == "RunnerFailed"
    assert f["env"]["ORCHESTRATOR_REPO"] == str(repo) and "exited 3" in f["env"]["ORCHESTRATOR_REASON"]
    assert f["argv"] == [f"job {failed} failed (RunnerFailed) in {repo.name}: Run `exit 3`", "RunnerFailed",
                         "$(not a shell)"]  # fmt: skip
    assert ok["env"]["ORCHESTRATOR_JOB_STATE"] == "landed" and ok["env"]["ORCHESTRATOR_CODE"] == "Landed"
    # The daemon says each ran once its process ended, which is after the process wrote its line.
    until(lambda: [e["event"] for e in d.events()].count("notify.ran") == 2, what="notify.ran twice in the log")


def test_config_show_names_where_each_value_came_from(tmp_path):
    """Defaults, the file and the environment are each named as a value's source."""
    home = tmp_path / "home"
    (home / "config").mkdir(parents=True)
    (home / "config" / "config.toml").write_text("[jobs]\nper_repo = 3\nmax_concurrent = 2\n")
    out = run_cli(home, "config", "show", "--json", env={"MAX_CONCURRENT_JOBS": "5"})
    assert out.returncode == 0, out.stderr
    rows = {r["key"]: r for r in json.loads(out.stdout)["settings"]}
    assert (rows["jobs.max_concurrent"]["value"], rows["jobs.max_concurrent"]["source"]) == (5, "env")
    assert (rows["jobs.per_repo"]["value"], rows["jobs.per_repo"]["source"]) == (3, "file")
    assert rows["jobs.min_confidence"]["source"] == "default"
    text = run_cli(home, "config", "show").stdout
    lines = text.splitlines()
    jobs = lines[lines.index("[jobs]") + 1 :]
    assert any(line.split()[0] == "per_repo" and line.endswith("# file") for line in jobs), text
    (home / "config" / "config.toml").write_text('[jobs]\non_end = ["notify-send", "{nope}"]\n')
    bad = run_cli(home, "config", "show")
    assert bad.returncode == 78 and "on_end" in bad.stderr and "{summary}" in bad.stderr


def test_demo_keep_refuses_a_used_directory_with_a_clear_message(tmp_path):
    """`demo --keep DIR` on a directory that already holds something says so (exit 2), no traceback."""
    used = tmp_path / "kept"
    (used / "demo-repo").mkdir(parents=True)
    out = run_cli(tmp_path / "home", "demo", "--keep", str(used))
    assert out.returncode == 2 and "not empty" in out.stderr and "Traceback" not in out.stderr

