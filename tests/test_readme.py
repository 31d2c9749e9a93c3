"""The README and docs/ tell the truth about the code: short, every command they show exists, every link lands."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from orchestrator.cli import main

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINKED = [*PAGES, ROOT / "hooks/README.md", ROOT / "bench/README.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")
# `orchestrator VERB [WORD]` in a code block or inline code: VERB must be a command, and WORD, after a group
# (which takes no argument of its own), one of its subcommands.
COMMAND = re.compile(r"(?:^|[\s`(])orchestrator ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    out, fence = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and (m := re.match(r"#{1,6} (.*)", line)):
            out.add(slug(m.group(1)))
    return out


def shown_commands(page: Path) -> set[tuple[str, str | None]]:
    """Every `orchestrator VERB [WORD]` the page shows in code (fenced blocks and inline code)."""
    text = page.read_text()
    code = re.findall(r"```.*?```", text, flags=re.S) + re.findall(r"`[^`\n]+`", text)
    return {(m.group(1), m.group(2)) for chunk in code for m in COMMAND.finditer(chunk)}


def test_readme_is_short() -> None:
    """The README is an entrance a newcomer reads in minutes: at most 250 lines, the rest in docs/."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail into docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_shown_exists(page: Path) -> None:
    """Each `orchestrator VERB` the page shows is a real command, and `VERB SUB` a real subcommand of a group."""
    ctx = click.Context(main)
    assert shown_commands(ROOT / "README.md"), "the README shows no command: the pattern is wrong"
    for verb, sub in sorted(shown_commands(page), key=str):
        cmd = main.get_command(ctx, verb)
        assert cmd is not None, f"{page.name} shows `orchestrator {verb}`, which is no command"
        if isinstance(cmd, click.Group) and sub is not None:
            assert cmd.get_command(ctx, sub) is not None, (
                f"{page.name} shows `orchestrator {verb} {sub}`, which is no subcommand of {verb}"
            )


@pytest.mark.parametrize("page", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_lands(page: Path) -> None:
    """Each relative link names a file of the repository, and a `#part` names a heading of that page."""
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists() and dest.is_relative_to(ROOT), f"{page.name}: link {target} names no file here"
        if anchor and dest.suffix == ".md":
            assert anchor in anchors(dest), f"{page.name}: link {target}: no heading #{anchor} in {dest.name}"


def test_every_docs_page_is_linked_from_the_readme() -> None:
    """A docs/ page no one can reach from the README is lost."""
    linked = {Path(t.partition("#")[0]).name for t in LINK.findall((ROOT / "README.md").read_text())}
    assert {p.name for p in PAGES[1:]} <= linked


def test_the_readme_test_command_is_what_ci_runs() -> None:
    """The README's test command and the second quick-start command (`.ci/run`) agree."""
    readme, ci = (ROOT / "README.md").read_text(), (ROOT / ".ci/run").read_text()
    assert "bash .ci/run" in readme and "`python -m pytest -q`" in readme
    assert re.search(r"-m pytest -q\b", ci)


def _dotted_names() -> set[tuple[str, str]]:
    """(file, `orchestrator.x.y`) for every dotted name in backticks in the docs and the package's own text."""
    files = [*PAGES, ROOT / "bench/README.md", *sorted((ROOT / "orchestrator").rglob("*.py"))]
    found = set()
    for f in files:
        for name in re.findall(r"`(orchestrator(?:\.[A-Za-z_][A-Za-z0-9_]*)+)", f.read_text()):
            found.add((str(f.relative_to(ROOT)), name))
    return found


def test_every_module_the_text_points_to_exists() -> None:
    """A `orchestrator.x.y` pointer in a docstring or a page names a real module (or a name in one)."""
    import importlib

    rooms = {p.stem for p in (ROOT / "orchestrator").iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    broken = []
    for where, name in sorted(_dotted_names()):
        parts = name.split(".")
        if parts[1] not in rooms:
            continue  # a file or event name that starts with the word (orchestrator.sock, orchestrator.gate...)
        for cut in range(len(parts), 1, -1):
            try:
                obj: object = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            for attr in parts[cut:]:
                obj = getattr(obj, attr, None)
            if obj is None:
                broken.append(f"{where}: {name}")
            break
        else:
            broken.append(f"{where}: {name}")
    assert broken == []
