"""Bad input: one clear line naming the file, the field or node, and what to do."""

from __future__ import annotations

import json
from collections.abc import Mapping

from pydantic import ValidationError


class InputError(ValueError):
    """Raised for anything a user gave us that we cannot use. `str()` is the whole message.

    `field` names the request field at fault when there is one, in the request's own words
    (`budget`, `devices`, `resources.host_memory_bytes`, `options.slots`): `str()` then reads
    "field: detail". Code below the entry points names fields, never flags; each entry point
    says them in its own words with `renamed` (the CLI: `--budget`; JSON: `budget`).
    """

    def __init__(self, detail: str, *, field: str | None = None) -> None:
        self.detail = detail
        self.field = field
        super().__init__(f"{field}: {detail}" if field else detail)

    def renamed(self, words: Mapping[str, str]) -> InputError:
        """The same error with its field said in an entry point's words: the field's first
        part is looked up in `words` (`{"budget": "--budget"}`); unknown fields stay as they
        are."""
        if self.field is None:
            return self
        head, dot, rest = self.field.partition(".")
        if head not in words:
            return self
        return InputError(self.detail, field=words[head] + dot + rest)


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
    kind = str(first.get("type", ""))
    value = first.get("input")
    if kind.endswith(("_type", "_parsing", "_from_float")) and (
        value is None or isinstance(value, str | int | float | bool)
    ):
        msg += f" (got {json.dumps(value)})"  # "12" vs 12: say which the document holds
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


def json_error_position(document: str | bytes, offset: int) -> tuple[int, int]:
    """(line, column), both from 1, of a character offset into a JSON text (what
    json.JSONDecodeError.pos and FastAPI's `("body", pos)` location give)."""
    text = document.decode("utf-8", "replace") if isinstance(document, bytes) else document
    offset = max(0, min(offset, len(text)))
    line = text.count("\n", 0, offset) + 1
    column = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return line, column


def describe_json_decode_error(
    document: str | bytes | None, offset: int, reason: str, where: str = "body"
) -> str:
    """'body: not valid JSON (line 3, column 5: Expecting value)': one line, never an offset
    alone."""
    if document is None:
        return f"{where}: not valid JSON (character {offset + 1}: {reason})"
    line, column = json_error_position(document, offset)
    return f"{where}: not valid JSON (line {line}, column {column}: {reason})"
