"""The scheduling policies ``phalanx bench trace`` compares, each over the same simulator.

Every policy sees the same queue (priority, then arrival) and the same required topology key per
gang (:meth:`bench.traces.Cluster.required_key`: the rack when the gang fits in one, else the
zone, else none). Within one round free capacity only shrinks, so a gang whose shape already
failed in the round is not tried again (kube-scheduler likewise retries an unschedulable pod only
after a cluster event).

* ``pod-by-pod`` — kube-scheduler without gang scheduling: every pod placed as it comes if it fits,
  on the tightest node; no topology key (pods carry none); pods stay bound until the gang completes.
* ``permit-barrier`` — coscheduling-style: pods reserve one by one (tightest node; after the first
  pod the rest must share its required-key domain, as a pod affinity would say) and wait at a
  barrier; the gang binds when all have reserved, else after 60 s the reservations are released
  and the gang retries at once from its queue position (coscheduling sorts by priority, then group
  creation; its optional denied-group backoff is not modelled).
* ``upstream-1.37`` — :func:`bench.baselines.upstream_style`: one trial placement per domain.
* ``kueue-tas`` — Kueue-TAS-style best fit: per node the count of pods that fit, summed per domain
  of the required level; the tightest domain whose count holds the gang wins; inside it nodes are
  taken by count (largest first) and the last chunk goes to the tightest node that holds it.
* ``phalanx-greedy`` — :func:`solver.place` on the greedy path, gang by gang.
* ``phalanx-exact`` — :func:`solver.place_batch` (CP-SAT) over the whole queue each round, then
  group preemption (:func:`solver.plan_preemption`, whole gangs as units) for high-priority gangs
  that still wait. Only this policy preempts; ``phalanx-exact-no-preemption`` is the same without
  preemption, to separate the two effects.

Every gang placement made by a gang policy except the Permit barrier's pod-by-pod reservations is
checked by :func:`solver.assert_placement_valid` before it is charged.
"""

from __future__ import annotations

import time

import numpy as np

from solver import (
    DisruptionMode,
    PreemptionContext,
    SolveOptions,
    VictimInfo,
    assert_placement_valid,
    place,
    place_batch,
    plan_preemption,
)

from .baselines import upstream_style
from .trace_sim import TIMEOUT, GangState, Simulation

PERMIT_TIMEOUT_S = 60.0


def tightest_node(free: np.ndarray, vec: np.ndarray, gpu: int, allowed: np.ndarray | None = None) -> int | None:
    """The node that fits ``vec`` with the fewest GPUs left, lowest index on ties."""
    fits = np.all(free >= vec, axis=1)
    if allowed is not None:
        fits &= allowed
    if not fits.any():
        return None
    candidates = np.nonzero(fits)[0]
    return int(candidates[np.argmin(free[candidates, gpu])])


class PodByPod:
    name = "pod-by-pod"
    gang = False

    def schedule(self, sim: Simulation, now: float) -> None:
        failed: set[tuple] = set()
        free = sim.free()
        for gang in sim.queue():
            vec = sim.vectors[gang.job.id]
            if gang.shape[1:3] in failed:
                continue
            started = time.perf_counter()
            placed = {}
            for pod in gang.remaining:
                i = tightest_node(free, vec, sim.gpu)
                if i is None:
                    failed.add(gang.shape[1:3])  # no key: the same pod shape fits nowhere now
                    break
                free[i] -= vec
                placed[pod.uid] = i
            sim.decided(started)
            sim.hold(gang, placed)


class PermitBarrier:
    name = "permit-barrier"
    gang = True

    def schedule(self, sim: Simulation, now: float) -> None:
        free = sim.free()
        for gang in sim.queue():
            vec = sim.vectors[gang.job.id]
            key = gang.group.topology_key
            values = sim.base.label_values(key) if key else None
            started = time.perf_counter()
            placed = {}
            for pod in gang.remaining:
                held = list(gang.held.values()) + list(placed.values())
                allowed = values == values[held[0]] if key and held else None
                i = tightest_node(free, vec, sim.gpu, allowed)
                if i is None:
                    break
                free[i] -= vec
                placed[pod.uid] = i
            sim.decided(started)
            sim.hold(gang, placed)
            if gang.held and gang.waiting_since is None and len(gang.held) < gang.job.pods:
                gang.waiting_since = now
                sim.at(now + PERMIT_TIMEOUT_S, TIMEOUT, gang.job.id, gang.epoch)


