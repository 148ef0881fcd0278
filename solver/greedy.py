"""The greedy fast path: best-fit packing inside one domain.

Per shape (largest first) and per preferred level (outermost first): if some sub-domain can hold
all remaining pods, take the one that needs the fewest nodes and has the least spare capacity
(best fit); otherwise fill the roomiest sub-domains whole and best-fit the remainder. On nodes
the same rule: fill the nodes with the most room first (fewest nodes touched), then put the last
chunk on the node it fits most tightly (least capacity stranded). Everything is a numpy sort and
a cumulative sum, so a domain of thousands of nodes costs well under a millisecond.
"""

from __future__ import annotations

import numpy as np

from .constraints import SOFT_SPREAD_WEIGHT, Spread
from .problem import Problem


def _fill_nodes(cap: np.ndarray, leftover_after: np.ndarray, demand: int) -> list[tuple[int, int]]:
    """Pick (position, count) pairs over nodes with capacities ``cap``; ``leftover_after(i, k)``
    is given as a per-node array of free main resource, used with ``demand`` for best fit."""
    order = np.lexsort((np.arange(len(cap)), -cap))  # roomiest first, stable by position
    cum = np.cumsum(cap[order])
    if len(cum) == 0 or cum[-1] < demand:
        return [(int(i), int(cap[i])) for i in order if cap[i] > 0]
    k = int(np.searchsorted(cum, demand))  # nodes order[:k] taken whole, then one more
    taken = [(int(i), int(cap[i])) for i in order[:k]]
    rem = demand - (int(cum[k - 1]) if k else 0)
    if rem > 0:
        rest = order[k:]
        fits = rest[cap[rest] >= rem]
        # tightest node for the remainder: least main resource left afterwards
        best = fits[np.lexsort((fits, leftover_after[fits]))[0]]
        taken.append((int(best), rem))
    return taken


def _nodes_needed(cap: np.ndarray, demand: int) -> int:
    cum = np.cumsum(np.sort(cap)[::-1])
    return int(np.searchsorted(cum, demand)) + 1 if len(cum) and cum[-1] >= demand else len(cap) + 1


def _choose(
    nodes: np.ndarray, cap: np.ndarray, slack: np.ndarray, demand: int, paths: list[np.ndarray], level: int
) -> list[tuple[int, int]]:
    """Choose (node index, count) for ``demand`` pods among ``nodes`` (global indices) with per-node
    capacity ``cap`` and per-node free main resource ``slack``, compact along ``paths[level:]``."""
    if demand <= 0 or len(nodes) == 0:
        return []
    if level == len(paths):
        picks = _fill_nodes(cap, slack, demand)
        return [(int(nodes[i]), c) for i, c in picks]
    ids = paths[level][nodes]
    values, inverse = np.unique(ids, return_inverse=True)
    group_cap = np.bincount(inverse, weights=cap, minlength=len(values)).astype(np.int64)
    out: list[tuple[int, int]] = []
    remaining = demand
    open_groups = list(range(len(values)))
    while remaining > 0 and open_groups:
        holding = [g for g in open_groups if group_cap[g] >= remaining]
        if holding:
            g = min(holding, key=lambda g: (_nodes_needed(cap[inverse == g], remaining), group_cap[g], g))
            take = remaining
        else:
            g = max(open_groups, key=lambda g: (group_cap[g], -g))
            take = int(group_cap[g])
            if take == 0:
                break
        sel = inverse == g
        out += _choose(nodes[sel], cap[sel], slack[sel], take, paths, level + 1)
        remaining -= take
        open_groups.remove(g)
    return out


