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
from typing import Callable, Mapping, Sequence

import numpy as np
from ortools.sat.python import cp_model

from .constraints import SOFT_SPREAD_WEIGHT, Coloc, Spread, _node_level, spread_fixed_min
from .problem import DomainBound, Problem

#: A node class: (per-shape capacities, free vector when mixed, free main resource, preferred
#: path ids, rule features). Nodes with equal keys are interchangeable for the group.
ClassKey = tuple[tuple[int, ...], tuple[int, ...], int, tuple[int, ...], tuple[int, ...]]
#: Pattern variables' terms per shape (pods of that shape the variable places), inside a domain.
PerShape = dict[int, list[cp_model.LinearExpr]]

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


def _patterns(caps: tuple[int, ...], free: np.ndarray, vecs: Sequence[np.ndarray]) -> list[tuple[int, ...]]:
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
    enc = RuleEncoder(problem, hosts) if problem.constrained else None
    classes: dict[ClassKey, list[int]] = {}
    for local in range(len(hosts)):
        key: ClassKey = (
            tuple(int(c) for c in caps[:, local]),
            tuple(int(x) for x in snap.free[hosts[local], rel_cols]) if mixed else (),
            int(problem.free_main[hosts[local]]),
            tuple(int(p[local]) for p in paths),
            enc.features(local) if enc else (),
        )
        classes.setdefault(key, []).append(local)

    weights = problem.weights
    w_unplaced, w_spread, w_nodes, w_stranded, w_df = weights.coefficients()
    unit = weights.unit
    model = cp_model.CpModel()
    placed: list[list[cp_model.LinearExpr]] = [[] for _ in shapes]
    objective: list[cp_model.LinearExprT] = []
    members_by_path: list[dict[int, list[tuple[cp_model.LinearExprT, int]]]] = [dict() for _ in paths]
    class_of_pattern: dict[tuple[ClassKey, tuple[int, ...]], cp_model.IntVar] = {}
    vecs = [s.vec[rel_cols] for s in shapes]
    w_pref = weights.preference_weight()
    for key, locals_ in classes.items():
        cap_tuple, _, free_main, path_ids, feats = key
        count = len(locals_)
        free_vec = snap.free[hosts[locals_[0]], rel_cols]
        class_vars: list[cp_model.IntVar] = []
        for pattern in _patterns(cap_tuple, free_vec, vecs):
            if enc is not None and not enc.pattern_ok(pattern, feats):
                continue
            var = model.new_int_var(0, count, "")
            class_vars.append(var)
            class_of_pattern[(key, pattern)] = var
            used_main = sum(n * shapes[s].main for s, n in enumerate(pattern))
            for s, n in enumerate(pattern):
                if n:
                    placed[s].append(var * n)
            cost = w_nodes + w_stranded * (max(0, free_main - used_main) // unit)
            if enc is not None:
                cost += w_pref * enc.pattern_cost(pattern, feats)
                enc.add_class_pattern(locals_[0], pattern, var)
            objective.append(var * cost)
        if not class_vars:
            continue
        model.add(sum(class_vars) <= count)
        for level, pid in enumerate(path_ids):
            members_by_path[level].setdefault(pid, []).append((sum(class_vars), count))
    if not class_of_pattern:
        return None
    total_placed: list[cp_model.LinearExprT] = []
    for s, shape in enumerate(shapes):
        if placed[s]:
            model.add(sum(placed[s]) <= shape.count)
            total_placed.append(sum(placed[s]))
    placed_expr = sum(total_placed)
    model.add(placed_expr >= max(problem.needed, 1))
    if enc is not None:
        objective.append(w_pref * enc.encode(model, placed))
    # unplaced and domain_free are both linear in the pods placed per shape
    df_base = int(problem.domain_free_main[bound.domain])
    objective.append(w_unplaced * (problem.pending_total - placed_expr))
    for s, shape in enumerate(shapes):
        if placed[s]:
            objective.append(-(w_df * shape.main // unit) * sum(placed[s]))
    const_df = w_df * (df_base // unit)
    for level, groups in enumerate(members_by_path):
        for members in groups.values():
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


def _add_hint(model: cp_model.CpModel, problem: Problem, hosts: np.ndarray, classes: Mapping[ClassKey, list[int]],
              class_of_pattern: Mapping[tuple[ClassKey, tuple[int, ...]], cp_model.IntVar],
              hint: Mapping[int, list[tuple[int, int]]]) -> None:
    """Start CP-SAT from the greedy solution of this domain."""
    position = {int(h): i for i, h in enumerate(hosts)}
    per_node: dict[int, list[int]] = {}
    for s, picks in hint.items():
        for node, count in picks:
            per_node.setdefault(position[node], [0] * len(problem.shapes))[s] += count
    class_key = {local: key for key, members in classes.items() for local in members}
    counts: dict[tuple[ClassKey, tuple[int, ...]], int] = {}
    for local, pattern in per_node.items():
        k = (class_key[local], tuple(pattern))
        if k not in class_of_pattern:
            return  # the greedy used a pattern the model does not have: no hint rather than a wrong one
        counts[k] = counts.get(k, 0) + 1
    for k, var in class_of_pattern.items():
        model.add_hint(var, counts.get(k, 0))


class RuleEncoder:
    """The rules of :mod:`solver.constraints` inside one domain's CP-SAT model.

    Rules over a per-node key (hostname) and node limits are checked per packing pattern: a class
    of nodes shares the features they read, so a pattern is valid (and costs the same) on every node
    of the class. Rules over wider keys (zone, rack) split classes by domain and become linear
    constraints over the pods each domain receives; a spread's global minimum is a variable unless
    the placement cannot move it (:func:`solver.constraints.spread_fixed_min`)."""

    def __init__(self, problem: Problem, hosts: np.ndarray) -> None:
        self.problem = problem
        self.rules = rules = problem.rules
        snap = problem.snapshot
        self.counts = [s.count for s in problem.shapes]
        self.node_spreads: list[tuple[Spread, int]] = []
        self.dom_spreads: list[Spread] = []
        for sp in rules.spreads:
            m0 = spread_fixed_min(sp, sum(self.counts[t] for t in sp.members))
            if _node_level(snap, sp.key) and m0 is not None:
                self.node_spreads.append((sp, m0))
            else:
                self.dom_spreads.append(sp)
        self.node_soft = [t for t in rules.soft if _node_level(snap, t.key)]
        self.dom_soft = [t for t in rules.soft if not _node_level(snap, t.key)]
        self.node_coloc = [c for c in rules.coloc if _node_level(snap, c.key)]
        self.dom_coloc = [c for c in rules.coloc if not _node_level(snap, c.key)]
        keys = [r.key for r in rules.anti] + [c.key for c in self.dom_coloc] + [sp.key for sp in self.dom_spreads]
        self.keys = list(dict.fromkeys(keys + [t.key for t in self.dom_soft]))
        self.ids: dict[str, np.ndarray] = {k: snap.domains(k)[1][hosts] for k in self.keys}
        cols = [lim.limit[hosts] for lim in rules.limits]
        for t in self.node_soft:
            cols.append(self._per_node(t.key, t.existing > 0, hosts))
        for sp, _ in self.node_spreads:
            cols.append(self._per_node(sp.key, sp.existing, hosts))
        self.cols = np.stack(cols).astype(np.int64) if cols else np.zeros((0, len(hosts)), dtype=np.int64)
        self.terms: dict[str, dict[int, PerShape]] = {k: {} for k in self.keys}
        self.coloc_vars: list[list[cp_model.IntVar]] = [[] for _ in self.node_coloc]
        self._off_soft = len(self.keys) + len(rules.limits)
        self._off_spread = self._off_soft + len(self.node_soft)

    def _per_node(self, key: str, per_domain_values: np.ndarray, hosts: np.ndarray) -> np.ndarray:
        ids = self.problem.snapshot.domains(key)[1][hosts]
        out = np.zeros(len(hosts), dtype=np.int64)
        ok = ids >= 0
        out[ok] = np.asarray(per_domain_values, dtype=np.int64)[ids[ok]]
        return out

    def features(self, local: int) -> tuple[int, ...]:
        return tuple(int(self.ids[k][local]) for k in self.keys) + tuple(int(v) for v in self.cols[:, local])

    def pattern_ok(self, pattern: tuple[int, ...], feats: tuple[int, ...]) -> bool:
        off = len(self.keys)
        for i, lim in enumerate(self.rules.limits):
            if sum(c * pattern[s] for s, c in zip(lim.shapes, lim.coeffs, strict=False)) > feats[off + i]:
                return False
        for s, t in self.rules.pairs:
            if pattern[s] and pattern[t]:
                return False
        for j, (sp, m0) in enumerate(self.node_spreads):
            if sp.hard and pattern[sp.shape] and (
                    sum(pattern[t] for t in sp.members) + feats[self._off_spread + j] > m0 + sp.skew):
                return False
        return True

    def pattern_cost(self, pattern: tuple[int, ...], feats: tuple[int, ...]) -> int:
        cost = 0
        for j, t in enumerate(self.node_soft):
            has = feats[self._off_soft + j]
            if t.kind == "anti":
                if t.self_match:
                    cost += t.weight * max(0, sum(pattern[m] for m in t.members) + has - 1)
                else:
                    cost += t.weight * pattern[t.shape] * has
            elif pattern[t.shape] and not has:
                cost += t.weight
        for j, (sp, m0) in enumerate(self.node_spreads):
            if not sp.hard:
                e = feats[self._off_spread + j]
                c = sum(pattern[t] for t in sp.members) + e
                cost += SOFT_SPREAD_WEIGHT * (max(0, c - m0 - sp.skew) - max(0, e - m0 - sp.skew))
        return cost

    def add_class_pattern(self, local: int, pattern: tuple[int, ...], var: cp_model.IntVar) -> None:
        for k in self.keys:
            d = int(self.ids[k][local])
            if d < 0:
                continue
            per = self.terms[k].setdefault(d, {})
            for s, n in enumerate(pattern):
                if n:
                    per.setdefault(s, []).append(var * n)
        for i, c in enumerate(self.node_coloc):
            if any(pattern[t] for t in c.shapes):
                self.coloc_vars[i].append(var)

    def encode(self, model: cp_model.CpModel, placed: list[list[cp_model.LinearExpr]]) -> cp_model.LinearExprT:
        """Add the domain-level rules; return the preference expression they contribute."""
        counts = self.counts
        pref: list[cp_model.LinearExprT] = []
        const = 0

        def pods(per: PerShape, shapes: tuple[int, ...]) -> list[cp_model.LinearExpr]:
            return [e for t in shapes for e in per.get(t, ())]

        def used(expr: cp_model.LinearExprT, bound: int) -> cp_model.IntVar:
            y = model.new_bool_var("")
            model.add(expr <= bound * y)
            return y

        for r in self.rules.anti:
            for per in self.terms[r.key].values():
                mine = per.get(r.shape)
                if not mine:
                    continue
                y = used(sum(mine), counts[r.shape])
                if r.self_match:
                    model.add(sum(mine) <= 1)
                for t in r.others:
                    if per.get(t):
                        model.add(sum(per[t]) <= counts[t] * (1 - y))
        def owner_placed(c: Coloc) -> cp_model.IntVar | int:
            """1 when any pod of the term's owner is placed (the rule then binds), else free."""
            owned = placed[c.owner] if c.owner >= 0 else []
            return used(sum(owned), counts[c.owner]) if owned else 0

        for i, c in enumerate(self.node_coloc):
            if self.coloc_vars[i]:
                o = owner_placed(c)
                if isinstance(o, int):
                    continue  # the owner can go nowhere: nothing to keep together
                model.add(sum(self.coloc_vars[i]) <= 1 + len(self.coloc_vars[i]) * (1 - o))
        for c in self.dom_coloc:
            o = owner_placed(c)
            if isinstance(o, int):
                continue
            zs: list[cp_model.IntVar] = []
            for per in self.terms[c.key].values():
                if not pods(per, c.shapes):
                    continue
                z = model.new_bool_var("")
                zs.append(z)
                for t in c.shapes:
                    if per.get(t):  # the owner's pods always follow z; the others only when it is placed
                        slack = 0 if t == c.owner else counts[t] * (1 - o)
                        model.add(sum(per[t]) <= counts[t] * z + slack)
            if zs:
                model.add(sum(zs) <= 1)
        for sp in self.dom_spreads:
            pref_part, c0 = self._spread(model, sp, pods, used)
            pref += pref_part
            const += c0
        for soft in self.dom_soft:
            for d, per in self.terms[soft.key].items():
                has = int(soft.existing[d] > 0)
                mine = per.get(soft.shape)
                if soft.kind == "anti" and soft.self_match:
                    crowd = pods(per, soft.members)
                    if crowd:
                        e = model.new_int_var(0, sum(counts), "")
                        model.add(e >= sum(crowd) + has - 1)
                        pref.append(soft.weight * e)
                elif soft.kind == "anti":
                    if has and mine:
                        pref.append(soft.weight * sum(mine))
                elif mine and not has:
                    pref.append(soft.weight * used(sum(mine), counts[soft.shape]))
        for sp, m0 in self.node_spreads:
            if not sp.hard:
                const += SOFT_SPREAD_WEIGHT * int(np.maximum(sp.existing[sp.counted] - m0 - sp.skew, 0).sum())
        for shapes, cap, _ in self.rules.totals:
            exprs = [e for s in shapes for e in placed[s]]
            if exprs:
                model.add(sum(exprs) <= cap)
        return sum(pref) + const

    def _spread(
        self,
        model: cp_model.CpModel,
        sp: Spread,
        pods: Callable[[PerShape, tuple[int, ...]], list[cp_model.LinearExpr]],
        used: Callable[[cp_model.LinearExprT, int], cp_model.IntVar],
    ) -> tuple[list[cp_model.LinearExprT], int]:
        per_domain = self.terms[sp.key]
        top = int(sp.existing.max()) + sum(self.counts) if len(sp.existing) else sum(self.counts)
        c: dict[int, cp_model.LinearExpr | int] = {}
        for d in range(len(sp.existing)):
            ex = pods(per_domain.get(d, {}), sp.members)
            c[d] = int(sp.existing[d]) + (sum(ex) if ex else 0)
        m: cp_model.IntVar | int
        if sp.min_zero or not sp.counted.any():
            m = 0
        else:
            m = model.new_int_var(0, top, "")
            for k in np.nonzero(sp.counted)[0]:
                model.add(m <= c[int(k)])
        pref: list[cp_model.LinearExprT] = []
        if sp.hard:
            # when the shape is the only one counted, a domain without its pods keeps its existing
            # count; where that is within maxSkew of the lowest existing count, the bound holds either
            # way (m can be the true minimum), so state it without the indicator: same solutions, a
            # much tighter relaxation (``low``: the least the global minimum can be)
            low = 0 if sp.min_zero or not sp.counted.any() else int(sp.existing[sp.counted].min())
            alone = sp.members == (sp.shape,)
            for d, per in per_domain.items():
                mine = per.get(sp.shape)
                if not mine:
                    continue
                if alone and int(sp.existing[d]) <= low + sp.skew:
                    model.add(c[d] <= m + sp.skew)
                    continue
                y = used(sum(mine), self.counts[sp.shape])
                model.add(sum(mine) >= y)
                model.add(c[d] <= m + sp.skew).only_enforce_if(y)
            return pref, 0
        for k in np.nonzero(sp.counted)[0]:
            e = model.new_int_var(0, top, "")
            model.add(e >= c[int(k)] - m - sp.skew)
            pref.append(SOFT_SPREAD_WEIGHT * e)
        return pref, 0
