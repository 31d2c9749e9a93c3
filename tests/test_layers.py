"""The rooms of the code and what each may import: the table in docs/architecture.md is the rule, read here.

Every import statement of the package counts (at module level, inside a function, under TYPE_CHECKING): a
module may import its own room and the rooms on lower floors; rooms on one floor do not import each other;
no two modules import each other, however indirectly; from outside the planner only its seam is imported.
"""

from __future__ import annotations

import ast
import functools
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "orchestrator"
DOC = ROOT / "docs" / "architecture.md"

PLAN_SEAM = frozenset({"orchestrator.plan", "orchestrator.plan.base", "orchestrator.plan.composite",
                       "orchestrator.plan.accuracy", "orchestrator.plan.declared"})  # fmt: skip
"""What of the planner other rooms may import: its interface and the composite that picks the sources. Its
heuristics (text, index, rank, score, focus, record, evidence, ...) are reached only through these."""
SEAM_EXEMPT = frozenset({"lab"})
"""The lab measures the heuristics themselves."""

Edges = Mapping[str, Iterable[str]]

pytestmark = pytest.mark.xdist_group("layers")
"""On one worker: every test here reads the same syntax trees, parsed once a process (`tree`)."""


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


@functools.cache
def tree(path: Path) -> ast.Module:
    """A module's syntax tree, parsed once for every check of this file."""
    return ast.parse(path.read_text(), str(path))


def _resolve(name: str, known: Mapping[str, Path]) -> str | None:
    """The module an imported name lives in (`orchestrator.git.repos.RepoError` → `orchestrator.git.repos`)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


@functools.cache
def _imported(mod: str, path: Path) -> tuple[str, ...]:
    """The dotted names of every import statement of `mod` (at module level, in a function, under TYPE_CHECKING),
    relative ones made absolute: a module, or a name of one."""
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out: list[str] = []
    for node in ast.walk(tree(path)):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], base]).strip(".")
            out += [f"{base}.{a.name}" for a in node.names]  # a submodule, or a name of `base`
    return tuple(out)


def imports(known: Mapping[str, Path]) -> dict[str, set[str]]:
    """module → the package's modules it imports, from every import statement in it."""
    edges: dict[str, set[str]] = defaultdict(set)
    for mod, path in known.items():
        for name in _imported(mod, path):
            if name == "orchestrator" or name.startswith("orchestrator."):
                target = _resolve(name, known)
                if target is not None and target != mod:
                    edges[mod].add(target)
    return edges


@functools.cache
def _strings(path: Path) -> tuple[str, ...]:
    """The string constants of a module that could name one of the package's (`orchestrator.…`)."""
    return tuple(
        n.value for n in ast.walk(tree(path))
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.startswith("orchestrator.")
    )  # fmt: skip


def named(known: Mapping[str, Path]) -> dict[str, set[str]]:
    """module → the package's modules it names in a string (`importlib.import_module("orchestrator.lab.bench")`,
    `"module:attribute"`): loaded late, but loaded. They count for the floors and the planner's seam, not for
    cycles: naming a module to load it when wanted is how a seam picks a plug-in that registers itself with it
    (`plan.composite`'s model planners)."""
    edges: dict[str, set[str]] = defaultdict(set)
    for mod, path in known.items():
        for value in _strings(path):
            name = value.partition(":")[0]
            if name in known and name != mod:
                edges[mod].add(name)
    return edges


def _with(edges: Edges, more: Edges) -> dict[str, set[str]]:
    out = {m: set(t) for m, t in edges.items()}
    for m, t in more.items():
        out.setdefault(m, set()).update(t)
    return out


def floors() -> tuple[dict[str, str], dict[str, int]]:
    """From the doc's table: (file or directory under orchestrator/ → its room, room → its floor)."""
    text = DOC.read_text()
    section = text.split("## Rooms and what each may import", 1)[1].split("\n## ", 1)[0]
    where: dict[str, str] = {}
    floor: dict[str, int] = {}
    for line in section.splitlines():
        m = re.fullmatch(r"\|\s*(\d+)\s*\|([^|]*)\|.*\|", line.strip())
        if not m:
            continue
        names = re.findall(r"`([^`]+)`", m.group(2))
        room = names[0].rstrip("/").removesuffix(".py")
        floor[room] = int(m.group(1))
        for n in names:
            where[n.rstrip("/")] = room
    return where, floor


