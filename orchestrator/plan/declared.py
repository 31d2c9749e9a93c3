"""The declared claim: the paths a person named with `--path`. The strongest source of all."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.core import claims
from orchestrator.core.models import Claim, ClaimSource


def claim(declared: Sequence[str]) -> Claim:
    """Declared paths become a confident claim; none at all is the empty (ambiguous) claim."""
    if not declared:
        return Claim()
    return Claim(claims.normalize_all(declared), 1.0, ClaimSource.DECLARED)
