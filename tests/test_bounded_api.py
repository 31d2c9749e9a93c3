"""The API is bounded: id lists, request bodies, connections that trickle their headers, too many connections."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import time

from orchestrator.client import Client
from tests.harness import Daemon


def _raw(d: Daemon) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(str(d.socket))
    return s


def _closed(s: socket.socket) -> bool:
    """The daemon closed it (nothing more to read), as opposed to still holding it open."""
    s.settimeout(0.05)
    try:
        return s.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


class _Unix(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=30)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(self.path)


def _post(d: Daemon, path: str, body: bytes) -> tuple[int, bytes]:
    conn = _Unix(str(d.socket))
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_a_huge_id_list_or_body_is_refused_at_once(daemon_factory):
    """400,000 ids to `/wait` are refused in a moment with what to do; a body past the cap gets 413; a text
    that is not Unicode gets 400, never 500."""
    d = daemon_factory().start()
    started = time.monotonic()
    status, body = _post(d, "/wait", json.dumps({"ids": list(range(400_000))}).encode())
    assert status == 400 and b"at most 10000" in body
    assert time.monotonic() - started < 10
    status, _ = _post(d, "/jobs", b'{"text": "' + b"x" * (5 * 1024 * 1024) + b'"}')
    assert status == 413
    status, body = _post(d, "/jobs", b'{"repo": "/tmp", "text": "echo \\ud800"}')
    assert status == 400 and b"not valid text" in body, body


def test_connections_that_trickle_their_headers_are_closed(daemon_factory):
    """Connections that send their headers a byte at a time (slowloris) are closed after the header timeout,
    past `max_connections` new ones are closed at once, and a normal request is answered all along."""
    d = daemon_factory()
    (d.home / "config").mkdir(parents=True)
    (d.home / "config" / "config.toml").write_text("[daemon]\nheader_timeout = 1\nmax_connections = 40\n")
    d.start()
    slow = [_raw(d) for _ in range(30)]
    for s in slow:
        s.sendall(b"GET /health HTTP/1.1\r\nHo")
    extra = [_raw(d) for _ in range(20)]
    time.sleep(0.3)
    assert sum(_closed(s) for s in extra) >= 10, "past max_connections a connection is closed at once"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        for s in slow:
            with contextlib.suppress(OSError):
                s.sendall(b"s")  # one more byte: it never finishes its headers
        if all(_closed(s) for s in slow):
            break
        time.sleep(0.2)
    assert all(_closed(s) for s in slow), "every trickling connection was closed"
    assert Client(d.socket, timeout=5).health()["ok"]
    for s in slow + extra:
        s.close()
    events = [e for e in d.events() if e["event"] == "api.connections_closed"]
    assert events and events[0]["header_timeout"] == 1
