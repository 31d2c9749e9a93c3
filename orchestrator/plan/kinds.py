"""What kind of file a path is, by its name alone (pure): a test, a doc, a config file or source.

The planner ranks, focuses and calibrates by these kinds (`rank`, `focus`, `score`, `record`).
"""

from __future__ import annotations

import posixpath
import re

_TEST_DIR = re.compile(r"(^|/)(tests?|testing|spec|__tests__)/")
_DOC_DIR = re.compile(r"(^|/)(docs?|documentation|examples?)/")
_DOC_EXT = (".rst", ".md", ".adoc")


def is_test(path: str) -> bool:
    base = posixpath.basename(path)
    return bool(
        _TEST_DIR.search(path)
        or base.startswith("test_")
        or re.search(r"(_test|_spec|\.test|\.spec|_tests)\.\w+$", base)
        or base in ("conftest.py", "tests.py")
    )


def is_doc(path: str) -> bool:
    return bool(_DOC_DIR.search(path)) or path.endswith(_DOC_EXT)


CLASSES = ("source", "test", "doc", "config")
"""Kinds of path the record learns escapes for apart (`path_class`)."""
_CONFIG = re.compile(
    r"(^|/)(\.github|\.circleci|\.gitlab|requirements)/|(^|/)[^/]*(requirements[^/]*\.(txt|in)|\.toml|\.cfg|\.ini|"
    r"\.ya?ml|\.lock|Makefile|Dockerfile|setup\.py|noxfile\.py|tox\.ini|\.pre-commit-config\.yaml)$"
)


def path_class(path: str) -> str:
    """`test`, `doc`, `config` (CI, manifests, tool settings) or `source`."""
    if is_test(path):
        return "test"
    if is_doc(path):
        return "doc"
    return "config" if _CONFIG.search(path) else "source"
