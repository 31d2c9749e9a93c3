"""The CLI's client of the daemon's API: HTTP over the UNIX socket, standard library only (fast to start).

What it sends are the typed requests of `orchestrator.requests`, the ones the daemon reads back."""

from __future__ import annotations

import http.client
import json
import socket
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from orchestrator import requests as rq


class Unreachable(ConnectionError):
    """No daemon answers on the socket."""


class ApiError(Exception):
    """The daemon refused the request; `message` says why and what to do."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# A daemon that dies mid-request: the connection drops, or a chunked answer stops short.
_GONE = (http.client.RemoteDisconnected, http.client.IncompleteRead, ConnectionResetError, BrokenPipeError)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float | None) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if self.timeout is not None:
            sock.settimeout(self.timeout)
        try:
            sock.connect(str(self._path))
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def _error(status: int, raw: bytes) -> ApiError:
    """The daemon's refusal: its JSON `error`, or the text it sent (a route that does not exist: 404 in text)."""
    try:
        data = json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        data = {}
    message = data.get("error") if isinstance(data, dict) else None
    return ApiError(status, message or raw.decode(errors="replace").strip() or f"HTTP {status}")


class Client:
    def __init__(self, socket_path: Path, timeout: float | None = 30.0) -> None:
        self.socket_path = socket_path
        self.timeout = timeout

    def _open(
        self, method: str, path: str, body: Any = None, timeout: float | None = None
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        conn = _UnixConnection(self.socket_path, timeout if timeout is not None else self.timeout)
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        try:
            conn.request(method, path, body=payload, headers=headers)
            return conn, conn.getresponse()
        except BaseException:
            conn.close()
            raise

    def _connect(
        self, method: str, path: str, body: Any = None, timeout: float | None = None
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        try:
            return self._open(method, path, body, timeout)
        except (FileNotFoundError, ConnectionRefusedError) as e:
            raise Unreachable(
                f"no daemon answers on {self.socket_path}: start it with `orchestrator daemon` "
                "(or `systemctl --user start orchestrator`)"
            ) from e
        except PermissionError as e:
            raise Unreachable(f"cannot open {self.socket_path}: it belongs to another user") from e
        except _GONE as e:
            raise self._gone() from e
        except OSError as e:  # "AF_UNIX path too long": no daemon can listen there either
            from orchestrator.paths import socket_too_long

            if (problem := socket_too_long(Path(self.socket_path))) is not None:
                raise Unreachable(problem) from e
            raise

    def _gone(self) -> Unreachable:
        return Unreachable(
            f"the daemon on {self.socket_path} went away mid-request (stopped or crashed): check "
            "`systemctl --user status orchestrator` or start it with `orchestrator daemon`, then ask again"
        )

    def request(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> Any:
        conn, resp = self._connect(method, path, body, timeout)
        try:
            raw = resp.read()
        except _GONE as e:
            raise self._gone() from e
        finally:
            conn.close()
        if resp.status >= 400:
            raise _error(resp.status, raw)
        try:
            return json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            return {"error": raw.decode(errors="replace")}

    def stream(self, path: str) -> Iterator[bytes]:
        conn, resp = self._connect("GET", path, timeout=None)
        try:
            if resp.status >= 400:
                raise _error(resp.status, resp.read())
            while chunk := resp.read1(65536):
                yield chunk
        except _GONE as e:
            raise self._gone() from e
        finally:
            conn.close()

    def post_lines(self, path: str, body: Any) -> Iterator[dict[str, Any]]:
        """POST and read an NDJSON answer line by line as it streams (the chat reply)."""
        conn, resp = self._connect("POST", path, body, timeout=None)
        try:
            if resp.status >= 400:
                raise _error(resp.status, resp.read())
            while line := resp.readline():
                yield json.loads(line)
        finally:
            conn.close()

    # The API, one method per endpoint.
    def health(self) -> dict[str, Any]:
        return self.request("GET", "/health")

    def enqueue(self, request: rq.Enqueue | None = None, /, **fields: Any) -> dict[str, Any]:
        """Queue a job: `request`, or one made of `fields` (`enqueue(repo=..., text=...)`)."""
        return self.request("POST", "/jobs", (request or rq.Enqueue(**fields)).to_json())

    def jobs(self, states: str | None = None) -> list[dict[str, Any]]:
        return self.request("GET", "/jobs" + (f"?state={states}" if states else ""))["jobs"]

    def job(self, job_id: int) -> dict[str, Any]:
        return self.request("GET", f"/jobs/{job_id}")

    def why(self, job_id: int) -> dict[str, Any]:
        return self.request("GET", f"/jobs/{job_id}/why")

    def cancel(self, job_id: int) -> dict[str, Any]:
        return self.request("POST", f"/jobs/{job_id}/cancel", {})

    def land(self, job_id: int) -> dict[str, Any]:
        return self.request("POST", f"/jobs/{job_id}/land", {})

    def reject(self, job_id: int) -> dict[str, Any]:
        return self.request("POST", f"/jobs/{job_id}/reject", {})

    def revise(self, job_id: int, feedback: str) -> dict[str, Any]:
        return self.request("POST", f"/jobs/{job_id}/revise", rq.Revise(feedback).to_json())

    def edit(self, job_id: int, change: rq.Edit | None = None, /, **fields: Any) -> dict[str, Any]:
        return self.request("POST", f"/jobs/{job_id}/edit", (change or rq.Edit(**fields)).to_json())

    def move(self, job_id: int, before: int) -> dict[str, Any]:
        return self.request("POST", f"/jobs/{job_id}/move", rq.Move(before).to_json())

    def switch(self, job_id: int, other: int) -> list[dict[str, Any]]:
        return list(self.request("POST", f"/jobs/{job_id}/switch", rq.Switch(other).to_json())["jobs"])

    def diff(self, job_id: int, against: str = "base") -> dict[str, Any]:
        return self.request("GET", f"/jobs/{job_id}/diff?against={against}")

    def retry(self, job_id: int) -> dict[str, Any]:
        return self.request("POST", f"/jobs/{job_id}/retry", {})

    def clean(self, job_id: int) -> dict[str, Any]:
        return self.request("POST", f"/jobs/{job_id}/clean", {})

    def wait(self, ids: list[int], timeout: float | None) -> dict[str, Any]:
        # The server holds the request until the jobs end; give the socket a little longer than that.
        sock_timeout = None if timeout is None else timeout + 10
        return self.request("POST", "/wait", rq.Wait(tuple(ids), timeout).to_json(), timeout=sock_timeout)

    def stats_predict(self, repo: str | None = None) -> dict[str, Any]:
        query = "?" + urllib.parse.urlencode({"repo": repo}) if repo else ""
        return self.request("GET", f"/stats/predict{query}")

    def plan(self, request: rq.Plan | None = None, /, **fields: Any) -> dict[str, Any]:
        return self.request("POST", "/plan", (request or rq.Plan(**fields)).to_json())

    def controls(self) -> dict[str, Any]:
        return self.request("GET", "/controls")["controls"]

    def pause(self, repo: str | None) -> dict[str, Any]:
        return self.request("POST", "/pause", rq.Control(repo).to_json())

    def resume(self, repo: str | None) -> dict[str, Any]:
        return self.request("POST", "/resume", rq.Control(repo).to_json())

    def limit(self, repo: str, slots: int | None) -> dict[str, Any]:
        return self.request("POST", "/limit", rq.Control(repo, slots).to_json())

    def tickets(self, request: rq.Tickets) -> dict[str, Any]:
        """A commit's tickets (the git hook's request): one result per ticket."""
        return self.request("POST", "/tickets", request.to_json())

    def events(self) -> Iterator[dict[str, Any]]:
        """The daemon's event stream, one JSON object per line, until the daemon closes it."""
        buf = b""
        for chunk in self.stream("/events"):
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                if line.strip():
                    yield json.loads(line)
