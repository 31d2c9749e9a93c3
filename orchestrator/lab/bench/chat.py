"""`orchestrator bench chat`: the seed's chat table, per policy, side by side in one run.

For each policy and each N it starts a fresh daemon (its own home, `[chat] policy`, `[ollama] parallel`)
in front of one model server — a fresh Ollama protocol double (`--double PROFILE`, the default) or a
real Ollama (`--ollama URL`) — fires N sessions at once through the daemon's socket (classification,
reply, memory extraction: the whole pipeline), and measures from the client's side:

- ttfa: this session's request started → the daemon's acknowledgement line (client side, as a user sees it:
  each session its own connection, opened for the turn, as the `orchestrator chat` CLI does);
  `ttfa_server_p99_s` is the handler's start → ack written, as the daemon says (it misses the time the
  request waited in the daemon's loop behind other sessions' work);
- first-Ollama: request sent → the first model call's answer (the classification's, or the reply's first
  token when local rules skip the classification);
- done: request sent → the reply's last line; wall (done): the last session's done;
- wall (drained): until the daemon reports no call running or pending (extraction included);
- CPU max and min free RAM: psutil, sampled every 100 ms during the run (whole machine).
Figures are ratios to the same policy's N=1 row, taken in this run. `naive` is the seed's pipeline:
every call straight to the server, extraction after every turn.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from orchestrator import __version__
from orchestrator.client import Client, Unreachable
from orchestrator.lab.bench import turns
from orchestrator.paths import resolve as resolve_paths
from orchestrator.store.sqlite import SqliteStore


@dataclass
class Sample:
    ttfa: float
    """From this session's own request start to the daemon's acknowledgement (client side)."""
    first: float | None
    done: float
    error: str | None = None
    ttfa_server: float = float("nan")
    """Request received → acknowledgement written, as the daemon reports it in the ack."""


class Sampler:
    """CPU max and min available RAM, sampled on a thread so the figures do not depend on the loop."""

    def __init__(self, every: float = 0.1) -> None:
        self.every = every
        self.cpu_max = 0.0
        self.ram_min_mb = float("inf")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        psutil.cpu_percent(None)
        while not self._stop.wait(self.every):
            self.cpu_max = max(self.cpu_max, psutil.cpu_percent(None))
            self.ram_min_mb = min(self.ram_min_mb, psutil.virtual_memory().available / 2**20)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _spawn_double(profile: str, parallel: int | None, *extra: str) -> tuple[subprocess.Popen[str], str]:
    args = [sys.executable, "-m", "orchestrator.lab.doubles.ollama", "--port", "0", "--profile", profile, *extra]
    if parallel:
        args += ["--parallel", str(parallel)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise SystemExit("the Ollama double did not start")
    return proc, json.loads(line)["url"]


def _stop(proc: subprocess.Popen[Any]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


async def _seeded(home: Path, sessions: dict[str, int]) -> None:
    """The sessions' earlier conversations and memories, written to the daemon's store before it starts."""
    paths = resolve_paths({"ORCHESTRATOR_HOME": str(home)})
    paths.ensure()
    store = await SqliteStore.open(paths.db)
    try:
        await turns.seed(store.chat, sessions)
    finally:
        await store.close()


@asynccontextmanager
async def _daemon(
    url: str,
    policy: str,
    slots: int,
    model: str,
    sessions: dict[str, int],
    chat: dict[str, Any] | None = None,
    turn_slots: int = 0,
) -> AsyncIterator[Path]:
    home = Path(tempfile.mkdtemp(prefix="orchestrator-bench-chat-"))
    (home / "config").mkdir()
    await _seeded(home, sessions)
    more = "".join(f"{k} = {json.dumps(v)}\n" for k, v in (chat or {}).items())
    (home / "config" / "config.toml").write_text(
        f'[ollama]\nhost = "{url}"\nparallel = {slots}\nmodel = "{model}"\nmax_queue = 4096\n'
        f'turn_slots = {min(turn_slots, slots)}\n[chat]\npolicy = "{policy}"\nextract_idle = 5.0\n{more}'
    )
    env = {**os.environ, "ORCHESTRATOR_HOME": str(home)}
    env.pop("OLLAMA_NUM_PARALLEL", None)
    env.pop("OLLAMA_HOST", None)
    log = (home / "daemon.log").open("wb")
    proc = subprocess.Popen(  # noqa: ASYNC220 - starting it is quick; nothing else runs on this loop yet
        [sys.executable, "-m", "orchestrator", "daemon"], env=env, stdout=log, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    sock = home / "run" / "orchestrator.sock"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"the daemon exited {proc.returncode}: {(home / 'daemon.log').read_text()[-2000:]}")
            try:
                Client(sock, timeout=2).health()
                break
            except (Unreachable, OSError):
                if time.monotonic() > deadline:
                    raise SystemExit("the daemon did not start within 30 s") from None
                await asyncio.sleep(0.05)
        yield sock
    finally:
        _stop(proc)
        log.close()
        shutil.rmtree(home, ignore_errors=True)


async def _session(sock: Path, i: int, t0: float) -> Sample:
    """Session `i`'s turn as the `orchestrator chat` CLI makes it: its own connection to the socket, opened
    when the turn starts (inside the ttfa), and the whole request written at once."""
    mine = time.monotonic()
    conn = await RawSession.open(sock)
    try:
        return await conn.turn(f"bench{i}", turns.prompt(i), started=mine, t0=t0)
    finally:
        await conn.close()


async def _stats(http: aiohttp.ClientSession) -> dict[str, Any]:
    async with http.get("http://localhost/chat") as r:
        return await r.json()


def _drained(s: dict[str, Any]) -> bool:
    return s["gate"]["running"] == 0 and s["gate"]["queued"] == 0 and s["extraction"]["pending"] == 0


async def warm(url: str, model: str, calls: int) -> None:
    """Warm the server as a day's use would have: the model loaded, the shared system part in each slot."""
    import ollama as ollama_pkg

    from orchestrator.lab.bench.simulate import warmup_messages
    from orchestrator.llm.ollama import DEFAULT_OPTIONS

    async with ollama_pkg.AsyncClient(host=url, timeout=120) as client:
        opts = {**DEFAULT_OPTIONS, "num_predict": 1}
        await asyncio.gather(
            *(client.chat(model=model, messages=warmup_messages(), options=opts) for _ in range(calls))
        )


