"""Saving a matplotlib figure where a user asked: one line for a path that cannot take it
(an unknown format, a missing folder, /proc), never a traceback; the figure is closed either
way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from planner.core.errors import InputError

FORMATS_HINT = "give a .png, .svg or .pdf path in a writable folder"


def save_figure(fig: Any, path: str | Path, dpi: int) -> Path:
    """`fig.savefig(path)`, then close it; InputError naming the path and what to do."""
    import matplotlib.pyplot as plt

    out = Path(path)
    try:
        fig.savefig(out, dpi=dpi)
    except ValueError as e:  # matplotlib: "Format 'xyz' is not supported ..."
        raise InputError(f"{out}: cannot draw it: {e}; {FORMATS_HINT}") from None
    except OSError as e:
        raise InputError(f"{out}: cannot write: {e.strerror or e}; {FORMATS_HINT}") from None
    finally:
        plt.close(fig)
    return out
