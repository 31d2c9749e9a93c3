"""Local evidence on a real repository with a crafted history: what a text names, and what goes with it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from orchestrator.core.models import ClaimSource
from orchestrator.plan.base import Kind, Note
from orchestrator.plan.evidence import local_plan
from orchestrator.plan.history import VERSION_TOKEN, History, mine, tokens
from orchestrator.plan.local import Histories
from orchestrator.plan.text import describes_change, front_matter, mentions, reports
from tests.conftest import git, write

FILES = {
    "src/shop/cart.py": "class Cart:\n    def total(self):\n        return 0\n",
    "src/shop/pricing.py": "def apply_discount(price, pct):\n    return price\n",
    "src/shop/money.py": "ROUNDING = 2\n",
    "tests/test_cart.py": "from shop.cart import Cart\n",
    "tests/test_checkout.py": "from shop.pricing import apply_discount\n",
    "docs/pricing.md": "# pricing\n",
    "README.md": "shop\n",
}


@pytest.fixture
def shop(make_repo) -> Path:
    """A repo where pricing.py and money.py have always changed together (three commits)."""
    repo = make_repo("shop", FILES)
    for n in range(3):
        pricing = FILES["src/shop/pricing.py"] + f"# {n}\n"
        write(repo, {"src/shop/pricing.py": pricing, "src/shop/money.py": f"R = {n}\n"})
        git(repo, "commit", "-qam", f"pricing rounding tweak {n}")
    write(repo, {"README.md": "shop!\n"})
    git(repo, "commit", "-qam", "readme")
    return repo


def plan(repo: Path, text: str):
    head = git(repo, "rev-parse", "HEAD")
    history = History(mine(repo, head)[0])
    return local_plan(repo, head, text, history)


def kinds(p) -> dict[str, set[Kind]]:
    out: dict[str, set[Kind]] = {}
    for e in p.evidence:
        out.setdefault(e.path, set()).add(e.kind)
    return out


def test_named_file_brings_its_test(shop: Path) -> None:
    """A path the text names is claimed; its test file (naming convention) follows with half its probability."""
    p = plan(shop, "refactor src/shop/cart.py to add logging")
    assert p.claim.source is ClaimSource.EVIDENCE and "src/shop/cart.py" in p.claim.paths
    k = kinds(p)
    assert Kind.NAMED in k["src/shop/cart.py"]
    ranked = {r["path"]: r for r in p.ranking}
    test = ranked["tests/test_cart.py"]
    assert any("naming convention" in w for w in test["why"])
    assert test["p"] >= 0.3 * ranked["src/shop/cart.py"]["p"]
    # Too few past changes for a record: the risk is unknown, and the plan says so.
    assert p.claim.risk is None and Note.NO_RECORD in [c for c, _ in p.notes]


def test_named_identifier_finds_its_definition_and_what_changes_with_it(shop: Path) -> None:
    """An identifier leads to the file defining it (read at the base, no checkout) and to the file that
    changed with it in every past change; a test that merely imports the module is not claimed for that."""
    p = plan(shop, "make `apply_discount` round half up")
    k = kinds(p)
    assert Kind.SYMBOL in k["src/shop/pricing.py"] and "src/shop/pricing.py" in p.claim.paths
    ranked = {r["path"]: r for r in p.ranking}
    assert any("changed with src/shop/pricing.py in 4 of its 4" in w for w in ranked["src/shop/money.py"]["why"])
    assert "tests/test_checkout.py" not in p.claim.paths


def test_text_naming_nothing_is_ambiguous_with_a_note(shop: Path) -> None:
    """A text that names nothing of the repo is not an error: an empty claim, and a note that says so."""
    p = plan(shop, "make everything faster please")
    assert not p.claim.paths and p.claim.confidence == 0.0
    assert p.notes and p.notes[0][0] is Note.NAMES_NOTHING


def test_definition_read_at_the_base_not_the_work_tree(shop: Path) -> None:
    """Evidence comes from the base commit: an uncommitted definition in the checkout does not count."""
    write(shop, {"src/shop/extra.py": "def brand_new_helper():\n    pass\n"})
    p = plan(shop, "call brand_new_helper() from the cart")
    assert "src/shop/extra.py" not in p.claim.paths


def test_front_matter_and_mentions() -> None:
    """`Paths:` front matter is declared; paths, identifiers and words are told apart."""
    declared, body = front_matter("Paths: src/a.py, tests/\n---\nrefactor things")
    assert declared == ("src/a.py", "tests/") and body.strip() == "refactor things"
    m = mentions("Fix `Cart.total` in src/shop/cart.py (see https://example.com/x.py), v1.2.3 blueprints")
    assert "src/shop/cart.py" in m.paths and "Cart.total" in m.identifiers
    assert not any("example.com" in p for p in m.paths) and "v1.2.3" not in m.paths
    assert "blueprints" in m.words


def test_history_is_incremental(shop: Path) -> None:
    """Mining from a known head returns only the newer changes."""
    head = git(shop, "rev-parse", "HEAD")
    old = git(shop, "rev-parse", "HEAD~1")
    new, incremental = mine(shop, head, old)
    assert incremental and [c.subject for c in new] == ["readme"]


def test_history_is_authored_changes_not_merges(shop: Path) -> None:
    """A merge is left out and the commits it brings are each a change on its own parent; mining on from a
    merge (or from a commit of a merged branch) adds only what is new; an unknown head re-mines all."""
    git(shop, "checkout", "-qb", "feature")
    write(shop, {"src/shop/cart.py": FILES["src/shop/cart.py"] + "# f\n"})
    git(shop, "commit", "-qam", "cart tweak")
    feature = git(shop, "rev-parse", "HEAD")
    git(shop, "checkout", "-q", "main")
    write(shop, {"docs/pricing.md": "# pricing!\n"})
    git(shop, "commit", "-qam", "docs tweak")
    git(shop, "merge", "-q", "--no-ff", "-m", "Merge branch 'feature'", "feature")
    merge = git(shop, "rev-parse", "HEAD")
    changes, _ = mine(shop, merge)
    assert len(changes) == 7 and {(c.subject, c.files) for c in changes[-2:]} == {
        ("docs tweak", ("docs/pricing.md",)),
        ("cart tweak", ("src/shop/cart.py",)),
    }
    line, _ = mine(shop, merge, first_parent=True)
    assert [(c.subject, c.files) for c in line[-2:]] == [
        ("docs tweak", ("docs/pricing.md",)),
        ("Merge branch 'feature'", ("src/shop/cart.py",)),
    ]
    write(shop, {"README.md": "shop 2\n"})
    git(shop, "commit", "-qam", "readme 2")
    head = git(shop, "rev-parse", "HEAD")
    assert [c.subject for c in mine(shop, head, merge)[0]] == ["readme 2"] and mine(shop, head, merge)[1]
    new, incremental = mine(shop, head, feature)
    assert incremental and sorted(c.subject for c in new) == ["docs tweak", "readme 2"]
    new, incremental = mine(shop, head, "0" * 40)
    assert not incremental and len(new) == 8
    histories = Histories(None)
    asyncio.run(histories.at(str(shop), merge))
    history = asyncio.run(histories.at(str(shop), head))  # on from the merge it was mined to
    assert history.tip == head and sorted(c.sha for c in history.changes) == sorted(c.sha for c in mine(shop, head)[0])


def test_attribute_and_history_confirmed_word_name_their_files(shop: Path) -> None:
    """`Cart.total` (an attribute, not a file name) leads to the file defining `Cart`; a bare word that is a
    file's name, said by past changes that touched that file, has two kinds of evidence."""
    k = kinds(plan(shop, "Constrain Cart.total to int"))
    assert Kind.SYMBOL in k["src/shop/cart.py"]
    p = plan(shop, "pricing: round half up")
    pricing = next(r for r in p.ranking if r["path"] == "src/shop/pricing.py")
    assert pricing["claimed"] and {w.split(":")[0] for w in pricing["why"]} >= {"named", "history"}


