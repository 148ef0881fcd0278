"""The workload cycle's API writes, off its lock: a bounded asynchronous dispatcher.

Events, PodGroup status patches, record removals and pod touches can take as long as the API
server's client timeout (30 s). None of them must hold the cycle's lock or a verb's thread, so the
cycle hands them here and moves on:

- **ordered per object**: the writes about one object (``Write.obj``, e.g. ``PodGroup/ns/name``)
  run in submission order, one at a time; different objects proceed in parallel (``workers``);
- **retried with backoff** on :class:`~cluster.backend.WriteError` (``backoff`` doubling to
  ``max_backoff``), timed with the injected clock: a refusal (409, 404, 403...) ``max_attempts``
  times in all; an API server that is away, failing or throttling (status 0, 5xx, 429: see
  :func:`transient`) until the write lands, so a slow or refusing API server loses no write (what
  bounds them is the queue's ``capacity``). The client under the writer has already honoured any
  ``Retry-After`` (cluster/kube.py). Any other exception is logged and the write dropped — a worker
  never dies;
- **coalesced**: a write with a ``coalesce`` tag replaces a queued, not yet started write with the
  same tag (a newer status for the same PodGroup supersedes the older one);
- **dropped on a standby**: a write the :class:`~cycle.leading.LeaderWriter` refused because this
  serve is a standby (several replicas) is dropped at once, counted ``standby``;
- **bounded, never blocking**: at ``capacity`` queued writes a submission drops the oldest
  coalescable write (else the oldest write) and counts it in
  ``phalanx_dispatch_dropped_total{kind}``.

Writes that must land before something else (the placement record before the bindings, the
bindings themselves) are not queued: the cycle makes them synchronously, outside its lock, after
:meth:`Dispatcher.flush` of that object so an older queued write cannot land after them.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable

from cluster import names
from cluster.backend import WriteError

from .metrics import CycleMetrics

log = logging.getLogger("phalanx.dispatch")


@dataclass
class Write:
    obj: str  # ordering key: the writes of one object run in order, one at a time
    kind: str  # "status" | "event" | "annotate" | "nudge" ...: the metric label
    call: Callable[[], None]
    coalesce: str = ""  # non-empty: a newer write with the same tag replaces this one while queued
    attempts: int = 0
    seq: int = field(default=0, compare=False)


def transient(err: WriteError) -> bool:
    """The API server could not take the write now (unreachable, 5xx, throttled with 429), as
    opposed to refusing it: such a write is kept and tried again until it lands."""
    return err.status == 0 or err.status == 429 or err.status >= 500


class Dispatcher:
    def __init__(self, clock: Callable[[], float] = time.monotonic, metrics: CycleMetrics | None = None,
                 capacity: int = 10_000, workers: int = 4, max_attempts: int = 5, backoff: float = 0.2,
                 max_backoff: float = 5.0) -> None:
        self.clock = clock
        self.metrics = metrics
        self.capacity = capacity
        self.max_attempts = max_attempts
        self.backoff, self.max_backoff = backoff, max_backoff
        self._cond = threading.Condition()
        self._queues: OrderedDict[str, deque[Write]] = OrderedDict()  # object -> its queued writes
        self._ready: deque[str] = deque()  # objects whose head write may start now
        self._delayed: list[tuple[float, int, str]] = []  # (not before, seq, object) backing off
        self._busy: set[str] = set()  # objects with a write in flight
        self._queued = 0
        self._seq = itertools.count()
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"phalanx-dispatch-{i}", daemon=True)
                         for i in range(workers)]
        for t in self._threads:
            t.start()

    # -- submitting (any thread, never blocks on I/O) ----------------------------------------
    def submit(self, write: Write) -> None:
        with self._cond:
            if self._closed:
                return
            write.seq = next(self._seq)
            queue = self._queues.get(write.obj)
            if write.coalesce and queue:
                for i, queued in enumerate(queue):
                    if queued.coalesce == write.coalesce:
                        queue[i] = write  # same position: the order with its neighbours holds
                        self._count("coalesced", write.kind)
                        return
            if self._queued >= self.capacity:
                self._drop_oldest()
            if queue is None:
                queue = self._queues[write.obj] = deque()
            queue.append(write)
            self._queued += 1
            if len(queue) == 1 and write.obj not in self._busy and not self._is_delayed(write.obj):
                self._ready.append(write.obj)
            self._gauge()
            self._cond.notify()

    def _is_delayed(self, obj: str) -> bool:
        return any(o == obj for _, _, o in self._delayed)

    def _drop_oldest(self) -> None:
        """Make room: the oldest queued coalescable write goes (else the oldest of any kind)."""
        victim: tuple[int, str, int] | None = None
        fallback: tuple[int, str, int] | None = None
        for obj, queue in self._queues.items():
            for i, w in enumerate(queue):
                if w.coalesce and (victim is None or w.seq < victim[0]):
                    victim = (w.seq, obj, i)
                if fallback is None or w.seq < fallback[0]:
                    fallback = (w.seq, obj, i)
        chosen = victim or fallback
        if chosen is None:
            return
        _, obj, i = chosen
        queue = self._queues[obj]
        dropped = queue[i]
        del queue[i]
        self._queued -= 1
        if not queue and obj not in self._busy:
            del self._queues[obj]
            if obj in self._ready:
                self._ready.remove(obj)
        log.warning("dispatch queue full (%d): dropped %s write on %s", self.capacity, dropped.kind, obj)
        self._count("dropped", dropped.kind)

    # -- waiting for writes (tests, and before a synchronous write on the same object) --------
    def flush(self, obj: str | None = None, timeout: float = 10.0) -> bool:
        """Wait (real time) until nothing is queued or in flight for ``obj`` (None: at all)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while (obj in self._queues or obj in self._busy) if obj else (self._queued or self._busy):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(timeout=min(left, 0.05))
        return True

    def pending(self, obj: str | None = None) -> int:
        with self._cond:
            return len(self._queues.get(obj, ())) if obj else self._queued

    def __len__(self) -> int:
        return self.pending()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -- the workers ----------------------------------------------------------------------------
    def _take(self) -> Write | None:
        with self._cond:
            while not self._closed:
                now = self.clock()
                while self._delayed and self._delayed[0][0] <= now:
                    _, _, obj = heapq.heappop(self._delayed)
                    if obj in self._queues and obj not in self._busy:
                        self._ready.append(obj)
                if self._ready:
                    obj = self._ready.popleft()
                    write = self._queues[obj].popleft()
                    self._queued -= 1
                    self._busy.add(obj)
                    self._gauge()
                    return write
                # backoff is measured on the injected clock; poll it, the real wait stays short
                self._cond.wait(timeout=0.05 if self._delayed else 1.0)
            return None

    def _work(self) -> None:
        while True:
            write = self._take()
            if write is None:
                return
            retry_at = 0.0
            try:
                write.call()
            except WriteError as err:
                write.attempts += 1
                if err.reason == names.REASON_STANDBY:  # a standby serve writes nothing: never retried
                    self._count("standby", write.kind)
                elif write.attempts < self.max_attempts or transient(err):
                    retry_at = self.clock() + min(self.max_backoff, self.backoff * 2 ** (write.attempts - 1))
                    self._count("retried", write.kind)
                else:
                    log.warning("%s write on %s failed %d times, dropped: %s", write.kind, write.obj,
                                write.attempts, err)
                    self._count("failed", write.kind)
            except Exception:  # noqa: BLE001 - a broken write must not kill the worker
                log.exception("%s write on %s failed", write.kind, write.obj)
                self._count("failed", write.kind)
            self._done(write, retry_at)

    def _done(self, write: Write, retry_at: float) -> None:
        with self._cond:
            obj = write.obj
            self._busy.discard(obj)
            queue = self._queues.get(obj)
            if retry_at:
                superseded = write.coalesce and queue and any(w.coalesce == write.coalesce for w in queue)
                if not superseded:
                    if queue is None:
                        queue = self._queues[obj] = deque()
                    queue.appendleft(write)
                    self._queued += 1
                    if self._queued > self.capacity:
                        self._drop_oldest()
            queue = self._queues.get(obj)
            if queue:
                if retry_at:
                    heapq.heappush(self._delayed, (retry_at, write.seq, obj))
                else:
                    self._ready.append(obj)
            elif queue is not None:
                del self._queues[obj]
            self._gauge()
            self._cond.notify_all()

    # -- metrics ----------------------------------------------------------------------------------
    def _count(self, outcome: str, kind: str) -> None:
        if self.metrics is not None:
            self.metrics.dispatch.labels(outcome=outcome, kind=kind).inc()

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.dispatch_queued.set(self._queued)
