"""The exact path: one CP-SAT model per candidate domain, over node classes and packing patterns.

Nodes of a domain that are interchangeable for this group (same per-shape capacity and
eligibility, same free main resource, same preferred-topology path; for mixed-shape groups the
same free vector) form a *class* with a count. A *pattern* is what one node of a class can host
(pods per shape). Variables are "how many nodes of class k take pattern p" — the cutting-stock
formulation of :mod:`solver.cpsat` — so a 1,000-pod gang on a 100-node rack is a few dozen
integers, and the model is exact: every solution maps back to a real per-node placement, no
relaxation involved.

:class:`PlacementModel` builds it from named parts: the node classes, the rules of
:mod:`solver.constraints` (:class:`RuleEncoder`, one method per rule family), the group's size, and
one method per term of :class:`solver.objective.Objective`, summed with its weights. CP-SAT's
proven bound certifies the answer (gap 0 when the status is OPTIMAL).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
from ortools.sat.python import cp_model

from .constraints import SOFT_SPREAD_WEIGHT, Coloc, DomainAnti, Soft, Spread, node_level, spread_fixed_min
from .cpsat import ModelBuilder, Pattern, Solved, packing_patterns
from .problem import DomainBound, Problem

#: A node class: (per-shape capacities, free vector when mixed, free main resource, preferred
#: path ids, rule features). Nodes with equal keys are interchangeable for the group.
ClassKey = tuple[tuple[int, ...], tuple[int, ...], int, tuple[int, ...], tuple[int, ...]]
#: Pattern variables' terms per shape (pods of that shape the variable places), inside a domain.
PerShape = dict[int, list[cp_model.LinearExpr]]
#: shape index -> [(node index, pods)] in one domain, as greedy and exact return it
Picks = dict[int, list[tuple[int, int]]]


@dataclass
class DomainSolution:
    picks: Picks
    optimal: bool
    scalar: int  # objective as the model scored it
    bound: int  # CP-SAT's proven lower bound on that scalar


def solve_domain(
    problem: Problem,
    bound: DomainBound,
    hint: Picks | None,
    seed: int = 0,
    deterministic_time: float = 2.0,
    time_limit: float = 10.0,
) -> DomainSolution | None:
    """Solve the group's placement inside one domain; None when it is infeasible there. Raises
    :class:`solver.cpsat.ModelTooLarge` when a class has too many packing patterns."""
    model = PlacementModel(problem, bound)
    if not model.build_model():
        return None
    if hint:
        model.add_hint(hint)
    solved = model.builder.solve(seed, deterministic_time, time_limit)
    if solved is None:
        return None
    return DomainSolution(model.picks(solved), solved.optimal, solved.objective, solved.bound)


class PlacementModel:
    """The CP-SAT model of one group inside one domain: its parts in the order they are added."""

    def __init__(self, problem: Problem, bound: DomainBound) -> None:
        self.problem = problem
        self.bound = bound
        self.hosts = hosts = bound.nodes
        shapes = problem.shapes
        self.caps = np.minimum(problem.caps[:, hosts], np.array([s.count for s in shapes])[:, None])
        self.rel_cols = np.nonzero(np.any(np.stack([s.vec for s in shapes]), axis=0))[0]
        self.vecs = [s.vec[self.rel_cols] for s in shapes]
        weights = problem.weights
        self.unit = weights.unit
        #: weights of (unplaced, spread levels, nodes, stranded, domain_free, largest_lost), and of
        #: preference
        (self.w_unplaced, self.w_spread, self.w_nodes, self.w_stranded, self.w_df,
         self.w_lost) = weights.coefficients()
        self.w_pref = weights.preference_weight()
        self.enc = RuleEncoder(problem, hosts) if problem.constrained else None
        self.classes = self.node_classes()
        self.builder = ModelBuilder(len(shapes))
        #: the variable of each (class, pattern) the model holds, in creation order
        self.pattern_vars: dict[tuple[ClassKey, Pattern], cp_model.IntVar] = {}
        #: per preferred level, per path id: (nodes of a class there, class size)
        self.members_by_path: list[dict[int, list[tuple[cp_model.LinearExprT, int]]]] = [
            dict() for _ in problem.pref]
        self.objective: list[cp_model.LinearExprT] = []
        #: per class that can take a pod: (its free main resource, its nodes, the nodes it touches)
        self.touched: list[tuple[int, int, cp_model.LinearExprT]] = []
        #: per node of the snapshot: in a class that can take a pod
        self.touchable = np.zeros(len(problem.snapshot.nodes), dtype=bool)

    def node_classes(self) -> dict[ClassKey, list[int]]:
        """The domain's nodes (local positions) grouped by what makes them interchangeable: classes
        in the order of their first node, each class's nodes in ascending order. Without per-node
        rules the grouping runs on an integer matrix of the key's columns (one row per node,
        ``np.unique``) and a key is built once per class, not per node: the same classes, at 5,000
        nodes about 30× cheaper than building a tuple per node (the largest share of a small
        gang's cycle, see docs/benchmarks.md)."""
        if self.enc is not None or len(self.hosts) == 0:
            return self._node_classes_per_node()
        problem, hosts = self.problem, self.hosts
        n = len(hosts)
        columns = [self.caps.T]
        if len(problem.shapes) > 1:
            columns.append(problem.snapshot.free[hosts][:, self.rel_cols])
        columns.append(problem.free_main[hosts])
        columns += [p[hosts] for p in problem.pref]
        # int() of each value, as the key holds it (floats truncate toward zero in both)
        matrix = np.concatenate([np.asarray(c).astype(np.int64).reshape(n, -1) for c in columns], axis=1)
        _, first, inverse = np.unique(matrix, axis=0, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        # each class's nodes in ascending order, the classes in the order of np.unique's rows
        groups = np.split(np.argsort(inverse, kind="stable"), np.cumsum(np.bincount(inverse))[:-1])
        classes: dict[ClassKey, list[int]] = {}
        for c in np.argsort(first, kind="stable"):
            classes[self.class_key(int(first[c]))] = groups[c].tolist()
        return classes

    def _node_classes_per_node(self) -> dict[ClassKey, list[int]]:
        """:meth:`node_classes` node by node (the rules' features are per node)."""
        classes: dict[ClassKey, list[int]] = {}
        for local in range(len(self.hosts)):
            classes.setdefault(self.class_key(local), []).append(local)
        return classes

    def class_key(self, local: int) -> ClassKey:
        """The class key of the domain's node ``local``."""
        problem, host = self.problem, self.hosts[local]
        return (
            tuple(int(c) for c in self.caps[:, local]),
            tuple(int(x) for x in problem.snapshot.free[host, self.rel_cols]) if len(problem.shapes) > 1 else (),
            int(problem.free_main[host]),
            tuple(int(p[host]) for p in problem.pref),
            self.enc.features(local) if self.enc else (),
        )

    # -- the model, part by part -----------------------------------------------------------------
    def build_model(self) -> bool:
        """Add every part; False when no node of the domain can take any pod (nothing to solve)."""
        for k, (key, locals_) in enumerate(self.classes.items()):
            self.add_node_class(k, key, locals_)
        if not self.pattern_vars:
            return False
        problem = self.problem
        placed = self.builder.group_size([s.count for s in problem.shapes], problem.needed)
        assert placed is not None  # a pattern places at least one pod
        if self.enc is not None:
            self.objective.append(self.w_pref * self.enc.encode(self.builder))
        self.objective.append(self.unplaced_term(placed))
        self.objective += self.domain_free_terms()
        self.objective += self.largest_lost_terms()
        self.objective += self.spread_terms()
        self.builder.model.minimize(sum(self.objective) + self.domain_free_constant())
        return True

    def add_node_class(self, k: int, key: ClassKey, locals_: list[int]) -> None:
        """A class's pattern variables, their packing cost (nodes, stranded, preference) and the
        preferred-level paths they use."""
        cap_tuple, _, free_main, path_ids, feats = key
        free_vec = self.problem.snapshot.free[self.hosts[locals_[0]], self.rel_cols]
        enc = self.enc
        patterns = [p for p in packing_patterns(cap_tuple, free_vec, self.vecs)
                    if enc is None or enc.pattern_ok(p, feats)]
        node = self.problem.snapshot.nodes[self.hosts[locals_[0]]].name
        variables = self.builder.node_class(f"class={k},first={node},nodes={len(locals_)}", len(locals_), patterns)
        for pattern, var in zip(patterns, variables, strict=True):
            self.pattern_vars[(key, pattern)] = var
            if enc is not None:
                enc.add_class_pattern(locals_[0], pattern, var)
            self.objective.append(var * self.packing_cost(pattern, free_main, feats))
        if variables:
            self.touched.append((free_main, len(locals_), sum(variables)))
            self.touchable[self.hosts[locals_]] = True
            for level, pid in enumerate(path_ids):
                self.members_by_path[level].setdefault(pid, []).append((sum(variables), len(locals_)))

    def packing_cost(self, pattern: Pattern, free_main: int, feats: tuple[int, ...]) -> int:
        """Objective terms ``nodes`` and ``stranded`` (and the per-node rules' ``preference``) of one
        node taking ``pattern``."""
        used_main = sum(n * self.problem.shapes[s].main for s, n in enumerate(pattern))
        cost = self.w_nodes + self.w_stranded * (max(0, free_main - used_main) // self.unit)
        if self.enc is not None:
            cost += self.w_pref * self.enc.pattern_cost(pattern, feats)
        return cost

    def unplaced_term(self, placed: cp_model.LinearExprT) -> cp_model.LinearExprT:
        """Objective term ``unplaced``: pending pods the model leaves out."""
        return self.w_unplaced * (self.problem.pending_total - placed)

    def domain_free_terms(self) -> list[cp_model.LinearExprT]:
        """Objective term ``domain_free``, the part that depends on the pods placed (linear in the
        pods placed per shape); the rest is :meth:`domain_free_constant`."""
        return [-(self.w_df * shape.main // self.unit) * sum(terms)
                for shape, terms in zip(self.problem.shapes, self.builder.placed, strict=True) if terms]

    def domain_free_constant(self) -> int:
        return self.w_df * (int(self.problem.domain_free_main[self.bound.domain]) // self.unit)

    def largest_lost_terms(self) -> list[cp_model.LinearExprT]:
        """Objective term ``largest_lost``: over the distinct free main resources ``v`` of the
        domain's nodes, roomiest first, a boolean per level that is 1 when every node with at least
        ``v`` free is touched, weighted by the step down to the next level (so the booleans that
        are 1 sum to the roomiest node's free less the roomiest untouched one's). A level that more
        nodes reach than the group has pods, or that a node the group cannot use reaches, is never
        lost: it and every level below get no variable (a small gang in a large domain gets none)."""
        problem = self.problem
        if not problem.keep_largest:
            return []
        never = (problem.domain_ids == self.bound.domain) & ~self.touchable
        floor = int(problem.free_main[never].max()) if never.any() else 0
        levels = sorted({free for free, _, _ in self.touched if free > floor}, reverse=True)
        terms: list[cp_model.LinearExprT] = []
        reach, used = 0, []
        for j, v in enumerate(levels):
            for free, count, touches in self.touched:
                if free == v:
                    reach += count
                    used.append(touches)
            if reach > problem.pending_total:
                break  # some node of this level stays untouched, whatever the placement
            below = levels[j + 1] if j + 1 < len(levels) else floor
            step = v // self.unit - below // self.unit
            if step <= 0:
                continue
            lost = self.builder.model.new_bool_var(f"lost[level={v}]")
            self.builder.model.add(lost >= sum(used) - (reach - 1))
            terms.append(self.w_lost * step * lost)
        return terms

    def spread_terms(self) -> list[cp_model.LinearExprT]:
        """Objective term ``spread``: per preferred level, a boolean per domain the group uses."""
        keys = self.problem.group.preferred_keys
        terms: list[cp_model.LinearExprT] = []
        for level, groups in enumerate(self.members_by_path):
            for pid, members in groups.items():
                used = self.builder.indicator(f"uses[key={keys[level]},path={pid}]", *members)
                terms.append(self.w_spread[level] * used)
        return terms

    # -- in and out ------------------------------------------------------------------------------
    def add_hint(self, hint: Mapping[int, list[tuple[int, int]]]) -> None:
        """Start CP-SAT from the greedy solution of this domain."""
        hinted = sorted({node for picks in hint.values() for node, _ in picks})
        # positions of the hinted nodes only (a domain may hold thousands of nodes, a hint a few)
        position = {int(self.hosts[i]): int(i) for i in np.flatnonzero(np.isin(self.hosts, hinted))}
        per_node: dict[int, list[int]] = {}
        for s, picks in hint.items():
            for node, count in picks:
                per_node.setdefault(position[node], [0] * len(self.problem.shapes))[s] += count
        counts: dict[tuple[ClassKey, Pattern], int] = {}
        for local, pattern in per_node.items():
            k = (self.class_key(local), tuple(pattern))
            if k not in self.pattern_vars:
                return  # the greedy used a pattern the model does not have: no hint rather than a wrong one
            counts[k] = counts.get(k, 0) + 1
        for k, var in self.pattern_vars.items():
            self.builder.model.add_hint(var, counts.get(k, 0))

    def picks(self, solved: Solved) -> Picks:
        """The solution as per-node pod counts: each class hands its nodes out in order."""
        picks: Picks = {s: [] for s in range(len(self.problem.shapes))}
        cursor = {key: 0 for key in self.classes}
        for (key, pattern), var in self.pattern_vars.items():
            for _ in range(solved.value(var)):
                local = self.classes[key][cursor[key]]
                cursor[key] += 1
                for s, n in enumerate(pattern):
                    if n:
                        picks[s].append((int(self.hosts[local]), n))
        return picks


class RuleEncoder:
    """The rules of :mod:`solver.constraints` inside one domain's CP-SAT model.

    Rules over a per-node key (hostname) and node limits are checked per packing pattern: a class
    of nodes shares the features they read, so a pattern is valid (and costs the same) on every node
    of the class. Rules over wider keys (zone, rack) split classes by domain and become linear
    constraints over the pods each domain receives (one method per rule family); a spread's global
    minimum is a variable unless the placement cannot move it
    (:func:`solver.constraints.spread_fixed_min`)."""

    def __init__(self, problem: Problem, hosts: np.ndarray) -> None:
        self.problem = problem
        self.rules = rules = problem.rules
        snap = problem.snapshot
        self.counts = [s.count for s in problem.shapes]
        self.node_spreads: list[tuple[Spread, int]] = []
        self.dom_spreads: list[Spread] = []
        for sp in rules.spreads:
            m0 = spread_fixed_min(sp, sum(self.counts[t] for t in sp.members))
            if node_level(snap, sp.key) and m0 is not None:
                self.node_spreads.append((sp, m0))
            else:
                self.dom_spreads.append(sp)
        self.node_soft = [t for t in rules.soft if node_level(snap, t.key)]
        self.dom_soft = [t for t in rules.soft if not node_level(snap, t.key)]
        self.node_coloc = [c for c in rules.coloc if node_level(snap, c.key)]
        self.dom_coloc = [c for c in rules.coloc if not node_level(snap, c.key)]
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

    def _where(self, key: str, d: int) -> str:
        """``key=value`` of domain ``d`` of ``key``, for variable names."""
        return f"{key}={self.problem.snapshot.domains(key)[0][d]}"

    # -- per packing pattern -------------------------------------------------------------------
    def features(self, local: int) -> tuple[int, ...]:
        return tuple(int(self.ids[k][local]) for k in self.keys) + tuple(int(v) for v in self.cols[:, local])

    def pattern_ok(self, pattern: Pattern, feats: tuple[int, ...]) -> bool:
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

    def pattern_cost(self, pattern: Pattern, feats: tuple[int, ...]) -> int:
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

    def add_class_pattern(self, local: int, pattern: Pattern, var: cp_model.IntVar) -> None:
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

    # -- per domain, one method per rule family --------------------------------------------------
    def encode(self, builder: ModelBuilder) -> cp_model.LinearExprT:
        """Add the domain-level rules; return the preference expression they contribute."""
        for r in self.rules.anti:
            self.add_anti(builder, r)
        for i, c in enumerate(self.node_coloc):
            self.add_node_coloc(builder, i, c)
        for i, c in enumerate(self.dom_coloc):
            self.add_domain_coloc(builder, i, c)
        pref: list[cp_model.LinearExprT] = []
        for sp in self.dom_spreads:
            pref += self.add_spread(builder, sp)
        for soft in self.dom_soft:
            pref += self.soft_terms(builder, soft)
        self.add_totals(builder)
        return sum(pref) + self.node_spread_excess()

    @staticmethod
    def _pods(per: PerShape, shapes: tuple[int, ...]) -> list[cp_model.LinearExpr]:
        return [e for t in shapes for e in per.get(t, ())]

    def add_anti(self, builder: ModelBuilder, r: DomainAnti) -> None:
        """Required anti-affinity over a wider key: where the shape goes, the pods it avoids do not
        (and at most one of its own when it selects itself)."""
        for d, per in self.terms[r.key].items():
            mine = per.get(r.shape)
            if not mine:
                continue
            y = builder.indicator(f"anti[{self._where(r.key, d)},shape={r.shape}]", (sum(mine), self.counts[r.shape]))
            if r.self_match:
                builder.model.add(sum(mine) <= 1)
            for t in r.others:
                if per.get(t):
                    builder.model.add(sum(per[t]) <= self.counts[t] * (1 - y))

    def _owner_placed(self, builder: ModelBuilder, c: Coloc, name: str) -> cp_model.IntVar | int:
        """1 when any pod of the term's owner is placed (the rule then binds), else free."""
        owned = builder.placed[c.owner] if c.owner >= 0 else []
        return builder.indicator(name, (sum(owned), self.counts[c.owner])) if owned else 0

    def add_node_coloc(self, builder: ModelBuilder, i: int, c: Coloc) -> None:
        """Required affinity among members over a per-node key: all on one node."""
        if not self.coloc_vars[i]:
            return
        o = self._owner_placed(builder, c, f"coloc_owner[{c.key},rule={i}]")
        if isinstance(o, int):
            return  # the owner can go nowhere: nothing to keep together
        builder.model.add(sum(self.coloc_vars[i]) <= 1 + len(self.coloc_vars[i]) * (1 - o))

    def add_domain_coloc(self, builder: ModelBuilder, i: int, c: Coloc) -> None:
        """Required affinity among members over a wider key: all in one domain."""
        o = self._owner_placed(builder, c, f"coloc_owner[{c.key},rule={i}]")
        if isinstance(o, int):
            return
        zs: list[cp_model.IntVar] = []
        for d, per in self.terms[c.key].items():
            if not self._pods(per, c.shapes):
                continue
            z = builder.bool_var(f"coloc[{self._where(c.key, d)},rule={i}]")
            zs.append(z)
            for t in c.shapes:
                if per.get(t):  # the owner's pods always follow z; the others only when it is placed
                    slack = 0 if t == c.owner else self.counts[t] * (1 - o)
                    builder.model.add(sum(per[t]) <= self.counts[t] * z + slack)
        if zs:
            builder.model.add(sum(zs) <= 1)

    def add_spread(self, builder: ModelBuilder, sp: Spread) -> list[cp_model.LinearExprT]:
        """A spread over a wider key (or one whose global minimum can move); the preference terms of
        a soft one."""
        per_domain = self.terms[sp.key]
        top = int(sp.existing.max()) + sum(self.counts) if len(sp.existing) else sum(self.counts)
        c: dict[int, cp_model.LinearExpr | int] = {}
        for d in range(len(sp.existing)):
            ex = self._pods(per_domain.get(d, {}), sp.members)
            c[d] = int(sp.existing[d]) + (sum(ex) if ex else 0)
        m: cp_model.IntVar | int
        if sp.min_zero or not sp.counted.any():
            m = 0
        else:
            m = builder.int_var(top, f"spread_min[{sp.key},shape={sp.shape}]")
            for k in np.nonzero(sp.counted)[0]:
                builder.model.add(m <= c[int(k)])
        if sp.hard:
            self._hard_spread(builder, sp, c, m)
            return []
        pref: list[cp_model.LinearExprT] = []
        for k in np.nonzero(sp.counted)[0]:
            e = builder.int_var(top, f"spread_excess[{self._where(sp.key, int(k))},shape={sp.shape}]")
            builder.model.add(e >= c[int(k)] - m - sp.skew)
            pref.append(SOFT_SPREAD_WEIGHT * e)
        return pref

    def _hard_spread(self, builder: ModelBuilder, sp: Spread, c: Mapping[int, cp_model.LinearExpr | int],
                     m: cp_model.IntVar | int) -> None:
        # when the shape is the only one counted, a domain without its pods keeps its existing
        # count; where that is within maxSkew of the lowest existing count, the bound holds either
        # way (m can be the true minimum), so state it without the indicator: same solutions, a
        # much tighter relaxation (``low``: the least the global minimum can be)
        low = 0 if sp.min_zero or not sp.counted.any() else int(sp.existing[sp.counted].min())
        alone = sp.members == (sp.shape,)
        for d, per in self.terms[sp.key].items():
            mine = per.get(sp.shape)
            if not mine:
                continue
            if alone and int(sp.existing[d]) <= low + sp.skew:
                builder.model.add(c[d] <= m + sp.skew)
                continue
            y = builder.indicator(f"spread_used[{self._where(sp.key, d)},shape={sp.shape}]",
                                  (sum(mine), self.counts[sp.shape]))
            builder.model.add(sum(mine) >= y)
            builder.model.add(c[d] <= m + sp.skew).only_enforce_if(y)

    def soft_terms(self, builder: ModelBuilder, soft: Soft) -> list[cp_model.LinearExprT]:
        """A preferred (anti-)affinity term over a wider key, as preference terms."""
        pref: list[cp_model.LinearExprT] = []
        for d, per in self.terms[soft.key].items():
            has = int(soft.existing[d] > 0)
            mine = per.get(soft.shape)
            where = f"{self._where(soft.key, d)},shape={soft.shape}"
            if soft.kind == "anti" and soft.self_match:
                crowd = self._pods(per, soft.members)
                if crowd:
                    e = builder.int_var(sum(self.counts), f"soft_crowd[{where}]")
                    builder.model.add(e >= sum(crowd) + has - 1)
                    pref.append(soft.weight * e)
            elif soft.kind == "anti":
                if has and mine:
                    pref.append(soft.weight * sum(mine))
            elif mine and not has:
                alone = builder.indicator(f"soft_alone[{where}]", (sum(mine), self.counts[soft.shape]))
                pref.append(soft.weight * alone)
        return pref

    def node_spread_excess(self) -> int:
        """The part of the per-node soft spreads' excess that the placement cannot change."""
        const = 0
        for sp, m0 in self.node_spreads:
            if not sp.hard:
                const += SOFT_SPREAD_WEIGHT * int(np.maximum(sp.existing[sp.counted] - m0 - sp.skew, 0).sum())
        return const

    def add_totals(self, builder: ModelBuilder) -> None:
        """Caps on the pods of some shapes in all (e.g. the PersistentVolumes available)."""
        for shapes, cap, _ in self.rules.totals:
            exprs = [e for s in shapes for e in builder.placed[s]]
            if exprs:
                builder.model.add(sum(exprs) <= cap)
