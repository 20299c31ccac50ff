"""Writing the files a user named (-o, --csv, --json-out, --png, --plot): checked before any
work starts, written atomically where that is safe, one line on failure, no `.tmp` left behind.

Atomic writes rename a temporary file over the target; that is right for a regular file (or a
new one) and wrong for anything else: `solve -o /dev/full` run as root replaced the device
node with a regular file and exited 0. A path that exists and is not a regular file (a device,
a FIFO) is written in place, and its errors (ENOSPC from /dev/full) are reported."""

from __future__ import annotations

import os
from pathlib import Path

from planner.core.errors import InputError

# what matplotlib writes (its canvas's file types), so a --png/--plot path is checked up front
FIGURE_SUFFIXES = frozenset({"png", "svg", "svgz", "pdf", "jpg", "jpeg", "eps", "ps", "tif",
                             "tiff", "webp", "gif", "pgf", "raw", "rgba", "avif"})


def check_output_path(path: Path | None, what: str = "output") -> None:
    """One line now, not after the work, when `path` cannot be written: a missing or
    read-only folder, a directory in its place."""
    if path is None:
        return
    if path.is_dir():
        raise InputError(f"{path}: is a directory; give a file name for the {what}")
    if path.exists():
        if not os.access(path, os.W_OK):
            raise InputError(f"{path}: not writable; give another path for the {what}")
        return
    folder = path.parent
    if not folder.is_dir():
        raise InputError(f"{path}: no such folder {folder}; create it or give another path "
                         f"for the {what}")
    if not os.access(folder, os.W_OK):
        raise InputError(f"{path}: folder {folder} is not writable; give another path for "
                         f"the {what}")


def check_figure_path(path: Path | None, what: str = "plot") -> None:
    """`check_output_path`, and a file type matplotlib can draw."""
    if path is None:
        return
    suffix = path.suffix.lower().lstrip(".")
    if suffix not in FIGURE_SUFFIXES:
        kind = path.suffix or "a file without a suffix"
        raise InputError(f"{path}: cannot draw a {what} as {kind}; give a .png, .svg or .pdf "
                         "path")
    check_output_path(path, what)


def write_text(path: str | Path, text: str) -> None:
    """`text` into `path`: atomically for a regular or new file, in place otherwise (see the
    module's docstring); InputError naming the path on failure, the temporary file removed."""
    path = Path(path)
    if path.exists() and not path.is_file():
        try:
            with open(path, "w") as fh:
                fh.write(text)
        except OSError as e:
            raise InputError(f"{path}: cannot write: {e.strerror or e}") from None
        return
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    except OSError as e:
        if tmp.is_file():
            tmp.unlink()
        raise InputError(f"{path}: cannot write: {e.strerror or e}") from None
