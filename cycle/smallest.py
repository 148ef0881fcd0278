"""The smallest change that makes a pending group fit, as the workload cycle reports it.

The solver computes it (``solver/smallest.py``) after a cycle found no placement and preemption did
not start: on the snapshot that cycle solved on (so it is measured against what the group was
refused on), with the greedy path — a change the greedy packing confirms the exact path confirms
too. The whole text is kept per group (``phalanx explain``, the dashboard), sent as a
``SmallestChange`` event when it changes, and its short form ends the ``PodGroupInitiallyScheduled``
message.

No verb waits for it. The search runs a few solves (~1 s for a gang short of room on 2,000 nodes,
measured by ``phalanx bench contention``), and the member's filter or PreFilter answer needs only
the refusal: :meth:`SmallestChanges.submit` hands it to this job's thread, which sends it to a
solver worker process (workers.py) and then writes the group's condition, event and listeners'
note (:meth:`StatusWriter.unschedulable`) once, with the change — as one write, the way the
refused cycle wrote it before. A later refusal of the same group replaces a search not started
yet; a search whose refusal is no longer the group's explanation (it was planned meanwhile, or
refused for another reason) writes nothing.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Mapping

from cluster import names
from cluster.cache import ClusterCache
from solver import (
    InvalidInput,
    PodGroup,
    SmallestChange,
    Snapshot,
    SolveOptions,
    SolverError,
    place,
    smallest_change,
    smallest_composite_change,
)
from solver.composite import Composite

from .lock import CycleLock
from .status import StatusWriter
from .workers import Solves, shared

log = logging.getLogger("phalanx.cycle")

#: the search confirms each candidate change with the greedy packing (see the module's docstring)
OPTIONS = SolveOptions(path="greedy")


@dataclass(frozen=True)
class Refusal:
    """A refused cycle whose condition waits for the smallest change."""

    group: PodGroup | Composite  # a composite's refusal is written on every PodGroup of its tree
    snapshot: Snapshot
    message: str  # the refusal: the group's explanation while the search runs
    reason: str  # the condition's reason


class SmallestChanges:
    def __init__(self, cache: ClusterCache, status: StatusWriter, lock: CycleLock,
                 explanations: Mapping[str, str], solves: Solves | None = None) -> None:
        """``lock`` and ``explanations``: the cycle's, read to tell whether a refusal still stands
        when its search ends; ``solves``: where searches run (the solver workers unless given)."""
        self.cache = cache
        self.status = status
        self.lock = lock
        self.explanations = explanations
        self.solves = solves or shared("smallest")
        self._pending: OrderedDict[str, Refusal] = OrderedDict()  # group -> its latest refusal
        self._busy = 0  # searches taken off _pending and not written yet
        self._idle = threading.Condition()
        self._thread: threading.Thread | None = None
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

    def find(self, group: PodGroup | Composite, snapshot: Snapshot) -> SmallestChange | None:
        """The smallest change for ``group`` (a composite: for its whole tree), which did not fit
        ``snapshot`` (off the lock; in a solver worker)."""
        search = smallest_composite_change if isinstance(group, Composite) else smallest_change
        try:
            return self.solves.run(search, snapshot, group, OPTIONS, self.cache.preemption_context())
        except InvalidInput as err:  # the cycle reported the group's own error already
            log.info("no smallest change for %s: %s", group.key, err)
            return None
        except SolverError as err:  # its worker died twice (workers.py): the refusal stands alone
            log.warning("no smallest change for %s: %s", group.key, err)
            return None

    # -- off the verbs -----------------------------------------------------------------------
    def submit(self, group: PodGroup | Composite, snapshot: Snapshot, message: str, reason: str) -> None:
        """``group`` was refused with ``message``: search its smallest change on this job's thread,
        then write the refusal with it (see the module's docstring); a composite's, on every
        PodGroup of its tree whose explanation it still is."""
        slot = f"compositepodgroup:{group.key}" if isinstance(group, Composite) else group.key
        with self._idle:
            self._pending[slot] = Refusal(group, snapshot, message, reason)
            self._pending.move_to_end(slot)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="phalanx-smallest-change", daemon=True)
                self._thread.start()
            self._idle.notify_all()

    def settle(self, timeout: float) -> bool:
        """Wait until every refusal submitted was searched and written (tests, benchmarks,
        shutdown); False when ``timeout`` passed first."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._pending and not self._busy, timeout)

    def _run(self) -> None:
        while True:
            with self._idle:
                self._idle.wait_for(lambda: bool(self._pending))
                _, refusal = self._pending.popitem(last=False)
                self._busy += 1
            try:
                self._search(refusal)
            except Exception:  # noqa: BLE001 - a search that fails must not stop the next ones
                log.exception("smallest change for %s failed", refusal.group.key)
            finally:
                with self._idle:
                    self._busy -= 1
                    self._idle.notify_all()

    def _search(self, refusal: Refusal) -> None:
        group = refusal.group
        keys = [leaf.key for leaf in group.leaves()] if isinstance(group, Composite) else [group.key]
        found = self.find(group, refusal.snapshot)
        with self.lock:
            for key in keys:
                if self.explanations.get(key) != refusal.message:
                    continue  # planned meanwhile, or refused again for another reason (its own search)
                change = self.record(key, found)
                message = f"{refusal.message}; smallest change: {change}" if change else refusal.message
                self.status.unschedulable(key, message, refusal.reason)

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
        with self._idle:
            self._pending.pop(key, None)

    def prune(self, live: Mapping[str, object]) -> None:
        for table in (self.texts, self.empty_fits):
            for key in [k for k in table if k not in live]:
                del table[key]
