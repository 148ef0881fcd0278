"""Place a PodGroup all-or-nothing: the entry points every other part of phalanx calls.

The search, for one group:

1. aggregate pending pods into shapes and compute per-node capacities (vector operations);
2. for every candidate domain of the required key, check totals (the *capacity pre-check*):
   a domain whose free resources cannot hold the needed pods is dropped before any packing;
3. order surviving domains by an objective lower bound and run the greedy best fit in that order,
   skipping a domain whose bound cannot beat the best placement so far;
4. on the exact path, solve one CP-SAT model per domain that could still improve on the incumbent
   (warm-started from its greedy packing), with the same bound-based pruning.

A gang is never placed below minCount: a domain either holds at least the needed members or
yields nothing. Basic groups place what fits inside one domain. The answer carries the objective,
whether it is proven optimal, and CP-SAT's bound as a certified gap.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Collection, Iterable, Iterator, Mapping

import numpy as np

from .cpsat import ModelTooLarge
from .errors import InvalidInput
from .exact import Picks, solve_domain
from .explain import Explanation, explain
from .greedy import greedy_domain
from .model import Pod, PodGroup
from .objective import Objective
from .problem import DomainBound, Problem, evaluate
from .snapshot import Snapshot

PATHS = ("greedy", "exact")

#: the incumbent: its objective, its domain, its picks
Best = tuple[Objective, DomainBound, Picks]


@dataclass(frozen=True)
class SolveOptions:
    path: str = "exact"
    seed: int = 0
    #: CP-SAT deterministic-time budget per domain (reproducible, unlike wall time).
    deterministic_time: float = 2.0
    #: Wall-clock safety net per domain, seconds.
    time_limit: float = 10.0
    #: Keep the domain's roomiest node whole when smaller ones hold the group (the objective's
    #: ``largest_lost``); False scores it 0, the rule before it, which the fragmentation benchmark
    #: measures beside it.
    keep_largest: bool = True

    def __post_init__(self) -> None:
        if self.path not in PATHS:
            raise InvalidInput(f"solver path must be one of {', '.join(PATHS)}, got {self.path!r}")


@dataclass(frozen=True)
class Placement:
    """The answer for one group. ``assignments`` maps pending pod uid -> node name; it is empty
    exactly when the group does not fit, and then ``explanation`` says why."""

    group: str
    assignments: Mapping[str, str]
    domain: str = ""
    objective: Objective | None = None
    path: str = "greedy"
    optimal: bool = False
    gap: float | None = None  # (objective - bound) / objective on the model's scalar; 0 = proven
    explanation: Explanation | None = None
    stats: Mapping[str, float] = field(default_factory=dict)

    @property
    def feasible(self) -> bool:
        return bool(self.assignments) or self.explanation is None


def _assign(problem: Problem, picks: dict[int, list[tuple[int, int]]]) -> dict[str, str]:
    """Hand out concrete pods (in ordinal order) to the picked nodes (in name order)."""
    nodes = problem.snapshot.nodes
    out: dict[str, str] = {}
    for s, node_counts in picks.items():
        pods = iter(problem.shapes[s].pods)
        for node, count in sorted(node_counts):
            for _ in range(count):
                out[next(pods).uid] = nodes[node].name
    return out


# the rule's one home (docs/design.md: KEP-6277/topology-one-domain)
def place(snapshot: Snapshot, group: PodGroup, options: SolveOptions = SolveOptions(),
          allowed: Mapping[str, Collection[str]] | None = None, explained: bool = True) -> Placement:
    """Place ``group``'s pending members on ``snapshot``. ``allowed`` maps a pending pod's uid to
    the only nodes it may take (kube-scheduler's verdict for that pod, learned from its filter
    calls); pods it does not name are unrestricted. Raises :class:`InvalidInput` for input that
    cannot be placed as given (e.g. a gang with fewer members than minCount).

    A group with running members and preferred topology keys grows into the nearest domain
    upward (:func:`held_upward`): its pending members are placed inside the smallest domain of a
    preferred key that its running members share and that takes them all, before anywhere.

    ``explained`` False: a group that does not fit gets no explanation (computing one looks at
    every domain: about as long as the solve at 200 racks), for a caller that never reads it."""
    for nodes in held_upward(snapshot, group):
        inside = _place(snapshot.only_nodes(nodes), group, options, allowed, explained)
        if len(inside.assignments) == len(group.pending):
            return inside
    return _place(snapshot, group, options, allowed, explained)


# the rule's one home (docs/design.md: phalanx/grow-upward)
def held_upward(snapshot: Snapshot, group: PodGroup) -> list[list[str]]:
    """The domains a growing group's running members hold, per preferred key, smallest first (a
    rack, then its block): for each preferred key whose value every running member's node shares,
    the nodes with that value. None for a group without running members or preferred keys, and no
    domain that is the whole cluster (the ordinary solve covers it)."""
    if not group.preferred_keys:
        return []
    held = [p.node for p in group.bound if p.node in snapshot.index]
    if not held:
        return []
    domains: dict[tuple[str, ...], list[str]] = {}
    for key in group.preferred_keys:
        values = {snapshot.nodes[snapshot.index[n]].labels.get(key) for n in held}
        if len(values) != 1 or None in values:
            continue
        value = values.pop()
        nodes = [n.name for n in snapshot.nodes if n.labels.get(key) == value]
        if len(nodes) < len(snapshot.nodes):
            domains.setdefault(tuple(nodes), nodes)
    return sorted(domains.values(), key=len)


def _place(snapshot: Snapshot, group: PodGroup, options: SolveOptions,
           allowed: Mapping[str, Collection[str]] | None, explained: bool = True) -> Placement:
    started = time.perf_counter()
    problem = Problem(snapshot, group, allowed, keep_largest=options.keep_largest)
    stats: dict[str, float] = {"domains": len(problem.candidate_domains)}
    if not problem.pending_total:
        return Placement(group.key, {}, objective=None, optimal=True, gap=0.0, stats=stats)

    bounds = problem.domain_bounds()
    viable = [b for b in bounds if b.placed_ub >= max(problem.needed, 1)]
    stats["domains_after_precheck"] = len(viable)
    ranked = _Ranked(problem, viable)
    best, greedy_picks, greedy_fits, stats["domains_greedy_pruned"] = _greedy(problem, ranked)

    path = "greedy"
    optimal = False
    gap: float | None = None
    if options.path == "exact":
        best, optimal, gap, exact_stats = _exact(problem, ranked, best, greedy_picks, options)
        stats.update(exact_stats)
        path = "exact"
    stats["solve_ms"] = (time.perf_counter() - started) * 1000.0
    if best is None:
        return Placement(group.key, {}, path=path, stats=stats,
                         explanation=explain(problem, bounds, greedy_fits) if explained else None)
    objective, bound, picks = best
    domain = problem.domain_values[bound.domain] if group.topology_key else ""
    return Placement(
        group.key, _assign(problem, picks), domain, objective, path, optimal, gap, None, stats
    )


def _head(objective: Objective) -> tuple[int, int, tuple[int, ...], int]:
    """The leading terms of an objective, those a domain's totals decide (see :class:`_Ranked`)."""
    return objective.unplaced, objective.preference, objective.spread, objective.domain_free


