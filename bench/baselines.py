"""An upstream-style group placement, written from the published facts (KEP-5732 / 1.37).

For every value of the required topology key, a full *trial placement*: the group's pods are
placed one at a time, each filtered against every node of the domain and scored by tightest fit
(least free main resource left), with the early abort when the pods still to place cannot reach
minCount. Feasible trials are scored (pods placed, then tightest fit) and the best wins. There is
no totals pre-check and no pruning across domains: each domain gets its full trial, as upstream.

It is a baseline for the benchmarks, not a reimplementation of kube-scheduler: filtering uses the
same snapshot eligibility as phalanx, and the result is scored with the same objective so both
answers are compared on equal terms.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from solver import Placement, PodGroup, Snapshot, evaluate
from solver.problem import Problem


def upstream_style(snapshot: Snapshot, group: PodGroup) -> Placement:
    problem = Problem(snapshot, group)
    main_j = problem.main_j

    def tightest(free: np.ndarray, candidates: np.ndarray, vec: np.ndarray) -> int:
        left = free[candidates, main_j] if main_j is not None else np.zeros(len(candidates))
        return int(candidates[int(np.argmin(left))])

    best = None
    for d in problem.candidate_domains:
        in_domain = np.nonzero(problem.domain_ids == d)[0]
        trial = _trial(problem, in_domain, tightest)
        if trial is None:
            continue
        assignments, free = trial
        free_after = int(free[:, main_j].sum()) if main_j is not None else 0
        score = (len(assignments), -free_after)
        if best is None or score > best[0]:
            best = (score, d, assignments)
    if best is None:
        return Placement(group.key, {}, path="upstream-style")
    _, d, assignments = best
    domain = problem.domain_values[d] if group.topology_key else ""
    return Placement(group.key, assignments, domain, evaluate(snapshot, group, assignments), "upstream-style")


def _trial(problem: Problem, nodes: np.ndarray,
           choose: Callable[[np.ndarray, np.ndarray, np.ndarray], int]) -> tuple[dict[str, str], np.ndarray] | None:
    """One trial placement in a domain (``nodes``): the pods one at a time, each on the node
    ``choose(free, candidates, request)`` picks among those it fits on, aborted once minCount cannot
    be reached. The assignments and the domain's free room after, or None."""
    free = problem.snapshot.free[nodes].copy()
    assignments: dict[str, str] = {}
    pods = [(s, pod) for s, shape in enumerate(problem.shapes) for pod in shape.pods]
    needed = max(problem.needed, 1)
    for k, (s, pod) in enumerate(pods):
        shape = problem.shapes[s]
        fits = shape.eligibility.mask[nodes] & np.all(free >= shape.vec, axis=1)
        if fits.any():
            i = choose(free, np.nonzero(fits)[0], shape.vec)
            free[i] -= shape.vec
            assignments[pod.uid] = problem.snapshot.nodes[nodes[i]].name
        elif len(assignments) + (len(pods) - k - 1) < needed:
            return None  # remaining + scheduled < minCount: abort this placement
    if len(assignments) < needed:
        return None
    return assignments, free


#: the resources kube-scheduler's NodeResourcesFit scores by default (weight 1 each)
IN_TREE_SCORED = ("cpu", "memory")


def in_tree_tas(snapshot: Snapshot, group: PodGroup) -> Placement:
    """A simulation of kube-scheduler v1.37.2's topology-aware gang placement, written from its
    source (not its code): one placement per value of the required key holding all of that domain's
    nodes; in each, the pods go one at a time to the node its default scoring ranks highest — of the
    node scores only NodeResourcesFit's LeastAllocated over CPU and memory is modelled (it spreads
    pods over a domain's nodes) — with the trial aborted once minCount cannot be reached; the
    feasible placements are scored by PodGroupPodsCount (pods placed, normalised to 0-100) plus
    NodeResourcesFit's placement score, MostAllocated over CPU and memory summed over the placement's
    nodes (``resource_allocation.go`` ``scorePlacement``), and the highest wins (the first of equals).
    """
    problem = Problem(snapshot, group)
    cols = [snapshot.rindex[r] for r in IN_TREE_SCORED if r in snapshot.rindex]
    alloc = snapshot.allocatable
    trials = []
    for d in problem.candidate_domains:
        in_domain = np.nonzero(problem.domain_ids == d)[0]
        room = np.maximum(alloc[in_domain][:, cols], 1)

        def least_allocated(free: np.ndarray, candidates: np.ndarray, vec: np.ndarray, room: np.ndarray = room) -> int:
            after = free[candidates][:, cols] - vec[cols]
            score = (100 * after // room[candidates]).sum(axis=1)  # LeastAllocated: most room left
            return int(candidates[int(np.argmax(score))])

        trial = _trial(problem, in_domain, least_allocated)
        if trial is not None:
            trials.append((d, in_domain, *trial))
    if not trials:
        return Placement(group.key, {}, path="in-tree (simulated)")
    most = max(len(t[2]) for t in trials)
    best = None
    for d, in_domain, assignments, free in trials:
        requested = (alloc[in_domain][:, cols] - free[:, cols]).sum(axis=0)
        total = np.maximum(alloc[in_domain][:, cols].sum(axis=0), 1)
        score = 100 * len(assignments) // max(most, 1) + int((100 * requested // total).sum() // max(len(cols), 1))
        if best is None or score > best[0]:
            best = (score, d, assignments)
    assert best is not None
    _, d, assignments = best
    domain = problem.domain_values[d] if group.topology_key else ""
    return Placement(group.key, assignments, domain, evaluate(snapshot, group, assignments), "in-tree (simulated)")
