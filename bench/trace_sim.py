"""An event-driven cluster simulator for ``phalanx bench trace``: one cluster, one arrival
sequence, one scheduling policy at a time.

Time is simulated and ends at the horizon (the last arrival): whatever has not started or finished
by then is *censored* there and counted as such. Events are arrivals, completions and (for the
Permit barrier) wait timeouts; after all events of one instant the policy runs one *scheduling
round* over the queue (pending gangs, highest priority first, then oldest — every policy queues
the same way and skips a gang whose shape already failed in the round, as kube-scheduler's and
Kueue's BestEffortFIFO queues do). A gang starts when all its pods hold resources and runs for
its remaining work. A preempted gang keeps the work up to its last checkpoint (every
``checkpoint_s`` seconds of running; 0 = none, it restarts from zero), loses the rest (counted in
GPU-seconds) and queues again.

Policies act through :meth:`Simulation.hold` / :meth:`Simulation.release` /
:meth:`Simulation.evict` and time each gang placement attempt with :meth:`Simulation.decided`
(one call per gang tried, for every policy alike). The simulation keeps the usage matrix and
samples, after every round, the GPUs held, the GPUs of running gangs, the GPUs held by
incomplete gangs, the free GPUs stranded on partly used nodes and the GPUs the waiting gangs ask
for (how contended the run is).
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from cluster.names import LABEL_RACK
from cycle.queue import lost_work
from solver import Pod, PodGroup, Snapshot

from .generate import GPU
from .traces import Cluster, Job

ARRIVAL, COMPLETION, TIMEOUT = 0, 1, 2


class SchedulingPolicy(Protocol):
    name: str
    #: All-or-nothing: a gang never holds resources while incomplete (the Permit barrier's
    #: reservations are counted as held, see the metrics).
    gang: bool

    def schedule(self, sim: "Simulation", now: float) -> None: ...


@dataclass
class GangState:
    job: Job
    group: PodGroup
    shape: tuple  # what decides whether the gang fits: identical shapes fail alike in a round
    held: dict[str, int] = field(default_factory=dict)  # pod uid -> node index
    started: float | None = None
    finished: float | None = None
    epoch: int = 0  # bumped on every start and release: stale completions and timeouts are dropped
    waiting_since: float | None = None
    was_partial: bool = False
    single_rack: bool | None = None
    preempted: int = 0
    progress: float = 0.0  # seconds of work kept (checkpointed) from earlier runs
    lost_gpu_s: float = 0.0  # GPU-seconds of work lost to preemption
    first_started: float | None = None
    queued_at: float = 0.0  # arrival, or the last eviction

    @property
    def left(self) -> float:
        """Seconds of work still to run."""
        return max(self.job.duration - self.progress, 0.0)

    @property
    def remaining(self) -> list[Pod]:
        return [p for p in self.group.members if p.uid not in self.held]


@dataclass
class Sample:
    time: float
    held: int
    running: int
    incomplete: int
    stranded: int
    waiting: int = 0  # GPUs of the gangs that arrived and are not running (what they ask for, whole)


class Simulation:
    def __init__(self, cluster: Cluster, jobs: tuple[Job, ...], policy: SchedulingPolicy,
                 horizon: float | None = None, checkpoint_s: float = 0.0) -> None:
        self.cluster = cluster
        self.policy = policy
        self.horizon = horizon if horizon is not None else max(j.arrival for j in jobs)
        self.checkpoint_s = checkpoint_s
        self.base = Snapshot(cluster.nodes)
        self.used = self.base.used.copy()
        self.gpu = self.base.rindex[GPU]
        self.capacity = int(self.base.allocatable[:, self.gpu].sum())
        self.racks = self.base.label_values(LABEL_RACK)
        self.gangs = {j.id: GangState(j, j.group(cluster.required_key(j)), ()) for j in jobs}
        for g in self.gangs.values():
            g.shape = (g.job.pods, g.job.gpus, g.job.cpu, g.group.topology_key)
        self.vectors = {g.job.id: self.base.request_vector(g.group.members[0].spec.requests)[0]
                        for g in self.gangs.values()}
        self.events: list[tuple[float, int, int, str, int]] = []
        self.sequence = 0
        self.arrived: set[str] = set()
        self.decisions_ms: list[float] = []
        self.samples: list[Sample] = []
        self.preempted_units = 0
        self.preempted_pods = 0
        self.lost_gpu_s = 0.0
        self.overhead_ms = 0.0
        self.stuck = False
        for j in jobs:
            self.at(j.arrival, ARRIVAL, j.id)

    # -- what policies use --------------------------------------------------------------------
    def at(self, when: float, kind: int, job: str, epoch: int = 0) -> None:
        self.sequence += 1
        heapq.heappush(self.events, (when, kind, self.sequence, job, epoch))

    def queue(self) -> list[GangState]:
        """Arrived gangs not running, highest priority first, then oldest."""
        waiting = [g for g in self.gangs.values() if g.job.id in self.arrived and g.started is None]
        return sorted(waiting, key=lambda g: (-g.job.priority, g.job.arrival, g.job.id))

    def running(self) -> list[GangState]:
        return [g for g in self.gangs.values() if g.started is not None and g.finished is None]

    def snapshot(self, with_bound: bool = False) -> Snapshot:
        """The cluster now; ``with_bound`` adds running gangs' pods as bound (for preemption)."""
        if not with_bound:
            return self.base.with_used(self.used)
        nodes = self.base.nodes
        bound = [replace(p, node=nodes[g.held[p.uid]].name) for g in self.running() for p in g.group.members]
        return self.base.with_used(self.used, bound)

    def free(self) -> np.ndarray:
        return np.maximum(self.base.allocatable - self.used, 0)

    def hold(self, gang: GangState, assignments: dict[str, int | str]) -> None:
        """Charge pods (uid -> node index or name) to the gang."""
        vec = self.vectors[gang.job.id]
        for uid, node in assignments.items():
            i = self.base.index[node] if isinstance(node, str) else int(node)
            self.used[i] += vec
            gang.held[uid] = i

    def release(self, gang: GangState) -> None:
        vec = self.vectors[gang.job.id]
        for i in gang.held.values():
            self.used[i] -= vec
        gang.held = {}
        gang.epoch += 1
        gang.waiting_since = None

    def lost_if_evicted(self, gang: GangState, now: float) -> float:
        """GPU-seconds ``gang`` (running) would lose if evicted at ``now``."""
        assert gang.started is not None
        return lost_work(gang.started, now, self.checkpoint_s) * gang.job.pods * gang.job.gpus

    def evict(self, gang: GangState, now: float) -> None:
        """Preempt a running gang: it keeps the work to its last checkpoint, releases everything
        and queues again."""
        assert gang.started is not None
        ran = now - gang.started
        lost = lost_work(gang.started, now, self.checkpoint_s)
        gang.progress += ran - lost
        gang.lost_gpu_s += lost * gang.job.pods * gang.job.gpus
        self.lost_gpu_s += lost * gang.job.pods * gang.job.gpus
        self.preempted_units += 1
        self.preempted_pods += len(gang.held)
        gang.preempted += 1
        gang.started = None
        gang.queued_at = now
        self.release(gang)

    def decided(self, started: float) -> None:
        """Record one gang placement attempt that began at ``started`` (``time.perf_counter()``)."""
        self.decisions_ms.append((time.perf_counter() - started) * 1000.0)

    def overhead(self, started: float) -> None:
        """Record per-round policy work (not one gang's attempt) that began at ``started``."""
        self.overhead_ms += (time.perf_counter() - started) * 1000.0

    # -- the loop ---------------------------------------------------------------------------------
    def run(self) -> "Simulation":
        while self.events and self.events[0][0] <= self.horizon:
            now = self.events[0][0]
            while self.events and self.events[0][0] == now:
                _, kind, _, job, epoch = heapq.heappop(self.events)
                self._handle(kind, self.gangs[job], epoch, now)
            if not self.running() and all(e[1] == TIMEOUT for e in self.events) and self.events:
                self.stuck = True  # nothing runs, nothing arrives: no round can change anything
                break
            self.policy.schedule(self, now)
            self._start_complete(now)
            self._sample(now)
        return self

    def _handle(self, kind: int, gang: GangState, epoch: int, now: float) -> None:
        if kind == ARRIVAL:
            self.arrived.add(gang.job.id)
            gang.queued_at = now
        elif kind == COMPLETION and epoch == gang.epoch and gang.started is not None:
            gang.finished = now
            self.release(gang)
        elif kind == TIMEOUT and epoch == gang.epoch and gang.started is None and gang.held:
            self.release(gang)

    def _start_complete(self, now: float) -> None:
        for gang in self.gangs.values():
            if gang.started is not None or not gang.held:
                continue
            if len(gang.held) < gang.job.pods:
                gang.was_partial = True
                continue
            gang.started = now
            if gang.first_started is None:
                gang.first_started = now
            gang.epoch += 1
            gang.waiting_since = None
            if gang.single_rack is None:
                gang.single_rack = len({self.racks[i] for i in gang.held.values()}) == 1
            self.at(now + gang.left, COMPLETION, gang.job.id, gang.epoch)

    def _sample(self, now: float) -> None:
        used = self.used[:, self.gpu]
        cap = self.base.allocatable[:, self.gpu]
        partly = (used > 0) & (used < cap)
        incomplete = sum(len(g.held) * g.job.gpus for g in self.gangs.values() if g.held and g.started is None)
        held = int(used.sum())
        waiting = sum(g.job.pods * g.job.gpus for g in self.gangs.values()
                      if g.started is None and g.job.id in self.arrived)
        self.samples.append(Sample(now, held, held - incomplete, incomplete, int((cap - used)[partly].sum()), waiting))

