"""`orchestrator bench chat`: the seed's chat table, per policy, side by side in one run.

For each policy and each N it starts a fresh daemon (its own home, `[chat] policy`, `[ollama] parallel`)
in front of one model server — a fresh Ollama protocol double (`--double PROFILE`, the default) or a
real Ollama (`--ollama URL`) — fires N sessions at once through the daemon's socket (classification,
reply, memory extraction: the whole pipeline), and measures from the client's side:

- ttfa: this session's request started → the daemon's acknowledgement line (client side, so it includes
  connecting to the socket); `ttfa_server_p99_s` is request received → ack written, as the daemon says;
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
import math
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from orchestrator import __version__
from orchestrator.bench import turns
from orchestrator.client import Client, Unreachable
from orchestrator.paths import resolve as resolve_paths
from orchestrator.store import Store


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
    args = [sys.executable, "-m", "orchestrator.doubles.ollama", "--port", "0", "--profile", profile, *extra]
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
    store = await Store.open(paths.db)
    try:
        await turns.seed(store, sessions)
    finally:
        await store.close()


@asynccontextmanager
async def _daemon(url: str, policy: str, slots: int, model: str, sessions: dict[str, int]) -> AsyncIterator[Path]:
    home = Path(tempfile.mkdtemp(prefix="orchestrator-bench-chat-"))
    (home / "config").mkdir()
    await _seeded(home, sessions)
    (home / "config" / "config.toml").write_text(
        f'[ollama]\nhost = "{url}"\nparallel = {slots}\nmodel = "{model}"\nmax_queue = 4096\n'
        f'[chat]\npolicy = "{policy}"\nextract_idle = 5.0\n'
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


async def _session(http: aiohttp.ClientSession, i: int, t0: float) -> Sample:
    ttfa = first = None
    error = None
    server = float("nan")
    mine = time.monotonic()
    async with http.post(f"http://localhost/chat/bench{i}", json={"text": turns.prompt(i), "end": True}) as r:
        if r.status != 200:
            return Sample(time.monotonic() - mine, None, time.monotonic() - t0, f"HTTP {r.status}")
        async for line in r.content:
            ev = json.loads(line)
            now = time.monotonic() - t0
            if ev["event"] == "ack":
                ttfa = time.monotonic() - mine
                server = float(ev.get("ttfa_s", "nan"))
            elif first is None and (
                ev["event"] == "token" or (ev["event"] == "intent" and ev.get("source") == "model")
            ):
                first = now
            elif ev["event"] == "error":
                error = f"{ev['code']}: {ev['message']}"
    return Sample(ttfa if ttfa is not None else float("nan"), first, time.monotonic() - t0, error, server)


async def _stats(http: aiohttp.ClientSession) -> dict[str, Any]:
    async with http.get("http://localhost/chat") as r:
        return await r.json()


def _drained(s: dict[str, Any]) -> bool:
    return s["gate"]["running"] == 0 and s["gate"]["queued"] == 0 and s["extraction"]["pending"] == 0


async def warm(url: str, model: str, calls: int) -> None:
    """Warm the server as a day's use would have: the model loaded, the shared system part in each slot."""
    import ollama as ollama_pkg

    from orchestrator.bench.simulate import warmup_messages
    from orchestrator.llm.ollama import DEFAULT_OPTIONS

    client = ollama_pkg.AsyncClient(host=url, timeout=120)
    try:
        opts = {**DEFAULT_OPTIONS, "num_predict": 1}
        await asyncio.gather(
            *(client.chat(model=model, messages=warmup_messages(), options=opts) for _ in range(calls))
        )
    finally:
        await client._client.aclose()


async def run_one(
    url: str, policy: str, n: int, slots: int, model: str, timeout: float, server_slots: int | None = None
) -> dict[str, Any]:
    await warm(url, model, server_slots or slots)
    async with _daemon(url, policy, slots, model, {f"bench{i}": i for i in range(n)}) as sock:
        conn = aiohttp.UnixConnector(path=str(sock), limit=0)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=timeout)) as http:
            with Sampler() as sampler:
                t0 = time.monotonic()
                samples = await asyncio.gather(*(_session(http, i, t0) for i in range(n)))
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
    }


async def _on_llama_server(policy: str, n: int, slots: int, timeout: float) -> dict[str, Any]:
    """One run on a fresh llama-server with as many slots as the gate (its prompt cache starts cold)."""
    from orchestrator.bench.llama_server import MODEL_NAME, LlamaServer, SetupMissing

    try:
        server = LlamaServer(slots)
    except SetupMissing as e:
        print(f"orchestrator: {e}", file=sys.stderr)
        sys.exit(2)
    async with server as url:
        return await run_one(url, policy, n, slots, MODEL_NAME, timeout)