def room_of(mod: str, where: Mapping[str, str]) -> str:
    """The room of a module: its top-level directory, or its own file, as the table names them."""
    parts = mod.split(".")
    if len(parts) == 1:
        return where["__init__.py"]
    top = parts[1]
    return where.get(top) or where.get(f"{top}.py") or f"(unlisted: {top})"


def upward(edges: Edges, where: Mapping[str, str], floor: Mapping[str, int]) -> list[str]:
    """Each import of a room on the same or a higher floor than the importer's own."""
    out = []
    for mod, targets in sorted(edges.items()):
        a = room_of(mod, where)
        for t in sorted(targets):
            b = room_of(t, where)
            if a != b and floor.get(b, 99) >= floor.get(a, -1):
                out.append(f"{mod} ({a}, floor {floor.get(a)}) imports {t} ({b}, floor {floor.get(b)})")
    return out


def cycles(edges: Edges) -> list[list[str]]:
    """The module import cycles: each strongly connected set of two or more modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def past_the_seam(edges: Edges, where: Mapping[str, str]) -> list[str]:
    """Each import of a planner module behind its seam from another room."""
    return [
        f"{mod} imports {t}"
        for mod, targets in sorted(edges.items())
        for t in sorted(targets)
        if t.startswith("orchestrator.plan.") and t not in PLAN_SEAM
        and room_of(mod, where) not in ("plan", *SEAM_EXEMPT)
    ]  # fmt: skip


def breaks(edges: Edges, late: Edges | None = None) -> list[str]:
    """Everything the rule finds wrong with this import graph (`late`: the modules named in strings)."""
    where, floor = floors()
    loaded = _with(edges, late or {})
    return upward(loaded, where, floor) + [" ↔ ".join(c) for c in cycles(edges)] + past_the_seam(loaded, where)


def check(known: Mapping[str, Path]) -> list[str]:
    """Everything the rule finds wrong with these modules' imports."""
    return breaks(imports(known), named(known))


# -- the rule on the code as it is ----------------------------------------------------------------------------


def test_every_module_is_in_a_room_of_the_table():
    """Each top-level module and package of orchestrator/ is listed in docs/architecture.md's table."""
    where, floor = floors()
    assert len(floor) >= 10, "the table of rooms in docs/architecture.md could not be read"
    unlisted = {room_of(m, where) for m in modules()} - set(floor)
    assert not unlisted, f"add these to the table of rooms in docs/architecture.md: {sorted(unlisted)}"


def test_no_room_imports_a_room_above_or_beside_it():
    """A module imports only its own room and rooms on lower floors (the daemon's path never reaches the lab), by
    an import statement or by naming the module in a string for importlib."""
    where, floor = floors()
    known = modules()
    assert upward(_with(imports(known), named(known)), where, floor) == []


def test_no_import_cycle():
    """No two modules import each other, directly or through others."""
    assert cycles(imports(modules())) == []


def test_the_planner_is_reached_through_its_seam():
    """Outside plan/ (the lab aside), only the planner's interface and composite are imported."""
    where, _ = floors()
    known = modules()
    assert past_the_seam(_with(imports(known), named(known)), where) == []


# -- the rule catches each break the review found (issue: seven of eleven rules broken) ------------------------


def plant(known: Mapping[str, Path], tmp: Path, mod: str, line: str, where: str = "") -> dict[str, Path]:
    """`known` with `mod` read from a copy of its file with `line` planted: at module level, or with `where` as the
    last statement of that function (as `config._validate` imported `git`, `jobs` and `runners`)."""
    text = known[mod].read_text().splitlines(keepends=True)
    if not where:
        at = next(i for i, t in enumerate(text) if t.startswith("from __future__")) + 1
        text.insert(at, line + "\n")
    else:
        fn = next(
            n for n in ast.walk(tree(known[mod]))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == where
        )  # fmt: skip
        indent = " " * fn.body[0].col_offset
        text.insert(fn.end_lineno or fn.lineno, "".join(indent + t + "\n" for t in line.split("\n")))
    copy = tmp / f"{mod}.{len(list(tmp.iterdir()))}.py"
    copy.write_text("".join(text))
    return {**known, mod: copy}


