"""The placement record as a reservation, while a gang is partly bound and no plan holds it.

The record (annotation ``scheduling.phalanx.dev/placement`` on the PodGroup) is written before the
first member binds. When binding stops half way — ``phalanx serve`` killed, the API server restarted
mid-binding, a bind call failing — the plan that held the gang's capacity is gone, yet some members
are bound and the rest must go to their recorded nodes. Until they are back in a filter call, other
groups must not be planned onto those nodes: without this, a companion gang planned first after a
restart takes the recorded room, the record no longer fits and the gang stays partly bound (seen in
the fault suite: an API server restart while 3 of 16 were bound; ``phalanx serve`` killed just after
the record was written).

So every gang with a record, at least one member bound and pending members named in the record
holds its recorded nodes for those members (their requests), exactly as a plan would, until the
members bind, the record is abandoned (it no longer fits) or the PodGroup goes. The group's own
cycle does not see its own hold (it resumes from the record).

Refreshed lazily: cache events only mark groups dirty (no cycle lock on the watch thread); the
cycle recomputes the dirty ones under its lock before it reads reservations.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterable

from cluster.cache import ClusterCache
from cluster.convert import placement_record
from solver import InvalidInput
from solver.model import Policy, placement_usage

Usage = dict[str, dict[str, int]]


class RecordedHolds:
    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache
        self._lock = threading.Lock()
        self._dirty: set[str] = set(cache.podgroups)
        self._all_dirty = False
        self.held: dict[str, Usage] = {}  # group -> node -> requests held for its pending members
        self._abandoned: dict[str, str] = {}  # group -> the record text it gave up (until it changes)

    # -- marking (any thread, never the cycle's lock) -------------------------------------------
    def mark(self, key: str) -> None:
        with self._lock:
            self._dirty.add(key)

    def mark_held(self) -> None:
        """A pod went away (its group unknown): look at every group that holds something again."""
        with self._lock:
            self._all_dirty = True

    def abandon(self, key: str) -> None:
        """The group's record no longer fits and is being removed: hold nothing for it from now on
        (the cache shows the annotation until the removal lands)."""
        record = self.cache.podgroups.get(key)
        text = record.placement if record else ""
        with self._lock:
            self._abandoned[key] = text
            self._dirty.add(key)

    def forget(self, key: str) -> None:
        with self._lock:
            self._dirty.add(key)
            self._abandoned.pop(key, None)

    def prune(self, live: Collection[str]) -> None:
        """Look again at every group held or abandoned, dropping the ones not in ``live`` (a
        re-list sends no DELETED event)."""
        with self._lock:
            self._all_dirty = True
            for key in [k for k in self._abandoned if k not in live]:
                del self._abandoned[key]

    def __len__(self) -> int:
        with self._lock:
            return len(self.held) + len(self._dirty) + len(self._abandoned)

    # -- reading (under the cycle's lock) ---------------------------------------------------------
    def refresh(self) -> bool:
        """Recompute the dirty groups; True when what is held changed."""
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            if self._all_dirty:
                dirty |= set(self.held)
                self._all_dirty = False
        changed = False
        for key in dirty:
            usage = self._usage(key)
            if usage:
                changed |= self.held.get(key) != usage
                self.held[key] = usage
            elif self.held.pop(key, None) is not None:
                changed = True
        return changed

    def usage(self, skip: Callable[[str], bool]) -> Iterable[Usage]:
        return [usage for key, usage in self.held.items() if not skip(key)]

    def _usage(self, key: str) -> Usage:
        record = self.cache.podgroups.get(key)
        if record is None:
            with self._lock:
                self._abandoned.pop(key, None)
            return {}
        if record.spec.policy is not Policy.GANG:
            return {}
        text = record.placement
        with self._lock:
            if key in self._abandoned:
                if self._abandoned[key] == text:
                    return {}
                del self._abandoned[key]  # a new record: it holds again
        try:
            recorded = placement_record(record.placement)
        except InvalidInput:
            return {}  # malformed: the group's next cycle abandons it
        if recorded is None:
            return {}
        members = self.cache.members(key)
        if not any(m.pod.node for m in members):
            return {}  # nothing bound: all-or-nothing holds, the gang may be planned afresh
        held = {m.pod.uid: recorded.pods[m.pod.name] for m in members
                if not m.pod.node and m.pod.name in recorded.pods}
        requests = {m.pod.uid: m.pod.spec.requests for m in members if m.pod.uid in held}
        return placement_usage(held, requests)
