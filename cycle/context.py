"""The state a workload cycle's jobs share, handed to each as one typed handle.

kube-scheduler hands each plugin one ``framework.Handle`` rather than its collaborators one by one;
:class:`CycleContext` is that for the cycle's jobs (planning, requeue, plan ahead): the lock and
the plan book, the cache, the status writer, the metrics and clock, and the maps several jobs read
and write (explanations, the domains groups keep, parked members, verdicts, records, the queue,
tenants). Each job still owns its own state and reaches the others only through what it is
handed; :class:`~cycle.service.WorkloadCycle` builds the context once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from cluster.cache import ClusterCache

from .inbox import Inbox
from .lock import CycleLock
from .metrics import CycleMetrics
from .parked import ParkedMembers
from .plans import PlanBook
from .queue import PodGroupQueue
from .records import RecordedHolds
from .status import StatusWriter
from .tenants import Tenants
from .verdicts import Verdicts


@dataclass(frozen=True)
class CycleContext:
    lock: CycleLock  # one cycle at a time changes the book
    book: PlanBook  # the plans and their state machine
    cache: ClusterCache  # what the cluster holds (read only)
    status: StatusWriter  # conditions, events and notes, off the lock
    metrics: CycleMetrics
    clock: Callable[[], float]  # timers (plan TTL, barrier, backoff)
    inbox: Inbox  # work noted for the requeue thread
    queue: PodGroupQueue  # groups backing off after failed attempts
    verdicts: Verdicts  # pod uid -> kube-scheduler's latest candidate list
    parked: ParkedMembers  # members answered "no node": touched when their plan forms
    recorded: RecordedHolds  # partly bound gangs' records hold their nodes
    tenants: Tenants  # per-namespace limits on phalanx's work
    explanations: dict[str, str]  # group -> the last reason it did not fit
    domains: dict[str, tuple[str, str]]  # group -> (topology key, domain) it keeps
    acting: Callable[[], bool]  # whether this serve acts (several replicas); a standby writes nothing