class GangByGang:
    """A policy that places one whole gang per call with ``decide(snapshot, group)``."""

    gang = True

    def __init__(self, name: str, decide) -> None:
        self.name = name
        self.decide = decide

    def schedule(self, sim: Simulation, now: float) -> None:
        failed: set[tuple] = set()
        for gang in sim.queue():
            if gang.shape in failed or gang.job.pods * gang.job.gpus > sim.capacity - sim.used[:, sim.gpu].sum():
                continue
            snapshot = sim.snapshot()
            started = time.perf_counter()
            assignments = self.decide(snapshot, gang.group)
            sim.decided(started)
            if not assignments:
                failed.add(gang.shape)
                continue
            assert_placement_valid(snapshot, gang.group, assignments)
            sim.hold(gang, assignments)


def upstream_policy() -> GangByGang:
    return GangByGang("upstream-1.37", lambda snapshot, group: upstream_style(snapshot, group).assignments)


def greedy_policy() -> GangByGang:
    options = SolveOptions(path="greedy")
    return GangByGang("phalanx-greedy", lambda snapshot, group: place(snapshot, group, options).assignments)


def kueue_policy() -> GangByGang:
    return GangByGang("kueue-tas", kueue_tas)


def kueue_tas(snapshot, group) -> dict[str, str]:
    """Kueue-TAS-style best fit: capacity counts per node, summed per domain; the tightest domain
    whose count holds the gang; inside it, largest counts first, the last chunk on the tightest
    node that holds it."""
    spec = group.members[0].spec
    vec, unknown = snapshot.request_vector(spec.requests)
    if unknown:
        return {}
    free = snapshot.free
    need = np.where(vec > 0, vec, 1)
    counts = np.min(np.where(vec > 0, free // need, np.iinfo(np.int64).max), axis=1)
    counts = np.where(snapshot.eligibility(spec).mask, counts, 0)
    values, ids = snapshot.domains(group.topology_key)
    totals = np.bincount(ids[ids >= 0], weights=counts[ids >= 0], minlength=len(values))
    pods = group.pending
    fitting = [d for d in range(len(values)) if totals[d] >= len(pods)]
    if not fitting:
        return {}
    domain = min(fitting, key=lambda d: (totals[d], values[d]))
    nodes = [i for i in np.nonzero(ids == domain)[0] if counts[i] > 0]
    nodes.sort(key=lambda i: (-counts[i], i))
    out: dict[str, str] = {}
    left = len(pods)
    for i in nodes:
        if left == 0:
            break
        if counts[i] >= left:  # the last chunk: the tightest node that still holds it
            i = min((n for n in nodes if counts[n] >= left and snapshot.nodes[n].name not in out.values()),
                    key=lambda n: (counts[n], n))
        take = int(min(counts[i], left))
        for _ in range(take):
            out[pods[len(pods) - left].uid] = snapshot.nodes[i].name
            left -= 1
    return out


class PhalanxExact:
    gang = True

    def __init__(self, preempt: bool = True, options: SolveOptions = SolveOptions()) -> None:
        self.name = "phalanx-exact" if preempt else "phalanx-exact-no-preemption"
        self.preempt = preempt
        self.options = options
        self.gaps: list[float] = []

    def schedule(self, sim: Simulation, now: float) -> None:
        queue = sim.queue()
        if not queue:
            return
        by_key = {g.group.key: g for g in queue}
        snapshot = sim.snapshot()
        result = place_batch(snapshot, [g.group for g in queue], self.options)
        current = snapshot
        waiting = []
        for placement in result.placements:
            sim.decisions_ms.append(placement.stats.get("solve_ms", 0.0))
            gang = by_key[placement.group]
            if not placement.assignments:
                waiting.append(gang)
                continue
            assert_placement_valid(current, gang.group, placement.assignments)
            current = current.with_placement(placement.assignments, {p.uid: p for p in gang.group.members})
            sim.hold(gang, placement.assignments)
            if placement.gap is not None:
                self.gaps.append(placement.gap)
        for gang in waiting:
            if self.preempt and gang.job.priority > 0:
                self._preempt(sim, gang)

    def _preempt(self, sim: Simulation, gang: GangState) -> None:
        running = {g.group.key: g for g in sim.running()}
        if not any(g.job.priority < gang.job.priority for g in running.values()):
            return
        snapshot = sim.snapshot(with_bound=True)
        context = PreemptionContext({p.uid: VictimInfo(p_gang.job.priority, key, DisruptionMode.ALL)
                                     for key, p_gang in running.items() for p in p_gang.group.members})
        started = time.perf_counter()
        plan = plan_preemption(snapshot, gang.group, context)
        sim.decided(started)
        if not plan.placement:
            return
        for unit in plan.units:
            sim.evict(running[unit.key])
        after = sim.snapshot()
        assert_placement_valid(after, gang.group, plan.placement)
        sim.hold(gang, plan.placement)


def all_policies():
    return [PodByPod(), PermitBarrier(), upstream_policy(), kueue_policy(), greedy_policy(), PhalanxExact(),
            PhalanxExact(preempt=False)]
