"""Group preemption planning: which lower-priority pods to evict so a PodGroup fits.

The rules, as upstream states them for workload-aware preemption (KEP-5710): a victim *unit* is
one pod (its group's disruption mode is ``single``, or it has no group) or a whole group (``all``:
every bound member goes together); only units of strictly lower priority than the preemptor are
candidates; a group with ``preemptionPolicy: Never`` never evicts anything. Victim sets compare in
upstream's order, smaller first (:class:`PreemptionCost`):

1. fewest PodDisruptionBudget violations;
2. the lowest priority of the most important victim;
3. fewest victim pods;
4. least total victim priority;

and every victim is necessary: giving back any one unit leaves the preemptor without room.

The search runs per candidate domain of the required topology key (the whole cluster without a
key) and takes victims only from units with a pod on a node of that domain that the group may use
(a unit's members elsewhere go with it: the unit is atomic):

* **greedy** — the upstream shape and the benchmark baseline: evict every candidate, check the
  group fits, then give units back one at a time (PDB-violating units first, then highest
  priority first; an ``all`` unit only as a whole), keeping each reprieve that still leaves room;
* **exact** — one CP-SAT model per domain, seeded with the greedy answer and capped by the best
  answer so far: a boolean per ``all`` unit, an integer per class of interchangeable ``single``
  victims on a node, the group's pods per shape on every node that holds victims, and the rest of
  the domain as node classes with packing patterns (:mod:`solver.cpsat`); the four criteria
  above as one weighted sum.

Every answer is then checked the way it will be acted on: remove the victims from the snapshot,
:func:`solver.place` the group, run the placement through the validator, and give back every unit
whose eviction turns out unnecessary (in reprieve order). The exact path returns the better of its
own answer and the greedy one, so it is never worse than the baseline.

For the extender's preempt verb (a pod *without* a group), :func:`expand_victims_for_pod` and
:func:`rank_candidates` count a victim that belongs to an ``all`` group as its whole group.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import numpy as np
from ortools.sat.python import cp_model

from .cpsat import ModelBuilder, ModelTooLarge, Solved, packing_patterns
from .errors import InvalidInput, SolverError
from .greedy import greedy_domain
from .model import PODS, DisruptionMode, Pod, PodGroup, PreemptionPolicy
from .placement import Placement, SolveOptions, place
from .problem import Problem
from .snapshot import Snapshot
from .validate import assert_placement_valid

#: Below every Kubernetes priority (int32): the highest victim priority of a plan with no victims.
NO_VICTIM_PRIORITY = -(2**31) - 1

#: Preemption defaults: the CP-SAT budget is per domain model and deterministic (reproducible).
#: The models find their best answer early; a larger budget mostly buys an unfinished proof.
PREEMPTION_OPTIONS = SolveOptions(path="exact", deterministic_time=0.1, time_limit=5.0)


# -- input ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class VictimInfo:
    """What preemption needs to know about one running pod: its unit's priority (the PodGroup's
    priority where it has one), its group key and that group's disruption mode."""

    priority: int
    group: str = ""
    mode: DisruptionMode = DisruptionMode.SINGLE

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", DisruptionMode(self.mode))
        if self.mode is DisruptionMode.ALL and not self.group:
            raise InvalidInput("victim info: disruption mode all needs a group key")


@dataclass(frozen=True)
class DisruptionBudget:
    """A PodDisruptionBudget as preemption sees it: the running pods it selects and how many of
    them may still be disrupted (its ``status.disruptionsAllowed``)."""

    name: str
    pods: frozenset[str]
    allowed: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "pods", frozenset(self.pods))
        if isinstance(self.allowed, bool) or not isinstance(self.allowed, int) or self.allowed < 0:
            raise InvalidInput(f"disruption budget {self.name}: allowed must be an integer >= 0, got {self.allowed!r}")


@dataclass(frozen=True)
class PreemptionContext:
    """Victim metadata per running pod uid, plus the disruption budgets. A bound pod missing from
    ``victims`` is a ``single`` unit at its own pod priority."""

    victims: Mapping[str, VictimInfo] = field(default_factory=dict)
    budgets: tuple[DisruptionBudget, ...] = ()

    def info(self, pod: Pod) -> VictimInfo:
        return self.victims.get(pod.uid) or VictimInfo(pod.spec.priority, pod.group)

    @classmethod
    def from_groups(cls, groups: Iterable[PodGroup], budgets: Iterable[DisruptionBudget] = ()) -> "PreemptionContext":
        """Context from the running groups: each bound member gets its group's priority and mode."""
        victims = {
            pod.uid: VictimInfo(group.priority, group.key, group.disruption_mode)
            for group in groups
            for pod in group.bound
        }
        return cls(victims, tuple(budgets))


