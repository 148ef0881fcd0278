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
from typing import Collection, Iterable, Mapping

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
          allowed: Mapping[str, Collection[str]] | None = None) -> Placement:
    """Place ``group``'s pending members on ``snapshot``. ``allowed`` maps a pending pod's uid to
    the only nodes it may take (kube-scheduler's verdict for that pod, learned from its filter
    calls); pods it does not name are unrestricted. Raises :class:`InvalidInput` for input that
    cannot be placed as given (e.g. a gang with fewer members than minCount)."""
    started = time.perf_counter()
    problem = Problem(snapshot, group, allowed)
    stats: dict[str, float] = {"domains": len(problem.candidate_domains)}
    if not problem.pending_total:
        return Placement(group.key, {}, objective=None, optimal=True, gap=0.0, stats=stats)

    bounds = problem.domain_bounds()
    viable = [b for b in bounds if b.placed_ub >= max(problem.needed, 1)]
    stats["domains_after_precheck"] = len(viable)
    # tried in the order of the looser bound (which domain wins a tie stays as it was), pruned
    # with the tighter one: a domain it prunes cannot beat the incumbent
    order = sorted(viable, key=lambda b: (problem.objective_lower_bound(b, b.placed_ub, tight=False), b.domain))
    ranked = [(problem.objective_lower_bound(b, b.placed_ub), b) for b in order]
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
        return Placement(
            group.key, {}, path=path, explanation=explain(problem, bounds, greedy_fits), stats=stats
        )
    objective, bound, picks = best
    domain = problem.domain_values[bound.domain] if group.topology_key else ""
    return Placement(
        group.key, _assign(problem, picks), domain, objective, path, optimal, gap, None, stats
    )


def _greedy(problem: Problem, ranked: list[tuple[Objective, DomainBound]]
            ) -> tuple[Best | None, dict[int, Picks], dict[int, int], int]:
    """Greedy best fit in the ranked domains, skipping those whose bound cannot beat the incumbent:
    the best answer, the picks per domain it fit in, how many pods fit where the group did not (for
    the explanation), and how many domains were pruned."""
    best: Best | None = None
    greedy_picks: dict[int, Picks] = {}
    greedy_fits: dict[int, int] = {}
    pruned = 0
    for lower, bound in ranked:
        if best is not None and lower >= best[0]:
            pruned += 1
            continue
        picks = greedy_domain(problem, bound.nodes)
        if picks is None:
            greedy_fits[bound.domain] = _count_fitting(problem, bound)
            continue
        greedy_picks[bound.domain] = picks
        objective = evaluate(problem.snapshot, problem.group, _assign(problem, picks), problem)
        if best is None or objective < best[0]:
            best = (objective, bound, picks)
    return best, greedy_picks, greedy_fits, pruned


def _count_fitting(problem: Problem, bound: DomainBound) -> int:
    """How many pods a best-effort packing fits in the domain (for the explanation only)."""
    picks = greedy_domain(problem, bound.nodes, minimum=0)
    return sum(c for counts in (picks or {}).values() for _, c in counts)


def _exact(
    problem: Problem,
    ranked: list[tuple[Objective, DomainBound]],
    best: Best | None,
    greedy_picks: Mapping[int, Picks],
    options: SolveOptions,
) -> tuple[Best | None, bool, float | None, dict[str, int]]:
    weights = problem.weights
    stats = {"domains_solved": 0, "domains_exact_pruned": 0}
    all_proven = True
    lowest_bound: int | None = None
    for lower, bound in ranked:
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
            pods: Mapping[str, Pod] = {p.uid: p for p in group.pending}
            current = current.with_placement(placement.assignments, pods)
        out.append(placement)
    return BatchResult(tuple(out), current)