async def run_one(
    url: str,
    policy: str,
    n: int,
    slots: int,
    model: str,
    timeout: float,
    server_slots: int | None = None,
    engine: Callable[[float, float], dict[str, Any]] | None = None,
    chat: dict[str, Any] | None = None,
    turn_slots: int = 0,
) -> dict[str, Any]:
    """One (policy, N) row; `engine(t0, end)` adds the model server's own account of the run, when it has one;
    `chat` sets more `[chat]` keys, `turn_slots` the gate's `[ollama] turn_slots`."""
    await warm(url, model, server_slots or slots)
    sessions = {f"bench{i}": i for i in range(n)}
    async with _daemon(url, policy, slots, model, sessions, chat, turn_slots) as sock:
        conn = aiohttp.UnixConnector(path=str(sock), limit=0)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=timeout)) as http:
            with Sampler() as sampler:
                t0 = time.monotonic()
                async with asyncio.timeout(timeout):
                    samples = await asyncio.gather(*(_session(sock, i, t0) for i in range(n)))
                wall_done = time.monotonic() - t0
                while True:
                    stats = await _stats(http)
                    if _drained(stats) or time.monotonic() - t0 > timeout:
                        break
                    await asyncio.sleep(0.02)
                wall_drained = time.monotonic() - t0
    errors = [s.error for s in samples if s.error]
    done = [s.done for s in samples]
    ttfas = sorted(s.ttfa for s in samples)
    servers = sorted(s.ttfa_server for s in samples)
    firsts = [s.first for s in samples if s.first is not None]
    gate = stats["gate"]["classes"]
    return {
        "policy": policy,
        "n": n,
        "slots": slots,
        "turn_slots": turn_slots if policy == "gate" else None,
        "ttfa_mean_s": round(statistics.fmean(ttfas), 4),
        "ttfa_p99_s": round(_p99(ttfas), 4),
        "ttfa_server_p99_s": round(_p99(servers), 6),
        "first_ollama_mean_s": round(statistics.fmean(firsts), 3) if firsts else None,
        "done_min_s": round(min(done), 3),
        "done_mean_s": round(statistics.fmean(done), 3),
        "done_max_s": round(max(done), 3),
        "wall_done_s": round(wall_done, 3),
        "wall_drained_s": round(wall_drained, 3),
        "cpu_max_pct": round(sampler.cpu_max, 1),
        "min_free_ram_mb": round(sampler.ram_min_mb),
        "gate_wait_interactive_s": gate["interactive"]["wait_mean_s"],
        "gate_wait_background_s": gate["background"]["wait_mean_s"],
        "extraction_calls": stats["extraction"]["calls"],
        "classify_calls": stats["turns"]["classify_calls"],
        "errors": errors,
        **({"engine": engine(t0, t0 + wall_drained)} if engine else {}),
    }