SEVEN = {
    "git/landing reaches up into runners for the check": [
        ("orchestrator.git.landing", "from orchestrator.runners.base import Runner", "", "orchestrator.runners.base"),
    ],
    "proc/process reaches up into git": [
        ("orchestrator.proc.process", "from orchestrator.git.repos import GIT_LOCATION_ENV", "",
         "orchestrator.git.repos"),
    ],
    "config validation imports git": [
        ("orchestrator.config", "from orchestrator.git.remote import PUBLISHERS", "_check_repos",
         "orchestrator.git.remote"),
    ],
    "config validation imports jobs": [
        ("orchestrator.config", "from orchestrator.jobs.notify import check_template", "_check_jobs",
         "orchestrator.jobs.notify"),
    ],
    "config validation imports runners": [
        ("orchestrator.config", "from orchestrator.runners.ratelimit import SIGNS", "_check_runners",
         "orchestrator.runners.ratelimit"),
    ],
    "jobs/service imports team": [
        ("orchestrator.jobs.service", "from orchestrator.team.clones import NotShared", "", "orchestrator.team.clones"),
    ],
    "plan/rank and plan/score import each other": [
        ("orchestrator.plan.rank", "from orchestrator.plan.score import logit", "", "orchestrator.plan.score"),
        ("orchestrator.plan.score", "from orchestrator.plan.rank import is_doc", "logit", "orchestrator.plan.rank"),
    ],
}  # fmt: skip
"""The review's seven breaks of the layering, each as the import statement(s) it was: (module, statement, the
function it sat in or "" for module level, the module it reached)."""


@pytest.mark.parametrize("why", sorted(SEVEN))
def test_each_break_the_review_found_fails_the_rule(why, tmp_path):
    """Put back any one of the seven breaks of the layering, as source in a copy of its module, and the rule reports
    it (naming both ends)."""
    known = modules()
    assert check(known) == []
    for mod, line, where, _ in SEVEN[why]:
        known = plant(known, tmp_path, mod, line, where)
    found = check(known)
    assert found, why
    assert all(any(mod in f and target in f for f in found) for mod, _, _, target in SEVEN[why]), found


FORMS = {
    "import a.b.c": "import orchestrator.runners.base",
    "from a.b import c": "from orchestrator.runners import base",
    "relative": "from ..runners import base",
    "under TYPE_CHECKING": "if TYPE_CHECKING:\n    from orchestrator.runners.base import Runner",
    "importlib by name": 'importlib.import_module("orchestrator.runners.base")',
    "module:attribute by name": 'LAZY = {"check": "orchestrator.runners.base:Runner"}',
}


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("where", ["", "land"])
def test_every_form_of_an_upward_import_fails_the_rule(form, where, tmp_path):
    """An upward import is found however it is written, at module level or inside a function."""
    known = plant(modules(), tmp_path, "orchestrator.git.landing", FORMS[form], where)
    found = check(known)
    assert any("orchestrator.git.landing" in f and "orchestrator.runners" in f for f in found), found


def test_a_planted_cycle_fails_the_rule(tmp_path):
    """Two modules of one room importing each other, one of them only inside a function, is a cycle."""
    known = plant(modules(), tmp_path, "orchestrator.core.claims", "from orchestrator.core import admission", "literal")
    assert any("orchestrator.core.admission" in f and "orchestrator.core.claims" in f for f in check(known))


JOB_WRITES = {
    "jobs": frozenset({"add", "transition", "update", "update_many", "update_all", "delete", "recover"}),
    "team": frozenset({"claim", "take_over"}),
}
"""The store's methods that write a job, by the part of the store (`store.base`) they are on."""
BOARD = "orchestrator.jobs.board"


def store_writes(known: Mapping[str, Path]) -> list[str]:
    """Each call of a store's job-writing method (`….store.jobs.update(…)`, `store.team.claim(…)`) outside the store
    and the board."""
    out = []
    for mod, path in sorted(known.items()):
        if mod == BOARD or mod.startswith(("orchestrator.store", "orchestrator.lab")):
            continue
        for node in ast.walk(tree(path)):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and (m := re.search(r"(^|\.)_?store\.(jobs|team)$", ast.unparse(node.func.value)))
                and node.func.attr in JOB_WRITES[m.group(2)]
            ):
                out.append(f"{mod}:{node.lineno} {ast.unparse(node.func)}")
    return out


def test_every_job_write_goes_through_the_board():
    """No module but the board writes a job to the store: every change is stored, then announced, in one place."""
    assert store_writes(modules()) == []


def test_a_write_beside_the_board_fails_the_rule(tmp_path):
    """A job write straight to the store (as planning and the watch made before) is found."""
    mod = tmp_path / "planning.py"
    mod.write_text("async def submit(self, job):\n    await self.board.store.jobs.transition(job.id, 1, 2, 3)\n")
    assert store_writes({"orchestrator.jobs.planning": mod}) == [
        "orchestrator.jobs.planning:2 self.board.store.jobs.transition"
    ]


