"""The collector's full passes, kept off the scheduling path's tail.

A full (generation 2) pass of CPython's cyclic garbage collector scans every tracked object while
it holds the interpreter lock: with the cache of a 2,000-node cluster (~100,000 objects) that is
150–220 ms on 2 busy cores, during which no filter or bind call progresses — the largest part of
a filter call's p99 while another group's preemption plan allocates heavily (``phalanx bench
contention``). The objects of a synced cache are long-lived and mostly acyclic, so scanning them
again and again finds nothing.

So once the caches are synced the heap is *settled*: everything alive is moved to the collector's
permanent generation (``gc.freeze``); later passes scan only what was made since. Objects frozen
are still freed by reference counting; only cycles among them wait. Every
:data:`REFREEZE_INTERVAL` the requeue thread unfreezes, runs one full pass (reclaiming those
cycles: one pause per interval instead of whenever allocation counts trip) and freezes again.
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Callable

log = logging.getLogger(__name__)

REFREEZE_INTERVAL = 600.0  # seconds between full passes over the frozen heap


class Heap:
    def __init__(self, clock: Callable[[], float] = time.monotonic, interval: float = REFREEZE_INTERVAL) -> None:
        self.clock, self.interval = clock, interval
        self.settled_at: float | None = None  # None: not settled (a process that never synced)

    def settle(self) -> None:
        """Freeze what is alive now (called once the caches are synced)."""
        gc.freeze()
        self.settled_at = self.clock()

    def tick(self) -> bool:
        """From the requeue thread: past the interval, one full pass and freeze again. True when it ran."""
        if self.settled_at is None or self.clock() - self.settled_at < self.interval:
            return False
        started = time.perf_counter()
        gc.unfreeze()
        found = gc.collect()
        self.settle()
        log.debug("full collection: %d unreachable, %.0f ms", found, (time.perf_counter() - started) * 1000)
        return True