class _Ranked:
    """The viable domains in the order of their loose objective bound (the domain's index breaking
    ties: which domain wins a tie stays as it was), each pruned with its tight bound, which is
    computed only for the domains a search reaches. The bounds' leading terms (:func:`_head`) are
    known per domain from its totals alone, so the domains are sorted on them first (the full loose
    bound orders only a run of equal heads) and a search stops at the first domain whose head
    already loses to the incumbent: every later one does too. At 200 racks that is a few bounds
    computed instead of 400 (each ~10 us of Python)."""

    def __init__(self, problem: Problem, viable: list[DomainBound]) -> None:
        self.problem = problem
        levels = len(problem.group.preferred_keys)
        max_main = max(s.main for s in problem.shapes)
        free = problem.domain_free_main
        heads = [(problem.pending_total - b.placed_ub, 0, (1 if b.placed_ub else 0,) * levels,
                  max(0, int(free[b.domain]) - b.placed_ub * max_main)) for b in viable]
        self.order: list[tuple[tuple[int, int, tuple[int, ...], int], DomainBound]] = []
        if not problem.constrained:
            # the loose bound is the head, the fewest nodes the pods need, 0: all sorted at once
            nodes = self._fewest_nodes(viable)
            keys = sorted(range(len(viable)), key=lambda i: (heads[i], nodes[i], viable[i].domain))
            self.order = [(heads[i], viable[i]) for i in keys]
        else:
            keyed = sorted(zip(heads, viable, strict=True), key=lambda hb: (hb[0], hb[1].domain))
            start = 0
            while start < len(keyed):
                end = start + 1
                while end < len(keyed) and keyed[end][0] == keyed[start][0]:
                    end += 1
                run = keyed[start:end]
                if len(run) > 1:
                    run.sort(key=lambda hb: (problem.objective_lower_bound(hb[1], hb[1].placed_ub, tight=False),
                                             hb[1].domain))
                self.order += run
                start = end
        self._tight: dict[int, Objective] = {}

    def _fewest_nodes(self, viable: list[DomainBound]) -> list[int]:
        """Per domain, the loose bound's node count (as :meth:`Problem.objective_lower_bound`): the
        roomiest hosts that together hold its pods, from one search over every domain's hosts."""
        order, starts, cum = self.problem._by_domain
        if not viable:
            return []
        domains = np.array([b.domain for b in viable])
        placed = np.array([b.placed_ub for b in viable])
        lo, hi = starts[domains], starts[domains + 1]
        offset = np.where(lo > 0, cum[np.maximum(lo - 1, 0)], 0)
        found = np.minimum(np.searchsorted(cum, offset + placed), hi) - lo
        return [int(n) for n in np.where(placed > 0, found + 1, 0)]

    def walk(self, incumbent: Callable[[], "Best | None"]) -> Iterator[tuple[Objective, DomainBound] | None]:
        """The domains in order with their tight bound; None for one pruned by its head alone (and
        for every one after it). ``incumbent`` gives the caller's best answer so far."""
        for k, (head, bound) in enumerate(self.order):
            best = incumbent()
            if best is not None and head > _head(best[0]):
                yield from (None for _ in self.order[k:])
                return
            lower = self._tight.get(bound.domain)
            if lower is None:
                lower = self._tight[bound.domain] = self.problem.objective_lower_bound(bound, bound.placed_ub)
            yield lower, bound


