"""What a person sees in a real terminal (tmux, 80 and 120 columns): nothing a job wrote drives the terminal, every
view fits its width, and a job in review that holds back other work is named with the command to review it."""

from __future__ import annotations

import shutil
import sys

import pytest

from tests.terminal import BEGIN, Terminal
from tests.test_e2e_jobs import until, wait_for_file

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (.ci/run installs it)")

ESC, BEL = "\x1b", "\x07"
CLIPBOARD = f"{ESC}]52;c;cm0gLXJmIH4K{BEL}"  # OSC 52: put "rm -rf ~\n" on the reader's clipboard
TITLE = f"{ESC}]0;PWNED{BEL}"  # OSC 0: set the window title
CLEAR = f"{ESC}[2J"  # clear the screen
FORGED = "state        landed"  # a line of `show`, forged by a newline in a file name
WIDTHS = (80, 120)


def hostile(gate: str) -> str:
    """A job whose text, file names and output all carry escape sequences, and a file name with a newline."""
    names = f'"$(printf "osc{CLIPBOARD}.txt")" "$(printf "name\\n{FORGED}")"'
    return (
        f": '{TITLE}{CLEAR}{CLIPBOARD}'; touch {names}; printf '{TITLE}{CLEAR}{CLIPBOARD}said\\n'; "
        f"echo x > src/a.py; {gate}"
    )


def fits(shot: str, width: int) -> list[str]:
    """The lines of a screen (joined where the terminal wrapped them) wider than `width`."""
    return [line for line in shot.splitlines() if len(line.rstrip()) > width]


def job_rows(shot: str) -> dict[int, str]:
    """The job lines of a screen by job id (the watch marks the selected one with `›`)."""
    words = [(ln.replace("›", " ").split(), ln) for ln in shot.splitlines()]
    return {int(w[0]): ln for w, ln in words if w and w[0].isdigit()}


def test_nothing_a_job_wrote_drives_the_terminal_in_any_view(make_repo, daemon_factory, tmp_path):
    """A job's text, its file names and its output carry OSC 52 (clipboard), OSC 0 (title), CSI 2J (clear) and a
    newline in a name: `status --wide`, `show`, `why`, `logs`, `diff` and `watch` show them escaped, at 80 and 120
    columns: the title and the clipboard stay, the screen is not cleared, no line is forged."""
    repo = make_repo()
    d = daemon_factory().start()
    gate = tmp_path / "gate"
    job = d.enqueue(repo, hostile(wait_for_file(gate, 2400)), "--path", "src/a.py", "--land", "review")
    until(lambda: len(d.cli_json("show", str(job))["actual"]) == 3, what="the job's files seen", timeout=60)
    t = Terminal(f"orch-escapes-{tmp_path.name}", 80)
    try:
        title = t.title()  # the pane's title before any view ran
        views = [("status", "--wide"), ("show", str(job)), ("why", str(job)), ("logs", str(job))]
        for width in WIDTHS:
            t.resize(width)
            for args in views:
                shot = t.view(d.home, *args)
                what = f"`{' '.join(args)}` at {width} columns"
                assert BEGIN in shot, f"{what} cleared the screen:\n{shot}"
                assert t.title() == title, f"{what} set the terminal's title"
                assert t.buffers() == "", f"{what} wrote the clipboard: {t.buffers()}"
                assert "\\x1b]52;c;cm0gLXJmIH4K\\x07" in shot, f"{what} shows the escape, visible:\n{shot}"
                assert not [ln for ln in shot.splitlines() if ln.startswith(FORGED)], f"{what} forged a line:\n{shot}"
            show = t.view(d.home, "show", str(job))
            assert "name\\nstate        landed" in show, "the newline in a name is shown, on the name's line"
            assert not fits(t.screen(joined=True), width), f"`show` fits {width} columns"

        gate.touch()
        until(lambda: d.cli_json("show", str(job))["state"] == "ready", what="the job ready", timeout=60)
        for width in WIDTHS:
            t.resize(width)
            for args in (("diff", str(job)), ("status", "--wide")):
                shot = t.view(d.home, *args)
                assert BEGIN in shot and t.title() == title and t.buffers() == "", f"{args} at {width}:\n{shot}"

            cli = f"env -u COLUMNS -u LINES ORCHESTRATOR_HOME={d.home} {sys.executable} -m orchestrator watch"
            t.start(f"clear; echo '{BEGIN}'; {cli}")
            shot = t.shows(f"› {job:>4} ready", f"the watch at {width} columns")
            assert BEGIN in shot and "\\x1b]0;PWNED\\x07" in shot, shot
            assert t.title() == title and t.buffers() == "", "the watch drove the terminal"
            assert not fits(t.screen(joined=True), width), f"the watch fits {width} columns:\n{shot}"
            t.keys("q")
            until(t.ended, timeout=15, what="q quits the watch")
    finally:
        t.close()