# -- output -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class VictimUnit:
    """What is evicted together: one pod (``key`` is the pod's ``namespace/name``) or a whole
    ``all`` group (``key`` is the group's)."""

    key: str
    pods: tuple[str, ...]  # uids
    priority: int
    mode: DisruptionMode

    def describe(self) -> str:
        if self.mode is DisruptionMode.ALL:
            return f"podgroup {self.key} ({len(self.pods)} pods)"
        return f"pod {self.key}"


@dataclass(frozen=True, order=True)
class PreemptionCost:
    """Upstream's order of victim sets as one comparable tuple: smaller is better."""

    pdb_violations: int
    highest_priority: int  # NO_VICTIM_PRIORITY when nothing is evicted
    pods: int
    priority_sum: int

    def describe(self) -> str:
        top = "-" if self.highest_priority == NO_VICTIM_PRIORITY else str(self.highest_priority)
        return (f"pdb_violations={self.pdb_violations} highest_priority={top} pods={self.pods} "
                f"priority_sum={self.priority_sum}")


@dataclass(frozen=True)
class PreemptionPlan:
    """The answer for one preemptor group. When ``reason`` is set, preemption cannot help and the
    reason is fit for an event or a condition message; otherwise evicting ``victims`` lets
    ``placement`` (pending pod uid -> node, checked by the validator on the snapshot without the
    victims) happen, and no victim could be spared."""

    group: str
    units: tuple[VictimUnit, ...] = ()  # highest priority first
    victims: tuple[str, ...] = ()  # pod uids, highest priority first
    pdb_violations: int = 0
    placement: Mapping[str, str] = field(default_factory=dict)
    domain: str = ""
    cost: PreemptionCost | None = None
    path: str = "greedy"
    optimal: bool = False  # CP-SAT proved every domain model it solved optimal
    reason: str = ""
    stats: Mapping[str, float] = field(default_factory=dict)

    @property
    def helps(self) -> bool:
        return not self.reason


def victim_cost(units: Iterable[VictimUnit], budgets: Iterable[DisruptionBudget]) -> PreemptionCost:
    """The cost of evicting ``units`` together. A budget is violated once per pod evicted beyond
    its allowed disruptions."""
    units = list(units)
    uids = {uid for unit in units for uid in unit.pods}
    return PreemptionCost(
        pdb_violations=sum(max(0, len(b.pods & uids) - b.allowed) for b in budgets),
        highest_priority=max((u.priority for u in units), default=NO_VICTIM_PRIORITY),
        pods=len(uids),
        priority_sum=sum(u.priority * len(u.pods) for u in units),
    )


# the rule's one home (docs/design.md: KEP-6277/disruption-all-unit)
def victim_units(snapshot: Snapshot, context: PreemptionContext, exclude_group: str = "") -> list[VictimUnit]:
    """Every running pod of ``snapshot`` grouped into eviction units, sorted by key. An ``all``
    unit's priority is the highest of its members' (they share the group's priority upstream)."""
    groups: dict[str, list[tuple[Pod, VictimInfo]]] = {}
    units = []
    for pod in snapshot.bound:
        info = context.info(pod)
        if exclude_group and exclude_group in (pod.group, info.group):
            continue
        if info.mode is DisruptionMode.ALL:
            groups.setdefault(info.group, []).append((pod, info))
        else:
            units.append(VictimUnit(pod.key, (pod.uid,), info.priority, DisruptionMode.SINGLE))
    for key, members in groups.items():
        uids = tuple(sorted(p.uid for p, _ in members))
        units.append(VictimUnit(key, uids, max(i.priority for _, i in members), DisruptionMode.ALL))
    units.sort(key=lambda u: (u.key, u.pods))
    return units


def _by_importance(units: Iterable[VictimUnit]) -> list[VictimUnit]:
    return sorted(units, key=lambda u: (-u.priority, u.key, u.pods))


# -- the search -------------------------------------------------------------------------------------
def plan_preemption(
    snapshot: Snapshot,
    group: PodGroup,
    context: PreemptionContext,
    options: SolveOptions = PREEMPTION_OPTIONS,
) -> PreemptionPlan:
    """Plan the evictions that let ``group``'s pending members be placed on ``snapshot`` (whose
    ``bound`` pods are the running pods). ``options.path`` picks greedy or exact; the CP-SAT budget
    is per domain model. Raises :class:`InvalidInput` for a group that cannot be placed as given."""
    started = time.perf_counter()
    group.check_ready()
    if group.preemption_policy is PreemptionPolicy.NEVER:
        return _cannot(group, "preemptionPolicy Never")
    if not group.pending:
        return _cannot(group, "no pending members to place")
    search = _Search(snapshot, group, context, options)
    plan = search.run()
    stats = dict(plan.stats)
    stats["decision_ms"] = (time.perf_counter() - started) * 1000.0
    return PreemptionPlan(**{**plan.__dict__, "stats": stats})


