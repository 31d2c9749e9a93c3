"""Install, remove and inspect the git hooks that queue work from commits.

The hooks are tiny POSIX sh scripts: they run a hook that was there before (moved aside to
`<hook>.orchestrator-chained`), then start the Python side (`service.hookrun`) in the background with
its I/O closed, so a commit is never failed and barely slowed. `core.hooksPath` set by another tool
(husky, pre-commit, ...) is left alone: `install` says which line to add to that tool's hook instead.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from orchestrator.git.landing import REFLOG
from orchestrator.service import tickets as tickets_mod

HOOKS = ("post-commit", "post-rewrite")
MARK = "# orchestrator-hook"
CHAINED = ".orchestrator-chained"


class HookError(RuntimeError):
    """The hooks cannot be installed or removed here; the message says what to do instead."""


def _q(value: str) -> str:
    return shlex.quote(value)


def run_line(hook: str, python: str) -> str:
    """The one line that runs our hook's Python side in the background (for another tool's hook file too)."""
    if hook == "post-rewrite":
        return (
            f'[ "$1" = rebase ] && t=$(mktemp "${{TMPDIR:-/tmp}}/orchestrator-rewrite.XXXXXX") && cat >"$t" && '
            f'( {_q(python)} -m orchestrator.service.hookrun post-rewrite rebase "$t" </dev/null >/dev/null 2>&1 & )'
        )
    # The commit: the newest entry of HEAD's reflog the daemon did not write (a landing may have moved the branch).
    not_ours = f'$2 != "{REFLOG.strip()}" {{print $1; exit}}'
    newest = f"git log -g -n 256 --format='%H %gs' HEAD 2>/dev/null | awk '{not_ours}'"
    return (
        f'( {_q(python)} -m orchestrator.service.hookrun post-commit "$({newest})" '
        '"$(git symbolic-ref -q --short HEAD)" </dev/null >/dev/null 2>&1 & )'
    )


def _ci(word: str) -> str:
    """A case-insensitive sh `case` pattern for `word` ("ab" → "[Aa][Bb]")."""
    return "".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else c for c in word)


def ticket_pattern(folder: str) -> str:
    """The sh `case` pattern, over a newline and `git log --name-only` output, of a changed ticket file."""
    folder = folder.strip("/")
    if not folder:
        return "*.md*"
    return f'*"$nl"{_q(folder + "/")}*.md*|*"$nl\\""{_q(folder + "/")}*.md*'  # a quoted name too


def script(hook: str, python: str, home: str | None = None, tickets: str = tickets_mod.DEFAULT_DIR) -> str:
    """The hook file: chain the hook that was there before, then queue in the background. POSIX sh.

    post-commit decides in sh, before any Python starts, whether the commit can queue anything (an
    `Orchestrator:` trailer or a changed file under the ticket folder `tickets`): a commit with no trailer
    line in the message git committed, in a repository without the ticket folder, costs no fork at all;
    otherwise one `git log` decides. It also notes a cherry-pick or revert under way, whose tickets the
    Python side does not queue (see `tickets.not_own`)."""
    env = f': "${{ORCHESTRATOR_HOME:={home}}}"; export ORCHESTRATOR_HOME\n' if home else ""
    head = f"""#!/bin/sh
{MARK} ({hook}): queues the work a commit names, in the background; never fails or slows the commit.
# Written by `orchestrator hook install`; `orchestrator hook uninstall` removes it and restores any hook
# it moved aside. ORCHESTRATOR_SKIP=1 skips it for one command.
chained="$0{CHAINED}"
py={_q(python)}
{env}"""
    if hook == "post-commit":
        return (
            head
            + f"""tickets={_q(tickets)}
