"""The chat plane end to end: the real daemon over its socket, the Ollama double as a real HTTP server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.chatkit import OllamaDouble, get, turn, wait_for, write_config
from tests.harness import Daemon

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def doubles() -> Iterator[Callable[..., OllamaDouble]]:
    made: list[OllamaDouble] = []

    def _make(*args: str) -> OllamaDouble:
        made.append(OllamaDouble(*args))
        return made[-1]

    yield _make
    for d in made:
        d.stop()


def chat_daemon(daemon_factory: Callable[..., Daemon], tmp_path: Path, url: str, **cfg: object) -> Daemon:
    home = tmp_path / "home"
    write_config(home, url, **cfg)
    return daemon_factory("home").start()


def _session_of(req: dict[str, object]) -> str:
    users = [m["content"] for m in req["messages"] if m["role"] == "user"]  # type: ignore[index, union-attr]
    return str(users[-1]).split(":", 1)[0]


async def test_memory_from_one_turn_reaches_a_later_turns_prompt(daemon_factory, doubles, tmp_path: Path) -> None:
    """A turn streams ack → intent → tokens → done; what it told us is extracted and used in the next prompt."""
    ol = doubles()
    d = chat_daemon(daemon_factory, tmp_path, ol.url, extract_every=1)
    status, events = await turn(d.socket, "ann", "I'm Ann and my dog is called Rex. What breed suits a flat?")
    assert status == 200
    kinds = [e["event"] for e in events]
    assert kinds[0] == "ack" and "intent" in kinds and kinds[-1] == "done" and "token" in kinds
    await wait_for(d.socket, lambda s: s["extraction"]["calls"] >= 1 and s["extraction"]["pending"] == 0)
    mem = await get(d.socket, "/chat/ann")
    assert any("Rex" in m for m in mem["memories"]), mem
    status, _ = await turn(d.socket, "ann", "Which walks are good for him in winter")
    reply_prompts = [r for r in ol.requests() if not r["format"]]
    assert "Rex" in json.dumps(reply_prompts[-1]["messages"][-1])  # the task instruction carries the memory


async def test_extraction_reads_only_what_is_not_extracted_yet(daemon_factory, doubles, tmp_path: Path) -> None:
    """The gate's extraction call carries the turns not yet extracted and the memories of the earlier ones,
    never the earlier messages themselves, and begins as every session's does (one cached prefix)."""
    ol = doubles()
    d = chat_daemon(daemon_factory, tmp_path, ol.url, extract_every=1)
    said = ["I'm Ann and my dog is called Rex.", "I live in Porto and I work on the billing service."]
    for i, text in enumerate(said):
        await turn(d.socket, "ann", text)
        await wait_for(d.socket, lambda s, i=i: s["extraction"]["calls"] == i + 1 and s["extraction"]["pending"] == 0)
    await turn(d.socket, "bob", "My cat is called Tom.")
    await wait_for(d.socket, lambda s: s["extraction"]["calls"] == 3 and s["extraction"]["pending"] == 0)
    extractions = [r["messages"] for r in ol.requests() if r["format"] and "intent" not in r["messages"][-1]["content"]]
    assert len(extractions) == 3
    assert [m["content"] for m in extractions[1] if m["role"] == "user"] == [said[1]]  # the first: extracted
    assert "Rex" in extractions[1][2]["content"]  # ... and its memory is there instead
    assert extractions[0][:2] == extractions[1][:2] == extractions[2][:2]


async def test_turn_holds_its_slot_from_classification_through_reply(daemon_factory, doubles, tmp_path: Path) -> None:
    """With one gate slot, no other call reaches the server between a turn's classification and its reply."""
    ol = doubles("--parallel", "4")
    d = chat_daemon(daemon_factory, tmp_path, ol.url, parallel=1, extract_idle=60.0, classify="model")
    results = await asyncio.gather(*(turn(d.socket, f"s{i}", f"s{i}: tell me about rivers") for i in range(4)))
    assert all(s == 200 and e[-1]["event"] == "done" for s, e in results)
    calls = [(_session_of(r), "classify" if r["format"] else "reply") for r in ol.requests()]
    calls = [c for c in calls if c[0].startswith("s")]
    assert len(calls) == 8
    for i in range(0, 8, 2):
        assert calls[i][1] == "classify" and calls[i + 1] == (calls[i][0], "reply"), calls
    assert ol.get("/_double/stats")["max_active"] == 1


async def test_slot_bound_holds_under_64_concurrent_sessions(daemon_factory, doubles, tmp_path: Path) -> None:
    """64 sessions at once: the server never sees more calls than the gate's slots, and every turn ends."""
    ol = doubles("--parallel", "8")
    d = chat_daemon(daemon_factory, tmp_path, ol.url, parallel=2)
    results = await asyncio.gather(
        *(turn(d.socket, f"u{i}", f"u{i}: hello there, how are rivers formed") for i in range(64))
    )
    assert all(s == 200 and e[-1]["event"] == "done" for s, e in results)
    stats = await get(d.socket, "/chat")
    assert stats["gate"]["max_running"] == 2
    assert ol.get("/_double/stats")["max_active"] <= 2