def test_release_descriptions_are_alike_whatever_the_number() -> None:
    """A description that is only a version number is one token for similarity; beside other words a
    number says nothing."""
    assert tokens("v2.34.0") == tokens("release version 3.1.0 (#5640)") == {VERSION_TOKEN}
    assert tokens("require werkzeug >= 2.3.3") == {"require", "werkzeug"}


def test_similar_past_changes_agree_on_the_files_that_still_exist(make_repo) -> None:
    """Past changes in the same words that also touched files deleted since agree on what is left."""
    repo = make_repo("ci", {".github/workflows/ci.yaml": "on: push\n", "a_old.cfg": "a\n", "b_old.cfg": "b\n"})
    for n, old in enumerate(["a_old.cfg", "b_old.cfg"]):
        write(repo, {".github/workflows/ci.yaml": f"on: push # {n}\n", old: f"{n}\n"})
        git(repo, "commit", "-qam", "bump ci workflow")
    git(repo, "rm", "-q", "a_old.cfg", "b_old.cfg")
    git(repo, "commit", "-qm", "drop old configs")
    p = plan(repo, "bump ci workflow")
    assert p.basis == "history" and p.claim.paths == {".github/workflows/ci.yaml"}
    assert p.claim.confidence <= 0.3  # past changes alone are one kind of evidence: not confident


