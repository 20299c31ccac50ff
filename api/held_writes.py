"""Store writes that outlast a storage fault: the job dispatcher's (planner.api.jobs)
result and re-queue writes that fail while the store refuses writes (disk full, read-only,
unreachable) are kept, and written in their order once it takes writes again, so a finished
job's answer is not lost. Other errors are no storage fault: they propagate (or, held back
already, are logged and dropped)."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

from planner.api.errors import StorageHealth

log = logging.getLogger("planner.api.jobs")


class HeldWrites:
    """Store writes held back by a storage fault (`health` records it), oldest first."""

    def __init__(self, health: StorageHealth) -> None:
        self.health = health
        # Store writes that failed on a storage fault, retried in order once it takes writes.
        self._unsaved: deque[Callable[[], object]] = deque()

    def save_held(self) -> None:
        """Write what a storage fault held back, oldest first; stop at the first failure."""
        while self._unsaved:
            try:
                self._unsaved[0]()
            except Exception as e:
                if self.health.failed(e) is not None:
                    return  # the store still fails: next loop
                log.exception("a held-back store write failed; dropped")
            self._unsaved.popleft()

    def write_or_keep(self, write: Callable[[], object]) -> None:
        """Run a store write; on a storage fault keep it for later (the job is not lost)."""
        if self._unsaved:  # keep the order: an earlier write is still waiting
            self._unsaved.append(write)
            return
        try:
            write()
        except Exception as e:
            if self.health.failed(e) is None:
                raise
            self._unsaved.append(write)
