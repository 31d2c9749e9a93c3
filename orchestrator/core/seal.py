"""A team job's order, sealed: what the enqueuing node asked for (what runs, where and how it lands), kept with an
HMAC under the team's secret, which the shared database never holds.

Anyone who can write the database (a job that reached it, a leaked password, the server's admin) can stop or
reorder the team's work, but a node runs only an order a node of the team sealed: a text, argv, runner, landing
policy, target branch or feedback changed in the database no longer verifies, and the node refuses the job
(`Code.UNVERIFIED`) instead of running it. Pure: the store computes and checks seals over the row it reads.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any

SECRET_ENV = "ORCHESTRATOR_TEAM_SECRET"
"""The team's secret, the same on every node, in each node's env file (never in the config, never in the
database; a job never sees it)."""
MIN_SECRET = 32
"""Characters a secret has at least (`openssl rand -hex 32` gives 64)."""

SEALED: tuple[str, ...] = (
    "id",
    "remote",
    "branch",
    "text",
    "argv",
    "runner",
    "land",
    "feedback",
    "plan_text",
    "author",
    "labels",
    "approved",
    "base",
    "result",
)
"""The columns of a job's row that make its order: the job, its shared repository and target branch, what runs
(its text or argv, its runner, a revision's feedback, the plan its agent starts from), who it is by (its commits'
author), where it may run (its labels), how it lands (its landing policy, and the result a person approved), and
what its node built it on (its base, its result: a revision goes on from them, and a push carries their history)."""


def seal(secret: bytes, row: Mapping[str, Any]) -> str:
    """The seal of a job's order: the HMAC-SHA256 of its `SEALED` columns as the row holds them."""
    order = json.dumps([row[k] for k in SEALED], ensure_ascii=False, separators=(",", ":"))
    return hmac.new(secret, order.encode(), hashlib.sha256).hexdigest()


def verifies(secret: bytes, row: Mapping[str, Any]) -> bool:
    """Whether the row's `seal` is its order's, under `secret` (compared in constant time)."""
    return hmac.compare_digest(str(row["seal"] or ""), seal(secret, row))


def problem(secret: str | None) -> str | None:
    """What is wrong with a node's team secret (None: nothing), and how to make one."""
    if not secret:
        return (
            f"team mode needs {SECRET_ENV}, the same on every node, in the service's env file (never in the "
            "config): make one with `openssl rand -hex 32`"
        )
    if len(secret) < MIN_SECRET:
        return f"{SECRET_ENV} has {len(secret)} characters; use at least {MIN_SECRET} (`openssl rand -hex 32`)"
    return None
