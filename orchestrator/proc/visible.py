"""Whether a job can start a command: found on the job's PATH from inside its sandbox, interpreter and all.

The daemon may find a CLI that a job cannot: bubblewrap shows a job `/tmp`, `/run/user`, `/dev/shm`,
`$XDG_RUNTIME_DIR` and the daemon's own dirs empty, so a CLI installed under a HOME inside `/tmp` (or a script
whose interpreter lives there) fails in a job with nothing but `bwrap: execvp NAME: No such file or directory`.
`look` asks from inside the sandbox, the way a job's command starts, and `Sight.problem` says where the command
is and what to do when a job cannot run it. `orchestrator runners`, `doctor` and a command runner (before it
starts its CLI) all ask here.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.proc import jobpath
from orchestrator.proc.sandbox import Sandbox, detect, emptied, mode_for

# Run by /bin/sh inside the sandbox with the command's name as $1. Prints the path found (and the interpreter a
# script names); exit 3: not on PATH, 4: not executable, 5: its interpreter cannot be found.
_SCRIPT = r"""
p=$(command -v "$1") || exit 3
case $p in /*) ;; *) echo "$p"; exit 0 ;; esac
echo "$p"
[ -x "$p" ] || exit 4
first=$(head -c 256 "$p" 2>/dev/null | head -n 1)
case $first in
  '#!'*)
    set -f
    set -- ${first#??}
    i=${1:-}
    if [ "${i##*/}" = env ]; then
      shift
      while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
      i=${1:-}
      [ -n "$i" ] && { command -v "$i" >/dev/null 2>&1 || { echo "$i"; exit 5; }; }
    elif [ -n "$i" ] && [ ! -x "$i" ]; then
      echo "$i"; exit 5
    fi ;;
esac
exit 0
"""
NOT_FOUND, NOT_EXECUTABLE, NO_INTERPRETER = 3, 4, 5


@dataclass(frozen=True, slots=True)
class Sight:
    """What a job would find for `command`, and why it cannot run it (`problem`: None when it can)."""

    command: str
    inside: str | None
    """The path a job's shell finds (None: none); inside the sandbox when there is one."""
    outside: str | None
    """The path the same PATH finds outside the sandbox (where the daemon, or you, would find it)."""
    problem: str | None

    @property
    def ok(self) -> bool:
        return self.problem is None


def look(box: Sandbox, command: str, path: str, timeout: float = 10.0) -> Sight:
    """Where a job whose PATH is `path` finds `command`, asked as a job's command starts (sync: call in a thread)."""
    outside = shutil.which(command, path=path) if "/" not in command else command
    with tempfile.TemporaryDirectory(prefix="orchestrator-look-") as tmp:
        argv = [*box.confine(Path(tmp), tmp=Path(tmp)), "/bin/sh", "-c", _SCRIPT, "sh", command]
        env = {"PATH": path, "HOME": os.environ.get("HOME", "/"), "LANG": "C"}
        try:
            out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout,
                                 stdin=subprocess.DEVNULL)  # fmt: skip
        except (OSError, subprocess.SubprocessError) as e:
            return Sight(command, None, outside, f"{command}: could not look for it as a job would ({e})")
    said = out.stdout.splitlines()
    found = said[0] if said else None
    if out.returncode == 0:
        return Sight(command, found, outside, None)
    if out.returncode not in (NOT_FOUND, NOT_EXECUTABLE, NO_INTERPRETER):
        why = (out.stderr.strip() or f"exit {out.returncode}")[:300]
        return Sight(command, None, outside, f"{command}: could not look for it as a job would: {why}")
    missing = said[1] if out.returncode == NO_INTERPRETER and len(said) > 1 else None
    if missing and "/" not in missing:  # `#!/usr/bin/env NAME`: where NAME is outside
        missing = shutil.which(missing, path=path) or missing
    return Sight(command, found, outside, explain(command, out.returncode, found, outside, missing, emptied(box)))