def _greedy(problem: Problem, ranked: _Ranked) -> tuple[Best | None, dict[int, Picks], dict[int, int], int]:
    """Greedy best fit in the ranked domains, skipping those whose bound cannot beat the incumbent:
    the best answer, the picks per domain it fit in, how many pods fit where the group did not (for
    the explanation), and how many domains were pruned."""
    best: Best | None = None
    greedy_picks: dict[int, Picks] = {}
    greedy_fits: dict[int, int] = {}
    pruned = 0
    for reached in ranked.walk(lambda: best):  # noqa: B023 - read late on purpose: the incumbent so far
        if reached is None:
            pruned += 1
            continue
        lower, bound = reached
        if best is not None and lower >= best[0]:
            pruned += 1
            continue
        picks = greedy_domain(problem, bound.nodes)
        if picks is None:
            greedy_fits[bound.domain] = _count_fitting(problem, bound)
            continue
        objective = evaluate(problem.snapshot, problem.group, _assign(problem, picks), problem)
        if objective.largest_lost:
            picks, objective = _keeping_largest(problem, bound, picks, objective)
        greedy_picks[bound.domain] = picks
        if best is None or objective < best[0]:
            best = (objective, bound, picks)
    return best, greedy_picks, greedy_fits, pruned


def _keeping_largest(problem: Problem, bound: DomainBound, picks: Picks,
                     objective: Objective) -> tuple[Picks, Objective]:
    """The greedy packing fills the roomiest nodes first; when that touched every node as roomy as
    the domain's roomiest, the same packing without them, if it holds the group and scores better
    (the objective's ``largest_lost``)."""
    free = problem.free_main[bound.nodes]
    rest = bound.nodes[free < free.max()]
    if len(rest) == 0:
        return picks, objective
    other = greedy_domain(problem, rest)
    if other is None:
        return picks, objective
    scored = evaluate(problem.snapshot, problem.group, _assign(problem, other), problem)
    return (other, scored) if scored < objective else (picks, objective)


