"""A value derived once per `Snapshot` object (pure): admission reads one snapshot many times while it decides, and
what it derives from the whole snapshot (its index, the chains between its jobs) is built on the first read and
forgotten with the snapshot."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

from orchestrator.core.models import Snapshot

T = TypeVar("T")


class PerSnapshot(Generic[T]):
    """`build(snapshot)`, called once per snapshot object; its value dropped when the snapshot is."""

    def __init__(self, build: Callable[[Snapshot], T]) -> None:
        self._build = build
        self._by: dict[int, tuple[weakref.ref[Snapshot], T]] = {}

    def __call__(self, snapshot: Snapshot) -> T:
        key = id(snapshot)
        hit = self._by.get(key)
        if hit is not None and hit[0]() is snapshot:
            return hit[1]
        value = self._build(snapshot)

        def forget(ref: weakref.ref[Snapshot], key: int = key) -> None:
            entry = self._by.get(key)
            if entry is not None and entry[0] is ref:
                del self._by[key]

        self._by[key] = (weakref.ref(snapshot, forget), value)
        return value

    def clear(self) -> None:
        """Forget every value (for benchmarks that measure cold calls)."""
        self._by.clear()