class RawSession:
    """One session's kept-alive connection to the daemon's socket, speaking just enough HTTP/1.1.

    The ttfa runs use it instead of a client library, so the figure is the daemon's and the socket's, not
    the time one client process spends building 64 requests (as 64 people's terminals would not).
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, sock: Path) -> RawSession:
        return cls(*await asyncio.open_unix_connection(str(sock)))

    async def turn(self, name: str, text: str) -> Sample:
        body = json.dumps({"text": text, "end": True}).encode()
        head = f"POST /chat/{name} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        t = time.monotonic()
        self.writer.write(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        headers = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        status = int(headers.split(" ", 2)[1])
        if "chunked" not in headers.lower():
            length = int(
                next(h.split(":", 1)[1] for h in headers.split("\r\n") if h.lower().startswith("content-length"))
            )
            await self.reader.readexactly(length)
            return Sample(time.monotonic() - t, None, time.monotonic() - t, f"HTTP {status}")
        ttfa = server = float("nan")
        error = None
        while size := int((await self.reader.readline()).strip(), 16):
            chunk = await self.reader.readexactly(size + 2)
            for line in chunk.splitlines():
                if not line.strip():
                    continue
                ev = json.loads(line)
                if ev["event"] == "ack":
                    ttfa, server = time.monotonic() - t, float(ev.get("ttfa_s", "nan"))
                elif ev["event"] == "error":
                    error = f"{ev['code']}: {ev['message']}"
        await self.reader.readline()
        return Sample(ttfa, None, time.monotonic() - t, error, server)

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


def _ratios(rows: list[dict[str, Any]]) -> None:
    singles = {(r["policy"], r["slots"]): r for r in rows if r["n"] == 1}
    for r in rows:
        one = singles.get((r["policy"], r["slots"]))
        one = one or next((s for s in rows if s["n"] == 1 and s["policy"] == r["policy"]), None)
        if one:
            base = one["done_mean_s"]
            r["wall_done_ratio"] = round(r["wall_done_s"] / (r["n"] * base), 2)
            r["done_max_x_single"] = round(r["done_max_s"] / base, 2)
            r["done_mean_x_single"] = round(r["done_mean_s"] / base, 2)
            r["drained_x_single"] = round(r["wall_drained_s"] / one["wall_drained_s"], 2)


def _cell(key: str, v: Any) -> str:
    """A table cell with its unit: ttfa in ms, times in s, CPU in %, RAM in MB, ratios bare."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if not isinstance(v, int | float) or isinstance(v, bool):
        return str(v)
    if key.startswith("ttfa"):
        return f"{v * 1000:.1f} ms"
    if key.endswith("_s"):
        return f"{v:.2f} s"
    if key.endswith("_pct"):
        return f"{v:.0f} %"
    if key.endswith("_mb"):
        return f"{v:,.0f} MB"
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def _table(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="bench chat", box=None, pad_edge=False)
    cols = [
        ("policy", "policy"), ("slots", "slots"), ("N", "n"), ("ttfa", "ttfa_mean_s"), ("ttfa p99", "ttfa_p99_s"),
        ("server p99", "ttfa_server_p99_s"), ("first-Ollama", "first_ollama_mean_s"), ("done min/mean/max", None),
        ("wall done", "wall_done_s"), ("wall drained", "wall_drained_s"), ("CPU max", "cpu_max_pct"),
        ("min free RAM", "min_free_ram_mb"), ("wait int/bg", None), ("done/(N×1)", "wall_done_ratio"),
        ("max×1", "done_max_x_single"), ("mean×1", "done_mean_x_single"), ("errors", None),
    ]  # fmt: skip
    for name, _ in cols:
        t.add_column(name, justify="right")
    for r in rows:
        cells = []
        for name, key in cols:
            if name.startswith("done min"):
                cells.append(f"{r['done_min_s']:.1f} / {r['done_mean_s']:.1f} / {r['done_max_s']:.1f} s")
            elif name.startswith("wait"):
                cells.append(f"{r['gate_wait_interactive_s']:.2f} / {r['gate_wait_background_s']:.2f} s")
            elif name == "errors":
                cells.append(str(len(r["errors"])))
            else:
                cells.append(_cell(key or "", r.get(key or "")))
        t.add_row(*cells)
    Console(width=220 if not sys.stdout.isatty() else None).print(t)


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("orchestrator: --plot needs matplotlib (`pip install 'orchestrator[plot]'`)", file=sys.stderr)
        sys.exit(2)
    fig, ax = plt.subplots(figsize=(7, 4))
    for policy in sorted({r["policy"] for r in rows}):
        mine = [r for r in rows if r["policy"] == policy]
        ax.plot([r["n"] for r in mine], [r["wall_done_s"] for r in mine], marker="o", label=f"{policy}: wall done")
        ns = [r["n"] for r in mine]
        ax.plot(ns, [r["wall_drained_s"] for r in mine], marker="x", ls="--", label=f"{policy}: drained")
    ax.set_xticks(sorted({r["n"] for r in rows}))
    ax.set_xlabel("concurrent sessions (N)")
    ax.set_ylabel("seconds")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


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
    ap.add_argument("--model", default="hermes3")
    ap.add_argument("--policy", default="gate,naive", help="policies side by side: gate,naive")
    ap.add_argument("--slots", type=int, help="the gate's slots (default: the double's num_parallel, or 1)")
    ap.add_argument("--sweep-slots", type=_ints, help="also run the gate at each slot count, e.g. 1,2,4")
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
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    if any(p not in ("gate", "naive") for p in policies):
        ap.error(f"--policy: use gate and/or naive, got {args.policy!r}")
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


