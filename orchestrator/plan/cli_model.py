"""The model source through an agent CLI the user already has (`plan.planner = "cli"`): its read-only plan mode.

Many users of Claude Code have a subscription and no API key. A runner profile may name a read-only plan
command (`plan_argv`: Claude Code's `--permission-mode plan --output-format json`); this planner gives it the
same prompt the other model planners get (`plan.prompt`: the ticket, the relevant snippets, the ranked file
list at the base) and asks for the paths as JSON, under the same deadline and fallbacks (the composite's):
a CLI that is missing, fails, is out of its usage or answers without a usable plan gives way to local
evidence with the reason logged.

The CLI runs in the repository's directory (it reads the code there), with a scratch HOME holding only the
profile's sign-in files, the profile's environment, and under bubblewrap when the daemon has it: the whole
file system read-only but that HOME.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.config import Config, RunnerTemplate
from orchestrator.core.job import Job
from orchestrator.plan.base import Note, Plan
from orchestrator.plan.composite import MODELS, ModelUnusable
from orchestrator.plan.prompt import model_plan, parse_input, user_message
from orchestrator.proc import process
from orchestrator.runners.command import claude_result, expand
from orchestrator.store import Store

INSTRUCTION = (
    "You are planning, not doing: do not change any file. Name every file of this repository the job will "
    'create, change or delete. Answer with one JSON object only: {"paths": ["repo/relative/path", ...], '
    '"confidence": 0..1, "plan": "a few sentences"}.'
)
_OBJECT = re.compile(r"\{.*\}", re.S)


def answer_of(text: str) -> dict[str, Any]:
    """The plan object in the CLI's final answer: the text itself, a fenced block, or the outermost `{...}`."""
    for candidate in (text.strip(), *re.findall(r"```(?:json)?\s*(.*?)```", text, re.S), *_OBJECT.findall(text)):
        try:
            data = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(data, dict):
            return data
    raise ModelUnusable(Note.MODEL_MALFORMED, "the CLI's plan held no JSON object")


def confinement(bwrap: str | None, repo: Path, home: Path) -> list[str]:
    """bwrap's prefix for a read-only look at `repo`: everything read-only but the scratch HOME."""
    if bwrap is None:
        return []
    return [
        bwrap, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc",
        "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--bind", str(home), str(home),
        "--chdir", str(repo), "--",
    ]  # fmt: skip


class CliPlanner:
    """A runner profile's read-only plan command as a model planner."""

    def __init__(
        self,
        runner: str,
        template: RunnerTemplate,
        budget_tokens: int,
        counts: Callable[[str], dict[str, int]] | None,
        confine: bool,
    ) -> None:
        self.name = f"cli:{runner}"
        self.runner = runner
        self.template = template
        self.budget_tokens = budget_tokens
        self.counts = counts
        self.bwrap: str | bool | None = confine
        """True until probed; then bwrap's path, or None (no sandbox here, or none asked for)."""

    async def plan(self, job: Job, base: str, local: Plan | None = None) -> Plan:
        content = await user_message(job, base, local, self.budget_tokens, self.counts)
        prompt = f"{content}\n\n{INSTRUCTION}"
        scratch = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="orchestrator-plan-"))
        try:
            home = scratch / "home"
            await asyncio.to_thread(_copy_home, home, self.template.home_files)
            log = scratch / "output.log"
            values = {"prompt": prompt, "plan": "", "worktree": job.repo, "job_id": str(job.id)}
            extra = {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), "TMPDIR": str(home)}
            extra.update({k: expand((v,), values)[0] for k, v in self.template.env.items()})
            result = await process.run(
                expand(self.template.plan_argv, values, []),
                prefix=confinement(await self._sandbox(), Path(job.repo), home),
                cwd=Path(job.repo),
                env=process.environment(self.template.pass_env, extra),
                timeout=self.template.timeout or 3600.0,  # the planner's deadline cuts it short first
                log_path=log,
                what=f"plan of job {job.id} by {self.runner}",
            )
            output = await asyncio.to_thread(_read, log)
        finally:
            await asyncio.to_thread(shutil.rmtree, scratch, True)
        if not result.ok:
            tail = " ".join(result.output_tail.split())[-300:]
            raise ModelUnusable(Note.MODEL_UNAVAILABLE, f"{self.runner}'s plan command {result.status}: {tail}")
        text = output
        if self.template.output == "claude-json":
            found = claude_result(output)
            if found is None:
                raise ModelUnusable(Note.MODEL_MALFORMED, f"{self.runner} gave no JSON result")
            if found.get("is_error"):
                raise ModelUnusable(Note.MODEL_UNAVAILABLE, f"{self.runner}: {str(found.get('result', ''))[:300]}")
            text = str(found.get("result") or "")
        return model_plan(parse_input(answer_of(text)), self.runner)

    async def _sandbox(self) -> str | None:
        """bwrap's path when it works here (probed once, off the event loop)."""
        if self.bwrap is True:
            from orchestrator.proc import sandbox

            found = shutil.which("bwrap")
            ok = found is not None and await asyncio.to_thread(sandbox.probe, found) is None
            self.bwrap = found if ok else None
        return self.bwrap if isinstance(self.bwrap, str) else None


def _copy_home(home: Path, files: tuple[str, ...]) -> None:
    real = Path(os.environ.get("HOME") or Path.home())
    home.mkdir(mode=0o700)
    for rel in files:
        src, dst = real / rel, home / rel
        if src.is_file() and not src.is_symlink():
            dst.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            shutil.copy2(src, dst)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _factory(
    cfg: Config,
    store: Store | None,
    counts: Callable[[str], dict[str, int]],
    gates: dict[str, Any],
    claude: object = None,
) -> CliPlanner | None:
    template = cfg.runners.get(cfg.plan.cli)
    if template is None or not template.plan_argv:
        return None
    return CliPlanner(cfg.plan.cli, template, cfg.plan.prompt_tokens, counts, cfg.jobs.sandbox != "none")


MODELS["cli"] = _factory

__all__ = ["CliPlanner", "answer_of"]
