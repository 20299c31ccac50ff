"""Reading a JSON file a user named: one line naming the file and what is wrong (no such file,
a directory, unreadable, not JSON with the line and column). A leaf: graph, plan and resources
readers all use it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from planner.core.errors import InputError


def read_json(path: str | Path) -> Any:
    path = Path(path)
    if path.exists() and not path.is_file() and not path.is_dir():
        # a device or FIFO: /dev/zero and /dev/urandom never end (info hung on them)
        raise InputError(f"{path}: not a regular file; give a JSON file")
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, expected a JSON file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read: {e}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
