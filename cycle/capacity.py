"""Barrier capacity: how many gang members may be planned and not yet bound at once.

In extender mode each gang member waiting at the bind barrier holds one server thread, and several
gangs wait at once; what counts is the sum of waiting members of every planned gang, not the
largest gang (docs/design.md). So capacity is *planned*: the cycle knows how many members the
server can hold waiting (:func:`barrier_capacity`) and never holds more planned-but-unbound gang
members than that. A gang whose plan would exceed the free capacity is not planned ("waiting for
barrier capacity") and is planned when capacity frees, in queue order: a gang waiting for more room
than is free blocks later ones from taking it (no starvation), and a gang that could never fit is
Unschedulable, saying so. Plugin mode holds no thread per member and runs without a limit (None).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from solver import PodGroup, Policy

from .plans import OPEN, PlanBook


def barrier_capacity(http_threads: int) -> int:
    """Gang members the server can hold waiting at the bind barrier at once: its threads minus a
    reserve for filter, prioritize, preempt and the probes (1/16 of the pool, at least 8, at most
    half of a small pool)."""
    return max(1, http_threads - max(min(8, http_threads // 2), http_threads // 16))


@dataclass
class BarrierWaiter:
    """A gang whose plan would exceed the free barrier capacity, waiting its turn."""

    need: int
    order: tuple[int, float, str]  # (-priority, created, key): queue order, as PodGroupQueue.order
    refreshed: float  # injected clock; a waiter not seen again within plan_ttl is dropped


class BarrierCapacity:
    """Called with the cycle's lock held. ``limit`` None: no limit."""

    def __init__(self, book: PlanBook, limit: int | None, bound_node: Callable[[str], str],
                 clock: Callable[[], float], plan_ttl: float) -> None:
        self.book = book
        self.limit = limit
        self.bound_node = bound_node
        self.clock = clock
        self.plan_ttl = plan_ttl
        self.waiting: dict[str, BarrierWaiter] = {}  # gangs waiting for barrier capacity

    def held(self, exclude: str = "") -> int:
        """Gang members planned and not yet bound: each may hold a server thread at the barrier."""
        return sum(1 for plan in self.book.values()
                   if plan.gang and plan.group != exclude and plan.state in OPEN
                   for uid in plan.assignments if uid not in plan.bound and not self.bound_node(uid))

    def never(self, group: PodGroup, need: int) -> str:
        """Why a gang of ``need`` members can never wait at the barrier whole, or ""."""
        if self.limit is None or group.policy is not Policy.GANG or need <= self.limit:
            return ""
        return (f"podgroup {group.key}: {need} members cannot all wait at the bind barrier: the server "
                f"holds at most {self.limit} (raise --http-threads)")

    def wait(self, group: PodGroup, need: int | None) -> str:
        """"" when a gang plan of ``need`` members (None: as many as last time, if known) may be
        held now, else why the group waits. Queue order: a gang waiting for more room than is free
        blocks later (lower, younger) ones from taking it, so a big gang is not starved."""
        if self.limit is None or group.policy is not Policy.GANG:
            return ""
        key = group.key
        now = self.clock()
        for other, waiter in list(self.waiting.items()):
            if waiter.refreshed + self.plan_ttl < now and other != key:
                del self.waiting[other]  # its members stopped asking
        mine = self.waiting.get(key)
        if need is None:
            if mine is None:
                return ""
            need = mine.need
        order = (-group.priority, group.created, key)
        held = self.held(key)
        ahead = any(w.order < order for k, w in self.waiting.items() if k != key)
        if need <= self.limit - held and not ahead:
            self.waiting.pop(key, None)
            return ""
        self.waiting[key] = BarrierWaiter(need, order, now)
        first = "" if not ahead else ", behind an earlier gang"
        return (f"podgroup {key}: waiting for barrier capacity: {held} members planned elsewhere "
                f"({need} needed of {self.limit}{first})")

    def first_fitting(self) -> str:
        """Capacity may have freed: the first waiting gang, when it now fits (its parked members
        are touched so kube-scheduler retries it; the rest wait their turn), else ""."""
        if not self.waiting:
            return ""
        free = (self.limit or 0) - self.held()
        key, waiter = min(self.waiting.items(), key=lambda kv: kv[1].order)
        return key if waiter.need <= free else ""