rc=0
if [ -x "$chained" ]; then "$chained" "$@"; rc=$?; fi
[ "${{ORCHESTRATOR_SKIP:-}}" = 1 ] && exit $rc
# The git dir: .git, or where a linked worktree's .git file points (read here: no fork).
g=.git
if [ -f .git ] && read -r line <.git; then g=${{line#gitdir: }}; fi
# In a rebase, post-rewrite takes the finished result once.
[ -d "$g/rebase-merge" ] || [ -d "$g/rebase-apply" ] && exit $rc
# The branch HEAD names (a landing moves the branch, never what HEAD names).
branch=
if [ -f "$g/HEAD" ] && read -r h <"$g/HEAD"; then
  case $h in "ref: refs/heads/"*) branch=${{h#ref: refs/heads/}} ;; esac
fi
picked=
[ -f "$g/CHERRY_PICK_HEAD" ] || [ -f "$g/REVERT_HEAD" ] || [ -d "$g/sequencer" ] && picked=picked
# Most commits name nothing to queue: tell them apart without a single fork. git leaves the message it
# committed in COMMIT_EDITMSG (after commit-msg hooks; cleanup only removes lines): no trailer line there
# and no ticket folder in the work tree, nothing to do. A cherry-pick or revert is asked of git itself.
ask=$picked
if [ -z "$ask" ] && [ -f "$g/COMMIT_EDITMSG" ]; then
  while IFS= read -r line || [ -n "$line" ]; do
    case $line in {_ci("orchestrator")}:*|{_ci("orchestrator")}[[:space:]]*:*) ask=trailer; break ;; esac
  done <"$g/COMMIT_EDITMSG"
elif [ -z "$ask" ]; then
  ask=message
fi
[ -z "$ask" ] && [ -d {_q(tickets or ".")} ] && ask=tickets
[ -n "$ask" ] || exit $rc
# The commit that ran this hook: the newest entry of HEAD's reflog that the daemon did not write. Not the
# branch: a landing on the checked-out branch may have moved it since (even before a chained hook ended).
sha= nl='
' tab='	'
if [ -f "$g/logs/HEAD" ] && entries=$(tail -n 256 "$g/logs/HEAD" 2>/dev/null); then
  ifs=$IFS; IFS=$nl; set -f
  for line in $entries; do
    case ${{line#*"$tab"}} in {_q(REFLOG)}*) ;; *) x=${{line#* }}; sha=${{x%% *}} ;; esac
  done
  IFS=$ifs; set +f
fi
# Without a reflog (core.logAllRefUpdates off), HEAD as it is now.
[ -n "$sha" ] || sha=$(git rev-parse -q --verify HEAD) || exit $rc
command -v "$py" >/dev/null 2>&1 || exit $rc
# A trailer line in the message: the Python side reads the commit and logs what it did. Otherwise its files
# and message decide: only a changed ticket file or a trailer starts the Python side.
if [ "$ask" != trailer ] && out=$(git -c core.quotePath=false log -1 --root --no-show-signature --format=%B \\
  --name-only "$sha" -- 2>/dev/null); then
  case "$nl$out" in
    *"$nl"{_ci("orchestrator")}:*|*"$nl"{_ci("orchestrator")}[[:space:]]*:*|{ticket_pattern(tickets)}) ;;
    *) exit $rc ;;
  esac
fi
( "$py" -m orchestrator.service.hookrun post-commit "$sha" "$branch" $picked </dev/null >/dev/null 2>&1 & )
exit $rc
"""
        )
    return (
        head
        + """rc=0
# An amend was taken by post-commit; with no hook of its own to feed, there is nothing to do.
if [ "$1" != rebase ] && [ ! -x "$chained" ]; then cat >/dev/null; exit 0; fi
t=$(mktemp "${TMPDIR:-/tmp}/orchestrator-rewrite.XXXXXX") || t=
if [ -n "$t" ]; then cat >"$t"; else cat >/dev/null; fi
if [ -x "$chained" ]; then "$chained" "$@" <"${t:-/dev/null}"; rc=$?; fi
if [ -n "$t" ] && [ "$1" = rebase ] && [ "${ORCHESTRATOR_SKIP:-}" != 1 ] && command -v "$py" >/dev/null 2>&1; then
  ( "$py" -m orchestrator.service.hookrun post-rewrite rebase "$t" </dev/null >/dev/null 2>&1 & )
elif [ -n "$t" ]; then
  rm -f "$t"
fi
exit $rc
"""
    )


def _tickets_of(text: str) -> str | None:
    for line in text.splitlines():
        if line.startswith("tickets="):
            parts = shlex.split(line[8:])
            return parts[0] if parts else ""
    return None


@dataclass(frozen=True)
class HookState:
    hook: str
    path: str
    state: str
    """`installed`, `missing`, `foreign` (someone else's, not ours) or `elsewhere` (core.hooksPath)."""
    chained: bool
    python: str | None
    python_ok: bool
    detail: str

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=30)


def hooks_dir(repo: Path) -> tuple[Path, str | None]:
    """The repository's hooks folder, and `core.hooksPath` when another tool set it."""
    if _git(repo, "rev-parse", "--git-dir").returncode != 0:
        raise HookError(f"{repo} is not a git repository: pass --repo with the path of one")
    custom = _git(repo, "config", "--get", "core.hooksPath").stdout.strip() or None
    common = _git(repo, "rev-parse", "--path-format=absolute", "--git-common-dir").stdout.strip()
    return Path(common) / "hooks", custom


def _python_of(text: str) -> str | None:
    for line in text.splitlines():
        if line.startswith("py="):
            parts = shlex.split(line[3:])
            return parts[0] if parts else None
    return None


def _tool_advice(custom: str, python: str) -> str:
    tool = "husky" if "husky" in custom else "the tool that set it"
    lines = "\n".join(f"  {custom}/{h}:  {run_line(h, python)}" for h in HOOKS)
    return (
        f"core.hooksPath is {custom!r} (set by {tool}); not changing it. Add these lines to its hooks instead:\n{lines}"
    )


def status(repo: Path) -> list[HookState]:
    folder, custom = hooks_dir(repo)
    out = []
    for hook in HOOKS:
        path = folder / hook
        if custom:
            out.append(HookState(hook, str(path), "elsewhere", False, None, False, f"core.hooksPath is {custom!r}"))
            continue
        chained = (folder / (hook + CHAINED)).exists()
        if not path.exists():
            out.append(HookState(hook, str(path), "missing", chained, None, False, "run `orchestrator hook install`"))
            continue
        text = path.read_text(errors="replace")
        if MARK not in text:
            out.append(HookState(hook, str(path), "foreign", False, None, False, "another hook; install chains it"))
            continue
        py = _python_of(text)
        ok = bool(py) and os.access(py or "", os.X_OK)
        detail = "ok" if ok else f"its Python {py} is gone: run `orchestrator hook install` again"
        baked = _tickets_of(text)
        if ok and hook == "post-commit" and baked is not None and baked != (wanted := configured_tickets(repo)):
            ok, detail = False, f"it looks for tickets in {baked!r}, the config says {wanted!r}: run `hook install`"
        elif ok and hook == "post-commit" and not reflog_on(repo):
            ok, detail = False, REFLOG_OFF
        out.append(HookState(hook, str(path), "installed", chained, py, ok, detail))
    return out


REFLOG_OFF = (
    "HEAD's reflog is off (core.logAllRefUpdates false): a landing between a commit and its hook can hide the "
    "commit from the hook; `git config core.logAllRefUpdates true` turns it on"
)


def reflog_on(repo: Path) -> bool:
    """HEAD's reflog is kept, where the hook finds the commit that ran it (git's default outside bare repos)."""
    return _git(repo, "config", "--bool", "--get", "core.logAllRefUpdates").stdout.strip() != "false"


def configured_tickets(repo: Path) -> str:
    """The repository's ticket folder: `git config orchestrator.tickets`, default `.orchestrator/tickets`."""
    return _git(repo, "config", "--get", "orchestrator.tickets").stdout.strip() or tickets_mod.DEFAULT_DIR


def install(repo: Path, python: str | None = None, home: str | None = None, tickets: str | None = None) -> list[str]:
    """Write our hooks; a hook already there is moved aside and still run. Returns what was done.

    `tickets` (default: the repository's `orchestrator.tickets`) is stored in git config and written into
    the post-commit hook, which tells a ticket commit from others without starting Python."""
    python = python or os.path.abspath(sys.executable)
    folder, custom = hooks_dir(repo)
    if custom:
        raise HookError(_tool_advice(custom, python))
    if tickets is not None:
        _git(repo, "config", "orchestrator.tickets", tickets).check_returncode()
    tickets = configured_tickets(repo)
    folder.mkdir(parents=True, exist_ok=True)
    done = []
    for hook in HOOKS:
        path = folder / hook
        aside = folder / (hook + CHAINED)
        if path.exists() and MARK not in path.read_text(errors="replace"):
            if aside.exists():
                raise HookError(f"{path} is not ours and {aside} already exists: move one of them away first")
            path.rename(aside)
            done.append(f"{hook}: moved the existing hook to {aside.name}; it still runs first")
        tmp = path.with_name(f".{hook}.orchestrator-tmp")
        tmp.write_text(script(hook, python, home, tickets))
        tmp.chmod(0o755)
        tmp.replace(path)
        done.append(f"{hook}: installed ({path})")
    if not reflog_on(repo):
        done.append(f"warning: {REFLOG_OFF}")
    return done


def uninstall(repo: Path) -> list[str]:
    """Remove our hooks and put back the ones install moved aside; someone else's hook is left alone."""
    folder, custom = hooks_dir(repo)
    if custom:
        raise HookError(f"core.hooksPath is {custom!r}: remove the orchestrator lines from that tool's hooks")
    done = []
    for hook in HOOKS:
        path = folder / hook
        aside = folder / (hook + CHAINED)
        if path.exists() and MARK not in path.read_text(errors="replace"):
            done.append(f"{hook}: not ours, left alone")
            continue
        if path.exists():
            path.unlink()
            done.append(f"{hook}: removed")
        if aside.exists():
            aside.rename(path)
            done.append(f"{hook}: restored the hook that was there before")
    return done


if __name__ == "__main__":  # the repository's generic copies: python -m orchestrator.service.hooks hooks/
    for _hook in HOOKS:
        _path = Path(sys.argv[1]) / _hook
        _path.write_text(script(_hook, "python3"))
        _path.chmod(0o755)