EVENT_KINDS = re.compile(r"JobEvent\.[A-Z_]+|w\.event")
"""What an engine may store as an event's kind: a member of `core.models.JobEvent`, or a `Write`'s event (typed
`JobEvent`, which mypy holds every writer to)."""


def stored_kinds(known: Mapping[str, Path]) -> list[str]:
    """Each statement that writes a job's event (`INSERT INTO job_events`) with the kind it stores, as written."""
    out = []
    for mod, path in sorted(known.items()):
        sql = {
            n.targets[0].id for n in ast.walk(tree(path))
            if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name) and isinstance(n.value, ast.Constant)
            and "INSERT INTO job_events" in str(n.value.value)
        }  # fmt: skip
        for n in ast.walk(tree(path)):
            if not isinstance(n, ast.Call) or not n.args:
                continue
            first = ast.unparse(n.args[0])
            if "INSERT INTO job_events" not in first and first not in sql:
                continue
            values = n.args[1:]
            if len(values) == 1 and isinstance(values[0], ast.Tuple):
                values = values[0].elts
            elif len(values) == 1 and isinstance(values[0], ast.ListComp) and isinstance(values[0].elt, ast.Tuple):
                values = values[0].elt.elts
            out.append(f"{mod}:{n.lineno} {ast.unparse(values[2]) if len(values) > 2 else '?'}")
    return out


def test_every_stored_event_kind_is_a_job_event():
    """The engines store an event's kind only from the closed `JobEvent` enum, never a bare string."""
    found = stored_kinds(modules())
    assert len(found) >= 4, found  # both engines' enqueue and guarded writes at least
    assert [f for f in found if not EVENT_KINDS.fullmatch(f.split(" ", 1)[1])] == []


def test_an_event_stored_as_a_bare_string_fails_the_rule(tmp_path):
    """A kind written as a string (as ~20 were in 8 modules before the enum) is found."""
    mod = tmp_path / "sqlite.py"
    mod.write_text(
        '_SQL = "INSERT INTO job_events (job_id, at, kind, data) VALUES (?, ?, ?, ?)"\n'
        'def f(conn, i, now):\n    conn.execute(_SQL, (i, now, "requeued", "{}"))\n'
    )
    assert stored_kinds({"orchestrator.store.sqlite": mod}) == ["orchestrator.store.sqlite:3 'requeued'"]


# -- the store's two engines, side by side ----------------------------------------------------------------------

ENGINES = {
    "sqlite": ("orchestrator.store.sqlite", "orchestrator.store.sqlite_records", "orchestrator.store.sqlite_thread"),
    "postgres": ("orchestrator.store.postgres", "orchestrator.store.pgrecords", "orchestrator.store.pgconn",
                 "orchestrator.store.pgaudit"),
}  # fmt: skip


def test_neither_engine_reads_the_others_private_names_nor_ignores_a_type():
    """The SQLite and PostgreSQL engines share only what is engine-free (`store.base`, `store.guarded`): neither
    imports a private name of the other, and the PostgreSQL engine has no `type: ignore`."""
    known = modules()
    for engine, mods in ENGINES.items():
        others = [m for e, ms in ENGINES.items() if e != engine for m in ms]
        for mod in mods:
            for node in ast.walk(tree(known[mod])):
                if isinstance(node, ast.ImportFrom) and node.module in others:
                    assert not [a.name for a in node.names if a.name.startswith("_")], f"{mod} imports {node.module}"
                if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                    reached = set(ast.unparse(node.value).split("."))  # `self.local._db`: the node's own file's
                    other = {"local", "_local", "sqlite", "sqlite_records", "postgres"}
                    assert not reached & other, f"{mod}: {node.attr}"
    for mod in ENGINES["postgres"]:
        assert "type: ignore" not in known[mod].read_text(), mod


def within(mod: str, places: Iterable[str]) -> bool:
    """Whether `mod` is one of `places` or inside one (`orchestrator.cli` is not `orchestrator.client`)."""
    return any(mod == p or mod.startswith(p + ".") for p in places)


LAB_OR_CLI = ("orchestrator.lab", "orchestrator.commands", "orchestrator.cli", "orchestrator.demo")


