"""The exact path: one CP-SAT model per candidate domain, over node classes and packing patterns.

Nodes of a domain that are interchangeable for this group (same per-shape capacity and
eligibility, same free main resource, same preferred-topology path; for mixed-shape groups the
same free vector) form a *class* with a count. A *pattern* is what one node of a class can host
(pods per shape). Variables are "how many nodes of class k take pattern p" — the cutting-stock
formulation — so a 1,000-pod gang on a 100-node rack is a few dozen integers, and the model is
exact: every solution maps back to a real per-node placement, no relaxation involved.

The objective is :class:`solver.objective.Objective` as a weighted sum; CP-SAT's proven bound
certifies the answer (gap 0 when the status is OPTIMAL).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from .problem import DomainBound, Problem

#: Patterns enumerated per class before the model is declared too large for the exact path.
MAX_PATTERNS_PER_CLASS = 4000


class ModelTooLarge(Exception):
    """A mixed-shape class has more packing patterns than the exact path enumerates."""


@dataclass
class DomainSolution:
    picks: dict[int, list[tuple[int, int]]]  # shape index -> [(node index, count)]
    optimal: bool
    scalar: int  # objective as the model scored it
    bound: int  # CP-SAT's proven lower bound on that scalar


def _patterns(caps: tuple[int, ...], free: np.ndarray | None, vecs: list[np.ndarray]) -> list[tuple[int, ...]]:
    """Non-empty pod-count vectors (one entry per shape) that fit on one node of a class."""
    if len(caps) == 1:
        return [(n,) for n in range(1, caps[0] + 1)]
    out: list[tuple[int, ...]] = []

    def walk(s: int, left: np.ndarray, prefix: tuple[int, ...]) -> None:
        if s == len(caps):
            if any(prefix):
                out.append(prefix)
                if len(out) > MAX_PATTERNS_PER_CLASS:
                    raise ModelTooLarge(f"more than {MAX_PATTERNS_PER_CLASS} packing patterns")
            return
        for n in range(caps[s] + 1):
            rest = left - vecs[s] * n
            if np.any(rest < 0):
                break
            walk(s + 1, rest, prefix + (n,))

    walk(0, free, ())
    return out


def solve_domain(
    problem: Problem,
    bound: DomainBound,
    hint: dict[int, list[tuple[int, int]]] | None,
    seed: int = 0,
    deterministic_time: float = 2.0,
    time_limit: float = 10.0,
) -> DomainSolution | None:
    """Solve the group's placement inside one domain; None when it is infeasible there."""
    shapes = problem.shapes
    hosts = bound.nodes
    snap = problem.snapshot
    caps = np.minimum(problem.caps[:, hosts], np.array([s.count for s in shapes])[:, None])
    mixed = len(shapes) > 1
    rel_cols = np.nonzero(np.any(np.stack([s.vec for s in shapes]), axis=0))[0]
    paths = [p[hosts] for p in problem.pref]
    classes: dict[tuple, list[int]] = {}
    for local in range(len(hosts)):
        key = (
            tuple(int(c) for c in caps[:, local]),
            tuple(int(x) for x in snap.free[hosts[local], rel_cols]) if mixed else (),
            int(problem.free_main[hosts[local]]),
            tuple(int(p[local]) for p in paths),
        )
        classes.setdefault(key, []).append(local)

    weights = problem.weights
    w_unplaced, w_spread, w_nodes, w_stranded, w_df = weights.coefficients()
    unit = weights.unit
    model = cp_model.CpModel()
    placed = [[] for _ in shapes]
    objective = []
    members_by_path: list[dict[int, list]] = [dict() for _ in paths]
    class_of_pattern: dict[tuple, cp_model.IntVar] = {}
    vecs = [s.vec[rel_cols] for s in shapes]
    for key, locals_ in classes.items():
        cap_tuple, _, free_main, path_ids = key
        count = len(locals_)
        free_vec = snap.free[hosts[locals_[0]], rel_cols]
        class_vars = []
        for pattern in _patterns(cap_tuple, free_vec, vecs):
            var = model.new_int_var(0, count, "")
            class_vars.append(var)
            class_of_pattern[(key, pattern)] = var
            used_main = sum(n * shapes[s].main for s, n in enumerate(pattern))
            for s, n in enumerate(pattern):
                if n:
                    placed[s].append(var * n)
            objective.append(var * (w_nodes + w_stranded * (max(0, free_main - used_main) // unit)))
        if not class_vars:
            continue
        model.add(sum(class_vars) <= count)
        for level, pid in enumerate(path_ids):
            members_by_path[level].setdefault(pid, []).append((sum(class_vars), count))
    if not class_of_pattern:
        return None
    total_placed = []
    for s, shape in enumerate(shapes):
        if placed[s]:
            model.add(sum(placed[s]) <= shape.count)
            total_placed.append(sum(placed[s]))
    placed_expr = sum(total_placed)
    model.add(placed_expr >= max(problem.needed, 1))
    # unplaced and domain_free are both linear in the pods placed per shape
    df_base = int(problem.domain_free_main[bound.domain])
    objective.append(w_unplaced * (problem.pending_total - placed_expr))
    for s, shape in enumerate(shapes):
        if placed[s]:
            objective.append(-(w_df * shape.main // unit) * sum(placed[s]))
    const_df = w_df * (df_base // unit)
    for level, groups in enumerate(members_by_path):
        for pid, members in groups.items():
            used = model.new_bool_var("")
            for expr, count in members:
                model.add(expr <= count * used)
            objective.append(w_spread[level] * used)
    model.minimize(sum(objective) + const_df)

    if hint:
        _add_hint(model, problem, hosts, classes, class_of_pattern, hint)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = seed
    solver.parameters.max_deterministic_time = deterministic_time
    solver.parameters.max_time_in_seconds = time_limit
    status = solver.solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    picks: dict[int, list[tuple[int, int]]] = {s: [] for s in range(len(shapes))}
    cursor = {key: 0 for key in classes}
    for (key, pattern), var in class_of_pattern.items():
        taken = solver.value(var)
        for _ in range(taken):
            local = classes[key][cursor[key]]
            cursor[key] += 1
            for s, n in enumerate(pattern):
                if n:
                    picks[s].append((int(hosts[local]), n))
    return DomainSolution(
        picks=picks,
        optimal=status == cp_model.OPTIMAL,
        scalar=int(round(solver.objective_value)),
        bound=int(round(solver.best_objective_bound)),
    )


def _add_hint(model, problem, hosts, classes, class_of_pattern, hint) -> None:
    """Start CP-SAT from the greedy solution of this domain."""
    position = {int(h): i for i, h in enumerate(hosts)}
    per_node: dict[int, list[int]] = {}
    for s, picks in hint.items():
        for node, count in picks:
            per_node.setdefault(position[node], [0] * len(problem.shapes))[s] += count
    class_key = {local: key for key, members in classes.items() for local in members}
    counts: dict[tuple, int] = {}
    for local, pattern in per_node.items():
        k = (class_key[local], tuple(pattern))
        if k not in class_of_pattern:
            return  # the greedy used a pattern the model does not have: no hint rather than a wrong one
        counts[k] = counts.get(k, 0) + 1
    for k, var in class_of_pattern.items():
        model.add_hint(var, counts.get(k, 0))