async def test_full_queue_answers_busy_with_retry_after(daemon_factory, doubles, tmp_path: Path) -> None:
    """Past the gate's queue bound a turn is refused at once: 503, code Busy, Retry-After."""
    ol = doubles("--decode-s", "0.05")
    d = chat_daemon(daemon_factory, tmp_path, ol.url, parallel=1, max_queue=1)
    results = await asyncio.gather(*(turn(d.socket, f"b{i}", f"b{i}: explain tides") for i in range(6)))
    busy = [e[0] for s, e in results if s == 503]
    assert busy and all(b["code"] == "Busy" and b["retry_after"] >= 1 and b["retry_after_header"] for b in busy)
    assert any(s == 200 for s, _ in results)


async def test_client_that_disconnects_frees_its_slot(daemon_factory, doubles, tmp_path: Path) -> None:
    """Closing the connection mid-reply cancels the turn: the slot frees and the next turn runs."""
    ol = doubles("--decode-s", "0.05", "--reply-tokens", "400")
    d = chat_daemon(daemon_factory, tmp_path, ol.url, parallel=1)
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(d.socket))) as http:
        r = await http.post("http://localhost/chat/gone", json={"text": "gone: tell me a long story"})
        async for line in r.content:
            if json.loads(line)["event"] == "token":
                break
        r.close()
    await wait_for(d.socket, lambda s: s["turns"]["cancelled"] == 1 and s["gate"]["running"] == 0, timeout=20)
    assert (await asyncio.wait_for(_stats(ol), 10))["closed_early"] >= 1


async def _stats(ol: OllamaDouble) -> dict[str, object]:
    while True:
        s = await asyncio.to_thread(ol.get, "/_double/stats")
        if s["closed_early"] >= 1 and s["active"] == 0:
            return s
        await asyncio.sleep(0.05)


async def test_coalescing_makes_fewer_extraction_calls_than_turns(daemon_factory, doubles, tmp_path: Path) -> None:
    """Four sessions of three turns each on one slot: extraction runs once per session, not once per turn."""
    ol = doubles()
    d = chat_daemon(daemon_factory, tmp_path, ol.url, parallel=1, extract_every=3, extract_idle=60.0)

    async def session(i: int) -> None:
        for n in range(3):
            status, events = await turn(d.socket, f"c{i}", f"c{i}: I like sailing and my boat is number {n}")
            assert status == 200 and events[-1]["event"] == "done"

    await asyncio.gather(*(session(i) for i in range(4)))
    stats = await wait_for(d.socket, lambda s: s["extraction"]["pending"] == 0)
    assert stats["turns"]["turns"] == 12
    assert 1 <= stats["extraction"]["calls"] < 12


async def test_down_server_fails_the_turn_with_a_clear_error(daemon_factory, tmp_path: Path) -> None:
    """No Ollama at the configured host: the turn ends with ServerDown naming the host, never hangs."""
    d = chat_daemon(daemon_factory, tmp_path, "http://127.0.0.1:9")
    out = await asyncio.to_thread(d.cli, "chat", "--session", "x", "what", "is", "up", timeout=60)
    assert out.returncode == 1 and "127.0.0.1:9" in out.stderr and "unreachable" in out.stderr


async def test_a_malformed_turn_is_refused_before_its_ack_with_what_to_send(daemon_factory, tmp_path: Path) -> None:
    """The chat route reads its turn as the typed request the CLI sends: text that is not text is a 400 that says
    so, before any model or store work, as for every other request."""
    d = chat_daemon(daemon_factory, tmp_path, "http://127.0.0.1:9")
    status, events = await turn(d.socket, "s", "\udc80")  # a lone surrogate: JSON can carry it, UTF-8 cannot
    assert status == 400 and "field 'text' is not valid text" in events[0]["error"], events
    status, events = await turn(d.socket, "s", "  ")
    assert status == 400 and events[0]["error"] == 'missing "text": send {"text": "your message"}', events