def test_claim_takes_directories_generated_files_and_slashed_names(make_repo) -> None:
    """Two of a directory's four files named: the directory is claimed (a sibling added since is covered),
    one of four stays a file; a manifest brings its lock file, a pip-compile input its output; `ci/b:`
    names `ci/b.yml`."""
    files = {f"ci/{n}.yml": f"{n}\n" for n in "abcd"}
    files |= {"pyproject.toml": "[project]\n", "uv.lock": "x\n", "reqs/dev.in": "x\n", "reqs/dev.txt": "x\n"}
    repo = make_repo("dirs", files)
    assert plan(repo, "bump ci/a.yml and ci/b.yml").claim.paths == {"ci/"}
    assert plan(repo, "ci/b: bump").claim.paths == {"ci/b.yml"}
    assert plan(repo, "raise the floor in pyproject.toml").claim.paths == {"pyproject.toml", "uv.lock"}
    assert plan(repo, "pin reqs/dev.in").claim.paths == {"reqs/dev.in", "reqs/dev.txt"}


SCOPES = b'''from typing import TYPE_CHECKING


class Request:
    """A request.
headers = at the margin of a docstring
    """

    kind = "plain"

    def __init__(self, headers=None):
        self.headers = headers
        self.hooks = dict(
retries=3)

        def later():
            self.inner = 1

        local = 2

    async def prepare(self):
        if self.hooks:
            self.body = None


if TYPE_CHECKING:
    JsonType = dict
else:
    JsonType = object


def helper():
    value = 3
'''


def test_a_class_defines_the_attributes_its_methods_assign_and_a_guarded_alias_is_a_definition() -> None:
    """`self.x = ...` in a method makes `Class.x`, a class attribute too; a name assigned under a module-level
    `if TYPE_CHECKING:` is defined there; a function's locals and a nested function's `self.x` are not; a
    continuation line at the margin does not end the class around it (the method after it is still its)."""
    from orchestrator.plan.index import facts_of

    f = facts_of("src/models.py", SCOPES)
    assert {"Request.headers", "Request.hooks", "Request.kind", "Request.body", "Request.prepare"} <= f.members
    assert not {"Request.inner", "Request.local", "helper.value", "Request.retries"} & f.members
    assert {"Request", "JsonType", "helper"} <= f.defs and not {"value", "local", "inner"} & f.defs


def test_an_attribute_assigned_in_a_method_names_its_class_s_file(make_repo) -> None:
    """`Request.headers` (set in `__init__`, no method of that name) leads to the file whose class assigns it,
    not to the docs that talk about headers most."""
    files = {
        "src/web/models.py": "class Request:\n    def __init__(self, headers):\n        self.headers = headers\n",
        "src/web/sessions.py": "class Session:\n    def send(self, request):\n        return request\n",
        "docs/headers.md": "Request.headers holds the headers. Headers, headers, headers of a Request.\n",
    }
    repo = make_repo("web", files)
    p = plan(repo, "Move Request.headers back to Mapping")
    assert Kind.SYMBOL in kinds(p).get("src/web/models.py", set()), p.ranking
    assert "src/web/models.py" in p.claim.paths


