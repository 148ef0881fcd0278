"""The collector's full passes, kept off the scheduling path's tail; freed memory handed back.

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

Freed memory is handed back to the system once a minute (:meth:`Heap.release`, glibc's
``malloc_trim(0)``), and soon after a burst: every :data:`GROWTH_CHECK_INTERVAL` the resident size
is read, and once it has grown by :data:`GROWTH_FACTOR` (and at least :data:`GROWTH_MIN_BYTES`) over
what the last trim left, it is trimmed at once (:meth:`Heap.release_if_grown`). ``phalanx serve``
runs some 300 threads (HTTP connections, watches, the binder, dispatchers, gRPC workers); glibc
gives threads that allocate at once arenas of their own and keeps what is freed in them for reuse. A
burst — every watch re-listing after the API server came back, a 64-pod gang binding — leaves the
resident size at its peak long after the objects are gone. Measured in the network-fault benchmark
(extender mode): serve at 272 MiB after such steps from a 148 MiB baseline; one ``malloc_trim(0)``
in the process brought it to 199 MiB. With the trim once a minute only, the same faults still found
serve at 250–254 MiB at rest three times, back at 195 MiB after the next trim: a trim after growth
catches such a peak within seconds. A trim takes milliseconds, up to ~150 ms on a large fragmented
heap (each arena locked in turn), so it is not run on a short fixed period. Where the C library has
no ``malloc_trim`` (musl, macOS) nothing is done. (Capping glibc's arenas at 2 as well was tried and
taken out: extender mode's throughput beside in-tree fell in every gang case of one side-by-side
round.)

glibc also keeps, in each thread, a cache of freed chunks (*tcache*: up to 7 of each of 64 sizes,
~240 KiB a thread) that it counts as in use, so no trim hands it back. serve's ~300 threads fill
theirs slowly, as each comes to serve every kind of call: in the simulated soak the C allocator's
in-use bytes rose from 27 to 54 MiB over 22 minutes, slowing, with Python's own allocations flat
(``tracemalloc``: 26–28 MiB throughout); with the cache off (``GLIBC_TUNABLES=
glibc.malloc.tcache_count=0``) they stayed at 27 MiB. So ``phalanx serve`` and ``phalanx bench``
start with it off (:func:`allocator_env`: the process re-executes itself once with the variable
set, which glibc reads only at start; the image sets it, so no re-execution happens there). A
``GLIBC_TUNABLES`` that already names ``tcache_count`` is left as it is.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import time
from typing import Callable

log = logging.getLogger(__name__)

#: glibc's tunable of the per-thread cache's depth, and serve's value (see the module's doc)
TUNABLES_VARIABLE = "GLIBC_TUNABLES"
TCACHE_TUNABLE = "glibc.malloc.tcache_count"
TCACHE_COUNT = 0

REFREEZE_INTERVAL = 600.0  # seconds between full passes over the frozen heap
GROWTH_CHECK_INTERVAL = 5.0  # seconds between looks at the resident size
GROWTH_FACTOR = 1.15  # resident size over what the last trim left that makes a trim at once
GROWTH_MIN_BYTES = 16 << 20  # ... and at least this much over it


def malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the process's C library has none."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def allocator_env(environ: dict[str, str], libc: str) -> dict[str, str] | None:
    """The environment to re-execute with so glibc keeps no per-thread cache of freed chunks, or
    None: ``libc`` (``os.confstr("CS_GNU_LIBC_VERSION")``) is not glibc, or ``GLIBC_TUNABLES``
    already names the tunable (the operator's choice, or this process re-executed)."""
    if not libc.startswith("glibc"):
        return None
    tunables = environ.get(TUNABLES_VARIABLE, "")
    if TCACHE_TUNABLE in tunables:
        return None
    setting = f"{TCACHE_TUNABLE}={TCACHE_COUNT}"
    return {**environ, TUNABLES_VARIABLE: f"{tunables}:{setting}" if tunables else setting}


def libc_name() -> str:
    """This process's C library and version ("glibc 2.36"), or "" where it does not say."""
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError, AttributeError):
        return ""


def resident_bytes() -> int:
    """This process's resident set size (``/proc/self/statm``); 0 where it cannot be read."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class Heap:
    def __init__(self, clock: Callable[[], float] = time.monotonic, interval: float = REFREEZE_INTERVAL,
                 returned: Callable[[int], None] | None = None,
                 trim: Callable[[int], int] | None = malloc_trim(),
                 resident: Callable[[], int] = resident_bytes) -> None:
        """``returned``: told the bytes each :meth:`release` gave back (a metric)."""
        self.clock, self.interval = clock, interval
        self.settled_at: float | None = None  # None: not settled (a process that never synced)
        self._returned, self._trim, self._resident = returned, trim, resident
        self._floor = 0  # resident bytes the last trim left (0: none yet)
        self._looked_at = float("-inf")  # when release_if_grown last read the resident size

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

    def release(self) -> int:
        """From the requeue thread, once a minute (and after growth, :meth:`release_if_grown`):
        hand the C allocator's free memory back to the system. Returns the bytes the resident size
        fell by (0 where there is no ``malloc_trim``).
        ctypes lets go of the interpreter lock for the call; the allocator takes each arena's lock
        in turn, so a thread allocating meanwhile waits for that arena only."""
        if self._trim is None:
            return 0
        before = self._resident()
        self._trim(0)
        self._floor = self._resident()
        returned = max(0, before - self._floor)
        if returned and self._returned is not None:
            self._returned(returned)
        return returned

    def release_if_grown(self) -> int:
        """From the requeue thread on every pass: at most every :data:`GROWTH_CHECK_INTERVAL`, read
        the resident size and :meth:`release` when it grew past what the last trim left (the first
        look only notes it). Returns the bytes handed back (0 when no trim ran)."""
        now = self.clock()
        if self._trim is None or now - self._looked_at < GROWTH_CHECK_INTERVAL:
            return 0
        self._looked_at = now
        resident = self._resident()
        if not self._floor:
            self._floor = resident
            return 0
        if resident < self._floor * GROWTH_FACTOR or resident - self._floor < GROWTH_MIN_BYTES:
            return 0
        return self.release()

    def next_look(self) -> float:
        """Seconds until :meth:`release_if_grown` reads the resident size again (the requeue
        thread wakes for it; never where there is no ``malloc_trim``)."""
        if self._trim is None:
            return float("inf")
        return max(0.0, GROWTH_CHECK_INTERVAL - (self.clock() - self._looked_at))
