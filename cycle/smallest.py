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
from dataclasses import replace
from typing import Mapping

from cluster import names
from cluster.cache import ClusterCache
from solver import InvalidInput, PodGroup, SmallestChange, Snapshot, SolveOptions, place, smallest_change

from .status import StatusWriter

log = logging.getLogger("phalanx.cycle")

#: the search confirms each candidate change with the greedy packing (see the module's docstring)
OPTIONS = SolveOptions(path="greedy")


class SmallestChanges:
    def __init__(self, cache: ClusterCache, status: StatusWriter) -> None:
        self.cache = cache
        self.status = status
        self.texts: dict[str, str] = {}  # group -> the whole statement of its last smallest change
        # group -> (the cache's nodes_version, member count, whether it fits the empty cluster then)
        self.empty_fits: dict[str, tuple[int, int, bool]] = {}

    def never_fits(self, key: str) -> bool:
        """Whether ``key`` would not fit even on the empty cluster — every pod gone, nothing
        reserved: the change it waits for is its own (or new nodes), never room. Solved once per
        node set and member count (the dashboard asks on every poll)."""
        try:
            group = self.cache.podgroup(key)
        except InvalidInput:
            return False  # its explanation says what is wrong
        if group is None or not group.members:
            return False
        empty, version = self.cache.empty_snapshot()
        known = self.empty_fits.get(key)
        if known is None or known[:2] != (version, len(group.members)):
            fresh = replace(group, members=tuple(replace(p, node="") for p in group.members), finished=0)
            try:
                fits = bool(place(empty, fresh, OPTIONS).assignments)
            except InvalidInput:
                fits = True  # not a question of room: its explanation says what is wrong
            known = self.empty_fits[key] = (version, len(group.members), fits)
        return not known[2]

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
        self.empty_fits.pop(key, None)

    def prune(self, live: Mapping[str, object]) -> None:
        for table in (self.texts, self.empty_fits):
            for key in [k for k in table if k not in live]:
                del table[key]
