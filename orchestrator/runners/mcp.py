"""`orchestrator mcp`: the Model Context Protocol server an agent CLI starts for its job, and how the CLI is told.

An agent CLI run as a job (Claude Code, codex) finds this server in its job's scratch config and starts it, inside
the job's sandbox, as `python -m orchestrator mcp`. Its tools tell the agent which paths the other running jobs of
its repository hold, and extend its own claim before it writes outside it (the decision claim growth makes,
asked ahead of the write), as the built-in agent's write tools do. It reaches the daemon only through the job's
door (`jobs.door`): a UNIX socket in the job's private dir, which the sandbox shows to that job alone, that
answers those two questions for that one job and checks the job's token; nothing else of the daemon is
reachable through it.

Wire: MCP's stdio transport, newline-delimited JSON-RPC 2.0 on stdin/stdout: `initialize` (the client's protocol
version when this server knows it, else its newest), `notifications/initialized`, `ping`, `tools/list`,
`tools/call`. A tool that cannot answer says why as a tool error (`isError`); a malformed message gets a
JSON-RPC error. Nothing but protocol on stdout: notes go to stderr.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from orchestrator import beneath
from orchestrator.core import claims

PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
"""The MCP revisions this server speaks, newest first (tools only: they are alike in all of them)."""
NAME = "orchestrator"
"""The server's name in a CLI's config: Claude Code shows its tools as `mcp__orchestrator__<tool>`."""
ENV_DOOR, ENV_TOKEN = "ORCHESTRATOR_DOOR", "ORCHESTRATOR_DOOR_TOKEN"
"""Where the server finds its job's door and token (set in the CLI's config for it)."""
MAX_LINE = 1 << 20
"""Bytes one message may have, on stdin and from the door."""
MAX_PATHS = 200
"""Paths one claim request may name."""

HELD, CLAIM = "held_paths", "claim_paths"
TOOLS: tuple[dict[str, Any], ...] = (
    {
        "name": HELD,
        "description": (
            "Which paths of this repository the other running jobs hold (claimed, or already changed) and what "
            "your own claim is. Other agents work in this repository at the same time: check before you edit a "
            "file outside your claim, and leave held files alone."
        ),
        "inputSchema": {"type": "object", "properties": {}, "additionalProperties": False},
        "annotations": {"readOnlyHint": True, "openWorldHint": False},
    },
    {
        "name": CLAIM,
        "description": (
            "Extend your claim to files (or directories, ending in /) you are about to write outside it, before "
            "you write them. Granted paths are yours until your work lands; a path another running job holds is "
            "refused with that job's id: do not write it, work on your own files first."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {
                "paths": {
                    "type": "array",
                    "items": {"type": "string"},
                    "minItems": 1,
                    "maxItems": MAX_PATHS,
                    "description": "Repository-relative paths, as in `src/app.py` or `docs/`.",
                }
            },
            "required": ["paths"],
            "additionalProperties": False,
        },
        "annotations": {"readOnlyHint": False, "idempotentHint": True, "openWorldHint": False},
    },
)

PARSE_ERROR, INVALID_REQUEST, NO_METHOD, INVALID_PARAMS = -32700, -32600, -32601, -32602


class DoorError(Exception):
    """The job's door could not be reached or refused the request; the message says which."""


Ask = Callable[[dict[str, Any]], dict[str, Any]]
"""Sends one request to the job's door and returns its answer (`Door.ask`)."""


@dataclass(frozen=True)
class Door:
    """The client side of a job's door: one request a connection, one JSON line each way."""

    path: Path
    token: str
    timeout: float = 30.0

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        try:
            with connect(self.path, self.timeout) as s:
                s.sendall(json.dumps({**request, "token": self.token}).encode() + b"\n")
                answer = read_line(s)
        except OSError as e:
            raise DoorError(f"the daemon's door for this job ({self.path}) cannot be reached: {e}") from None
        try:
            data = json.loads(answer)
        except ValueError:
            raise DoorError("the daemon's door answered something that is not JSON") from None
        if not isinstance(data, dict) or not data.get("ok"):
            raise DoorError(str(data.get("error") if isinstance(data, dict) else "no answer"))
        return data


def connect(path: Path, timeout: float) -> socket.socket:
    """A connection to the UNIX socket at `path`, however long the path (reached through its dir's descriptor)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        with _short(path) as short:
            s.connect(short)
    except BaseException:
        s.close()
        raise
    return s


def bind(path: Path) -> socket.socket:
    """A listening UNIX socket at `path` (any stale one there replaced), however long the path."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with _short(path) as short:
            with contextlib.suppress(FileNotFoundError):  # a stale socket of an earlier run
                os.unlink(short)
            s.bind(short)
        os.chmod(path, 0o600)
        s.listen(8)
    except BaseException:
        s.close()
        raise
    return s