def _count_fitting(problem: Problem, bound: DomainBound) -> int:
    """How many pods a best-effort packing fits in the domain (for the explanation only)."""
    picks = greedy_domain(problem, bound.nodes, minimum=0)
    return sum(c for counts in (picks or {}).values() for _, c in counts)


def _exact(
    problem: Problem,
    ranked: _Ranked,
    best: Best | None,
    greedy_picks: Mapping[int, Picks],
    options: SolveOptions,
) -> tuple[Best | None, bool, float | None, dict[str, int]]:
    weights = problem.weights
    stats = {"domains_solved": 0, "domains_exact_pruned": 0}
    all_proven = True
    lowest_bound: int | None = None
    for reached in ranked.walk(lambda: best):  # noqa: B023 - read late on purpose: the incumbent so far
        if reached is None:
            stats["domains_exact_pruned"] += 1
            continue
        lower, bound = reached
        if best is not None and lower >= best[0]:
            stats["domains_exact_pruned"] += 1
            continue
        try:
            solution = solve_domain(
                problem,
                bound,
                greedy_picks.get(bound.domain),
                seed=options.seed,
                deterministic_time=options.deterministic_time,
                time_limit=options.time_limit,
            )
        except ModelTooLarge:
            all_proven = False
            continue
        stats["domains_solved"] += 1
        if solution is None:
            continue
        all_proven &= solution.optimal
        lowest_bound = solution.bound if lowest_bound is None else min(lowest_bound, solution.bound)
        objective = evaluate(problem.snapshot, problem.group, _assign(problem, solution.picks), problem)
        if best is None or objective < best[0]:
            best = (objective, bound, solution.picks)
    if best is None:
        return None, all_proven, None, stats
    if all_proven:
        return best, True, 0.0, stats
    incumbent_scalar = weights.scalar(best[0])
    floor = min(lowest_bound, incumbent_scalar) if lowest_bound is not None else incumbent_scalar
    gap = (incumbent_scalar - floor) / max(1, abs(incumbent_scalar))
    return best, False, gap, stats


@dataclass(frozen=True)
class BatchResult:
    placements: tuple[Placement, ...]  # in the order the groups were considered
    snapshot: Snapshot  # the input snapshot with every placed group's pods charged


def with_group(snapshot: Snapshot, group: PodGroup, assignments: Mapping[str, str]) -> Snapshot:
    """``snapshot`` with ``group``'s pending pods of ``assignments`` (uid -> node) using their nodes."""
    pods: Mapping[str, Pod] = {p.uid: p for p in group.pending}
    return snapshot.with_placement(assignments, pods)


def place_batch(
    snapshot: Snapshot, groups: Iterable[PodGroup], options: SolveOptions = SolveOptions()
) -> BatchResult:
    """Place several pending groups in one call: highest priority first, then oldest. A group that
    does not fit is skipped (its explanation kept) and the next is tried, so a small group is never
    blocked behind an infeasible big one; each placed group's pods are charged before the next."""
    ordered = sorted(groups, key=lambda g: (-g.priority, g.created, g.key))
    out = []
    current = snapshot
    for group in ordered:
        placement = place(current, group, options)
        if placement.assignments:
            current = with_group(current, group, placement.assignments)
        out.append(placement)
    return BatchResult(tuple(out), current)
