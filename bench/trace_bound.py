"""The shared allocation bound of ``phalanx bench trace``: computed once per trace from its
arrivals alone, the same for every policy.

* **Instantaneous.** Whatever a gang policy does, the gangs running at time t are a subset of the
  gangs arrived by t, placed whole inside one domain of their required key. So the GPUs running at
  t are at most P(t), the most GPUs of any such subset that fits the cluster: a CP-SAT model over
  racks (each rack-keyed gang in at most one rack, each zone- or cluster-wide gang's pods split
  over the racks of one zone or of the cluster; per rack its GPUs, CPU, and nodes for pods of more
  than half a node), with a time limit and its *proven* bound (``BestObjectiveBound``), so P is an
  upper bound even when the search stops early. With 1-, 2-, 4- and 8-GPU pods on 8-GPU nodes the
  rack capacities are exact for GPUs (divisible sizes pack perfectly). P changes only at arrivals,
  and the k-th arrival set is the same at every load, so P is solved once per arrival index.
* **Work.** No policy does more useful work inside the horizon H than every job running from its
  arrival: W = sum of gpus x min(duration, H - arrival).

Combined over time (:meth:`Bound.cumulative`): work done by t is at most the work done by an
earlier s plus the integral of P over [s, t], and at most W(t) (W up to t); the bound B(H) is at
most min(integral of P over [0, H], W). A policy's allocation ÷ bound is its useful in-window
GPU-seconds over B(H). It holds for preempting policies
too (useful work excludes work lost to preemption); it does not hold for pod-by-pod, whose partial
gangs are not gangs (reported, not compared).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from ortools.sat.python import cp_model

from cluster.names import LABEL_RACK, LABEL_ZONE

from .generate import GPU
from .traces import Cluster, Job, Trace

BOUND_DETERMINISTIC_TIME = 0.5


@dataclass(frozen=True)
class Bound:
    times: np.ndarray  # arrival instants (step starts)
    gpus: np.ndarray  # P at each, proven upper bound
    found: np.ndarray  # the best packing CP-SAT found (a lower end: the gap is gpus - found)
    work: float  # W: GPU-seconds
    horizon: float
    useful_gpu_s: float = 0.0  # B at the horizon (<= min(integral of P, W))

    def integral(self) -> float:
        edges = np.append(self.times, self.horizon)
        return float(np.sum(self.gpus * np.clip(np.diff(edges), 0, None)))


    def packed(self, grid: np.ndarray) -> np.ndarray:
        """The integral of P from 0 to each time of ``grid``."""
        edges = np.append(self.times, self.horizon)
        steps = np.concatenate([[0.0], np.cumsum(self.gpus * np.diff(edges))])
        idx = np.clip(np.searchsorted(self.times, grid, side="right") - 1, 0, None)
        return np.where(grid >= self.times[0], steps[idx] + self.gpus[idx] * (grid - self.times[idx]), 0.0)

    def cumulative(self, jobs: tuple[Job, ...], grid: np.ndarray) -> np.ndarray:
        """The bound B on useful GPU-seconds done by each time of ``grid`` (sorted, from 0):
        B(t_k) = min(W(t_k), B(t_k-1) + integral of P over [t_k-1, t_k]), with W(t) every job's
        work that fits between its arrival and t. Work done by t_k is at most that done by t_k-1
        plus what the cluster can run in between, and at most W(t_k): B is valid at every step."""
        arrivals = np.array([j.arrival for j in jobs])
        durations = np.array([j.duration for j in jobs])
        sizes = np.array([j.pods * j.gpus for j in jobs])
        work = (sizes * np.minimum(durations, np.clip(grid[:, None] - arrivals, 0, None))).sum(axis=1)
        step = np.diff(self.packed(grid), prepend=0.0)
        out = np.empty(len(grid))
        previous = 0.0
        for k in range(len(grid)):
            previous = min(work[k], previous + step[k])
            out[k] = previous
        return out

    def useful(self, jobs: tuple[Job, ...], points: int = 4000) -> float:
        """B at the horizon, on a grid of the arrivals and ``points`` even steps."""
        grid = np.union1d(np.linspace(0.0, self.horizon, points), [j.arrival for j in jobs])
        return float(self.cumulative(jobs, grid)[-1])

    def at(self, t: np.ndarray) -> np.ndarray:
        idx = np.searchsorted(self.times, t, side="right") - 1
        return np.where(idx >= 0, self.gpus[np.clip(idx, 0, None)], 0)


class PackingBound:
    """P(k) for the first k jobs in arrival order, memoised across loads of the same trace."""

    def __init__(self, cluster: Cluster, jobs: tuple[Job, ...],
                 deterministic_time: float = BOUND_DETERMINISTIC_TIME) -> None:
        self.cluster = cluster
        self.deterministic_time = deterministic_time
        self.jobs = sorted(jobs, key=lambda j: (j.arrival, j.id))
        nodes = cluster.nodes
        self.racks = sorted({n.labels[LABEL_RACK] for n in nodes})
        self.zone_of = {n.labels[LABEL_RACK]: n.labels[LABEL_ZONE] for n in nodes}
        self.zones = sorted(set(self.zone_of.values()))
        self.rack_gpus = {r: sum(n.allocatable.get(GPU, 0) for n in nodes if n.labels[LABEL_RACK] == r)
                          for r in self.racks}
        self.rack_cpu = {r: sum(n.allocatable.get("cpu", 0) for n in nodes if n.labels[LABEL_RACK] == r)
                         for r in self.racks}
        self.rack_nodes = {r: sum(1 for n in nodes if n.labels[LABEL_RACK] == r) for r in self.racks}
        self.node_gpus = max(n.allocatable.get(GPU, 0) for n in nodes)
        self.capacity = cluster.gpus
        self.keys = [cluster.required_key(j) for j in self.jobs]
        self.memo: dict[int, tuple[int, int]] = {}

    def value(self, k: int) -> tuple[int, int]:
        """(proven bound, packing found) for the first ``k`` jobs."""
        if k in self.memo:
            return self.memo[k]
        demand = sum(j.pods * j.gpus for j in self.jobs[:k])
        previous = max((v for kk, v in self.memo.items() if kk < k), default=(0, 0))
        if previous[1] >= self.capacity:
            out = (self.capacity, self.capacity)  # P only grows and is at most the cluster
        elif k == 0:
            out = (0, 0)
        else:
            out = self._solve(k, demand)
        self.memo[k] = out
        return out

    def _solve(self, k: int, demand: int) -> tuple[int, int]:
        m = cp_model.CpModel()
        gpus_in = {r: [] for r in self.racks}
        cpu_in = {r: [] for r in self.racks}
        big_in = {r: [] for r in self.racks}
        total = []
        for j, key in zip(self.jobs[:k], self.keys[:k], strict=True):
            size = j.pods * j.gpus
            big = j.gpus * 2 > self.node_gpus
            if key == LABEL_RACK:
                picks = {r: m.NewBoolVar("") for r in self.racks if self.rack_gpus[r] >= size}
                if not picks:
                    continue
                m.Add(sum(picks.values()) <= 1)
                total.append(size * sum(picks.values()))
                for r, x in picks.items():
                    gpus_in[r].append(size * x)
                    cpu_in[r].append(j.pods * j.cpu * x)
                    if big:
                        big_in[r].append(j.pods * x)
                continue
            domains = [[r for r in self.racks if self.zone_of[r] == z] for z in self.zones] if key == LABEL_ZONE \
                else [self.racks]
            chosen = []
            for racks in domains:
                if sum(self.rack_gpus[r] for r in racks) < size:
                    continue
                y = m.NewBoolVar("")
                split = {r: m.NewIntVar(0, min(j.pods, self.rack_gpus[r] // j.gpus), "") for r in racks}
                m.Add(sum(split.values()) == j.pods * y)
                chosen.append(y)
                for r, z in split.items():
                    gpus_in[r].append(j.gpus * z)
                    cpu_in[r].append(j.cpu * z)
                    if big:
                        big_in[r].append(z)
            if chosen:
                m.Add(sum(chosen) <= 1)
                total.append(size * sum(chosen))
        for r in self.racks:
            if gpus_in[r]:
                m.Add(sum(gpus_in[r]) <= self.rack_gpus[r])
                m.Add(sum(cpu_in[r]) <= self.rack_cpu[r])
            if big_in[r]:
                m.Add(sum(big_in[r]) <= self.rack_nodes[r])
        objective = sum(total)
        m.Add(objective <= self.capacity)
        m.Maximize(objective)
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = 1
        solver.parameters.max_deterministic_time = self.deterministic_time
        status = solver.Solve(m)
        found = int(solver.ObjectiveValue()) if status in (cp_model.OPTIMAL, cp_model.FEASIBLE) else 0
        bound = int(np.floor(solver.BestObjectiveBound() + 1e-6)) if status != cp_model.UNKNOWN else demand
        return min(bound, demand, self.capacity), found


def shared_bound(trace: Trace, packing: PackingBound) -> Bound:
    """The bound for ``trace`` (whose jobs are ``packing``'s, possibly at another load)."""
    jobs = sorted(trace.jobs, key=lambda j: (j.arrival, j.id))
    times, values, found = [], [], []
    k = 0
    while k < len(jobs):
        t = jobs[k].arrival
        while k < len(jobs) and jobs[k].arrival == t:
            k += 1
        v, f = packing.value(k)
        times.append(t), values.append(v), found.append(f)
    h = trace.horizon
    work = sum(j.pods * j.gpus * min(j.duration, max(h - j.arrival, 0.0)) for j in jobs)
    bound = Bound(np.array(times), np.array(values), np.array(found), work, h)
    return replace(bound, useful_gpu_s=bound.useful(trace.jobs))
