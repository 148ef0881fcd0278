"""The smallest change that makes a pending group fit, as the workload cycle reports it.

The solver computes it (``solver/smallest.py``) after a cycle found no placement and preemption did
not start: off the cycle's lock, on the snapshot that cycle solved on (so it is measured against
what the group was refused on), with the greedy path — the search runs a few solves, a filter
call waits for them, and a change the greedy packing confirms the exact path confirms too. The
whole text is kept per group (``phalanx explain``, the dashboard), sent as a ``SmallestChange``
event when it changes, and its short form ends the ``PodGroupInitiallyScheduled`` message.
"""

from __future__ import annotations

import logging
from typing import Mapping

from cluster import names
from cluster.cache import ClusterCache
from solver import InvalidInput, PodGroup, SmallestChange, Snapshot, SolveOptions, smallest_change

from .status import StatusWriter

log = logging.getLogger("phalanx.cycle")

#: the search confirms each candidate change with the greedy packing (see the module's docstring)
OPTIONS = SolveOptions(path="greedy")


class SmallestChanges:
    def __init__(self, cache: ClusterCache, status: StatusWriter) -> None:
        self.cache = cache
        self.status = status
        self.texts: dict[str, str] = {}  # group -> the whole statement of its last smallest change

    def find(self, group: PodGroup, snapshot: Snapshot) -> SmallestChange | None:
        """The smallest change for ``group``, which did not fit ``snapshot`` (off the lock)."""
        try:
            return smallest_change(snapshot, group, OPTIONS, self.cache.preemption_context())
        except InvalidInput as err:  # the cycle reported the group's own error already
            log.info("no smallest change for %s: %s", group.key, err)
            return None

    def record(self, key: str, found: SmallestChange | None) -> str:
        """Keep ``found`` for ``key`` (lock held); an event when it changed. Returns the short form
        for the condition ("" when nothing was found)."""
        if found is None or not found.changes:
            self.texts.pop(key, None)
            return ""
        text = found.message()
        if self.texts.get(key) != text:
            self.texts[key] = text
            self.status.event(key, names.EVENT_SMALLEST_CHANGE, text)
        return found.short()

    def forget(self, key: str) -> None:
        self.texts.pop(key, None)

    def prune(self, live: Mapping[str, object]) -> None:
        for key in [k for k in self.texts if k not in live]:
            del self.texts[key]
