"""Bad input from the command line gets a message that says what is wrong, never a traceback or an internal error."""

from __future__ import annotations

import subprocess
import sys


def _cli(d, *args: bytes | str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args], env=d.env, capture_output=True, timeout=60
    )


def test_bad_input_is_refused_with_a_clear_message(make_repo, daemon_factory):
    """A job text that is not UTF-8, a chat session name with `..`, and several ids to `reject` are each
    answered with what to do (exit 2), not an internal error or a traceback."""
    repo = make_repo()
    d = daemon_factory().start()
    out = _cli(d, "enqueue", "--repo", str(repo), b"echo \xff")
    assert out.returncode == 2 and b"not valid text" in out.stderr and b"UTF-8" in out.stderr, out.stderr
    out = _cli(d, "chat", "--session", "../../etc", "hi")
    assert out.returncode == 2 and b"bad session name" in out.stderr, out.stderr
    out = _cli(d, "reject", "998", "999")
    assert out.returncode == 2 and b"no job 998" in out.stderr and b"no job 999" in out.stderr, out.stderr
    for err in (b"Traceback", b"internal error"):
        assert not any(err in line for line in d.log_path.read_bytes().splitlines() if b"api.error" in line)


def _cmdline(p) -> str:
    import psutil

    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def test_bench_chat_stopped_by_sigterm_leaves_nothing_running(tmp_path):
    """SIGTERM to `bench chat` stops the daemon and the model server it started, and says so (exit 143)."""
    import signal
    import time

    import psutil

    bench = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "bench", "chat", "-n", "1", "--policy", "gate", "--double", "fast"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        kids: list[psutil.Process] = []
        while time.monotonic() < deadline and not any("daemon" in _cmdline(k) for k in kids):
            time.sleep(0.1)
            kids = psutil.Process(bench.pid).children(recursive=True)
        assert kids, "bench chat started no daemon"
        bench.send_signal(signal.SIGTERM)
        _, stderr = bench.communicate(timeout=60)
    finally:
        if bench.poll() is None:
            bench.kill()
    assert bench.returncode == 143 and b"stopped by SIGTERM" in stderr, stderr[-2000:]
    _, alive = psutil.wait_procs(kids, timeout=10)
    assert not alive, [p.cmdline() for p in alive]
