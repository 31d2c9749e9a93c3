"""Dependency updates and releases claim the manifests and version files they touch (`plan.manifests`)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.core import claims
from orchestrator.plan import manifests
from orchestrator.plan.evidence import local_plan
from orchestrator.plan.history import Change, History, mine
from tests.conftest import git, write

FILES = {
    ".github/workflows/ci.yml": "steps:\n  - uses: actions/checkout@v3\n",
    ".github/workflows/docs.yml": "steps:\n  - uses: actions/setup-python@v4\n",
    ".github/dependabot.yml": (
        "version: 2\nupdates:\n  - package-ecosystem: pip\n    directory: /requirements\n"
        "    groups:\n      py-deps:\n        patterns: ['*']\n"
    ),
    "requirements/dev.txt": "mypy==1.0\n",
    "requirements/docs.txt": "sphinx==7.0\n",
    "pyproject.toml": '[project]\nversion = "1.0.dev"\ndependencies = ["rich>=10"]\n\n[tool.mypy]\nfiles = ["src"]\n',
    "CHANGES.md": "# 1.0\n",
    "src/app.py": "x = 1\n",
}


def plan(repo: Path, text: str):
    head = git(repo, "rev-parse", "HEAD")
    return local_plan(repo, head, text, History(mine(repo, head)[0]), ("CHANGES*",))


def commit(repo: Path, files: dict[str, str], message: str) -> None:
    write(repo, files)
    git(repo, "commit", "-qam", message)


def test_dependency_updates_claim_where_the_dependency_is_declared_trusted_by_past_updates(make_repo) -> None:
    """`Bump X from a to b` claims the manifests declaring X (not a `[tool.X]` section); a dependabot group
    claims its directory's manifests; made confident only where past updates to those files stayed in manifests."""
    repo = make_repo("deps", FILES)
    p = plan(repo, "Bump actions/checkout from 3 to 4")
    assert p.claim.paths == {".github/workflows/ci.yml"} and p.claim.confidence < 0.5
    assert plan(repo, "Bump mypy from 1.0 to 1.1").claim.paths == {"requirements/dev.txt"}
    assert "pyproject.toml" not in plan(repo, "Update src to 2 packages").claim.paths  # the repo's own directory
    assert plan(repo, "Bump the py-deps group in /requirements with 2 updates").claim.paths == {
        "requirements/dev.txt",
        "requirements/docs.txt",
    }
    for n in range(3):
        commit(
            repo,
            {".github/workflows/ci.yml": f"steps:\n  - uses: actions/checkout@v3.{n}\n"},
            f"Bump actions/checkout from 3 to 3.{n}",
        )
    assert plan(repo, "Bump actions/checkout from 3.2 to 4").claim.confidence >= 0.5
    for n in range(3):  # mypy updates that also fixed the code: the rule does not vouch for the claim
        commit(
            repo,
            {"requirements/dev.txt": f"mypy==1.{n}\n", "src/app.py": f"x = {n}\n"},
            f"Bump mypy from 1.{n} to 1.{n + 1}",
        )
    p = plan(repo, "Bump mypy from 1.3 to 1.4")
    assert "0 of the 3 past changes of this kind (dependency)" in str(p.notes) and "src/app.py" in p.claim.paths


def test_release_claims_the_version_file_and_what_past_releases_touched(make_repo) -> None:
    """A release claims the file that sets the version; once past releases stayed inside it, confidently."""
    repo = make_repo("rel", FILES)
    assert plan(repo, "Release version 1.0").claim.paths == {"pyproject.toml"}
    for n in range(3):
        commit(
            repo,
            {"pyproject.toml": FILES["pyproject.toml"].replace("1.0.dev", f"1.{n}"), "CHANGES.md": f"{n}\n"},
            f"v1.{n}",
        )
    p = plan(repo, "v1.3")
    assert p.claim.paths == {"pyproject.toml"} and p.claim.confidence >= 0.5


def test_titles_and_dependabot_groups() -> None:
    """What titles say a dependency or a release, and which directory a dependabot group covers."""
    assert manifests.dependency("Update httpcore requirement from <0.17 to <0.18") == "httpcore"
    assert (
        manifests.dependency("Bump https://github.com/astral-sh/ruff-pre-commit (#1)")
        == "https://github.com/astral-sh/ruff-pre-commit"
    )
    assert (
        manifests.dependency("update dependencies") is None
        and manifests.dependency("bump werkzeug 2.3.7") == "werkzeug"
    )
    assert manifests.is_release("v2.32.0") and manifests.is_release("Release version 3.0.0")
    assert not manifests.is_release("fix the version check")
    assert manifests.group_directory(FILES[".github/dependabot.yml"], "py-deps") == ("pip", "requirements")
    assert manifests.group_directory(FILES[".github/dependabot.yml"], "other") is None


def test_a_recurring_title_claims_what_its_past_instances_touched(make_repo) -> None:
    """`update dev dependencies`, seen three times before (numbers and refs aside), claims the files most of
    them touched, confidently when they stayed inside; a title seen fewer times claims by its words."""
    repo = make_repo("recur", FILES)
    for n in range(3):
        commit(
            repo,
            {
                ".github/workflows/ci.yml": f"steps:\n  - uses: actions/checkout@v3.{n}\n",
                "requirements/dev.txt": f"mypy==1.{n}\n",
            },
            f"update dev dependencies (#{100 + n})",
        )
    p = plan(repo, "update dev dependencies (#200)")
    assert p.claim.paths == {".github/workflows/ci.yml", "requirements/dev.txt"} and p.claim.confidence >= 0.5
    assert manifests.shape("Update dev dependencies (#7)") == manifests.shape("update dev dependencies 2.1")
    assert manifests.shape("fix") == ()  # one word is no shape
    assert "requirements/dev.txt" not in plan(repo, "document the app").claim.paths