class _short:
    """`path` as a name short enough for `sun_path`: `/proc/self/fd/N/NAME`, N a descriptor on its dir."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = -1

    def __enter__(self) -> str:
        self.fd = os.open(self.path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        return f"/proc/self/fd/{self.fd}/{self.path.name}"

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def read_line(s: socket.socket) -> bytes:
    """One newline-ended message from a socket (at most MAX_LINE bytes)."""
    buf = bytearray()
    while b"\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
        if len(buf) > MAX_LINE:
            raise OSError("message too long")
    return bytes(buf.split(b"\n", 1)[0])


# -- the protocol ---------------------------------------------------------------------------------------


def handle(message: Any, ask: Ask) -> dict[str, Any] | None:
    """The answer to one JSON-RPC message (None for a notification, which gets none)."""
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0" or not isinstance(message.get("method"), str):
        return _error(
            message.get("id") if isinstance(message, dict) else None, INVALID_REQUEST, "not a JSON-RPC 2.0 request"
        )
    method, params, mid = message["method"], message.get("params") or {}, message.get("id")
    if "id" not in message:
        return None  # a notification (notifications/initialized, cancelled): nothing to answer
    if not isinstance(params, dict):
        return _error(mid, INVALID_PARAMS, "params must be an object")
    if method == "initialize":
        asked = params.get("protocolVersion")
        version = asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0]
        info = {"name": NAME, "title": "orchestrator: the claims of the jobs beside yours", "version": _version()}
        return _result(mid, {"protocolVersion": version, "capabilities": {"tools": {}}, "serverInfo": info})
    if method == "ping":
        return _result(mid, {})
    if method == "tools/list":
        return _result(mid, {"tools": list(TOOLS)})
    if method == "tools/call":
        name, args = params.get("name"), params.get("arguments") or {}
        if name not in (HELD, CLAIM):
            return _error(mid, INVALID_PARAMS, f"unknown tool {name!r}: use {HELD} or {CLAIM}")
        if not isinstance(args, dict):
            return _error(mid, INVALID_PARAMS, "arguments must be an object")
        return _result(mid, _call(name, args, ask))
    return _error(mid, NO_METHOD, f"method {method!r} is not served here (tools only)")


def _call(name: str, args: Mapping[str, Any], ask: Ask) -> dict[str, Any]:
    try:
        if name == HELD:
            return _text(held_text(ask({"op": "held"})))
        paths = args.get("paths")
        if not isinstance(paths, list) or not paths or not all(isinstance(p, str) and p for p in paths):
            return _text('paths: give a list of repository-relative paths, as in ["src/app.py"]', error=True)
        if len(paths) > MAX_PATHS:
            return _text(f"paths: at most {MAX_PATHS} a call", error=True)
        return _text(claim_text(ask({"op": "claim", "paths": paths})))
    except DoorError as e:
        return _text(str(e), error=True)


def held_text(answer: Mapping[str, Any]) -> str:
    """What `held_paths` tells the agent: its claim, then each other running job and what it holds."""
    mine = [str(p) for p in answer.get("claim") or []]
    lines = [f"Your claim: {_shown(mine) if mine else 'nothing yet (claim what you write)'}."]
    others = answer.get("held") or []
    if not others:
        lines.append("No other running job holds any path of this repository now.")
    for o in others:
        paths = [str(p) for p in o.get("paths") or []]
        held = [p for p in paths if not claims.is_addition(p)]
        adds = [p for p in paths if claims.is_addition(p)]
        line = f"Job {o.get('job')} ({o.get('state')}) holds: {_shown(held) or 'nothing yet'}"
        if adds:  # another's new file meets no file of yours: only the directory itself is kept from you
            line += f"; and adds {_shown(adds)} (a new file of your own there is fine)"
        lines.append(line + ".")
    if others:
        lines.append("Do not write a held path: it is free once that job has landed.")
    return "\n".join(lines)


def _shown(paths: list[str]) -> str:
    """Claim paths as an agent reads them (`claims.describe`: `changelog.d/+` is a new file in changelog.d/)."""
    return ", ".join(map(claims.describe, paths))


def claim_text(answer: Mapping[str, Any]) -> str:
    """What `claim_paths` tells the agent: what is now in its claim, and what is refused and why."""
    granted, refused = answer.get("granted") or [], answer.get("refused") or []
    lines = []
    if granted:
        lines.append(f"Granted: {_shown(granted)} now in your claim.")
    if refused:
        lines.append(f"Refused: {_shown(refused)}: {answer.get('why') or 'held by another running job'}.")
    return "\n".join(lines) or "Nothing to claim: those paths are in your claim already."


def _text(text: str, *, error: bool = False) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": error}


def _result(mid: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": mid, "result": result}


def _error(mid: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": mid, "error": {"code": code, "message": message}}


def _version() -> str:
    from orchestrator import __version__

    return __version__


def serve(stdin: BinaryIO, stdout: BinaryIO, ask: Ask) -> None:
    """Answer newline-delimited JSON-RPC on `stdin` until it closes."""
    while line := stdin.readline(MAX_LINE + 1):
        if not line.strip():
            continue
        try:
            message = json.loads(line)
        except ValueError:
            answer: dict[str, Any] | None = _error(None, PARSE_ERROR, "not JSON")
        else:
            answer = handle(message, ask)
        if answer is not None:
            stdout.write(json.dumps(answer).encode() + b"\n")
            stdout.flush()


def main() -> int:
    """`orchestrator mcp`: serve the job's tools on stdin/stdout (its door from the environment)."""
    path, token = os.environ.get(ENV_DOOR), os.environ.get(ENV_TOKEN)
    if not path or not token:
        print(f"orchestrator mcp: {ENV_DOOR} and {ENV_TOKEN} are not set: an agent CLI run as a job has them in its "
              "MCP config; run it only there", file=sys.stderr)  # fmt: skip
        return 2
    serve(sys.stdin.buffer, sys.stdout.buffer, Door(Path(path), token).ask)
    return 0


