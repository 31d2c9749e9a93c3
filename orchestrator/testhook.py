"""Named points where a test may pause the daemon between two awaits, to make a race deterministic.

Production code calls `await reach("name", job_id)` at the await points where interleavings matter (between a
read and the write that acts on it); with nothing installed that is one dict lookup. A test installs an async
callable for a name (`install`) and so decides what runs in between, instead of sleeping and hoping.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

Hook = Callable[[str, int | None], Awaitable[None]]

_hooks: dict[str, Hook] = {}


async def reach(name: str, job_id: int | None = None) -> None:
    hook = _hooks.get(name) or _hooks.get("*")
    if hook is not None:
        await hook(name, job_id)


def install(name: str, hook: Hook) -> None:
    """Call `hook(name, job_id)` at every `reach(name, ...)`; name `*` is every point without a hook of its own."""
    _hooks[name] = hook


def clear() -> None:
    _hooks.clear()