def test_bench_chat_prints_both_policies_side_by_side(tmp_path: Path) -> None:
    """`bench chat --json` runs the real pipeline per policy and N and reports the seed's columns, and ttfa. (The
    command in this process; its daemons and model servers are processes. The order of several N's and policies is
    `plan`'s, tested below: one N here.)"""
    from tests.harness import cli

    out = cli("bench", "chat", "-n", "2", "--double", "fast", "--ttfa-sessions", "8", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    order = [(r["run"], r["n"], r["policy"]) for r in data["rows"]]
    assert order == [(0, 2, "gate"), (0, 2, "naive")]
    rows = {(r["policy"], r["n"]): r for r in data["rows"]}
    keys = {"policy", "n", "ttfa_mean_s", "first_ollama_mean_s", "done_min_s", "done_mean_s", "done_max_s",
            "wall_done_s", "wall_drained_s", "cpu_max_pct", "min_free_ram_mb"}  # fmt: skip
    assert all(keys <= set(r) and not r["errors"] for r in rows.values())
    assert all(r["wall_drained_s"] >= r["wall_done_s"] >= r["done_max_s"] for r in rows.values())
    # each session's own connection saw its ack, then the first model answer, then its last line
    assert all(0 < r["ttfa_p99_s"] < r["first_ollama_mean_s"] <= r["done_max_s"] for r in rows.values()), rows
    assert data["machine"]["cores"] >= 1
    ttfa = {r["mode"]: r for r in data["ttfa"]}  # 8 sessions open at once: the benchmark itself opens 64
    assert set(ttfa) == {"typing", "burst"} and all(r["sessions"] == 8 and not r["errors"] for r in ttfa.values())
    assert all(0 < r["ttfa_p50_s"] <= r["ttfa_p99_s"] <= r["ttfa_max_s"] for r in ttfa.values())


def test_bench_chat_runs_the_policies_in_the_reverse_order_every_other_run() -> None:
    """`bench chat --repeat K`: gate and naive of one (slots, N) side by side, in the reverse order every other run
    (a load that drifts during a run favours neither)."""
    from orchestrator.lab.bench.chat import plan

    assert plan(["gate", "naive"], [1, 2], [1], 0) == [("gate", 1, 1), ("naive", 1, 1), ("gate", 2, 1), ("naive", 2, 1)]
    assert plan(["gate", "naive"], [1, 2], [1], 1) == [("naive", 1, 1), ("gate", 1, 1), ("naive", 2, 1), ("gate", 2, 1)]
    assert plan(["gate", "naive"], [4], [1, 2], 2) == [("gate", 4, 1), ("naive", 4, 1), ("gate", 4, 2), ("naive", 4, 2)]


def test_bench_chat_takes_gate_against_naive_within_each_run_then_the_median_over_runs() -> None:
    """Repeated runs: each figure's median and spread per (policy, slots, N), and gate / naive taken run by run
    before its median (a load that drifts between runs moves both policies together)."""
    from orchestrator.lab.bench import chat_report as report

    def row(run: int, policy: str, n: int, done: float) -> dict:
        figures = dict.fromkeys(report.FIGURES, done)
        return {"run": run, "policy": policy, "slots": 1, "n": n, **figures, "errors": []}

    rows = [row(0, "gate", 2, 1.0), row(0, "naive", 2, 2.0), row(1, "gate", 2, 3.0), row(1, "naive", 2, 4.0)]
    medians = {(r["policy"], r["n"]): r for r in report.medians(rows)}
    assert medians[("gate", 2)]["done_max_s"] == 2.0 and medians[("gate", 2)]["spread"]["done_max_s"] == [1.0, 3.0]
    assert medians[("naive", 2)]["runs"] == 2
    (versus,) = report.versus(rows)
    assert [r["done_max_s"] for r in versus["runs"]] == [0.5, 0.75]
    assert versus["done_max_s"] == {"median": 0.625, "min": 0.5, "max": 0.75}


def test_bench_chat_runs_on_the_llama_server_backend(tmp_path: Path) -> None:
    """`bench chat --llama-server` drives the same pipeline through the llama-server shim (a stand-in engine here),
    started with the flags `--llama-args` gives."""
    import os
    import stat
    import subprocess
    import sys

    cache = tmp_path / "cache" / "orchestrator" / "llama-server"
    (cache / "bin").mkdir(parents=True)
    fake = Path(__file__).parent / "fakes" / "llama_server.py"
    binary = cache / "bin" / "llama-server"
    binary.write_text(f'#!/bin/sh\nexec {sys.executable} {fake} "$@"\n')
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    from orchestrator.lab.bench.llama_server import MODEL_FILE

    (cache / MODEL_FILE).write_bytes(b"GGUF")
    argv = tmp_path / "argv"
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "FAKE_LLAMA_ARGV": str(argv)}
    env.pop("ORCHESTRATOR_LLAMA_SERVER", None)
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator", "bench", "chat", "-n", "2", "--llama-server", "--policy", "gate",
         "--ttfa-sessions", "0", "--llama-args", "--cache-ram 0", "--json"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["source"] == "llama-server --cache-ram 0"
    assert [(r["policy"], r["n"], r["errors"]) for r in data["rows"]] == [("gate", 2, [])]
    started = [json.loads(line) for line in argv.read_text().splitlines()]
    assert len(started) == 1 and started[0][-2:] == ["--cache-ram", "0"], started
