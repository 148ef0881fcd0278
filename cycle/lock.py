"""The cycle's lock, and the condition its waiters sleep on.

One re-entrant lock guards the plan book and every map of the cycle's jobs; nothing slow runs
under it: API writes go through the dispatcher, solves run in :meth:`CycleLock.unlocked` on inputs
taken under it and commit under it only if the plan generation did not move. Bind calls waiting
at the barrier (and overlapping cycles of one group) sleep on :attr:`CycleLock.changed`, which
every plan transition notifies.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator


class CycleLock:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.changed = threading.Condition(self._lock)

    def __enter__(self) -> "CycleLock":
        self._lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    @contextmanager
    def unlocked(self) -> Iterator[None]:
        """Run a slow step (a solve) without the lock; called with it held once."""
        self._lock.release()
        try:
            yield
        finally:
            self._lock.acquire()

    def wait(self, timeout: float) -> None:
        """Sleep until a transition (or ``timeout``); called with the lock held."""
        self.changed.wait(timeout=timeout)

    def notify(self) -> None:
        self.changed.notify_all()