def greedy_domain(problem: Problem, hosts: np.ndarray, minimum: int | None = None
                  ) -> dict[int, list[tuple[int, int]]] | None:
    """Greedy placement in one domain: shape index -> [(node index, count)], or None when fewer
    than ``minimum`` pods fit (default: the pods the group needs)."""
    if problem.constrained and not _only_own_node_limits(problem):
        return constrained_greedy(problem, hosts, minimum)
    snap = problem.snapshot
    free = snap.free[hosts].copy()
    slack_all = problem.free_main[hosts].copy()
    paths = [p[hosts] for p in problem.pref]  # local: indexed by position in hosts
    result: dict[int, list[tuple[int, int]]] = {}
    placed = 0
    used_first_level: set[int] = set()
    for s, shape in enumerate(problem.shapes):
        if shape.unknown:
            continue
        cols = np.nonzero(shape.vec)[0]
        cap = np.min(free[:, cols] // shape.vec[cols], axis=1)
        cap = np.where(shape.eligibility.mask[hosts], np.minimum(cap, shape.count), 0)
        for lim in problem.rules.limits:  # per-node limits of this shape alone (see _only_own_node_limits)
            cap = np.minimum(cap, lim.limit[hosts] // lim.coeffs[0]) if lim.shapes == (s,) else cap
        slack = slack_all.copy()  # free main resource before this shape
        picks: list[tuple[int, int]] = []
        local = np.arange(len(hosts))
        if used_first_level and paths:
            # later shapes of a mixed group stay in the sub-domains already used when they can
            near = np.isin(paths[0], list(used_first_level))
            if int(cap[near].sum()) >= shape.count:
                picks = _choose(local[near], cap[near], slack[near], shape.count, paths, 0)
        if not picks:
            picks = _choose(local, cap, slack, shape.count, paths, 0)
        for i, count in picks:
            free[i] -= shape.vec * count
            slack_all[i] -= shape.main * count
            if paths:
                used_first_level.add(int(paths[0][i]))
        result[s] = [(int(hosts[i]), c) for i, c in picks]
        placed += sum(c for _, c in picks)
    if placed < (max(problem.needed, 1) if minimum is None else minimum):
        return None
    return result


def _only_own_node_limits(problem: Problem) -> bool:
    """The rules are per-node limits of one shape each (self anti-affinity on the hostname, host
    ports, local PVs of one shape): the packing greedy honours them as capacities."""
    r = problem.rules
    return (not (r.pairs or r.anti or r.coloc or r.spreads or r.soft or r.totals)
            and all(len(lim.shapes) == 1 for lim in r.limits))


class _State:
    """What the pod-by-pod greedy has placed so far in one domain, per shape and per rule key."""

    def __init__(self, problem: Problem, hosts: np.ndarray) -> None:
        self.problem = problem
        self.hosts = hosts
        snap = problem.snapshot
        self.free = snap.free[hosts].copy()
        self.x = np.zeros((len(problem.shapes), len(hosts)), dtype=np.int64)
        keys = problem.rules.domain_keys
        self.ids: dict[str, np.ndarray] = {k: snap.domains(k)[1][hosts] for k in keys}
        self.sizes = {k: len(snap.domains(k)[0]) for k in keys}
        self.coloc_domain: dict[int, int] = {}
        self.total_left = [cap for _, cap, _ in problem.rules.totals]

    def per_domain(self, key: str, shapes: tuple[int, ...]) -> np.ndarray:
        ids = self.ids[key]
        ok = ids >= 0
        per_node = self.x[list(shapes)].sum(axis=0) if shapes else np.zeros(len(self.hosts), dtype=np.int64)
        return np.bincount(ids[ok], weights=per_node[ok], minlength=self.sizes[key]).astype(np.int64)

    def on_domain(self, key: str, per_domain_values: np.ndarray) -> np.ndarray:
        ids = self.ids[key]
        out = np.zeros(len(ids), dtype=per_domain_values.dtype)
        ok = ids >= 0
        out[ok] = per_domain_values[ids[ok]]
        return out

    def spread_ok(self, sp: Spread, s: int) -> np.ndarray:
        """kube-scheduler's check for one more pod of ``s``, given what is placed so far."""
        c = sp.existing + self.per_domain(sp.key, sp.members)
        m = sp.global_min(c)
        after = c + (1 if s in sp.members else 0)
        ok = self.on_domain(sp.key, (after - m <= sp.skew).astype(np.int64)) > 0
        return ok & (self.ids[sp.key] >= 0)

    def spread_kept(self, sp: Spread) -> np.ndarray:
        """Hosts where one more pod that ``sp`` counts (but does not constrain) keeps the pods of
        ``sp.shape`` already placed within maxSkew: the plan must hold whatever order kube-scheduler
        takes the members in, so a later-counted pod may not push their domain past the minimum."""
        c = sp.existing + self.per_domain(sp.key, sp.members)
        m = sp.global_min(c)
        crowded = (self.per_domain(sp.key, (sp.shape,)) > 0) & (c + 1 - m > sp.skew)
        return ~(self.on_domain(sp.key, crowded.astype(np.int64)) > 0)

    def candidates(self, s: int) -> np.ndarray:
        """Where one more pod of shape ``s`` may go now (per local node): room, then every rule."""
        shape = self.problem.shapes[s]
        cols = np.nonzero(shape.vec)[0]
        ok: np.ndarray = shape.eligibility.mask[self.hosts] & np.all(self.free[:, cols] >= shape.vec[cols], axis=1)
        self.keep_limits(s, ok)
        self.keep_anti(s, ok)
        rules = self.problem.rules
        for i, c in enumerate(rules.coloc):
            if s in c.shapes and i in self.coloc_domain:
                ok &= self.ids_or_nodes(c.key) == self.coloc_domain[i]
        for sp in rules.spreads:
            if sp.hard and sp.shape == s:
                ok &= self.spread_ok(sp, s)
            elif sp.hard and s in sp.members:
                ok &= self.spread_kept(sp)
        for j, (shapes, _, _) in enumerate(rules.totals):
            if s in shapes and self.total_left[j] <= 0:
                ok[:] = False
        return ok

    def keep_limits(self, s: int, ok: np.ndarray) -> None:
        """Narrow ``ok`` to nodes where node limits and pair conflicts allow one more pod of ``s``."""
        rules = self.problem.rules
        for lim in rules.limits:
            if s in lim.shapes:
                used = sum(c * self.x[t] for t, c in zip(lim.shapes, lim.coeffs, strict=False))
                ok &= used + lim.coeffs[lim.shapes.index(s)] <= lim.limit[self.hosts]
        for a, b in rules.pairs:
            if s in (a, b):
                ok &= self.x[b if s == a else a] == 0

    def keep_anti(self, s: int, ok: np.ndarray) -> None:
        """Narrow ``ok`` to nodes outside the domains required anti-affinity closes to ``s``."""
        for r in self.problem.rules.anti:
            if r.shape == s:
                blocked = self.per_domain(r.key, r.others) > 0
                if r.self_match:
                    blocked |= self.per_domain(r.key, (s,)) > 0
                ok &= ~(self.on_domain(r.key, blocked.astype(np.int64)) > 0)
            elif s in r.others:
                ok &= ~(self.on_domain(r.key, (self.per_domain(r.key, (r.shape,)) > 0).astype(np.int64)) > 0)

    def ids_or_nodes(self, key: str) -> np.ndarray:
        ids: np.ndarray = self.ids[key] if key in self.ids else np.arange(len(self.hosts))
        return ids

    def soft_cost(self, s: int) -> np.ndarray:
        """Increase of the preference term when one more pod of ``s`` goes to each host."""
        cost = np.zeros(len(self.hosts), dtype=np.int64)
        for t in self.problem.rules.soft:
            has = self.on_domain(t.key, (t.existing > 0).astype(np.int64))
            mine = self.on_domain(t.key, self.per_domain(t.key, (t.shape,)))
            if t.kind == "anti":
                if t.self_match and s in t.members:
                    crowd = self.on_domain(t.key, self.per_domain(t.key, t.members)) + has
                    cost += t.weight * (crowd >= 1)
                elif t.shape == s:
                    cost += t.weight * has
            elif t.shape == s:
                cost += t.weight * ((mine == 0) & (has == 0))
        for sp in self.problem.rules.spreads:
            if not sp.hard and s in sp.members:
                c = sp.existing + self.per_domain(sp.key, sp.members)
                m = sp.global_min(c)
                cost += SOFT_SPREAD_WEIGHT * (self.on_domain(sp.key, c + 1 - m - sp.skew) > 0)
        return cost

    def spread_count(self, s: int) -> np.ndarray:
        """Matching pods in each host's domain, summed over the shape's spread rules: fewer first,
        as kube-scheduler's own scoring spreads them."""
        out = np.zeros(len(self.hosts), dtype=np.int64)
        for sp in self.problem.rules.spreads:
            if sp.shape == s:
                out += self.on_domain(sp.key, sp.existing + self.per_domain(sp.key, sp.members))
        return out

    def take(self, s: int, i: int) -> None:
        shape = self.problem.shapes[s]
        self.x[s, i] += 1
        self.free[i] -= shape.vec
        for j, c in enumerate(self.problem.rules.coloc):
            if s in c.shapes and j not in self.coloc_domain:
                self.coloc_domain[j] = int(self.ids_or_nodes(c.key)[i])
        for j, (shapes, _, _) in enumerate(self.problem.rules.totals):
            if s in shapes:
                self.total_left[j] -= 1


def constrained_greedy(problem: Problem, hosts: np.ndarray, minimum: int | None = None
                       ) -> dict[int, list[tuple[int, int]]] | None:
    """Pod by pod, as kube-scheduler would take them, for groups with inter-pod or volume rules:
    each pod goes to a node every rule allows given the pods before it, preferring (in order) the
    smallest increase of the soft terms, the least crowded spread domain, a node already used
    (packing) and then the tightest fit. A co-located set takes the domain its first pod lands in."""
    state = _State(problem, hosts)
    free_main = problem.free_main[hosts].astype(np.int64)
    placed = 0
    for s, shape in enumerate(problem.shapes):
        if shape.unknown:
            continue
        for _ in range(shape.count):
            ok = state.candidates(s)
            if not ok.any():
                break
            idx = np.nonzero(ok)[0]
            touched = state.x.sum(axis=0) > 0
            order = np.lexsort((idx, free_main[idx], ~touched[idx], state.spread_count(s)[idx],
                                state.soft_cost(s)[idx]))
            i = int(idx[order[0]])
            state.take(s, i)
            free_main[i] -= shape.main
            placed += 1
    if placed < (max(problem.needed, 1) if minimum is None else minimum):
        return None
    return {s: [(int(hosts[i]), int(state.x[s, i])) for i in np.nonzero(state.x[s])[0]]
            for s in range(len(problem.shapes))}
