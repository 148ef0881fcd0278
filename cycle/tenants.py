"""Tenants: per-namespace limits on phalanx's own work, so one namespace cannot starve another.

Every namespace shares one serve: its lock, its solver time, its plan book and its bind barrier.
A careless (or hostile) namespace with 10,000 PodGroups would otherwise hold as many plans as fit —
each reserving capacity and, in extender mode, barrier threads another tenant's gang needs — and
have every one of its failed groups checked for room on every capacity change. So:

- **plans per namespace** (``phalanx serve --namespace-max-plans``): a namespace holds at most this
  many open plans (planned or binding) at once. A group beyond it is not solved; its members are
  answered "no node" with the limit and the flag, its PodGroup condition says so (reason
  :data:`cluster.names.REASON_NAMESPACE_LIMIT`), and when one of the namespace's plans closes the
  oldest such group's parked members are touched, in the order they hit the limit.
- **failed workload cycles per namespace** (``--namespace-cycles-per-second``): a token bucket per
  namespace (holding :data:`BURST_SECONDS` of its rate), spent by every cycle that found no
  placement. Every group backs off on its own after a failed cycle, but 10,000 groups backing off
  10 s each still ask for 1,000 failed cycles a second, each a solve and a preemption search; once
  the bucket is empty a group of that namespace is answered "no node" without a solve, and its
  parked members are touched once the bucket refills (:meth:`NamespaceCycles.due`, on any later
  call and the requeue thread's sweep). Cycles that place their group are bounded by the plan
  limit instead, so a namespace submitting many gangs that fit is not slowed by this one.
- **retries per namespace** (``--namespace-max-retries``): when room appears, the requeue pass
  checks at most this many of a namespace's backing-off groups, rotating between namespaces and
  through each namespace's groups (:class:`FairShare`), so the pass costs the same whether a
  namespace has 10 or 10,000 failed groups.

Both are counts of phalanx's work, not of capacity: how much of the cluster a namespace may use is
ResourceQuota's job (docs/limitations.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Collection, Iterable

from .plans import OPEN, PlanBook

DEFAULT_MAX_PLANS = 32
DEFAULT_MAX_RETRIES = 8
DEFAULT_CYCLES_PER_SECOND = 10.0
BURST_SECONDS = 10.0  # a namespace's bucket holds this many seconds of its rate


@dataclass(frozen=True)
class NamespaceLimits:
    """Per-namespace limits on phalanx's work; 0 turns a limit off."""

    max_plans: int = DEFAULT_MAX_PLANS
    max_retries: int = DEFAULT_MAX_RETRIES
    cycles_per_second: float = DEFAULT_CYCLES_PER_SECOND


def namespace_of(key: str) -> str:
    return key.split("/", 1)[0]


class NamespacePlans:
    """The plans-per-namespace limit (called with the cycle's lock held)."""

    def __init__(self, book: PlanBook, limit: int) -> None:
        self.book = book
        self.limit = limit
        self.limited: dict[str, dict[str, None]] = {}  # namespace -> groups held back, in order

    def open_plans(self, namespace: str, exclude: str = "") -> int:
        return sum(1 for key, plan in self.book.items()
                   if key != exclude and plan.state in OPEN and namespace_of(key) == namespace)

    def check(self, key: str) -> str:
        """Why group ``key`` may not be planned now because of its namespace's open plans, or ""."""
        namespace = namespace_of(key)
        if self.limit <= 0 or self.open_plans(namespace, exclude=key) < self.limit:
            self.forget(key)
            return ""
        self.limited.setdefault(namespace, {})[key] = None
        return (f"phalanx: namespace {namespace} holds {self.limit} open plans, the most one namespace "
                f"may hold at once (phalanx serve --namespace-max-plans); podgroup {key} waits its turn")

    def freed(self, key: str) -> str:
        """A plan of ``key``'s namespace closed: the group held back longest in that namespace, to
        be retried now ("" none)."""
        waiting = self.limited.get(namespace_of(key))
        if not waiting:
            return ""
        first = next(iter(waiting))
        self.forget(first)
        return first

    def forget(self, key: str) -> None:
        waiting = self.limited.get(namespace_of(key))
        if waiting is not None:
            waiting.pop(key, None)
            if not waiting:
                del self.limited[namespace_of(key)]

    def prune(self, live: Collection[str]) -> None:
        for key in [k for groups in self.limited.values() for k in groups if k not in live]:
            self.forget(key)


