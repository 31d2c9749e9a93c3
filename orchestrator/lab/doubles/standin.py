"""A stand-in of the Claude Messages API a person can run: a first agent job without an account or a key.

`orchestrator stand-in` serves the Messages API double (`lab.doubles.anthropic`) on a fixed port with a scripted
"model" that does one thing the way a coding agent does it: asked a task in Claude Code's main loop (a request that
offers tools), it writes the file the task names (the task's first relative path, else `STAND-IN.md`) holding the
task's first line, through Claude Code's own `Write` tool, then says it is done. Claude Code's side calls (titles,
summaries: no tools offered) get a short text. The daemon's own pre-plan (a request that offers `submit_plan`)
gets a plan naming that same file, so a job in words is planned as a real model would plan it. Point the daemon
at it with `ANTHROPIC_BASE_URL`; the job runs the real CLI, under the real sandbox, and lands like any other.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from orchestrator.lab.doubles.anthropic import Reply, text_message, tool_use_message
from orchestrator.lab.doubles.script import messages_of, system_text, text_of

KEY = "sk-ant-stand-in"
"""The API key to give Claude Code (any key works; this one says what it is)."""
FALLBACK_FILE = "STAND-IN.md"
_WORKDIR = re.compile(r"(?:Primary working directory|Working directory|cwd)\s*:\s*(\S+)", re.IGNORECASE)
_REMINDERS = re.compile(r"<system-reminder>.*?</system-reminder>", re.DOTALL)
_PATH = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.[A-Za-z0-9]+)(?![\w/])")
_TICKET = re.compile(r"^Ticket:\n(.*?)(?:\n\n|\Z)", re.DOTALL)
PLAN_TOOL = "submit_plan"


def target(task: str) -> str:
    """The file the scripted model writes for `task`: the first relative path it names, else `STAND-IN.md`."""
    found = _PATH.search(task)
    return found.group(1) if found else FALLBACK_FILE


def script(say: Callable[[str], None] = lambda _line: None) -> Callable[[dict[str, Any]], Reply]:
    """The stand-in's model: turn 0 of a task writes its file, turn 1 says done; side calls get a short text.
    `say` hears one line per answer (what the stand-in prints)."""

    def answer(body: dict[str, Any]) -> Reply:
        msgs = messages_of(body)
        users = [text_of(m.get("content")) for m in msgs if m.get("role") == "user"]
        if not body.get("tools") or not users:
            return text_message("ok")
        if any(t.get("name") == PLAN_TOOL for t in body["tools"] if isinstance(t, dict)):
            found = _TICKET.search(users[0])
            name = target(found.group(1) if found else users[0])
            say(f"stand-in: plan: {name}")
            return tool_use_message(PLAN_TOOL, {"paths": [name], "confidence": 0.9, "plan": f"1. Write {name}."})
        task = _REMINDERS.sub("", users[0]).strip()  # Claude Code puts its context before the task
        first = task.splitlines()[0] if task else "a task"
        step = sum(1 for m in msgs if m.get("role") == "assistant")
        name = target(task)
        if step == 0:
            match = _WORKDIR.search(system_text(body) + "\n" + task)
            where = f"{match.group(1).rstrip('/')}/{name}" if match else name
            say(f"stand-in: {first[:60]!r}: writing {name}")
            return tool_use_message("Write", {"file_path": where, "content": f"{first}\n"})
        say(f"stand-in: {first[:60]!r}: done")
        return text_message(f"Wrote {name}.")

    return answer