# -- how a CLI is told --------------------------------------------------------------------------------


def command() -> list[str]:
    """How a CLI starts the server: this interpreter (the daemon's) running `orchestrator mcp`. A job starts it inside
    its sandbox, so that interpreter and the package it imports must be in a job's sight (`runners.mcp_sight`)."""
    return [sys.executable, "-m", "orchestrator", "mcp"]


def server_entry(door: Path, token: str) -> dict[str, Any]:
    """The server as a CLI's MCP config names it (`command`), told its door."""
    program, *args = command()
    return {"command": program, "args": args, "env": {ENV_DOOR: str(door), ENV_TOKEN: token}}


BEGIN, END = "# orchestrator: this job's MCP server\n", "# orchestrator: end\n"
"""The lines around the server's table in codex's config.toml (written again, not twice, by a run that goes on)."""


def wire(style: str, home: Path, door: Path, token: str) -> None:
    """Write the server into the CLI's config in the job's scratch `home`: `claude-code` (its user config and
    settings: the server, and its tools allowed), `codex` (`[mcp_servers]` in its config.toml). A home a run of
    the job wrote before is the job's: every file in it is opened beneath it, following no link."""
    entry = server_entry(door, token)
    with beneath.Root(home) as root:
        if style == "claude-code":
            _merge_json(root, (".claude.json",), {"mcpServers": {NAME: {"type": "stdio", **entry}}})
            _merge_json(root, (".claude", "settings.json"), {"permissions": {"allow": [f"mcp__{NAME}"]}})
        elif style == "codex":
            env = ", ".join(f"{k} = {json.dumps(v)}" for k, v in entry["env"].items())
            table = (
                f"{BEGIN}[mcp_servers.{NAME}]\ncommand = {json.dumps(entry['command'])}\n"
                f"args = {json.dumps(entry['args'])}\nenv = {{ {env} }}\n{END}"
            )
            old = _read(root, (".codex", "config.toml"))
            if BEGIN in old:  # the table of an earlier run of the job: replaced
                head, _, rest = old.partition(BEGIN)
                old = head + rest.partition(END)[2]
            _write(root, (".codex", "config.toml"), old.rstrip("\n") + ("\n\n" if old.strip() else "") + table)
        else:
            raise ValueError(f"unknown MCP wiring {style!r}: use claude-code or codex")


def _read(root: beneath.Root, names: tuple[str, ...]) -> str:
    try:
        fd = root.open(names, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return ""
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise beneath.Escape(f"{'/'.join(names)}: not a regular file")
        return f.read(MAX_LINE).decode(errors="replace")


def _write(root: beneath.Root, names: tuple[str, ...], text: str) -> None:
    os.close(root.makedirs(names[:-1]))
    fd = root.open(names, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK, 0o600)
    with os.fdopen(fd, "wb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise beneath.Escape(f"{'/'.join(names)}: not a regular file")
        f.truncate(0)
        f.write(text.encode())


def _merge_json(root: beneath.Root, names: tuple[str, ...], add: dict[str, Any]) -> None:
    """Add `add` into the JSON object of the file `names` (made when missing): objects merge, lists extend."""
    try:
        data = json.loads(_read(root, names) or "{}")
    except ValueError:
        data = {}
    if not isinstance(data, dict):
        data = {}

    def merge(into: dict[str, Any], more: Mapping[str, Any]) -> None:
        for k, v in more.items():
            if isinstance(v, Mapping) and isinstance(into.get(k), dict):
                merge(into[k], v)
            elif isinstance(v, list) and isinstance(into.get(k), list):
                into[k] = [*into[k], *(x for x in v if x not in into[k])]
            else:
                into[k] = v

    merge(data, add)
    _write(root, names, json.dumps(data, indent=2))