class NamespaceCycles:
    """The failed-workload-cycles-per-namespace token bucket (called with the cycle's lock held)."""

    def __init__(self, rate: float, clock: Callable[[], float]) -> None:
        self.rate = rate
        self.burst = BURST_SECONDS * rate
        self.clock = clock
        self._tokens: dict[str, tuple[float, float]] = {}  # namespace -> (tokens, at)
        self.throttled: dict[str, dict[str, None]] = {}  # namespace -> groups answered "wait", in order

    def _level(self, namespace: str, now: float) -> float:
        tokens, at = self._tokens.get(namespace, (self.burst, now))
        return min(self.burst, tokens + (now - at) * self.rate)

    def check(self, key: str) -> str:
        """Why ``key``'s namespace may not run a workload cycle now (it spent its failed cycles), or ""."""
        if self.rate <= 0:
            return ""
        namespace = namespace_of(key)
        if self._level(namespace, self.clock()) >= 1.0:
            waiting = self.throttled.get(namespace)
            if waiting is not None:
                waiting.pop(key, None)
            return ""
        self.throttled.setdefault(namespace, {})[key] = None
        return (f"phalanx: namespace {namespace} ran its {self.rate:g} failed workload cycles a second "
                f"(phalanx serve --namespace-cycles-per-second); podgroup {key} is retried when it may run one")

    def spend(self, key: str) -> None:
        """A cycle of ``key``'s namespace found no placement: one of its failed cycles is spent."""
        if self.rate > 0:
            namespace, now = namespace_of(key), self.clock()
            self._tokens[namespace] = (self._level(namespace, now) - 1.0, now)

    def due(self) -> list[str]:
        """Groups answered "wait" whose namespace may run a cycle again: as many per namespace as
        it has cycles (they are forgotten here; their members are touched by the caller)."""
        now, out = self.clock(), []
        for namespace in list(self.throttled):
            groups = self.throttled[namespace]
            for _ in range(int(self._level(namespace, now))):
                if not groups:
                    break
                first = next(iter(groups))
                del groups[first]
                out.append(first)
            if not groups:
                del self.throttled[namespace]
        return out

    def prune(self, live: Collection[str]) -> None:
        """Forget throttled groups that are gone, and full buckets (a full bucket is no bucket):
        what is kept stays the size of the namespaces being limited, not of the cluster."""
        for namespace in list(self.throttled):
            for key in [k for k in self.throttled[namespace] if k not in live]:
                del self.throttled[namespace][key]
            if not self.throttled[namespace]:
                del self.throttled[namespace]
        now = self.clock()
        for namespace in [n for n in self._tokens if self._level(n, now) >= self.burst]:
            del self._tokens[namespace]


class FairShare:
    """Which of the backing-off groups the requeue pass checks: at most ``limit`` per namespace,
    rotating through each namespace's groups from pass to pass, namespaces interleaved."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._turn: dict[str, int] = {}  # namespace -> where its next pass starts

    def take(self, keys: Iterable[str]) -> list[str]:
        by_namespace: dict[str, list[str]] = {}
        for key in keys:
            by_namespace.setdefault(namespace_of(key), []).append(key)
        if self.limit <= 0:
            return [k for groups in by_namespace.values() for k in groups]
        chosen: list[list[str]] = []
        for namespace, groups in by_namespace.items():
            if len(groups) <= self.limit:
                chosen.append(groups)
                self._turn.pop(namespace, None)
                continue
            start = self._turn.get(namespace, 0) % len(groups)
            chosen.append([groups[(start + i) % len(groups)] for i in range(self.limit)])
            self._turn[namespace] = start + self.limit
        for namespace in [n for n in self._turn if n not in by_namespace]:
            del self._turn[namespace]
        # interleaved: the first of every namespace, then the second of every namespace, ...
        return [groups[i] for i in range(max(map(len, chosen), default=0)) for groups in chosen if i < len(groups)]


class Tenants:
    """The per-namespace limits the cycle's jobs share (planning, requeue, the service)."""

    def __init__(self, book: PlanBook, limits: NamespaceLimits, clock: Callable[[], float]) -> None:
        self.plans = NamespacePlans(book, limits.max_plans)
        self.cycles = NamespaceCycles(limits.cycles_per_second, clock)
        self.share = FairShare(limits.max_retries)

    def prune(self, live: Collection[str]) -> None:
        """Forget what is kept for groups that are gone (``live``: the PodGroups that exist);
        proportional to what the limits hold, not to ``live``."""
        self.plans.prune(live)
        self.cycles.prune(live)