def first_plan(snapshot: Snapshot, group: PodGroup, contexts: Sequence[PreemptionContext],
               options: SolveOptions = PREEMPTION_OPTIONS) -> PreemptionPlan | None:
    """The plan of the first of ``contexts`` (victims offered in growing prefixes) under which
    evicting someone lets ``group`` fit and no PodDisruptionBudget is violated; else the last plan
    that helped (a larger prefix may respect every budget, so one that violates a budget does not
    stop the search); None when none helps. One call, so a worker process runs the whole search."""
    plan = None
    for context in contexts:
        tried = plan_preemption(snapshot, group, context, options)
        if tried.helps and tried.victims:
            plan = tried
            if tried.pdb_violations == 0:
                break
    return plan


def _cannot(group: PodGroup, why: str, stats: Mapping[str, float] | None = None) -> PreemptionPlan:
    return PreemptionPlan(group.key, reason=f"podgroup {group.key}: preemption cannot help: {why}", stats=stats or {})


class _Room:
    """A necessary condition for the group to fit, kept as victims are given back one by one.

    An eligible node (the group's node selectors, node affinity and tolerations: nothing that
    depends on which pods run) holds at most ``min over resources of free // cheapest`` of the
    group's pending pods, ``cheapest`` being the smallest request of its shapes per resource (each
    pod counts one toward the node's pod limit); a domain whose nodes hold fewer than the pods still
    needed cannot host the group. Every other rule of a placement (inter-pod terms, spread, ports,
    node limits) only takes room away, so when no domain passes this count the full check (a
    packing or a solve over the whole snapshot) would refuse too, and the search skips it. A
    100-pod gang preempting 1,000 pods on 100 nodes gives 1,000 victims back in turn, each refused:
    a solve each was half a minute in all, the count is milliseconds."""

    def __init__(self, search: "_Search", snapshot: Snapshot, domains: list[int]) -> None:
        base = search.base
        cheapest = np.min(np.stack([s.vec for s in base.shapes]), axis=0)
        self.cols = np.nonzero(cheapest)[0]
        self.per_pod = cheapest[self.cols]
        self.free = snapshot.free.copy()
        self.index, self.rindex = snapshot.index, snapshot.rindex
        self.ids, self.eligible = base.domain_ids, search.eligible
        self.needed = max(base.needed, 1)
        caps = self._caps(np.arange(len(self.free)), self.free)
        self.sums = {d: int(caps[self.ids == d].sum()) for d in domains}
        self.caps = caps

    def _caps(self, rows: np.ndarray, free: np.ndarray) -> np.ndarray:
        """Pods of the group that ``rows`` hold, ``free`` being their free room (one row each)."""
        held = np.min(free[:, self.cols] // self.per_pod, axis=1)
        return np.where(self.eligible[rows], np.maximum(held, 0), 0)

    def _after(self, usage: Mapping[str, Mapping[str, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rows = np.array([self.index[node] for node in usage], dtype=np.int64)
        free = self.free[rows].copy()
        for i, amounts in enumerate(usage.values()):
            for r, amount in amounts.items():
                j = self.rindex.get(r)
                if j is not None:
                    free[i, j] -= amount
        return rows, free, self._caps(rows, free)

    def refuses(self, usage: Mapping[str, Mapping[str, int]]) -> bool:
        """True when, with ``usage`` (a unit given back: node -> amounts) charged again, no domain
        holds the pods the group needs."""
        rows, _, caps = self._after(usage)
        change: dict[int, int] = {}
        for row, cap in zip(rows.tolist(), caps.tolist(), strict=True):
            d = int(self.ids[row])
            change[d] = change.get(d, 0) + cap - int(self.caps[row])
        return all(total + change.get(d, 0) < self.needed for d, total in self.sums.items())

    def take(self, usage: Mapping[str, Mapping[str, int]]) -> None:
        """``usage`` was given back for good."""
        rows, free, caps = self._after(usage)
        for row, cap in zip(rows.tolist(), caps.tolist(), strict=True):
            d = int(self.ids[row])
            if d in self.sums:
                self.sums[d] += cap - int(self.caps[row])
        self.free[rows] = free
        self.caps[rows] = caps


class _Search:
    def __init__(self, snapshot: Snapshot, group: PodGroup, context: PreemptionContext, options: SolveOptions):
        self.snapshot = snapshot
        self.group = group
        self.budgets = context.budgets
        self.options = options
        self.check = SolveOptions(path="exact", seed=options.seed, deterministic_time=options.deterministic_time,
                                  time_limit=options.time_limit)
        self.base = Problem(snapshot, group)
        self.pods = {p.uid: p for p in snapshot.bound}
        self.units = [u for u in victim_units(snapshot, context, group.key) if u.priority < group.priority]
        self.stats: dict[str, float] = {"candidate_units": len(self.units),
                                        "candidate_pods": sum(len(u.pods) for u in self.units)}
        eligible = np.any(np.stack([s.eligibility.mask for s in self.base.shapes]), axis=0)
        ids = self.base.domain_ids
        self.domain_units: dict[int, list[int]] = {d: [] for d in self.base.candidate_domains}
        for k, unit in enumerate(self.units):
            nodes = {snapshot.index[self.pods[uid].node] for uid in unit.pods}
            for d in sorted({int(ids[i]) for i in nodes if eligible[i]}):
                if d in self.domain_units:
                    self.domain_units[d].append(k)
        self.eligible = eligible
        # the group's pods ask for room and node eligibility only (no inter-pod terms, spread,
        # host ports), and the group has no member running yet to count against them
        self.room_only = not group.bound and not any(p.spec.has_pod_constraints for p in group.pending)

    # -- helpers --------------------------------------------------------------------------------
    def uids(self, units: Iterable[int]) -> list[str]:
        return [uid for k in units for uid in self.units[k].pods]

    def cost(self, units: Iterable[int]) -> PreemptionCost:
        return victim_cost((self.units[k] for k in units), self.budgets)

    def usage(self, k: int) -> dict[str, dict[str, int]]:
        """What unit ``k``'s pods use, per node (to charge it back on a reprieve)."""
        out: dict[str, dict[str, int]] = {}
        for uid in self.units[k].pods:
            pod = self.pods[uid]
            slot = out.setdefault(pod.node, {PODS: 0})
            slot[PODS] += 1
            for r, amount in pod.spec.requests.items():
                slot[r] = slot.get(r, 0) + amount
        return out

    def reprieve_order(self, units: Iterable[int]) -> list[int]:
        """Upstream's reprieve order: units whose eviction would violate a budget first, then the
        rest; highest priority first inside each (so the most important are spared when possible)."""
        ordered = sorted(units, key=lambda k: (-self.units[k].priority, self.units[k].key, k))
        left = {b.name: b.allowed for b in self.budgets}
        violating = set()
        for k in ordered:
            for uid in self.units[k].pods:
                for b in self.budgets:
                    if uid in b.pods:
                        left[b.name] -= 1
                        if left[b.name] < 0:
                            violating.add(k)
        return [k for k in ordered if k in violating] + [k for k in ordered if k not in violating]

    def places(self, units: Iterable[int]) -> tuple[Snapshot, Placement]:
        snap = self.snapshot.without_pods(self.uids(units))
        return snap, place(snap, self.group, self.check)

    # -- the whole search -------------------------------------------------------------------------
    def run(self) -> PreemptionPlan:
        group = self.group
        if place(self.snapshot, group, self.check).assignments:
            return self.finish([], self.options.path, True)
        if not self.units:
            return _cannot(group, f"no running pod has a priority below {group.priority}", self.stats)
        snap, everything = self.places(range(len(self.units)))
        if not everything.assignments:
            assert everything.explanation is not None  # place() explains every group it cannot place
            detail = everything.explanation.message().removeprefix(f"podgroup {group.key}: ")
            return _cannot(
                group,
                f"even with all {self.stats['candidate_pods']} lower-priority pods evicted: {detail}",
                self.stats,
            )
        greedy = {}
        for d, units in self.domain_units.items():
            found = self.greedy(d, units)
            if found is not None:
                greedy[d] = found
        self.stats["domains_feasible"] = len(greedy)
        if not greedy:  # the greedy packing misses what the exact placement found: evict all
            greedy = {-1: list(range(len(self.units)))}
        best_d = min(greedy, key=lambda d: (self.cost(greedy[d]), d))
        baseline = self.necessary_only(greedy[best_d])
        if self.options.path == "greedy":
            return self.finish(baseline, "greedy", False)
        found, optimal = self.exact(greedy, self.cost(baseline))
        if found is not None:
            found = self.necessary_only(found)
        if found is None or self.cost(baseline) <= self.cost(found):
            return self.finish(baseline, "exact", optimal)
        return self.finish(found, "exact", optimal)

    def greedy(self, d: int, units: list[int]) -> list[int] | None:
        """Upstream's shape in one domain: evict every candidate, then reprieve in order."""
        current = self.snapshot.without_pods(self.uids(units))
        witness = self.packing_in_domain(current, d)
        if witness is None:
            return None
        room = _Room(self, current, [d])
        evicted = set(units)
        for k in self.reprieve_order(units):
            usage = self.usage(k)
            if room.refuses(usage):
                continue
            trial = current.with_usage(usage)
            if not self.untouched(witness, usage):
                found = self.packing_in_domain(trial, d)
                if found is None:
                    continue
                witness = found
            current = trial
            room.take(usage)
            evicted.discard(k)
        return sorted(evicted)

    def necessary_only(self, units: list[int]) -> list[int]:
        """Give back, in reprieve order, every unit the placement solver does not need."""
        kept = list(units)
        room = _Room(self, self.snapshot.without_pods(self.uids(kept)), list(self.domain_units))
        witness: set[str] | None = None  # the nodes of the last placement found, where known
        for k in self.reprieve_order(units):
            usage = self.usage(k)
            if room.refuses(usage):
                continue
            trial = [j for j in kept if j != k]
            if witness is None or not self.untouched(witness, usage):
                placement = self.places(trial)[1]
                if not placement.assignments:
                    continue
                witness = set(placement.assignments.values())
            kept = trial
            room.take(usage)
        return kept

    def packing_in_domain(self, snap: Snapshot, d: int) -> set[str] | None:
        """The nodes of a packing of the group in domain ``d`` (:func:`greedy_domain`), None when
        it finds none."""
        problem = Problem(snap, self.group)
        hosts = np.nonzero((problem.domain_ids == d) & (problem.pods_ub > 0))[0]
        if not len(hosts):
            return None
        packing = greedy_domain(problem, hosts)
        if packing is None:
            return None
        return {snap.nodes[int(i)].name for counts in packing.values() for i, _ in counts}

    def untouched(self, witness: set[str], usage: Mapping[str, Mapping[str, int]]) -> bool:
        """A unit given back whose pods sit only on nodes outside ``witness`` (a placement found
        with it evicted) leaves that placement standing, when the group's pods ask only for room
        and node eligibility: then nothing but the room of their own nodes concerns them. Its
        check is skipped: a 10-pod gang preempting on a 100-node cluster gives back the units of
        the 90 other nodes, each a solve before."""
        return self.room_only and witness.isdisjoint(usage)
    def finish(self, units: list[int], path: str, optimal: bool) -> PreemptionPlan:
        snap, placement = self.places(units)
        if not placement.assignments:
            raise SolverError(f"podgroup {self.group.key}: preemption plan does not free enough room")
        assert_placement_valid(snap, self.group, placement.assignments)
        ordered = _by_importance(self.units[k] for k in units)
        cost = victim_cost(ordered, self.budgets)
        return PreemptionPlan(
            group=self.group.key,
            units=tuple(ordered),
            victims=tuple(uid for u in ordered for uid in u.pods),
            pdb_violations=cost.pdb_violations,
            placement=dict(placement.assignments),
            domain=placement.domain,
            cost=cost,
            path=path,
            optimal=optimal,
            stats=self.stats,
        )

    # -- the exact path ---------------------------------------------------------------------------
    def exact(self, greedy: dict[int, list[int]], incumbent: PreemptionCost) -> tuple[list[int] | None, bool]:
        """Solve a CP-SAT model per domain that could beat the incumbent; best answer and whether
        every model solved was proven optimal."""
        weights = _CostWeights.for_units(self.units, self.budgets)
        best: tuple[PreemptionCost, list[int]] | None = None
        proven = True
        solved = pruned = 0
        # domains the greedy solved, cheapest first, then those where its packing missed
        ranked = sorted((d for d in greedy if d >= 0), key=lambda d: (self.cost(greedy[d]), d))
        ranked += [d for d in self.domain_units if d not in greedy]
        for d in ranked:
            ceiling = incumbent if best is None else min(incumbent, best[0])
            if self.lower_bound(d, ceiling) >= ceiling:
                pruned += 1
                continue
            try:
                answer = self.solve_domain(d, greedy.get(d, []), weights, weights.scalar(ceiling))
            except ModelTooLarge:
                proven = False
                continue
            solved += 1
            if answer is None:
                continue
            units, optimal = answer
            proven &= optimal
            cost = self.cost(units)
            if best is None or cost < best[0]:
                best = (cost, units)
        self.stats.update(domains_solved=solved, domains_pruned=pruned)
        return (best[1] if best else None), proven

    def lower_bound(self, d: int, ceiling: PreemptionCost) -> PreemptionCost:
        """No victim set of domain ``d`` costs less than this (from totals only): the lowest
        priority level whose units, all evicted, free enough in total, and the fewest pods of at
        most the ceiling's priority that cover the largest shortfall."""
        units = self.domain_units[d]
        nodes = np.nonzero((self.base.domain_ids == d) & self.eligible)[0]
        cheapest = np.min(np.stack([s.vec for s in self.base.shapes]), axis=0)
        short = cheapest * max(self.base.needed, 1) - self.snapshot.free[nodes].sum(axis=0)
        if not np.any(short > 0):
            return PreemptionCost(0, NO_VICTIM_PRIORITY, 0, 0)
        in_domain = set(nodes.tolist())
        freed = []  # (priority, request vector) per candidate pod on the domain's eligible nodes
        for k in units:
            for uid in self.units[k].pods:
                pod = self.pods[uid]
                if self.snapshot.index[pod.node] in in_domain:
                    freed.append((self.units[k].priority, self.snapshot.request_vector(pod.spec.requests)[0]))
        freed.sort(key=lambda f: f[0])
        total = np.zeros_like(short)
        top = NO_VICTIM_PRIORITY
        for priority, vec in freed:
            if not np.any(total < short):
                break
            total = total + vec
            top = priority
        if np.any(total < short):
            return PreemptionCost(0, 2**62, 0, 0)  # cannot be feasible
        if top < ceiling.highest_priority or ceiling.pdb_violations > 0:
            return PreemptionCost(0, top, 1, 0)
        pods = 0
        for j in np.nonzero(short > 0)[0]:
            sizes = sorted((int(v[j]) for p, v in freed if p <= ceiling.highest_priority), reverse=True)
            reach = np.cumsum(sizes) if sizes else np.zeros(1)
            pods = max(pods, int(np.searchsorted(reach, short[j])) + 1)
        return PreemptionCost(0, top, pods, pods * min(p for p, _ in freed))

    def solve_domain(self, d: int, hint: list[int], weights: "_CostWeights",
                     ceiling: int) -> tuple[list[int], bool] | None:
        """The CP-SAT model of domain ``d`` (see the module docstring); None when nothing under the
        ceiling exists, else (unit indices, proven optimal)."""
        model = _VictimModel(self, d)
        if not model.build_model(weights, ceiling):
            return None
        model.add_hint(hint)
        solved = model.builder.solve(self.options.seed, self.options.deterministic_time, self.options.time_limit)
        if solved is None:
            return None
        return model.evicted(solved), solved.optimal


#: A class of interchangeable ``single`` victims: (node, request vector, priority, budgets)
VictimClass = tuple[int, tuple[int, ...], int, tuple[str, ...]]


class _VictimModel:
    """The CP-SAT model of one domain of a preemption search, part by part: the victims (a boolean
    per ``all`` unit, a count per class of interchangeable ``single`` pods on a node), the group's
    pods on every node that holds victims, the rest of the domain as node classes with packing
    patterns, the group's size, and the eviction's cost (:meth:`_CostWeights.terms`)."""

    def __init__(self, search: _Search, d: int) -> None:
        self.search = search
        snap, base = search.snapshot, search.base
        self.cols = np.nonzero(np.any(np.stack([s.vec for s in base.shapes]), axis=0))[0]
        self.vecs = np.stack([s.vec[self.cols] for s in base.shapes])
        self.raw = (snap.allocatable - snap.used)[:, self.cols]
        self.units = search.domain_units[d]
        self.nodes = np.nonzero((base.domain_ids == d) & search.eligible)[0]
        self.in_domain = set(self.nodes.tolist())
        self.builder = ModelBuilder(len(base.shapes))
        #: node -> [(request vector over cols, victim variable)]: what evicting frees there
        self.freed: dict[int, list[tuple[np.ndarray, cp_model.IntVar]]] = {}
        self.unit_vars: dict[int, cp_model.IntVar] = {}
        self.class_vars: list[tuple[cp_model.IntVar, list[int]]] = []

    def build_model(self, weights: "_CostWeights", ceiling: int) -> bool:
        """Add every part, the cost at most ``ceiling``; False when the group can go nowhere."""
        self.add_victims()
        for i, terms in self.freed.items():
            self.add_node_with_victims(i, terms)
        self.add_other_nodes()
        base = self.search.base
        if self.builder.group_size([s.count for s in base.shapes], base.needed) is None:
            return False
        search = self.search
        victims = [(search.units[k], var, 1) for k, var in self.unit_vars.items()]
        victims += [(search.units[members[0]], var, len(members)) for var, members in self.class_vars]
        objective = weights.terms(self.builder, victims, search.budgets)
        self.builder.model.add(objective <= ceiling)
        self.builder.model.minimize(objective)
        return True

    def _request(self, uid: str) -> np.ndarray:
        snap = self.search.snapshot
        return snap.request_vector(self.search.pods[uid].spec.requests)[0][self.cols]

    def add_victims(self) -> None:
        """A boolean per ``all`` unit, a count per class of interchangeable ``single`` pods."""
        search, snap = self.search, self.search.snapshot
        classes: dict[VictimClass, list[int]] = {}
        for k in self.units:
            unit = search.units[k]
            if unit.mode is DisruptionMode.ALL:
                var = self.unit_vars[k] = self.builder.bool_var(f"evict[unit={unit.key}]")
                per_node: dict[int, np.ndarray] = {}
                for uid in unit.pods:
                    i = snap.index[search.pods[uid].node]
                    if i in self.in_domain:
                        per_node[i] = per_node.get(i, 0) + self._request(uid)
                for i, vec in per_node.items():
                    self.freed.setdefault(i, []).append((vec, var))
            else:
                pod = search.pods[unit.pods[0]]
                vec = self._request(pod.uid)
                budgets = tuple(b.name for b in search.budgets if pod.uid in b.pods)
                key = (snap.index[pod.node], tuple(int(v) for v in vec), unit.priority, budgets)
                classes.setdefault(key, []).append(k)
        for (i, vec_key, priority, _), members in classes.items():
            name = f"evict[node={snap.nodes[i].name},priority={priority},like={search.units[members[0]].key}]"
            var = self.builder.int_var(len(members), name)
            self.class_vars.append((var, members))
            self.freed.setdefault(i, []).append((np.array(vec_key), var))

    def add_node_with_victims(self, i: int, terms: list[tuple[np.ndarray, cp_model.IntVar]]) -> None:
        """The group's pods per shape on node ``i``, within what is free there plus what the evicted
        victims give back."""
        shapes, raw, vecs = self.search.base.shapes, self.raw, self.vecs
        node = self.search.snapshot.nodes[i].name
        most = raw[i] + sum(vec for vec, _ in terms)
        ys: dict[int, cp_model.IntVar] = {}
        for s, shape in enumerate(shapes):
            if not shape.eligibility.mask[i]:
                continue
            nz = vecs[s] > 0
            cap = int(np.min(np.maximum(most[nz], 0) // vecs[s][nz]))
            if cap > 0:
                ys[s] = self.builder.int_var(min(cap, shape.count), f"pods[shape={s},node={node}]")
                self.builder.placed[s].append(ys[s])
        if not ys:
            return
        model = self.builder.model
        for j in range(len(self.cols)):
            users = [s for s in ys if vecs[s][j] > 0]
            if not users:
                continue
            lhs = sum(int(vecs[s][j]) * ys[s] for s in users)
            rhs = sum(int(vec[j]) * var for vec, var in terms if vec[j]) + int(raw[i, j])
            if raw[i, j] >= 0:
                model.add(lhs <= rhs)
            else:  # overcommitted already: only a node that takes a pod must fit it
                resource = self.search.snapshot.resources[self.cols[j]]
                used = self.builder.bool_var(f"takes[node={node},resource={resource}]")
                for s in users:
                    model.add(ys[s] == 0).only_enforce_if(~used)
                model.add(lhs <= rhs).only_enforce_if(used)

    def add_other_nodes(self) -> None:
        """The domain's nodes without victims, as classes with packing patterns."""
        snap, base = self.search.snapshot, self.search.base
        static: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
        caps = np.minimum(base.caps, np.array([s.count for s in base.shapes])[:, None])
        for i in self.nodes.tolist():
            if i in self.freed or not caps[:, i].any():
                continue
            key = (tuple(int(c) for c in caps[:, i]), tuple(int(x) for x in snap.free[i, self.cols]))
            static[key] = static.get(key, 0) + 1
        for k, ((cap_tuple, free), count) in enumerate(static.items()):
            patterns = packing_patterns(cap_tuple, np.array(free), list(self.vecs))
            self.builder.node_class(f"class={k},nodes={count}", count, patterns)

    def add_hint(self, hint: list[int]) -> None:
        """Start from the greedy answer's victims."""
        model = self.builder.model
        for k, var in self.unit_vars.items():
            model.add_hint(var, int(k in hint))
        chosen = set(hint)
        for var, members in self.class_vars:
            model.add_hint(var, sum(k in chosen for k in members))

    def evicted(self, solved: Solved) -> list[int]:
        """The units the answer evicts (a class's count as its first members)."""
        out = [k for k, var in self.unit_vars.items() if solved.value(var)]
        for var, members in self.class_vars:
            out += members[: solved.value(var)]
        return sorted(out)


@dataclass(frozen=True)
class _CostWeights:
    """Integer weights that make a weighted sum order exactly like :class:`PreemptionCost` over one
    search's candidates. Priorities enter as levels (rank among the candidates' distinct
    priorities) for the second tier and shifted by the lowest for the fourth; ``unit`` divides the
    fourth tier when the sum would not fit in 62 bits."""

    levels: tuple[int, ...]  # distinct candidate priorities, ascending
    violations_max: int
    pods_max: int
    shifted_max: int
    unit: int

    @classmethod
    def for_units(cls, units: list[VictimUnit], budgets: tuple[DisruptionBudget, ...]) -> "_CostWeights":
        levels = tuple(sorted({u.priority for u in units}))
        uids = {uid for u in units for uid in u.pods}
        violations = sum(max(0, len(b.pods & uids) - b.allowed) for b in budgets)
        pods = len(uids)
        shifted = sum((u.priority - levels[0]) * len(u.pods) for u in units) if units else 0
        unit = 1
        while (violations + 1) * (len(levels) + 1) * (pods + 1) * (shifted // unit + 1) >= 2**62:
            unit *= 10
        return cls(levels, violations, pods, shifted // unit, unit)

    def level(self, priority: int) -> int:
        return 0 if priority == NO_VICTIM_PRIORITY else self.levels.index(priority) + 1

    def coefficients(self) -> tuple[int, int, int, int]:
        w_sum = 1
        w_pods = self.shifted_max + 1
        w_top = w_pods * (self.pods_max + 1)
        w_viol = w_top * (len(self.levels) + 1)
        return w_viol, w_top, w_pods, w_sum

    def scalar(self, cost: PreemptionCost) -> int:
        w_viol, w_top, w_pods, w_sum = self.coefficients()
        shifted = cost.priority_sum - (self.levels[0] if self.levels else 0) * cost.pods
        return (w_viol * cost.pdb_violations + w_top * self.level(cost.highest_priority)
                + w_pods * cost.pods + w_sum * (shifted // self.unit))

    def terms(self, builder: ModelBuilder, victims: list[tuple[VictimUnit, cp_model.IntVar, int]],
              budgets: tuple[DisruptionBudget, ...]) -> cp_model.LinearExprT:
        """The weighted cost of the chosen victims: ``victims`` holds a unit (the representative of
        a class of interchangeable single pods), its eviction count variable and the class size."""
        w_viol, w_top, w_pods, w_sum = self.coefficients()
        top = builder.int_var(len(self.levels), "highest_priority_level")
        pods: list[cp_model.LinearExpr] = []
        shifted: list[cp_model.LinearExpr] = []
        per_budget: dict[str, list[cp_model.LinearExpr]] = {}
        for unit, var, size in victims:
            level = self.level(unit.priority)
            if size > 1:  # a class count: evicting any of them reaches its level
                some = builder.indicator(f"evicts_any[like={unit.key}]", (var, size))
                builder.model.add(top >= level * some)
            else:
                builder.model.add(top >= level * var)
            pods.append(len(unit.pods) * var)
            shifted.append(((unit.priority - self.levels[0]) * len(unit.pods) // self.unit) * var)
            for b in budgets:
                inside = len(b.pods.intersection(unit.pods))
                if inside:
                    per_budget.setdefault(b.name, []).append(inside * var)
        violations: list[cp_model.IntVar] = []
        for b in budgets:
            if b.name in per_budget:
                excess = builder.int_var(self.violations_max, f"violations[budget={b.name}]")
                builder.model.add(excess >= sum(per_budget[b.name]) - b.allowed)
                violations.append(excess)
        return w_viol * sum(violations) + w_top * top + w_pods * sum(pods) + w_sum * sum(shifted)


# -- the extender's preempt verb: a pod without a group --------------------------------------------
@dataclass(frozen=True)
class PodCandidate:
    """One node kube-scheduler proposes for a pod without a group, with its true cost.

    ``victims`` are the pods on that node to evict (kube-scheduler's victims plus the other members
    on the node of any ``all`` group among them): the only ones an extender may name for the node,
    since kube-scheduler looks victims up on that node. ``collateral`` are those groups' members on
    other nodes, which phalanx must evict itself so the group goes as one unit."""

    node: str
    victims: tuple[str, ...]
    collateral: tuple[str, ...]
    cost: PreemptionCost
    breaks_all_group: bool


def expand_victims_for_pod(
    node_to_victims: Mapping[str, Iterable[str]], snapshot: Snapshot, context: PreemptionContext
) -> dict[str, tuple[str, ...]]:
    """Per node, every pod that goes if the preemptor takes it: the proposed victims, then the rest
    of any ``all`` group they belong to (wherever those members run)."""
    return {c.node: c.victims + c.collateral for c in _pod_candidates(node_to_victims, snapshot, context)}


def rank_candidates(
    node_to_victims: Mapping[str, Iterable[str]], snapshot: Snapshot, context: PreemptionContext
) -> list[PodCandidate]:
    """Candidates cheapest first (upstream order, counting an ``all`` victim as its whole group);
    a candidate that would break an ``all`` group is dropped when a cheaper candidate exists."""
    ranked = sorted(_pod_candidates(node_to_victims, snapshot, context), key=lambda c: (c.cost, c.node))
    if not ranked:
        return []
    cheapest = ranked[0].cost
    return [c for c in ranked if not c.breaks_all_group or c.cost <= cheapest]


def _pod_candidates(
    node_to_victims: Mapping[str, Iterable[str]], snapshot: Snapshot, context: PreemptionContext
) -> list[PodCandidate]:
    unit_of = {uid: unit for unit in victim_units(snapshot, context) for uid in unit.pods}
    node_of = {p.uid: p.node for p in snapshot.bound}
    out = []
    for node, proposed in node_to_victims.items():
        if node not in snapshot.index:
            raise InvalidInput(f"preemption candidate node {node!r} is not in the snapshot")
        units: dict[str, VictimUnit] = {}
        for uid in proposed:
            unit = unit_of.get(uid)
            if unit is None or node_of[uid] != node:
                raise InvalidInput(f"preemption candidate {node}: victim {uid} is not running on that node")
            units.setdefault(unit.key, unit)
        seen = set(proposed)
        extra = [uid for unit in units.values() for uid in unit.pods if uid not in seen]
        on_node = tuple(proposed) + tuple(u for u in extra if node_of[u] == node)
        elsewhere = tuple(u for u in extra if node_of[u] != node)
        out.append(PodCandidate(
            node, on_node, elsewhere, victim_cost(units.values(), context.budgets),
            any(u.mode is DisruptionMode.ALL for u in units.values()),
        ))
    return out