@pytest.mark.parametrize(
    "text",
    [
        "Fix the legend's alpha",
        "Fixed #123 -- Made Query.has_select_fields a computed property.",
        "Refs #28606 -- Corrected deprecation version",
        "docs: clarify the install guide",
        "fix(api): keep the order of headers",
        "MNT: Re-enable the duplicate-code checker",
        "DOC fix a link in the FAQ",
        "C++ domain: Add support for semicolons",
        "Only run codspeed against pull requests",
        "Don't suggest a comprehension for unpacking",
        "Apply suggestions from code review",
        "Update the ruff pin (#1234)",
        "v2.34.0",
    ],
)
def test_a_change_described_as_commit_messages_do_is_no_report(text: str) -> None:
    assert describes_change(text) and not reports(text)


@pytest.mark.parametrize(
    "text",
    [
        "[Bug]: Adding suptitle in compressed layout causes weird spacing",
        "Legend ignores alpha when the facecolor is 'none'",
        "`ax.pie()` raises `ValueError` when input contains `NaN`",
        "False positive `unreachable` for `NoReturn` coroutine functions",
        "copy should have the option to log all files it copied",
        "Creating a subclassed instance now errors with an unexpected keyword",
        "Support for serialization of combination of Enum flags?",
        "LaTeX: the py:class directive renders badly in PDF",
    ],
)
def test_an_issues_title_reports(text: str) -> None:
    assert reports(text) and not describes_change(text)


def test_a_text_neither_reporting_nor_describing_a_change_is_no_report() -> None:
    """A noun phrase (`Boxplotting masked arrays`, `new vendored libs`) tells neither: it is planned as any text."""
    assert not reports("Boxplotting masked arrays") and not reports("new vendored libs") and not reports("")


@pytest.mark.parametrize(
    "command",
    ["sed -i 's/fail-under=100/fail-under=99/' Makefile", "while [ ! -e gate ]; do sleep 0.05; done; echo slow > a"],
)
def test_a_shell_jobs_command_line_is_no_report(command: str) -> None:
    """A shell job's text is its command: words in it (`fail-under`, `slow`) report nothing."""
    assert not reports(command)


SETUP = """

### Environment

- Shop version: 2.3.1
- Python version: 3.11.4
- Shop extensions: shop.app, shop.plugins
- OS: Linux

<details><summary>Output of <tt>show_versions()</tt></summary>

INSTALLED VERSIONS
------------------
shop: 2.3.1
python: 3.11.4 (main, Jun  7 2023, 12:45:48)
</details>
<!-- Please tell us which Shop version and which plugins you use -->
"""


def test_an_issue_templates_environment_section_names_nothing_of_the_work(make_repo) -> None:
    """What a report's template asks of every reporter (versions, platform, extensions, `show_versions()`'s output, the
    template's own comments) names the same files in every report of a repository: sphinx's `Sphinx extensions:
    sphinx.ext.autodoc` and `Sphinx version` (its class `Sphinx`), xarray's `xr.show_versions()` dump (SWE-bench
    Verified: `print_versions.py` the likeliest file of 8 of 13 xarray tickets, never fixed there). Left out, two
    reports about different files claim apart, each its own file first."""
    repo = make_repo(
        "shopsetup",
        {
            "shop/__init__.py": "",
            "shop/app.py": "class Shop:\n    pass\n\n\ndef show_versions():\n    print('shop')\n",
            "shop/plugins.py": "PLUGINS = []\n",
            "shop/cart.py": "class Cart:\n    def total(self):\n        return 0\n",
            "shop/pricing.py": "def apply_discount(price, pct):\n    return price\n",
        },
    )
    cart = plan(repo, "Cart total ignores the quantity of each line\n\n`Cart.total` counts each line once." + SETUP)
    pricing = plan(repo, "apply_discount rounds the wrong way\n\n`apply_discount(10, 15)` gives 8.5." + SETUP)
    for p in (cart, pricing):
        assert not {"shop/app.py", "shop/plugins.py"} & set(kinds(p)), "nothing of the setup is evidence"
    assert "shop/cart.py" in cart.claim.paths and "shop/pricing.py" in pricing.claim.paths
    assert not set(cart.claim.paths) & set(pricing.claim.paths)
    m = mentions("Cart is slow\n\n### Environment\n- Shop version: 2.3.1\n\n### Steps\nCall `Cart.total` on shop.app")
    assert "Cart.total" in m.identifiers and "shop.app" in m.identifiers, "a section after the setup counts again"
    assert "Shop" not in m.identifiers and "2.3.1" not in m.paths

