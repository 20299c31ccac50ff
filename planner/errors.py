"""Bad input: one clear line naming the file, the field or node, and what to do."""

from __future__ import annotations

from pydantic import ValidationError


class InputError(ValueError):
    """Raised for anything a user gave us that we cannot use. `str()` is the whole message."""


class NoPlanFits(RuntimeError):
    """No plan of the methods tried fits the budget; carries the smallest budget that worked."""

    def __init__(self, message: str, smallest_feasible_bytes: int | None):
        super().__init__(message)
        self.smallest_feasible_bytes = smallest_feasible_bytes


def describe_validation_error(err: ValidationError, document: object | None = None) -> str:
    """First error of a pydantic ValidationError as 'nodes[3] (id 7, conv1).compute_ms: ...'."""
    first = err.errors()[0]
    loc = first.get("loc", ())
    where = _format_loc(loc, document)
    msg = first.get("msg", "invalid")
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    more = f" (and {err.error_count() - 1} more problems)" if err.error_count() > 1 else ""
    return f"{where}: {msg}{more}" if where else f"{msg}{more}"


def _format_loc(loc: tuple[int | str, ...], document: object | None) -> str:
    parts: list[str] = []
    cursor = document
    for item in loc:
        if isinstance(item, int):
            label = f"[{item}]"
            if isinstance(cursor, list) and 0 <= item < len(cursor):
                cursor = cursor[item]
                if isinstance(cursor, dict) and "id" in cursor:
                    name = cursor.get("name")
                    label += f" (id {cursor['id']}{', ' + str(name) if name else ''})"
            else:
                cursor = None
            parts.append(label)
        else:
            cursor = cursor.get(item) if isinstance(cursor, dict) else None
            parts.append(("." if parts else "") + str(item))
    return "".join(parts)
