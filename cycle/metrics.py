"""Prometheus metrics of the workload cycle, under the upstream names where upstream has one.

Each service instance owns a registry, so tests and benchmarks can run several side by side.
"""

from __future__ import annotations

import re
import threading
from collections import Counter as Tally
from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from cluster import names

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class CycleMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.attempts = Counter(names.METRIC_PODGROUP_ATTEMPTS.removesuffix("_total"),
                                "PodGroup scheduling attempts by result", ["result"], registry=r)
        self.attempt_duration = Histogram(names.METRIC_PODGROUP_ATTEMPT_DURATION,
                                          "Duration of one PodGroup scheduling attempt (snapshot + solver)",
                                          buckets=LATENCY_BUCKETS, registry=r)
        self.plans_released = Counter(names.METRIC_PLANS_RELEASED.removesuffix("_total"),
                                      "Plans released before binding, by reason "
                                      "(a fixed set, see cycle/replans.py)",
                                      ["reason"], registry=r)
        self.barrier = Counter(names.METRIC_BARRIER_OUTCOMES.removesuffix("_total"),
                               "Bind barrier outcomes", ["outcome"], registry=r)
        self.barrier_waiting = Gauge(names.METRIC_BARRIER_WAITING, "Bind calls waiting at the barrier now",
                                     registry=r)
        self.preemption_attempts = Counter(names.METRIC_PREEMPTION_ATTEMPTS.removesuffix("_total"),
                                           "Group preemption attempts by result", ["result"], registry=r)
        self.preemption_victims = Histogram(names.METRIC_PREEMPTION_VICTIMS, "Pods evicted per group preemption",
                                            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 1024), registry=r)
        self.plans = Gauge(names.METRIC_PLANS, "Plans currently held (reserving capacity)", registry=r)
        self.heap_returned = Counter(names.METRIC_HEAP_RETURNED.removesuffix("_total"),
                                     "Bytes of freed memory handed back to the system (malloc_trim)", registry=r)
        self.time_to_place = Histogram(names.METRIC_TIME_TO_PLACE,
                                       "From a plan made to every planned member bound (gang and Basic)",
                                       buckets=LATENCY_BUCKETS + (10.0, 30.0, 60.0), registry=r)
        self.transitions = Counter(names.METRIC_PLAN_TRANSITIONS.removesuffix("_total"),
                                   "Plan state changes by target state", ["to"], registry=r)
        self.plan_requests = Counter(names.METRIC_PLAN_REQUESTS.removesuffix("_total"),
                                     "PlanForPod calls (a member reaching kube-scheduler's PreFilter without its "
                                     "plan in the plugin's mirror) by whether the plan was held already (made ahead, "
                                     "not yet streamed), made on the call, or none", ["plan"], registry=r)
        self.barrier_held = Gauge(names.METRIC_BARRIER_HELD,
                                  "Gang members planned and not yet bound "
                                  "(each may hold a server thread at the barrier)",
                                  registry=r)
        self.dispatch = Counter(names.METRIC_DISPATCH_WRITES.removesuffix("_total"),
                                "Asynchronous API writes by outcome (coalesced, retried, failed, dropped) and kind",
                                ["outcome", "kind"], registry=r)
        self.dispatch_queued = Gauge(names.METRIC_DISPATCH_QUEUED, "API writes waiting in the dispatcher", registry=r)
        self.namespace_limited = Counter(names.METRIC_NAMESPACE_LIMITED.removesuffix("_total"),
                                         "Work a per-namespace limit held back: a group not planned (plans), a "
                                         "backing-off group not checked in a requeue pass (retries)",
                                         ["limit"], registry=r)
        self.leading = Gauge(names.METRIC_LEADING, "1 while this serve acts (its kube-scheduler leads, or one "
                             "replica), 0 while it is a standby that writes nothing", registry=r)
        self.api_writes = Counter(names.METRIC_API_WRITES.removesuffix("_total"),
                                  "API writes by kind and outcome (written, failed, standby: refused by a standby)",
                                  ["kind", "outcome"], registry=r)
        r.register(_Threads())

    def track_sizes(self, sizes: Callable[[], dict[str, int]]) -> None:
        """Export ``sizes()`` (collection -> entries, see cluster/sizes.py) as a gauge, read at scrape."""
        self.registry.register(_Sizes(sizes))


class _Sizes(Collector):
    def __init__(self, sizes: Callable[[], dict[str, int]]) -> None:
        self.sizes = sizes

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(names.METRIC_INTERNAL_ENTRIES,
                                   "Entries in each long-lived collection of phalanx serve (a leak shows as growth)",
                                   labels=["collection"])
        for collection, entries in sorted(self.sizes().items()):
            family.add_metric([collection], entries)
        yield family


_NUMBERED = re.compile(r"[-_ ]?\d+(?= \(.*\)$|$)")


def thread_pool(name: str) -> str:
    """A thread's pool: its name without the number a pool or ``threading`` gives each thread
    (``phalanx-grpc_3`` -> ``phalanx-grpc``, ``Thread-7 (_evict)`` -> ``Thread (_evict)``)."""
    return _NUMBERED.sub("", name) or name


class _Threads(Collector):
    """The process's Python threads by pool, read at scrape: a pool that grows and keeps its
    threads (bounded) tells itself apart from a leak (unbounded) here."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(names.METRIC_THREADS, "Threads of this process by pool (Python threads, "
                                   "named; numbers dropped)", labels=["pool"])
        for pool, count in sorted(Tally(thread_pool(t.name) for t in threading.enumerate()).items()):
            family.add_metric([pool], count)
        yield family