async def _step(args: argparse.Namespace, policy: str, n: int, slots: int) -> dict[str, Any]:
    """One (policy, N, slots) row on a fresh model server."""
    from orchestrator.doubles.ollama import profile_named

    if args.llama_server:
        return await _on_llama_server(policy, n, slots, args.timeout)
    proc = None
    url = args.ollama
    if not url:
        proc, url = _spawn_double(args.double, None)
    try:
        server_slots = None if args.ollama else profile_named(args.double).num_parallel
        return await run_one(url, policy, n, slots, args.model, args.timeout, server_slots)
    finally:
        if proc is not None:
            _stop(proc)


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


async def _main(args: argparse.Namespace, policies: list[str]) -> None:
    from orchestrator.doubles.ollama import profile_named

    real = args.ollama or args.llama_server
    default_slots = args.slots or (1 if real else profile_named(args.double).num_parallel)
    plan: list[tuple[str, int, int]] = [(p, n, default_slots) for p in policies for n in args.n]
    for k in args.sweep_slots or []:
        plan += [("gate", n, k) for n in args.n if k != default_slots or "gate" not in policies]

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    steps: list[tuple[str, int | str, int]] = [*([] if args.only_ttfa else plan)]
    steps += [("ttfa", m, 0) for m in (("typing", "burst") if args.ttfa_sessions > 0 else ())]
    rows: list[dict[str, Any]] = []
    ttfa: list[dict[str, Any]] = []
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"))
    with Progress(*columns, TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("bench chat", total=len(steps))
        for policy, n, slots in steps:
            if policy == "ttfa":
                bar.update(task, description=f"ttfa: {args.ttfa_sessions} sessions open, {n}")
                ttfa.append(await _ttfa_step(args, str(n), default_slots))
            else:
                bar.update(task, description=f"{policy} N={n} slots={slots}")
                rows.append(await _step(args, policy, int(n), slots))
            bar.advance(task)
    _ratios(rows)
    if args.json:
        source = args.ollama or ("llama-server" if args.llama_server else f"double:{args.double}")
        print(json.dumps({"machine": machine(), "source": source, "rows": rows, "ttfa": ttfa}, indent=2))
    else:
        m = machine()
        source = args.ollama or ("llama-server" if args.llama_server else f"the Ollama double, profile {args.double}")
        where = f"{m['cores']} cores, {m['ram_mb']} MB RAM, Python {m['python']}, load {m['load_1m']}"
        print(f"bench chat on {source}: {where}")
        if rows:
            _table(rows)
        for t in ttfa:
            print(
                f"ttfa with {t['sessions']} sessions open, {t['mode']} ({t['turns']} turns): "
                f"p50 {t['ttfa_p50_s'] * 1000:.1f} ms, p99 {t['ttfa_p99_s'] * 1000:.1f} ms, "
                f"max {t['ttfa_max_s'] * 1000:.1f} ms (daemon side p99 {t['ttfa_server_p99_s'] * 1000:.2f} ms)"
            )
    if args.sweep_slots:
        top = max(args.n)
        best = min((r for r in rows if r["policy"] == "gate" and r["n"] == top), key=lambda r: r["wall_done_s"])
        print(
            f"at N={top} the gate's done-wall is lowest with {best['slots']} slots: "
            f"set [ollama] parallel = {best['slots']} (and OLLAMA_NUM_PARALLEL on the server)",
            file=sys.stderr,
        )
    for r in rows:
        for e in r["errors"][:3]:
            print(f"orchestrator: {r['policy']} N={r['n']}: {e}", file=sys.stderr)
    if args.plot:
        _plot(rows, args.plot)
