"""Drive the real daemon on a temp ORCHESTRATOR_HOME: in a thread of the test's own process (`InProcessDaemon`,
the default), or as a process of its own with the CLI as processes too (`Daemon`, for the end-to-end tests and
for what only a process has: a kill -9, signals, its own environment and limits).

Both run the same `orchestrator.daemon.Daemon` (its API on its real UNIX socket, the scheduler, the SQLite store,
git, runners starting real processes) and offer a test the same surface: `start`, `stop`, `cli`, `cli_json`,
`enqueue`, `events` (its JSON log lines, in `home/daemon.log`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import gc
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from orchestrator.client import Client, Unreachable

CHANGED = threading.Condition()
"""Notified on every change an in-process daemon's job board announces: `until` re-checks at once."""


def until(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    """Check until `check` returns something truthy (returned), or fail saying what never came. Re-checked on
    every job change of an in-process daemon, else every 50 ms."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        with CHANGED:
            CHANGED.wait(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _changed() -> None:
    with CHANGED:
        CHANGED.notify_all()


class _Driven:
    """What a test does with a daemon of either kind, through the CLI (`cli`)."""

    def __init__(self, home: Path, env: dict[str, str] | None = None) -> None:
        self.home = home
        # No bubblewrap unless a test asks for it: jobs in tests coordinate through files outside the repo.
        self.env = {**os.environ, "ORCHESTRATOR_HOME": str(home), "ORCHESTRATOR_SANDBOX": "none", **(env or {})}
        self.env.pop("JOURNAL_STREAM", None)
        self.log_path = home / "daemon.log"
        self.socket = home / "run" / "orchestrator.sock"

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        raise NotImplementedError

    def cli_json(self, *args: str) -> Any:
        out = self.cli(*args, "--json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def enqueue(self, repo: Path, text: str, *args: str) -> int:
        out = self.cli("enqueue", "--repo", str(repo), *args, "--", text)
        assert out.returncode == 0, out.stderr
        return int(out.stdout.strip())

    def events(self) -> list[dict[str, Any]]:
        # Only whole lines: the daemon may be half-way through writing the last one.
        text = self.log_path.read_text() if self.log_path.exists() else ""
        lines = text[: text.rfind("\n") + 1].splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]


class Daemon(_Driven):
    """One daemon process with its own home; its JSON log lines land in `home/daemon.log`; `cli` runs the CLI as
    a process too."""

    def __init__(self, home: Path, env: dict[str, str] | None = None) -> None:
        super().__init__(home, env)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *args: str, wait: bool = True) -> Daemon:
        self.home.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "daemon", *args],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited {self.proc.returncode}:\n{self.log_path.read_text()}")
            try:
                Client(self.socket, timeout=2).health()
                return
            except (Unreachable, OSError):
                time.sleep(0.05)
        raise AssertionError(f"daemon not ready in {timeout}s:\n{self.log_path.read_text()}")

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "orchestrator", *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def wait_exit(self, timeout: float = 60) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`orchestrator ARGS` run in this process by click's runner (with `env` set meanwhile): its exit code and
    output as a process's would be. An exception the command does not handle is raised here (a process would
    print it and exit 1)."""
    from click.testing import CliRunner

    from orchestrator.cli import main

    result = CliRunner().invoke(main, list(args), env=env, catch_exceptions=True)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(["orchestrator", *args], result.exit_code, result.stdout, result.stderr)


# -- the daemon in the test's own process ----------------------------------------------------------------------

_LOG: contextvars.ContextVar[IO[str]] = contextvars.ContextVar("daemon_log")
"""The log file of the in-process daemon whose code is running (its thread, its tasks, its `to_thread` calls)."""


class _RoutedLog:
    """structlog's stream for in-process daemons: each daemon's lines go to its own `daemon.log` (by `_LOG`),
    anything else to the test's stdout."""

    def write(self, text: str) -> int:
        out = _LOG.get(None)
        return (out or sys.stdout).write(text)

    def flush(self) -> None:
        out = _LOG.get(None)
        (out or sys.stdout).flush()

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        raise OSError("not a file")  # `stdout_is_journal` asks: never the journal


class _Loop(asyncio.SelectorEventLoop):
    """The daemon's loop in a thread: a signal's handler is kept (`InProcessDaemon.send` calls it) instead of
    installed (only the main thread may)."""

    def __init__(self) -> None:
        super().__init__()
        self.handlers: dict[int, tuple[Callable[..., object], tuple[Any, ...]]] = {}

    def add_signal_handler(self, sig: int, callback: Callable[..., object], *args: Any) -> None:
        self.handlers[sig] = (callback, args)

    def remove_signal_handler(self, sig: int) -> bool:
        return self.handlers.pop(sig, None) is not None


class InProcessDaemon(_Driven):
    """The real daemon in a thread of this process (its own event loop there), and the CLI run in-process by
    click's runner: no interpreter started per daemon or per command. While it lives, the process environment
    is the daemon's (its runners' commands inherit it, as a daemon process's would); `restore_env` undoes that.

    Not for what only a process has (kill -9, a real signal, limits or memory of its own): use `Daemon`."""

    def __init__(self, home: Path, env: dict[str, str] | None = None) -> None:
        super().__init__(home, env)
        self.thread: threading.Thread | None = None
        self.loop: _Loop | None = None
        self.daemon: Any = None
        """The `orchestrator.daemon.Daemon` running."""
        self.plane: Any = None
        """Its `JobPlane` once started (board, scheduler, jobs)."""
        self.error: BaseException | None = None
        self._ready = threading.Event()
        self._saved_env: dict[str, str] | None = None

    def start(self, *args: str, wait: bool = True) -> InProcessDaemon:
        from orchestrator import config, paths
        from orchestrator import logging as olog

        burst, grace = _daemon_args(args)
        assert self.thread is None or not self.thread.is_alive(), "this daemon is running already"
        self.home.mkdir(parents=True, exist_ok=True)
        self._use_env()
        p = paths.resolve(self.env)
        stamp = config.stamp(p.config_file)
        cfg = config.load(p.config_file, self.env)  # a ConfigError is raised to the test (the CLI exits 78)
        olog.configure(_RoutedLog(), force_json=True)
        self.error, self.plane = None, None
        self._ready.clear()
        self.thread = threading.Thread(
            target=self._run, args=(cfg, p, burst, grace, stamp), name=f"daemon {self.home.name}", daemon=True
        )
        self.thread.start()
        if wait:
            self.wait_ready()
        return self

    def _run(self, cfg: Any, p: Any, burst: bool, grace: float, stamp: Any) -> None:
        with self.log_path.open("a", buffering=1) as log:
            _LOG.set(log)
            try:
                self.daemon = _daemon_class()(cfg, p, burst=burst, grace=grace, config_stamp=stamp)
                self.daemon.started = self._started
                with asyncio.Runner(loop_factory=self._new_loop) as runner:
                    runner.run(self.daemon.serve())
            except BaseException as e:  # noqa: BLE001 - handed to the test (`wait_ready`, `stop`, `wait_exit`)
                self.error = e
                log.write("".join(traceback.format_exception(e)))
            finally:
                gc.unfreeze()  # the daemon froze its start-up objects; this process goes on
                self._ready.set()
                _changed()

    def _started(self, plane: Any) -> None:
        plane.board.on_change(_changed)
        self.plane = plane
        self._ready.set()

    def _new_loop(self) -> _Loop:
        self.loop = _Loop()
        return self.loop

    def wait_ready(self, timeout: float = 60.0) -> None:
        if not self._ready.wait(timeout):
            raise AssertionError(f"daemon not ready in {timeout}s:\n{self.log_path.read_text()}")
        if self.error is not None or self.plane is None:
            raise AssertionError(f"daemon ended: {self.error!r}\n{self.log_path.read_text()}") from self.error

    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def send(self, sig: int) -> None:
        """What the daemon does on signal `sig` (SIGTERM, SIGINT): its own handler, run on its loop."""
        assert self.loop is not None
        callback, args = self.loop.handlers[sig]
        self.loop.call_soon_threadsafe(callback, *args)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if sig == signal.SIGKILL:
            raise AssertionError("an in-process daemon cannot be killed -9: start this test's daemon as a process")
        self.send(sig)
        self.wait_exit()

    def wait_exit(self, timeout: float = 60) -> int:
        """Wait for the daemon to end (burst mode, or a stop); 0, or the error it ended with is raised."""
        assert self.thread is not None
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise AssertionError(f"daemon still running after {timeout}s")
        if self.error is not None:
            raise self.error
        return 0

    def stop(self) -> None:
        if self.running:
            assert self.loop is not None and self.daemon is not None
            with contextlib.suppress(RuntimeError):  # its loop closed meanwhile: it is ending by itself
                self.loop.call_soon_threadsafe(self.daemon.request_stop)
            self.wait_exit()

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """The real CLI's command, run in this process (`cli`)."""
        return cli(*args, env=self.env)

    def _use_env(self) -> None:
        if self._saved_env is None:
            self._saved_env = dict(os.environ)
        os.environ.clear()
        os.environ.update(self.env)

    def restore_env(self) -> None:
        """The test process's environment as it was before this daemon started."""
        if self._saved_env is not None:
            os.environ.clear()
            os.environ.update(self._saved_env)
            self._saved_env = None


_LOGIN_PATHS: dict[tuple[object, ...], list[str]] = {}
PROFILES = (".bash_profile", ".bash_login", ".profile", ".bashrc", ".zprofile", ".zshrc", ".zshenv")


def _login_path_once(ask: Callable[..., list[str] | None]) -> Callable[..., list[str] | None]:
    """`jobpath.ask_login_shell` asked once per shell, home and state of their profile files in this process, not
    at every in-process daemon's start (a login shell each: a tenth of a second and more); a failure is asked (and
    logged) again."""

    @functools.wraps(ask)
    def remembered(timeout: float = 5.0, quiet: bool = False) -> list[str] | None:
        home = Path(os.environ.get("HOME") or "/nonexistent")
        files = [home / name for name in PROFILES] + [Path("/etc/profile"), Path("/etc/zsh/zshenv")]
        key = (os.getuid(), os.environ.get("SHELL"), str(home), *(_stamp(f) for f in files))
        if key not in _LOGIN_PATHS:
            got = ask(timeout, quiet)
            if got is None:
                return None
            _LOGIN_PATHS[key] = got
        return list(_LOGIN_PATHS[key])

    return remembered


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


@functools.cache
def _daemon_class() -> type:
    """`orchestrator.daemon.Daemon`, telling the harness its job plane once it has started (it is ready then)."""
    from orchestrator import daemon
    from orchestrator.proc import jobpath

    jobpath.ask_login_shell = _login_path_once(jobpath.ask_login_shell)

    class Started(daemon.Daemon):
        started: Callable[[Any], None]

        async def startup(self, parts: contextlib.AsyncExitStack) -> Any:
            plane, notifier = await super().startup(parts)
            self.started(plane)
            return plane, notifier

    return Started


def _daemon_args(args: tuple[str, ...]) -> tuple[bool, float]:
    """`--burst` and `--grace S`, as `orchestrator daemon` takes them."""
    burst, grace, rest = False, 2.0, list(args)
    while rest:
        arg = rest.pop(0)
        if arg == "--burst":
            burst = True
        elif arg == "--grace":
            grace = float(rest.pop(0))
        else:
            raise AssertionError(f"`orchestrator daemon` takes no {shlex.quote(arg)}")
    return burst, grace


def _process_state() -> Callable[[], None]:
    """What a daemon sets for its whole process when it starts (its log's setup and the secrets it masks, the
    login PATH its jobs get, the cgroups it makes): a function that puts this process's back."""
    import structlog

    from orchestrator import logging as olog
    from orchestrator.proc import jobpath, process

    log, known, login, cgroups = structlog.get_config(), olog._known_rx, jobpath._login, process.CGROUPS

    def restore() -> None:
        structlog.configure(**log)
        olog._known_rx, jobpath._login, process.CGROUPS = known, login, cgroups

    return restore


ALL_PROCESSES = os.environ.get("ORCHESTRATOR_TEST_DAEMONS") == "process"
"""`ORCHESTRATOR_TEST_DAEMONS=process`: every test's daemon a process, and its CLI calls processes (slower; the
whole suite end to end)."""


@contextlib.contextmanager
def daemons(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Make daemons on temp homes under `tmp_path` (in-process; `process=True`: a process); all are stopped at
    the end, and the test process is left as it was (its environment, what a daemon sets process-wide)."""
    made: list[Any] = []
    restore = _process_state()

    def make(name: str = "home", env: dict[str, str] | None = None, *, process: bool = False) -> Any:
        d = (Daemon if process or ALL_PROCESSES else InProcessDaemon)(tmp_path / name, env)
        made.append(d)
        return d

    try:
        yield make
    finally:
        for d in made:
            d.stop()
        for d in reversed(made):
            if isinstance(d, InProcessDaemon):
                d.restore_env()
        restore()