def test_a_kinds_risk_is_what_its_past_changes_touched_beyond_the_claim() -> None:
    """Each file of the tree past changes of the kind touched outside the claim has the share that did
    (add-one-half); a file none touched has the chance of an unseen one, spread over the tree."""
    tree = frozenset({"a", "b", "c", *(f"f{i}" for i in range(97))})
    near, rest = manifests.escapes([("a", "b"), ("a",), ("a", "c"), ("a", "b"), ("a", "gone")], {"a"}, tree)
    assert dict(near) == {"b": 2.5 / 6, "c": 1.5 / 6}  # a file no longer in the tree is not listed
    assert abs(rest - (2 + 1) / 7 / 100) < 1e-12


def test_a_release_claims_the_directory_whose_news_fragments_past_releases_folded(make_repo) -> None:
    """Past releases each deleted the news fragments they folded into the changelog: every fragment is a file
    seen once, so no file count finds them; the release claims their directory, and a fragment added there
    meets its claim."""
    repo = make_repo("frag", {**FILES, "newsfragments/.gitignore": "!.gitignore\n"})
    for n in range(3):
        write(repo, {f"newsfragments/{n}.bugfix.rst": f"fixed {n}\n"})
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", f"fix thing {n}")
        git(repo, "rm", "-q", f"newsfragments/{n}.bugfix.rst")
        commit(repo, {"pyproject.toml": FILES["pyproject.toml"].replace("1.0.dev", f"1.{n}"),
                      "CHANGES.md": f"- fixed {n}\n"}, f"v1.{n}")  # fmt: skip
    p = plan(repo, "v1.3")
    assert "newsfragments/" in p.claim.paths and "pyproject.toml" in p.claim.paths, p.claim.paths
    assert manifests.folded([("a/1.rst", "v.py"), ("b/x.py",)], frozenset({"v.py", "b/x.py"}), ()) == [], (
        "one release alone is no pattern"
    )


def test_a_change_like_those_that_added_news_fragments_claims_a_new_file_in_their_directory(make_repo) -> None:
    """Most past fixes added a fragment to the directory releases fold: a fix claims a new file there
    (`newsfragments/+`), which meets the release's claim of the directory and not another fix's new file; a
    release adds none, and a dependency update (none of its kind ever added one) claims none."""
    repo = make_repo("adds", {**FILES, "newsfragments/.gitignore": "!.gitignore\n"})
    for n in range(3):
        write(repo, {f"newsfragments/{n}.bugfix.rst": f"fixed {n}\n", "src/app.py": f"x = {n}\n"})
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", f"fix thing {n}")
        commit(repo, {"requirements/dev.txt": f"mypy==1.{n + 1}\n"}, f"Bump mypy from 1.{n} to 1.{n + 1}")
        git(repo, "rm", "-q", f"newsfragments/{n}.bugfix.rst")
        commit(repo, {"pyproject.toml": FILES["pyproject.toml"].replace("1.0.dev", f"1.{n}")}, f"v1.{n}")
    fix = plan(repo, "fix the app crashing on start")
    assert "newsfragments/+" in fix.claim.paths, fix.claim.paths
    assert any(e.path == "newsfragments/+" for e in fix.evidence)
    release = plan(repo, "v1.3")
    assert "newsfragments/" in release.claim.paths and not any(claims.is_addition(p) for p in release.claim.paths)
    assert claims.overlapping(fix.claim.paths, release.claim.paths) == {"newsfragments/+"}
    assert "newsfragments/+" not in plan(repo, "Bump mypy from 1.3 to 1.4").claim.paths


def test_fragments_are_claimed_where_recent_releases_fold_them_even_when_few_changes_add_one() -> None:
    """A project that took to news fragments lately: its older releases folded none, the last ones did (their
    directory is claimed); where a pull request lands as several commits only one of them adds the fragment, and
    a change of that kind still claims a new file there (two of the last fifty suffice); one alone does not."""
    old = [Change(f"o{i}", f"v0.{i}", ("pyproject.toml", "CHANGES.rst")) for i in range(20)]
    fixes = [Change(f"f{i}", f"fix thing {i}", ("src/app.py",)) for i in range(40)]
    adds = [Change(f"a{i}", f"fix other {i}", ("src/app.py", f"news/{i}.bugfix.rst")) for i in range(6)]
    releases = [Change(f"r{i}", f"v1.{i}", ("pyproject.toml", "CHANGES.rst", f"news/{i}.bugfix.rst")) for i in range(6)]
    present = frozenset({"pyproject.toml", "CHANGES.rst", "src/app.py", "news/.keep"})
    history = History([*old, *fixes, *adds, *releases])
    assert manifests.release_companions(history, present, ()) == ["CHANGES.rst", "pyproject.toml", "news/"]
    assert manifests.additions(history, "fix the crash", present, ()) == ["news/+"]
    assert manifests.additions(history, "v1.9", present, ()) == []
    once = History([*old, *fixes, *adds[:1], *releases])
    assert manifests.additions(once, "fix the crash", present, ()) == [], "one fragment in fifty changes is no habit"
