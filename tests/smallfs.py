"""Filling a small file system (the `small_fs` fixture of conftest mounts one) for tests of a full disk."""

from __future__ import annotations

import os
from pathlib import Path


def fill(fs: Path, leave: int = 0) -> Path:
    """Fill `fs` up to `leave` free bytes; the filler file, to remove for room again."""
    filler = fs / "filler"
    st = os.statvfs(fs)
    with filler.open("ab") as f:
        f.write(b"\0" * max(st.f_bavail * st.f_frsize - leave, 0))
    return filler