def _bases(mod: str, node: ast.ClassDef, known: Mapping[str, Path]) -> list[tuple[str, str]]:
    """The package's classes `node` inherits from, as (module, class): defined beside it, imported by name
    (`from orchestrator.store.base import JobTable`) or reached through an imported module (`base.JobTable`)."""
    bound: dict[str, str] = {}  # a name in `mod` → the dotted name it was imported as
    for name in _imported(mod, known[mod]):
        bound[name.rpartition(".")[2]] = name
    for n in ast.walk(tree(known[mod])):
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            for a in n.names:
                if a.asname and a.name.rpartition(".")[2] in bound:
                    bound[a.asname] = bound.pop(a.name.rpartition(".")[2])
    out = []
    for b in node.bases:
        dotted = ast.unparse(b)
        head, _, rest = dotted.partition(".")
        if head == "orchestrator":  # `import orchestrator.store.base` then `orchestrator.store.base.JobTable`
            full = dotted
        else:
            full = f"{bound[head]}.{rest}".rstrip(".") if head in bound else f"{mod}.{dotted}"
        owner, _, cls = full.rpartition(".")
        if owner in known:
            out.append((owner, cls))
    return out


def public_methods(known: Mapping[str, Path], mod: str, cls: str, seen: frozenset[str] = frozenset()) -> set[str]:
    """The public methods of class `cls` of `mod`: its own and those it inherits from the package's classes."""
    node = next(
        (n for n in ast.walk(tree(known[mod])) if isinstance(n, ast.ClassDef) and n.name == cls), None
    )  # fmt: skip
    if node is None or f"{mod}.{cls}" in seen:
        return set()
    own = {
        f.name for f in node.body
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and not f.name.startswith("_")
    }  # fmt: skip
    for base_mod, base in _bases(mod, node, known):
        own |= public_methods(known, base_mod, base, seen | {f"{mod}.{cls}"})
    return own


def big_classes(known: Mapping[str, Path]) -> list[str]:
    """Each class of the daemon (the lab and the CLI aside) with more than 30 public methods, inherited ones too."""
    big = []
    for mod, path in known.items():
        if within(mod, LAB_OR_CLI):
            continue
        for node in ast.walk(tree(path)):
            if isinstance(node, ast.ClassDef) and len(public := public_methods(known, mod, node.name)) > 30:
                big.append(f"{mod}.{node.name}: {len(public)}")
    return big


def test_no_class_of_the_daemon_over_30_public_methods():
    """A class with more than 30 public methods does more than one thing (the store was 53 before its parts)."""
    assert big_classes(modules()) == []


def test_a_class_over_30_public_methods_through_its_bases_fails_the_rule(tmp_path):
    """Methods a class inherits from the package's classes count: a store split into mixins is still one store."""
    methods = "".join(f"    def m{i}(self): ...\n" for i in range(20))
    (tmp_path / "a.py").write_text(f"class Jobs:\n{methods}")
    (tmp_path / "b.py").write_text(f"class Events:\n{methods.replace('m', 'e')}")
    (tmp_path / "c.py").write_text(f"class Chat:\n{methods.replace('m', 'c')}")
    (tmp_path / "d.py").write_text(
        "import orchestrator.store.c\nfrom orchestrator.store import a\nfrom orchestrator.store.b import Events as E\n"
        "\n\nclass Store(a.Jobs, E, orchestrator.store.c.Chat):\n    def close(self): ...\n"
    )
    known = {f"orchestrator.store.{m}": tmp_path / f"{m}.py" for m in "abcd"}
    assert big_classes(known) == ["orchestrator.store.d.Store: 61"]


JOB_PATH = ("orchestrator.jobs", "orchestrator.git", "orchestrator.runners", "orchestrator.proc", "orchestrator.store",
            "orchestrator.core", "orchestrator.daemon", "orchestrator.api", "orchestrator.service.intake")  # fmt: skip


def test_no_function_on_the_job_path_over_80_lines():
    """A function on a job's path (from enqueue to landing) reads as named steps: none over 80 lines."""
    long = []
    for mod, path in modules().items():
        if not within(mod, JOB_PATH):
            continue
        for node in ast.walk(tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > 80:
                    long.append(f"{mod}.{node.name}: {lines}")
    assert long == []


@pytest.mark.parametrize(
    "line", ["from orchestrator.lab.doubles import ollama", 'importlib.import_module("orchestrator.lab.bench.load")']
)
def test_a_daemon_module_importing_the_lab_fails_the_rule(line, tmp_path):
    """The daemon never imports the lab (benchmarks, protocol doubles), not even by name: it sits above the
    daemon."""
    known = plant(modules(), tmp_path, "orchestrator.daemon", line)
    assert any("orchestrator.daemon " in f and "orchestrator.lab." in f for f in check(known))