def engine_args(gpu_layers: int | None, extra: list[str]) -> list[str]:
    """llama-server's flags for a run: the GPU offload (`-ngl N`), then the ones given as they are."""
    return [*(["-ngl", str(gpu_layers)] if gpu_layers is not None else []), *extra]


async def _on_llama_server(
    policy: str,
    n: int,
    slots: int,
    timeout: float,
    chat: dict[str, Any] | None = None,
    turn_slots: int = 0,
    engine_args: tuple[str, ...] = (),
    model: Path | None = None,
) -> dict[str, Any]:
    """One run on a fresh llama-server with as many slots as the gate (its prompt cache starts cold)."""
    from orchestrator.lab.bench.llama_server import MODEL_NAME, LlamaServer, SetupMissing, engine_summary

    try:
        server = LlamaServer(slots, args=engine_args, model=model)
    except SetupMissing as e:
        print(f"orchestrator: {e}", file=sys.stderr)
        sys.exit(2)
    async with server as url:
        return await run_one(
            url,
            policy,
            n,
            slots,
            MODEL_NAME,
            timeout,
            engine=lambda a, b: engine_summary(server.trace, a, b),
            chat=chat,
            turn_slots=turn_slots,
        )


class RawSession:
    """One session's kept-alive connection to the daemon's socket, speaking just enough HTTP/1.1.

    The bench's sessions use it instead of a client library: N people's terminals are N processes, and one
    process building N requests through a library would add its own queue to the figure. What it adds is a
    connect and one write, as each `orchestrator chat` process does (measured at N=4 on 2 cores: connect
    0.2-0.8 ms, the ack's way back 0.1-2 ms); most of the rest (0.6-4.5 ms) passes in the daemon between the
    connection and the handler's start, behind the other sessions' work, where the daemon's own `ttfa_s`
    (from the handler's start) does not see it.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, sock: Path) -> RawSession:
        return cls(*await asyncio.open_unix_connection(str(sock)))

    async def turn(self, name: str, text: str, *, started: float | None = None, t0: float | None = None) -> Sample:
        """One turn on this connection: ttfa from `started` (default: now) to the ack; the first model answer
        (a token, or a classification by the model) and the last line, from `t0` (default: `started`)."""
        body = json.dumps({"text": text, "end": True}).encode()
        head = f"POST /chat/{name} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        t = time.monotonic() if started is None else started
        base = t if t0 is None else t0
        self.writer.write(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        headers = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        status = int(headers.split(" ", 2)[1])
        if "chunked" not in headers.lower():
            length = int(
                next(h.split(":", 1)[1] for h in headers.split("\r\n") if h.lower().startswith("content-length"))
            )
            await self.reader.readexactly(length)
            return Sample(time.monotonic() - t, None, time.monotonic() - base, f"HTTP {status}")
        ttfa = server = float("nan")
        first: float | None = None
        error = None
        while size := int((await self.reader.readline()).strip(), 16):
            chunk = await self.reader.readexactly(size + 2)
            for line in chunk.splitlines():
                if not line.strip():
                    continue
                ev = json.loads(line)
                if ev["event"] == "ack":
                    ttfa, server = time.monotonic() - t, float(ev.get("ttfa_s", "nan"))
                elif first is None and (
                    ev["event"] == "token" or (ev["event"] == "intent" and ev.get("source") == "model")
                ):
                    first = time.monotonic() - base
                elif ev["event"] == "error":
                    error = f"{ev['code']}: {ev['message']}"
        await self.reader.readline()
        return Sample(ttfa, first, time.monotonic() - base, error, server)

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


async def ttfa_run(url: str, sessions: int, slots: int, model: str, mode: str, timeout: float) -> dict[str, Any]:
    """ttfa with `sessions` sessions open at once (one kept-alive connection each), through the gate.

    `typing`: each session sends two turns at random moments over ~6 s, as people typing would (the
    realistic load; a session's second turn goes once its first is answered); `burst`: every session's
    turn is sent at the same instant (the worst case).
    """
    rng = random.Random(7)
    names = [f"t{i}" for i in range(sessions)]
    async with _daemon(url, "gate", slots, model, {name: i for i, name in enumerate(names)}) as sock:
        conns = await asyncio.gather(*(RawSession.open(sock) for _ in names))  # the sessions are open
        if mode == "burst":
            plans = [[0.0] for _ in names]
        else:
            plans = [sorted(rng.uniform(0.0, 6.0) for _ in range(2)) for _ in names]
        t0 = time.monotonic()

        async def session(i: int, delays: list[float]) -> list[Sample]:
            out = []
            for d in delays:
                await asyncio.sleep(max(0.0, t0 + d - time.monotonic()))
                out.append(await conns[i].turn(names[i], turns.prompt(i)))
            return out

        try:
            with Sampler() as sampler:
                async with asyncio.timeout(timeout):
                    got = await asyncio.gather(*(session(i, p) for i, p in enumerate(plans)))
        finally:
            await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)
    samples = [s for g in got for s in g]
    ttfas = sorted(s.ttfa for s in samples)
    servers = sorted(s.ttfa_server for s in samples)
    return {
        "mode": mode,
        "sessions": sessions,
        "turns": len(samples),
        "ttfa_p50_s": round(ttfas[len(ttfas) // 2], 4),
        "ttfa_p99_s": round(_p99(ttfas), 4),
        "ttfa_max_s": round(ttfas[-1], 4),
        "ttfa_server_p99_s": round(_p99(servers), 6),
        "cpu_max_pct": round(sampler.cpu_max, 1),
        "errors": [s.error for s in samples if s.error][:5],
    }


def _p99(sorted_values: list[float]) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(0.99 * len(sorted_values)))]


def machine() -> dict[str, Any]:
    from importlib.metadata import version

    import ollama as ollama_pkg  # noqa: F401 - its version is part of the record

    return {
        "cores": os.cpu_count(),
        "ram_mb": round(psutil.virtual_memory().total / 2**20),
        "load_1m": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "orchestrator": __version__,
        "ollama_client": version("ollama"),
        "aiohttp": version("aiohttp"),
    }


def _ints(raw: str) -> list[int]:
    try:
        out = [int(x) for x in raw.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {raw!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError("every value must be at least 1")
    return out


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="orchestrator bench chat", description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=_ints, default=[1, 2, 4], help="concurrent sessions, e.g. 1,2,4,8 (default 1,2,4)")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--ollama", metavar="URL", help="a real Ollama server (its model must be pulled)")
    src.add_argument("--double", metavar="PROFILE", default="seed", help="the Ollama double's profile (default seed)")
    src.add_argument(
        "--llama-server", action="store_true",
        help="real compute: llama.cpp's llama-server with a random-weight model behind an Ollama shim "
        "(`bash bench/llama-server-setup.sh` builds it once)",
    )  # fmt: skip
    ap.add_argument(
        "--llama-args", type=shlex.split, default=[], metavar="ARGS",
        help="more llama-server flags, e.g. '--cache-ram 0' (no host-memory prompt cache, as Ollama's runner)",
    )  # fmt: skip
    ap.add_argument(
        "--gpu-layers", type=int, metavar="N",
        help="with --llama-server: offload N layers to the GPU (llama-server -ngl N; 999: all of them)",
    )  # fmt: skip
    ap.add_argument(
        "--shape", metavar="SPEC",
        help="with --llama-server: the random model's shape, `small` (default), `8b` (Llama 3 8B's: 128-dim heads, "
        "8 key/value heads) or key=value pairs, e.g. embd=4096,layers=32,head_dim=128,kv_heads=8,ff=14336",
    )  # fmt: skip
    ap.add_argument("--model", default="hermes3")
    ap.add_argument(
        "--policy", default="gate,naive",
        help="policies side by side: gate, naive, and gate:model / gate:idle / gate:rules (the gate with that "
        "[chat] classify)",
    )  # fmt: skip
    ap.add_argument(
        "--slots", type=_ints, metavar="K[,K...]",
        help="server slots = the gate's slots, e.g. 1,2,3: every policy runs at each (default: the double's "
        "num_parallel, or 1)",
    )  # fmt: skip
    ap.add_argument("--sweep-slots", type=_ints, help="also run the gate alone at each slot count, e.g. 1,2,4")
    ap.add_argument(
        "--turn-slots", type=int, metavar="K",
        help="the gate's [ollama] turn_slots: turns answered at once (default 0: one per slot)",
    )  # fmt: skip
    ap.add_argument(
        "--repeat", type=int, default=1, metavar="K",
        help="run everything K times (policies side by side in each run) and report the median and spread",
    )  # fmt: skip
    ap.add_argument(
        "--ttfa-sessions", type=int, default=64, metavar="N",
        help="also measure ttfa with N sessions open at once, typing and in a burst (0: skip; default 64)",
    )  # fmt: skip
    ap.add_argument("--only-ttfa", action="store_true", help="measure only ttfa (see --ttfa-sessions)")
    ap.add_argument("--timeout", type=float, default=300.0, help="per run")
    ap.add_argument("--json", action="store_true", help="print {machine, rows} as JSON on stdout")
    ap.add_argument("--plot", type=Path, help="write a PNG of wall done / drained against N")
    ap.add_argument("--backend", choices=["double", "ollama", "llama-server"], help="same as the flags above, by name")
    args = ap.parse_args(argv)
    if args.backend == "llama-server":
        args.llama_server = True
    elif args.backend == "ollama" and not args.ollama:
        ap.error("--backend ollama needs --ollama URL")
    for flag, given in (("--llama-args", args.llama_args), ("--gpu-layers", args.gpu_layers is not None),
                        ("--shape", args.shape)):  # fmt: skip
        if given and not args.llama_server:
            ap.error(f"{flag}: only with --llama-server")
    args.llama_args = engine_args(args.gpu_layers, args.llama_args)
    args.llama_model = None
    if args.shape:
        from orchestrator.lab.bench.llama_model import Shape
        from orchestrator.lab.bench.llama_server import model_for

        try:
            args.llama_model = model_for(Shape.parse(args.shape))
        except ValueError as e:
            ap.error(f"--shape: {e}")
    if args.repeat < 1:
        ap.error("--repeat: at least 1")
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    known = ("gate", "naive", *(f"gate:{m}" for m in CLASSIFY))
    if not policies or any(p not in known for p in policies):
        ap.error(f"--policy: use {', '.join(known)} (comma-separated), got {args.policy!r}")
    try:
        asyncio.run(_stopped_by_sigterm(_main(args, policies)))
    except asyncio.CancelledError:
        print("orchestrator bench chat: stopped by SIGTERM; its daemons and model servers are stopped", file=sys.stderr)
        sys.exit(143)


async def _stopped_by_sigterm(work: Coroutine[Any, Any, None]) -> None:
    """`work`, cancelled by SIGTERM: every `finally` on the way out stops the daemon and model server it started."""
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    await work


CLASSIFY = ("model", "idle", "rules")
"""`gate:MODE` runs the gate with `[chat] classify = MODE` (plain `gate`: the configured default)."""


async def _step(args: argparse.Namespace, policy: str, n: int, slots: int) -> dict[str, Any]:
    """One (policy, N, slots) row on a fresh model server (with `--slots`, the double gets as many slots)."""
    from orchestrator.lab.doubles.ollama import profile_named

    base, _, mode = policy.partition(":")
    chat = {"classify": mode} if mode else None
    turn_slots = _turn_slots(args)
    if args.llama_server:
        row = await _on_llama_server(
            base, n, slots, args.timeout, chat, turn_slots, tuple(args.llama_args), model=args.llama_model
        )
    else:
        proc = None
        url = args.ollama
        parallel = slots if args.slots else None
        if not url:
            proc, url = _spawn_double(args.double, parallel)
        try:
            server_slots = None if args.ollama else parallel or profile_named(args.double).num_parallel
            row = await run_one(
                url, base, n, slots, args.model, args.timeout, server_slots, chat=chat, turn_slots=turn_slots
            )
        finally:
            if proc is not None:
                _stop(proc)
    return {**row, "policy": policy}


def _turn_slots(args: argparse.Namespace) -> int:
    """The gate's `turn_slots`: as given, else 0 (one turn per slot)."""
    return int(args.turn_slots or 0)


async def _ttfa_step(args: argparse.Namespace, mode: str, default_slots: int) -> dict[str, Any]:
    proc = None
    url = args.ollama
    if not url:  # the ack must not depend on the model: 8 slots streaming 50 tokens/s each keep it busy
        proc, url = _spawn_double("fast", 8, "--decode-s", "0.02")
    try:
        slots = default_slots if args.ollama else 8
        return await ttfa_run(url, args.ttfa_sessions, slots, args.model, mode, args.timeout)
    finally:
        if proc is not None:
            _stop(proc)


def plan(policies: list[str], ns: list[int], slot_counts: list[int], run: int) -> list[tuple[str, int, int]]:
    """Run `run`'s (policy, N, slots) steps. Policies innermost: gate and naive of one (slots, N) run back to back,
    side by side; every other run in the reverse order, so a load that drifts during a run favours neither policy
    over the runs."""
    order = policies if run % 2 == 0 else policies[::-1]
    return [(p, n, k) for k in slot_counts for n in ns for p in order]


async def _main(args: argparse.Namespace, policies: list[str]) -> None:
    from orchestrator.lab.bench import chat_report as report
    from orchestrator.lab.doubles.ollama import profile_named

    real = args.ollama or args.llama_server
    slot_counts = args.slots or [1 if real else profile_named(args.double).num_parallel]

    sweep = [
        ("gate", n, k) for k in args.sweep_slots or [] for n in args.n if k not in slot_counts or "gate" not in policies
    ]

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    steps: list[tuple[int, str, int | str, int]] = [
        (run, *step)
        for run in range(args.repeat)
        for step in ([] if args.only_ttfa else plan(policies, args.n, slot_counts, run) + sweep)
    ]
    steps += [(0, "ttfa", m, 0) for m in (("typing", "burst") if args.ttfa_sessions > 0 else ())]
    rows: list[dict[str, Any]] = []
    ttfa: list[dict[str, Any]] = []
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"))
    with Progress(*columns, TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("bench chat", total=len(steps))
        for run, policy, n, slots in steps:
            if policy == "ttfa":
                bar.update(task, description=f"ttfa: {args.ttfa_sessions} sessions open, {n}")
                ttfa.append(await _ttfa_step(args, str(n), slot_counts[0]))
            else:
                bar.update(task, description=f"run {run + 1}/{args.repeat}: {policy} N={n} slots={slots}")
                rows.append({"run": run, **await _step(args, policy, int(n), slots)})
            bar.advance(task)
    report.ratios(rows)
    median = report.medians(rows)
    vs = report.versus(rows)
    m = machine()
    if args.json:
        source = args.ollama or ("llama-server" if args.llama_server else f"double:{args.double}")
        source += "".join(f" {a}" for a in args.llama_args)
        out = {"machine": m, "source": source, "repeat": args.repeat, "rows": rows, "median": median, "versus": vs,
               "ttfa": ttfa}  # fmt: skip
        print(json.dumps(out, indent=2))
    else:
        source = args.ollama or ("llama-server" if args.llama_server else f"the Ollama double, profile {args.double}")
        source += "".join(f" {a}" for a in args.llama_args)
        where = f"{m['cores']} cores, {m['ram_mb']} MB RAM, Python {m['python']}, load {m['load_1m']}"
        print(f"bench chat on {source}: {where}")
        if rows:
            report.table(rows)
            report.versus_table(vs)
        for t in ttfa:
            print(
                f"ttfa with {t['sessions']} sessions open, {t['mode']} ({t['turns']} turns): "
                f"p50 {t['ttfa_p50_s'] * 1000:.1f} ms, p99 {t['ttfa_p99_s'] * 1000:.1f} ms, "
                f"max {t['ttfa_max_s'] * 1000:.1f} ms (daemon side p99 {t['ttfa_server_p99_s'] * 1000:.2f} ms)"
            )
    if args.sweep_slots:
        top = max(args.n)
        best = min((r for r in median if r["policy"] == "gate" and r["n"] == top), key=lambda r: r["wall_done_s"])
        print(
            f"at N={top} the gate's done-wall is lowest with {best['slots']} slots: "
            f"set [ollama] parallel = {best['slots']} (and OLLAMA_NUM_PARALLEL on the server)",
            file=sys.stderr,
        )
    for r in rows:
        for e in r["errors"][:3]:
            print(f"orchestrator: run {r['run'] + 1} {r['policy']} N={r['n']}: {e}", file=sys.stderr)
    if args.plot:
        report.plot(median, args.plot)
