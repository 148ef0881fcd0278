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
