"""`orchestrator service install | uninstall | status`: the daemon as a systemd user service.

Everything here shells out to `systemctl --user` and `loginctl`; where there is no systemd user
manager (containers, CI, a login without one) it says so and fails instead of pretending.
"""

from __future__ import annotations

import getpass
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator import paths
from orchestrator.service import unit

SERVICE = "orchestrator"


class ServiceError(RuntimeError):
    """The service cannot be installed or read here; the message says why and what to do."""


@dataclass
class Report:
    """What a service command did, for people (`lines`) and for `--json` (`data`)."""

    ok: bool = True
    lines: list[str] = field(default_factory=list)
    data: dict[str, object] = field(default_factory=dict)


def run_tool(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(list(args), 124, "", f"{args[0]} did not answer in {timeout:.0f} s")
    except FileNotFoundError:
        return subprocess.CompletedProcess(list(args), 127, "", f"{args[0]} is not installed")


def systemctl(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return run_tool("systemctl", "--user", *args, timeout=timeout)


def no_user_manager() -> str | None:
    """Why there is no systemd user manager to talk to, or None when there is one."""
    if shutil.which("systemctl") is None:
        return "systemctl is not installed (no systemd on this machine)"
    out = systemctl("show-environment", timeout=10)
    if out.returncode != 0:
        why = (out.stderr or out.stdout).strip().splitlines()
        return f"no systemd user manager answers ({why[-1] if why else 'exit ' + str(out.returncode)})"
    return None


NO_MANAGER_ADVICE = (
    "containers and CI usually have none. Run `orchestrator daemon` under the supervisor you have, "
    "or print the unit with `orchestrator service install --dry-run`."
)


def unit_text(env: dict[str, str] | None = None) -> str:
    """The unit for this installation: this interpreter, its bin folder first on PATH, ORCHESTRATOR_HOME if set."""
    env = dict(os.environ) if env is None else env
    extra = {"ORCHESTRATOR_HOME": env["ORCHESTRATOR_HOME"]} if env.get("ORCHESTRATOR_HOME") else {}
    # With ORCHESTRATOR_HOME the config dir, and the env file in it, are under that home.
    env_path = str(unit.env_file(env)).replace("%", "%%") if extra else "%E/orchestrator/env"
    return unit.render(
        unit.entry_point(), environment=extra, extra_path=[os.path.dirname(unit.entry_point()[0])], env_path=env_path
    )


def unit_path() -> Path:
    return unit.unit_dir() / unit.NAME


def _importable_from_anywhere() -> str | None:
    """systemd starts us in another folder: the package must import from there, not only from a checkout."""
    out = run_tool(*unit.entry_point(), "--version", timeout=60)
    if out.returncode != 0:
        return (out.stderr or out.stdout).strip()[-300:] or f"exit {out.returncode}"
    return None


def _write(path: Path, text: str) -> None:
    """The unit file, 0600 in dirs made 0700 whatever the umask: whoever can change it runs as you."""
    tmp = path.with_name(f".{path.name}.tmp")
    with os.fdopen(paths.open_private(tmp, os.O_WRONLY | os.O_TRUNC), "w") as f:
        f.write(text)
    tmp.replace(path)


def linger() -> tuple[bool, str]:
    """Whether the user manager outlives logout (and starts at boot); tries to turn it on when off."""
    user = getpass.getuser()
    out = run_tool("loginctl", "show-user", user, "--property=Linger", "--value", timeout=10)
    if out.stdout.strip() == "yes":
        return True, "linger is on: the service starts at boot and outlives your logout"
    tried = run_tool("loginctl", "enable-linger", user, timeout=30)
    if tried.returncode == 0:
        return True, "turned linger on: the service starts at boot and outlives your logout"
    return False, (
        "linger is off: the service stops when you log out. To keep it running, run: "
        f"sudo loginctl enable-linger {user}"
    )


def install(dry_run: bool = False) -> Report:
    text = unit_text()
    target = unit_path()
    if dry_run:
        return Report(lines=[f"would write {target}"], data={"unit": text, "path": str(target), "dry_run": True})
    if why := _importable_from_anywhere():
        raise ServiceError(
            f"{' '.join(unit.entry_point())} does not start outside this folder ({why}); "
            "install the package (pip install . or pipx install .) and run this again"
        )
    if why := no_user_manager():
        raise ServiceError(f"cannot install the service: {why}; {NO_MANAGER_ADVICE}")
    report = Report(data={"path": str(target)})
    _write(target, text)
    report.lines.append(f"wrote {target}")
    was_active = systemctl("is-active", SERVICE).stdout.strip() == "active"
    for args in (("daemon-reload",), ("enable", SERVICE), ("restart" if was_active else "start", SERVICE)):
        # Type=notify: start returns only once the daemon said READY=1 (socket listening, recovery done).
        out = systemctl(*args, timeout=120)
        if out.returncode != 0:
            raise ServiceError(
                f"systemctl --user {' '.join(args)} failed: {(out.stderr or out.stdout).strip()}\n"
                f"see: journalctl --user -u {SERVICE} -n 50 -o cat"
            )
    report.lines.append(f"enabled and {'restarted' if was_active else 'started'} {unit.NAME}; it is ready")
    ok, msg = linger()
    report.lines.append(msg)
    report.data.update({"active": True, "linger": ok})
    return report


def uninstall() -> Report:
    target = unit_path()
    report = Report(data={"path": str(target)})
    if why := no_user_manager():
        if target.exists():
            target.unlink()
            report.lines.append(f"removed {target} ({why})")
        else:
            report.lines.append(f"nothing to remove ({why})")
        return report
    out = systemctl("disable", "--now", SERVICE, timeout=120)
    report.lines.append("stopped and disabled" if out.returncode == 0 else f"disable: {out.stderr.strip()}")
    if target.exists():
        target.unlink()
        report.lines.append(f"removed {target}")
    systemctl("daemon-reload")
    return report


def status() -> Report:
    target = unit_path()
    report = Report(data={"path": str(target), "installed": target.exists()})
    report.lines.append(f"unit: {target} ({'present' if target.exists() else 'not installed'})")
    if why := no_user_manager():
        report.ok = False
        report.lines.append(f"service: unknown, {why}")
        report.data["manager"] = why
        return report
    props = "ActiveState,SubState,StatusText,MainPID,NRestarts,Result"
    out = systemctl("show", SERVICE, f"--property={props}")
    state = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    report.data.update(state)
    report.ok = state.get("ActiveState") == "active"
    report.lines.append(
        f"service: {state.get('ActiveState', '?')} ({state.get('SubState', '?')}), "
        f"pid {state.get('MainPID', '?')}, {state.get('NRestarts', '0')} restarts"
    )
    if state.get("StatusText"):
        report.lines.append(f"status: {state['StatusText']}")
    report.lines.append(f"socket: {paths.resolve().socket}")
    return report