def starts(
    box: Sandbox, argv: Sequence[str], env: Mapping[str, str], *, scratch_home: bool = False, timeout: float = 30.0
) -> str | None:
    """Why a job whose environment is `env` cannot run `argv` to exit 0 (None: it can): its program looked for as
    `look` does, then run inside the sandbox as a job's command is. `scratch_home`: HOME is an empty dir of the
    job's own, as a runner with a scratch HOME gives it (what your HOME holds is then out of its reach). Sync: call
    in a thread."""
    sight = look(box, argv[0], env.get("PATH", ""), timeout)
    if sight.problem is not None:
        return sight.problem
    with tempfile.TemporaryDirectory(prefix="orchestrator-look-") as tmp:
        home = {"HOME": tmp, "XDG_CONFIG_HOME": f"{tmp}/.config"} if scratch_home else {}
        try:
            out = subprocess.run(
                [*box.confine(Path(tmp), tmp=Path(tmp)), *argv],
                env={**env, "TMPDIR": tmp, **home},
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
                cwd=tmp,
            )
        except (OSError, subprocess.SubprocessError) as e:
            return f"{shlex.join(argv)}: could not run it as a job would ({e})"
    if out.returncode == 0:
        return None
    said = (out.stderr.strip() or out.stdout.strip()).splitlines()
    return f"{shlex.join(argv)} fails in a job (exit {out.returncode}): {said[-1][:300] if said else 'it said nothing'}"


def hidden_in(path: str | Path, box: Sandbox) -> Path | None:
    """The dir a job sees empty (`sandbox.emptied`) that holds `path` (or what it links to), or None."""
    empty = emptied(box)
    return _dir_of(os.path.realpath(path), empty) or _dir_of(str(path), empty)


def commands(named: dict[str, str], mode: str, team: bool, hide: tuple[Path, ...]) -> dict[str, Sight]:
    """Each named command as a job started now would find it: the sandbox of `mode` (probed), a job's PATH (the
    login shell asked). For `orchestrator runners` and `doctor`, which run outside the daemon (sync)."""
    box = detect(mode_for(mode, team), hide)
    path = jobpath.learn(quiet=True)
    return {name: look(box, command, path) for name, command in named.items()}


def explain(
    command: str, code: int, inside: str | None, outside: str | None, interpreter: str | None, empty: list[Path]
) -> str:
    """Why a job cannot start `command`, naming the path and the fix. Pure (reads no file but `outside`'s links)."""
    if code == NOT_EXECUTABLE:
        return f"{command} is {inside}, which is not executable: chmod +x {inside}"
    if code == NO_INTERPRETER:
        real = os.path.realpath(interpreter) if interpreter and "/" in interpreter else interpreter or "?"
        where = _dir_of(real, empty) or _dir_of(interpreter or "", empty)
        if where is None:
            return f"{command} is {inside}, whose interpreter {interpreter} a job cannot find: install it"
        return (
            f"{command} is {inside}, whose interpreter {interpreter} a job cannot see: {where} is empty inside a "
            f"job's sandbox. Install it with an interpreter outside {where}{_or_unconfined(where)}"
        )
    if outside is None:
        return (
            f"{command} is not on a job's PATH (your login shell's PATH, then the daemon's): install it, or put its "
            "directory on your login shell's PATH"
        )
    real = os.path.realpath(outside)
    shown = outside if real == outside else f"{outside} (→ {real})"
    shown = shown if outside == command else f"{command} is {shown}"  # a command named by its path: said once
    where = _dir_of(real, empty) or _dir_of(outside, empty)
    if where is None:
        return f"{shown}, which a job cannot see from inside its sandbox"
    return (
        f"{shown}, which a job cannot see: {where} is empty inside a job's sandbox. Install it outside "
        f"{where} (a job sees the rest of the file system, read-only){_or_unconfined(where)}"
    )


def _dir_of(path: str, empty: list[Path]) -> Path | None:
    """The emptied dir that holds `path`, if any."""
    p = Path(path)
    return next((d for d in empty if p == d or p.is_relative_to(d)), None)


def _or_unconfined(where: Path | None) -> str:
    home = os.environ.get("HOME", "")
    mine = bool(where and home and Path(home).is_relative_to(where))
    why = f". Your HOME ({home}) is under {where}: what is installed into it is out of a job's sight" if mine else ""
    return f', or set jobs.sandbox = "none" to run jobs unconfined{why}'
