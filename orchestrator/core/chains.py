"""Jobs made on top of one another: a job that needs what an earlier job is making waits for it. Pure, no I/O.

A user queues a series ("add the h2 parser", then "h2: flow control", then "h2: tests"). The later ones cannot
be planned against files that do not exist yet: their plans name nothing of what the first one creates, so claims
alone run them side by side and each later one conflicts with (or, replayed, breaks) the first. What the product
can know is the words: a later job's text names something its base does not have (a module, an identifier, a
topic word no file of the base uses, or only a few do, and hardly a change of its history named), and an earlier
job's text, or a path it claims or has
created, names it too. Such a job waits for that earlier job to end (to land, or to fail) before it starts.

- `words(text)`: the terms of a text (words lower-cased, and the parts of `snake_case`, `CamelCase`, `a-b` and
  `path/names.py`), common English and code words left out.
- `coined(text, used)`: the terms of a text its base does not have (`used(term)`: how many of the base's files use
  it), computed when the job is planned (`Claim.coined`).
- `links(jobs)` (`of(snapshot)`): per job, the earlier unfinished jobs of its repository and branch it needs, with
  the words that say so, and `Link.message` for `why` (admission's Dependency check).
- `named(job, moved)`: the paths its branch moved in whose names say one of its new words: it is planned again
  (admission's BaseMoved check), so that its claim names what it waited for.

Only an earlier job (queue order) can be needed, and only while it has not ended: a job queued once the first has
landed is planned on a base that has the word, and needs nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache

from orchestrator.core.models import JobView, Snapshot
from orchestrator.core.snapcache import PerSnapshot

RARE = 4
"""A term used by at most this many files of the base is new to it (a word a few docs name in passing, as
gunicorn's settings page named h2c before its support came, says little about where the code is)."""
SAID = 2
"""A term at most this many subjects of the base's history name is new to it (a word or two from a distant past)."""
SHOWN = 3
"""Words shown in a message."""

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_]*(?:[-'][A-Za-z0-9_]+)*")
_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")
_COMMON = frozenset(
    """about above add added adds after again all also and any are around as at be because been before being below
    between both but by can cannot case change changed changes check could did do does doing done down during each
    either else end even every few fix fixed fixes for from further get had has have having here how if in instead
    into is it its just keep like make makes many may more most much must need needs new no nor not now of off old
    on once one only or other our out over own per rather same see should so some still such than that the their
    them then there these they this those through to too under until up update updated updates use used uses using
    very via was way we were what when where which while who why will with without would yet you your
    self cls def class return import none true false pass elif try except finally lambda yield raise assert
    print len str int isinstance super init var let const function null undefined void public private static
    bump version release merge pull request branch main master wip typo docs doc test tests readme changelog
    adding improve improves improved improving refactor cleanup clean remove removed rename support allow ensure
    handle avoid drop minor small missing correct correctly properly better simplify tweak tweaks various""".split()  # noqa: SIM905 - a word list reads better as prose
)
"""Words any change's text may use whatever it is about: they never say what a change makes."""


def _terms(word: str) -> list[str]:
    low = word.lower()
    out = [low] if len(low) > 2 and low not in _COMMON else []
    for chunk in re.split(r"[-_']", word):
        parts = [chunk] if chunk.islower() or chunk.isupper() else _CAMEL.findall(chunk)
        out += [p.lower() for p in parts if len(p) > 2 and p.lower() not in _COMMON and p.lower() not in out]
    return out


@lru_cache(maxsize=8192)
def words(text: str) -> frozenset[str]:
    """The terms of `text`: each word lower-cased, and its parts (`InvalidH2CPreface` → `invalid`, `preface`, ...;
    `prior-knowledge` → `prior`, `knowledge`; `tests/_plugins/x.py` → `tests`, `plugins`, `x`), common words out."""
    return frozenset(t for w in _WORD.findall(text) for t in _terms(w))


def path_words(paths: Iterable[str]) -> frozenset[str]:
    """The terms of paths' names (a path a job claims or created names what it makes)."""
    return frozenset(t for p in paths for t in words(p.replace(".", " ").replace("/", " ")))


def naming(text: str) -> str:
    """What of a job's text names things: its subject (first line), and of the rest only what is written as code
    (`snake_case`, `CamelCase`, `a.b`, `a/b`, `backticked`). A body's prose names a great many words a base uses
    rarely (a couple of hundred files seldom say "older" or "stays"), and two bodies share some by chance."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip() and not _TRAILER.match(ln)]
    if not lines:
        return ""
    body = _LINKS.sub(" ", "\n".join(lines[1:]))
    return " ".join([lines[0], *_CODE.findall(body), *_TICKED.findall(body)])


_CODE = re.compile(r"(?<![A-Za-z0-9_])[A-Za-z0-9_]*(?:_[A-Za-z0-9]|[a-z][A-Z]|\.[a-z]|/[A-Za-z_])[\w./]*")
"""A word written as code. It starts where a run of word characters does (what a later start would find, the run's
start finds too): from every offset of a long word it took seconds on 10,000 letters."""
_TICKED = re.compile(r"`([^`\n]+)`")
_TRAILER = re.compile(r"^\s*[A-Za-z][\w-]*-by:\s", re.I)
_LINKS = re.compile(r"(?<!\S)\S+://\S+|(?<!\S)\S+@\S+")
"""Addresses and links (a bot's body lists a dozen): they name other sites, not what the change makes. Looked for from
a word's start only (what a later start would find, the word's start finds too): from every offset, a long word took
seconds."""


def coined(
    text: str, used: Callable[[str], int], said: Callable[[str], int] = lambda t: 0, rare: int = RARE
) -> frozenset[str]:
    """The terms `text` names (`naming`) its base does not have: used by at most `rare` of its files (`used`), and
    by at most `SAID` of its history's subjects (`said`: a word its changes keep naming is a topic of the repository,
    though its code may seldom spell it: pip-tools' "coverage")."""
    return frozenset(t for t in words(naming(text)) if used(t) <= rare and said(t) <= SAID)


@dataclass(frozen=True, slots=True)
class Link:
    """What a waiting job needs: the earlier jobs making something its text names, and the words that say so."""

    needs: tuple[int, ...]
    words: tuple[str, ...]

    def message(self) -> str:
        """`needs what job 22 is making (h2c, negotiation): its base has no such thing yet`, for `why`."""
        ids = ", ".join(str(i) for i in self.needs)
        said = ", ".join(self.words[:SHOWN]) + (
            f" and {len(self.words) - SHOWN} more" if len(self.words) > SHOWN else ""
        )
        who = f"job {ids} is" if len(self.needs) == 1 else f"jobs {ids} are"
        return (
            f"needs what {who} making ({said}: its text names {'it' if len(self.words) == 1 else 'them'}, "
            f"its base has no such thing yet)"
        )


def named(job: JobView, paths: Iterable[str]) -> list[str]:
    """The paths of `paths` (its branch moved in them since it was planned) whose names say a word its text named as
    new: the thing it needs has come (the job it waited for landed it), and a plan on the new head can claim it."""
    want = job.claim.coined
    return sorted(p for p in paths if want & path_words((p,))) if want else []


def makes(job: JobView) -> frozenset[str]:
    """The terms of what `job` makes: its text's new terms, and the names of the paths it claims or touched."""
    try:
        return _makes(job.claim.coined, job.claim.paths, job.actual)
    except TypeError:  # a field given as a list or set: unhashable, so derive without the cache
        return frozenset(job.claim.coined) | path_words({*job.claim.paths, *job.actual})


@lru_cache(maxsize=16384)
def _makes(coined: frozenset[str], paths: frozenset[str], actual: frozenset[str]) -> frozenset[str]:
    return coined | path_words(paths | actual)


def links(jobs: Iterable[JobView]) -> Mapping[int, Link]:
    """For each job with new terms, the earlier jobs (queue order, same repository and branch) among `jobs` whose
    text or paths name one of them. `jobs`: the unfinished jobs (active, waiting, held); one that ended needs
    nothing more of a job that follows it."""
    by_branch: dict[tuple[str, str], list[JobView]] = {}
    for j in jobs:
        by_branch.setdefault((j.repo, j.branch), []).append(j)
    out: dict[int, Link] = {}
    for group in by_branch.values():
        group.sort(key=lambda j: j.order_key)
        seen: dict[str, list[int]] = {}
        """term → the earlier jobs making it."""
        for j in group:
            want = j.claim.coined
            if want:
                hit = {t: seen[t] for t in want if t in seen}
                if hit:
                    ids = sorted({i for ids in hit.values() for i in ids})
                    out[j.id] = Link(tuple(ids), tuple(sorted(hit)))
            for t in makes(j):
                seen.setdefault(t, []).append(j.id)
    return out


_LINKS_OF: PerSnapshot[Mapping[int, Link]] = PerSnapshot(
    lambda s: links((*s.active, *s.elsewhere, *s.waiting, *s.held))
)


def of(snapshot: Snapshot) -> Mapping[int, Link]:
    """`links` of every unfinished job of `snapshot` (active, elsewhere, waiting, held), once per snapshot object."""
    return _LINKS_OF(snapshot)
