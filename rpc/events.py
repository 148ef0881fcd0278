"""Fan-out of the workload cycle's events to gRPC WatchEvents streams.

The cycle calls its listeners inside a scheduling cycle, holding its lock, so the one listener
phalanx subscribes (:meth:`EventHub.publish`) only appends to bounded per-stream queues and
returns: a slow client never slows scheduling. A full queue drops its oldest event and counts it;
the stream tells its client how many it lost (``Event.dropped``).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Mapping


@dataclass(frozen=True)
class CycleEvent:
    kind: str
    data: Mapping[str, Any]
    time_ns: int  # wall clock when the cycle emitted it

    @property
    def group(self) -> str:
        return str(self.data.get("group", ""))


class TooManyStreams(RuntimeError):
    pass


class EventStream:
    """One client's bounded queue of events (oldest dropped first when full)."""

    def __init__(self, capacity: int, accept: Callable[[CycleEvent], bool]) -> None:
        self._queue: deque[CycleEvent] = deque(maxlen=capacity)
        self._ready = threading.Condition()
        self._accept = accept
        self.dropped = 0
        self.closed = False

    def put(self, event: CycleEvent) -> None:
        if not self._accept(event):
            return
        with self._ready:
            if len(self._queue) == self._queue.maxlen:
                self.dropped += 1
            self._queue.append(event)
            self._ready.notify()

    def next(self, timeout: float) -> CycleEvent | None:
        """The oldest queued event, waiting up to ``timeout``; None on timeout or once closed."""
        with self._ready:
            if not self._queue and not self.closed:
                self._ready.wait(timeout)
            if self.closed or not self._queue:
                return None
            return self._queue.popleft()

    def close(self) -> None:
        with self._ready:
            self.closed = True
            self._ready.notify_all()


class EventHub:
    def __init__(self, capacity: int = 1024, max_streams: int = 16) -> None:
        self.capacity = capacity
        self.max_streams = max_streams
        self._lock = threading.Lock()
        self._streams: set[EventStream] = set()

    def publish(self, kind: str, data: Mapping[str, Any]) -> None:
        """The cycle's listener: queue the event on every open stream; never blocks on a client."""
        event = CycleEvent(kind, dict(data), time.time_ns())
        with self._lock:
            streams = list(self._streams)
        for stream in streams:
            stream.put(event)

    def open(self, accept: Callable[[CycleEvent], bool] = lambda _: True) -> EventStream:
        with self._lock:
            if len(self._streams) >= self.max_streams:
                raise TooManyStreams(f"phalanx: at most {self.max_streams} event streams at once")
            stream = EventStream(self.capacity, accept)
            self._streams.add(stream)
        return stream

    def detach(self, stream: EventStream) -> None:
        stream.close()
        with self._lock:
            self._streams.discard(stream)

    def close(self) -> None:
        """End every stream (the server is stopping)."""
        with self._lock:
            streams, self._streams = list(self._streams), set()
        for stream in streams:
            stream.close()
