"""An event-driven cluster simulator for ``phalanx bench trace``: one cluster, one arrival
sequence, one scheduling policy at a time.

Time is simulated. Events are arrivals, completions and (for the Permit barrier) wait timeouts;
after all events of one instant the policy runs one *scheduling round* over the queue (pending
gangs, highest priority first, then oldest — every policy queues the same way and skips a gang
that does not fit, as kube-scheduler's and Kueue's BestEffortFIFO queues do). A gang starts when
all its pods hold resources and runs for its duration; a preempted gang loses its progress and
queues again. The run ends when no event is left, or when only wait timeouts are left and nothing
runs (nothing can ever change: the remaining gangs are stuck).

Policies act through :meth:`Simulation.hold` / :meth:`Simulation.release` /
:meth:`Simulation.evict` and report the wall-clock of their placement calls with
:meth:`Simulation.decided`. The simulation keeps the usage matrix and samples, after every round,
the GPUs held, the GPUs of running gangs, the GPUs held by incomplete gangs, the free GPUs stranded
on partly used nodes, and a per-round upper bound on what could be held (see :func:`round_bound`).
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
from ortools.sat.python import cp_model

from cluster.names import LABEL_RACK
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
    bound: int


class Simulation:
    def __init__(self, cluster: Cluster, jobs: tuple[Job, ...], policy: SchedulingPolicy) -> None:
        self.cluster = cluster
        self.policy = policy
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

    def evict(self, gang: GangState) -> None:
        """Preempt a running gang: it releases everything and queues again from scratch."""
        self.preempted_units += 1
        self.preempted_pods += len(gang.held)
        gang.preempted += 1
        gang.started = None
        self.release(gang)

    def decided(self, started: float) -> None:
        """Record one placement call that began at ``started`` (``time.perf_counter()``)."""
        self.decisions_ms.append((time.perf_counter() - started) * 1000.0)

    # -- the loop ---------------------------------------------------------------------------------
    def run(self) -> "Simulation":
        while self.events:
            now = self.events[0][0]
            while self.events and self.events[0][0] == now:
                _, kind, _, job, epoch = heapq.heappop(self.events)
                self._handle(kind, self.gangs[job], epoch, now)
            if not self.running() and all(e[1] == TIMEOUT for e in self.events) and self.events:
                self.stuck = True  # nothing runs, nothing arrives: no round can change anything
                break
            before = self._held_and_bound()
            self.policy.schedule(self, now)
            self._start_complete(now)
            self._sample(now, before)
        return self

    def _handle(self, kind: int, gang: GangState, epoch: int, now: float) -> None:
        if kind == ARRIVAL:
            self.arrived.add(gang.job.id)
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
            gang.epoch += 1
            gang.waiting_since = None
            if gang.single_rack is None:
                gang.single_rack = len({self.racks[i] for i in gang.held.values()}) == 1
            self.at(now + gang.job.duration, COMPLETION, gang.job.id, gang.epoch)

    def _held_and_bound(self) -> tuple[int, int]:
        held = int(self.used[:, self.gpu].sum())
        free = self.capacity - held
        demands = [len(g.remaining) * g.job.gpus for g in self.queue()]
        return held, held + round_bound(demands, free)

    def _sample(self, now: float, before: tuple[int, int]) -> None:
        used = self.used[:, self.gpu]
        cap = self.base.allocatable[:, self.gpu]
        partly = (used > 0) & (used < cap)
        incomplete = sum(len(g.held) * g.job.gpus for g in self.gangs.values() if g.held and g.started is None)
        held = int(used.sum())
        self.samples.append(Sample(now, held, held - incomplete, incomplete,
                                   int((cap - used)[partly].sum()), max(before[1], held)))


def round_bound(demands: list[int], free: int) -> int:
    """The most GPUs one round could add: a knapsack of the waiting gangs' GPU demands into the
    free GPUs (nodes and topology relaxed), solved by CP-SAT. An upper bound for every policy
    that places whole gangs and does not preempt."""
    if not demands or free <= 0:
        return 0
    if sum(demands) <= free:
        return sum(demands)
    counts: dict[int, int] = {}
    for d in demands:
        if d <= free:
            counts[d] = counts.get(d, 0) + 1
    model = cp_model.CpModel()
    take = {d: model.NewIntVar(0, min(c, free // d), f"n{d}") for d, c in counts.items()}
    total = sum(d * v for d, v in take.items())
    model.Add(total <= free)
    model.Maximize(total)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_deterministic_time = 1.0
    solver.Solve(model)
    return int(solver.BestObjectiveBound())