def test_a_job_in_review_holding_back_work_is_named_with_the_command_to_review_it(make_repo, daemon_factory, tmp_path):
    """Job R waits in review holding src/a.py; A (src/, Overlap) waits on it, and B (src/b.py, Priority) waits on A.
    At 80 and 120 columns, `status`, `watch` and `why` say which job in review holds them and the command to review
    it; a job waiting on a running job shows its code and what it waits for, whole; `l` in the watch lands R and
    the work it held runs. Every other view fits the terminal too."""
    repo = make_repo()
    d = daemon_factory(env={"MAX_CONCURRENT_JOBS": "4"}).start()
    gate = tmp_path / "gate"
    r = d.enqueue(repo, "echo reviewed > src/a.py", "--path", "src/a.py", "--land", "review")
    until(lambda: d.cli_json("show", str(r))["state"] == "ready", what="R in review")
    h = d.enqueue(repo, f"{wait_for_file(gate, 2400)}; echo h > docs/x.md", "--path", "docs/")
    until(lambda: d.cli_json("show", str(h))["state"] == "running", what="H running")
    w = d.enqueue(repo, "echo w > docs/x.md", "--path", "docs/x.md")
    a = d.enqueue(repo, "echo a > src/c.py", "--path", "src/")
    b = d.enqueue(repo, "echo b > src/b.py", "--path", "src/b.py")
    until(lambda: d.cli_json("show", str(b))["code"] == "Priority", what="B behind A")
    assert d.cli_json("show", str(a))["code"] == "Overlap" and d.cli_json("show", str(w))["code"] == "Overlap"

    t = Terminal(f"orch-holds-{tmp_path.name}", 80)
    try:
        for width in WIDTHS:
            t.resize(width)
            shot = t.view(d.home, "status")
            rows = job_rows(shot)
            assert "Overlap" in rows[a] and f"held by job {r} in review" in rows[a], shot
            assert "Priority" in rows[b] and f"held by job {r} in review" in rows[b], shot
            assert "Overlap" in rows[w] and f"waits for job {h} to land" in rows[w], f"code, what it waits for:\n{shot}"
            assert f"holding back jobs {a}, {b}" in shot and f"`orchestrator diff {r}`" in shot, shot
            assert not fits(t.screen(joined=True), width), f"`status` fits {width} columns:\n{shot}"
            why = t.view(d.home, "why", str(b))
            assert f"held by job {r} in review" in why and f"`orchestrator land {r}`" in why, why
            for args in (("show", str(b)), ("why", str(a)), ("config", "show"), ("runners",), ("stats", "predict"),
                         ("plan", "--repo", str(repo), "edit src/a.py and docs/x.md")):  # fmt: skip
                t.view(d.home, *args)
                assert not fits(t.screen(joined=True), width), f"`{' '.join(args)}` fits {width}:\n{t.screen(True)}"

        t.resize(80)
        cli = f"env -u COLUMNS -u LINES ORCHESTRATOR_HOME={d.home} {sys.executable} -m orchestrator watch"
        t.start(cli)
        shot = t.shows(f"job {r} in review holds back jobs {a}, {b}", "the watch naming the job in review")
        rows = job_rows(shot)
        assert f"held by job {r} in review" in rows[a] and f"held by job {r} in review" in rows[b], shot
        assert f"waits for job {h} to land" in rows[w], shot
        assert not fits(t.screen(joined=True), 80), f"the watch fits 80 columns:\n{shot}"
        t.resize(120)
        t.shows(f"held by job {r} in review: `orchestrator diff {r}`", "the watch at 120 columns")
        assert not fits(t.screen(joined=True), 120), f"the watch fits 120 columns:\n{t.screen()}"
        t.keys("l")  # R is the ready job selected: land it
        until(lambda: all(d.cli_json("show", str(j))["state"] == "landed" for j in (r, a, b)), timeout=90,
              what="R landed and the work it held ran")  # fmt: skip
        until(lambda: "in review" not in t.screen(), what="the watch no longer names a hold")
        t.keys("q")
        until(t.ended, timeout=15, what="q quits the watch")
    finally:
        t.close()
        gate.touch()


def test_doctor_runners_and_config_show_fit_the_terminal(daemon_factory, tmp_path):
    """`doctor` (long paths, long advice), `runners` and `config show` in a real terminal at 80 and 120 columns: no
    line is wider than the pane, and doctor's details keep every character of a path (broken, never cut)."""
    d = daemon_factory().start()
    t = Terminal(f"orch-fit-{tmp_path.name}", 80)
    try:
        for width in WIDTHS:
            t.resize(width)
            for args in (("doctor",), ("runners",), ("config", "show")):
                shot = t.view(d.home, *args)
                assert not fits(t.screen(joined=True), width), f"`{' '.join(args)}` fits {width} columns:\n{shot}"
            doctor = t.view(d.home, "doctor")
            assert str(d.socket) in "".join(ln.strip() for ln in doctor.splitlines()), doctor
    finally:
        t.close()
