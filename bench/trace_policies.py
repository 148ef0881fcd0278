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
* ``phalanx-greedy`` — :func:`solver.place` on the greedy path, gang by gang, no queue policy.
* ``phalanx`` — :func:`solver.place` (exact path, CP-SAT) gang by gang under the queue policies
  of :mod:`cycle.queue` with their defaults (the live cycle's code and defaults), then
  group preemption (:func:`solver.plan_preemption`, whole gangs as units) for high-priority gangs
  that still wait. Only phalanx policies preempt. ``phalanx-no-queue-policy`` is placement alone
  (no hold, no fragmentation awareness, no preemption); ``phalanx-no-preemption`` the defaults
  without preemption; :func:`ablations` change one option at a time.

Decisions: one per gang tried, timed from the policy's own per-gang work (the queue policies'
restriction included) to its answer; per-round work (the holds) is counted in the total.
The Permit barrier skips a shape that stopped short in the round, like every other policy.

Every gang placement made by a gang policy except the Permit barrier's pod-by-pod reservations is
checked by :func:`solver.assert_placement_valid` before it is charged.
"""

from __future__ import annotations

import time

import numpy as np

from cycle.queue import (
    Hold,
    QueuePolicy,
    Running,
    Waiting,
    blocked_nodes,
    plan_holds,
    preemptor_work,
    restrict,
    victim_budget,
    victim_prefixes,
)
from solver import (
    DisruptionMode,
    PreemptionContext,
    SolveOptions,
    VictimInfo,
    assert_placement_valid,
    place,
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
        failed: set[tuple] = set()
        for gang in sim.queue():
            if gang.shape in failed and not gang.held:
                continue  # free capacity only shrinks in a round: this shape would stop short again
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
            if len(gang.held) < gang.job.pods:
                failed.add(gang.shape)
            if gang.held and gang.waiting_since is None and len(gang.held) < gang.job.pods:
                gang.waiting_since = now
                sim.at(now + PERMIT_TIMEOUT_S, TIMEOUT, gang.job.id, gang.epoch)


class GangByGang:
    """A policy that places one whole gang per call with ``decide(snapshot, group)``; every gang
    tried is one decision, and a shape that failed in the round is not tried again."""

    gang = True

    def __init__(self, name: str, decide) -> None:
        self.name = name
        self.decide = decide

    def schedule(self, sim: Simulation, now: float) -> None:
        failed: set[tuple] = set()
        for gang in sim.queue():
            if gang.job.pods * gang.job.gpus > sim.capacity - sim.used[:, sim.gpu].sum():
                continue
            snapshot = sim.snapshot()
            started = time.perf_counter()
            restricted, key = self.prepare(sim, gang, snapshot, now)
            if key in failed:
                sim.overhead(started)
                continue
            assignments = self.decide(restricted, gang.group)
            sim.decided(started)
            if not assignments:
                failed.add(key)
                continue
            assert_placement_valid(snapshot, gang.group, assignments)
            sim.hold(gang, assignments)
        self.after_round(sim, now)

    def prepare(self, sim: Simulation, gang: GangState, snapshot, now: float) -> tuple:
        """The snapshot the gang is placed on and its key for the failed-shape skip."""
        return snapshot, gang.shape

    def after_round(self, sim: Simulation, now: float) -> None:
        pass


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


class Phalanx(GangByGang):
    """phalanx: :func:`solver.place` gang by gang (exact or greedy path) under the queue policies of
    :mod:`cycle.queue` (the code the live cycle runs), then group preemption for
    high-priority gangs that still wait (:func:`solver.plan_preemption`, whole gangs as units;
    victims offered cheapest lost work first when ``policy.lost_work_preemption``)."""

    def __init__(self, name: str = "phalanx", preempt: bool = True, policy: QueuePolicy = QueuePolicy(),
                 options: SolveOptions = SolveOptions()) -> None:
        super().__init__(name, lambda snapshot, group: place(snapshot, group, options).assignments)
        self.preempt = preempt
        self.policy = policy
        self.holds: list[Hold] = []
        self.held_rounds = 0
        self.queued: list = []

    def schedule(self, sim: Simulation, now: float) -> None:
        queue = sim.queue()
        if not queue:
            return
        started = time.perf_counter()
        snapshot = sim.snapshot()
        self.queued = [g.group for g in queue]
        waiting = [Waiting(g.group, g.queued_at, g.job.hint) for g in queue]
        running = [Running(g.job.id, {i: sim.vectors[g.job.id] * n for i, n in _per_node(g).items()},
                           None if g.job.hint is None or g.started is None
                           else g.started + max(g.job.hint - g.progress, 0.0), g.job.priority)
                   for g in sim.running()]
        self.holds = plan_holds(snapshot, waiting, running, now, self.policy)
        self.held_rounds += bool(self.holds)
        sim.overhead(started)
        super().schedule(sim, now)

    def prepare(self, sim: Simulation, gang: GangState, snapshot, now: float) -> tuple:
        restricted, _ = restrict(snapshot, gang.group, gang.job.hint, now, self.holds,
                                 [g for g in self.queued if g.key != gang.group.key], self.policy)
        blocked = blocked_nodes(gang.group, gang.job.hint, now, self.holds)
        key = (gang.shape, None if blocked is None else blocked.tobytes(), gang.job.id if restricted is not snapshot
               and self.policy.fragmentation_aware else None)
        return restricted, key

    def after_round(self, sim: Simulation, now: float) -> None:
        if not self.preempt:
            return
        for gang in sim.queue():
            if gang.job.priority > 0 and not gang.held:
                self._preempt(sim, gang, now)

    def _preempt(self, sim: Simulation, gang: GangState, now: float) -> None:
        running = {g.group.key: g for g in sim.running() if g.job.priority < gang.job.priority}
        if not running:
            return
        started = time.perf_counter()
        snapshot = sim.snapshot(with_bound=True)
        costs = {key: sim.lost_if_evicted(g, now) for key, g in running.items()}
        work = preemptor_work(gang.job.pods * gang.job.gpus, gang.job.hint)
        priorities = {key: g.job.priority for key, g in running.items()}
        prefixes = victim_prefixes(costs, victim_budget(self.policy, work), priorities) \
            if self.policy.lost_work_preemption else [list(running)]
        plan = None
        for prefix in prefixes:
            offered = set(prefix)
            context = PreemptionContext({
                p.uid: VictimInfo(r.job.priority if key in offered else gang.job.priority, key, DisruptionMode.ALL)
                for key, r in running.items() for p in r.group.members})
            plan = plan_preemption(snapshot, gang.group, context)
            if plan.placement:
                break
        sim.decided(started)
        if plan is None or not plan.placement:
            return
        for unit in plan.units:
            sim.evict(running[unit.key], now)
        after = sim.snapshot()
        assert_placement_valid(after, gang.group, plan.placement)
        sim.hold(gang, plan.placement)


def _per_node(gang: GangState) -> dict[int, int]:
    out: dict[int, int] = {}
    for i in gang.held.values():
        out[i] = out.get(i, 0) + 1
    return out


def all_policies(preempt_default: bool = True) -> list:
    """The policies compared: the baselines, then phalanx as configured by default, phalanx with no
    queue policy (placement alone) and without preemption."""
    return [PodByPod(), PermitBarrier(), upstream_policy(), kueue_policy(), greedy_policy(),
            Phalanx("phalanx", preempt=preempt_default),
            Phalanx("phalanx-no-queue-policy", preempt=False,
                    policy=QueuePolicy(starvation_after=None, starvation_factor=None, fragmentation_aware=False)),
            Phalanx("phalanx-no-preemption", preempt=False)]


#: the defaults without starvation holds
NO_HOLDS = QueuePolicy(starvation_after=None, starvation_factor=None)


def ablations() -> list:
    """One queue policy changed at a time from the defaults (to pick them)."""
    return [Phalanx("phalanx-no-hold", policy=NO_HOLDS),
            Phalanx("phalanx-hold-1x-duration", policy=QueuePolicy(starvation_factor=1.0)),
            Phalanx("phalanx-hold-2x-duration", policy=QueuePolicy(starvation_factor=2.0)),
            Phalanx("phalanx-2-holds", policy=QueuePolicy(max_holds=2)),
            Phalanx("phalanx-fragmentation-aware", policy=QueuePolicy(fragmentation_aware=True)),
            Phalanx("phalanx-fifo-preemption", policy=QueuePolicy(lost_work_preemption=False)),
            Phalanx("phalanx-budget-0.25", policy=QueuePolicy(lost_work_budget=0.25)),
            Phalanx("phalanx-no-budget", policy=QueuePolicy(lost_work_budget=None))]
