"""The queue of PodGroups waiting for a workload cycle: order, eligibility and backoff.

kube-scheduler sends every member of a group through filter, and retries rejected pods on any
cluster event; without a memory of failures, a 1,000-pod gang that does not fit would run the
solver 1,000 times per retry. The queue remembers each group's last failed attempt:

    attempt fails  --> backoff 0.5 s, doubling per consecutive failure, capped at 10 s
    plans released past their re-plan limit --> the same backoff, doubling per release past it
    capacity freed (a node added or changed, a bound pod gone or finished) --> retry at once
    attempt succeeds --> forgotten

Groups become *eligible* once at least minCount members exist (Basic: one) and are taken highest
priority first, then oldest (:meth:`PodGroupQueue.order`), as kube-scheduler orders pods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from solver import PodGroup

INITIAL_BACKOFF = 0.5
MAX_BACKOFF = 10.0


@dataclass
class Attempt:
    failures: int
    retry_at: float
    capacity_version: int
    message: str


class PodGroupQueue:
    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.failed: dict[str, Attempt] = {}

    def backing_off(self, key: str, capacity_version: int) -> str:
        """The last failure's message while the group is backing off, else "" (try now)."""
        attempt = self.failed.get(key)
        if attempt is None:
            return ""
        if attempt.capacity_version != capacity_version or self.clock() >= attempt.retry_at:
            return ""
        return attempt.message

    def failed_attempt(self, key: str, capacity_version: int, message: str, failures: int = 0) -> None:
        """Back ``key`` off; ``failures`` (when more than the consecutive count) sets the delay, for
        failures a successful plan does not end (re-plans past their limit, see replans.py)."""
        previous = self.failed.get(key)
        failures = max(failures, previous.failures + 1 if previous else 1)
        delay = min(MAX_BACKOFF, INITIAL_BACKOFF * 2 ** (failures - 1))
        self.failed[key] = Attempt(failures, self.clock() + delay, capacity_version, message)

    def succeeded(self, key: str) -> None:
        self.failed.pop(key, None)

    @staticmethod
    def order(groups: Iterable[PodGroup]) -> list[PodGroup]:
        """Eligible groups (enough members exist), highest priority first, then oldest."""
        eligible = [g for g in groups if g.pending and len(g.members) >= g.min_count]
        return sorted(eligible, key=lambda g: (-g.priority, g.created, g.key))
