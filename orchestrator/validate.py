"""Checking what a client sent (a JSON request, a spooled ticket): each problem is a BadRequest that says what
to send instead. Shared by the API, the hook's intake and the job verbs, so a request is checked one way.
"""

from __future__ import annotations

from typing import Any

INT_MIN, INT_MAX = -(2**63), 2**63 - 1
"""What SQLite stores in an INTEGER column: anything bigger is a request error, not a server error."""
MAX_IDS = 10_000
"""Job ids one request may name (`POST /wait`, `--after`): more is refused at once, not worked through."""


class BadRequest(ValueError):
    """The request is malformed; the message says what to send instead."""


def text(value: str, name: str) -> str:
    """`value` if it is text that can be stored (UTF-8); a lone surrogate (from bytes that were not UTF-8, or a
    broken JSON escape) is refused with its position."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise BadRequest(
            f"field {name!r} is not valid text: character {e.start} is {value[e.start]!r}, which is not Unicode "
            "(bytes that are not UTF-8?); send UTF-8 text"
        ) from None
    return value


def field(
    data: dict[str, Any], name: str, typ: type | tuple[type, ...], default: Any = None, required: bool = False
) -> Any:
    if name not in data or data[name] is None:
        if required:
            raise BadRequest(f"missing field {name!r}")
        return default
    value = data[name]
    if isinstance(value, bool) and typ is not bool:
        raise BadRequest(f"field {name!r} has the wrong type")
    if not isinstance(value, typ):
        raise BadRequest(f"field {name!r} has the wrong type: expected {getattr(typ, '__name__', typ)}")
    if isinstance(value, int) and not INT_MIN <= value <= INT_MAX:
        raise BadRequest(f"field {name!r} is out of range: use a number between {INT_MIN} and {INT_MAX}")
    if isinstance(value, str):
        text(value, name)
    return value


def str_list(data: dict[str, Any], name: str) -> list[str]:
    value = field(data, name, list, default=[])
    if not all(isinstance(v, str) for v in value):
        raise BadRequest(f"field {name!r} must be a list of strings")
    for v in value:
        text(v, name)
    return list(value)


def int_list(data: dict[str, Any], name: str, limit: int = MAX_IDS) -> list[int]:
    value = field(data, name, list, default=[])
    if len(value) > limit:
        raise BadRequest(f"field {name!r} names {len(value)} jobs; at most {limit} at once (send several requests)")
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= INT_MAX for v in value):
        raise BadRequest(f"field {name!r} must be a list of job ids")
    return list(value)


def job_id(raw: str) -> int:
    """A job id from a URL."""
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"job id must be a number, got {raw!r}") from None
    if not 0 <= value <= INT_MAX:
        raise BadRequest(f"job id {raw} is out of range") from None
    return value
