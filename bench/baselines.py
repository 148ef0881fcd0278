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

import numpy as np

from solver import Placement, PodGroup, Snapshot, evaluate
from solver.problem import Problem


def upstream_style(snapshot: Snapshot, group: PodGroup) -> Placement:
    problem = Problem(snapshot, group)
    best = None
    for d in problem.candidate_domains:
        in_domain = np.nonzero(problem.domain_ids == d)[0]
        trial = _trial(problem, in_domain)
        if trial is None:
            continue
        placed, free_after, assignments = trial
        score = (placed, -free_after)
        if best is None or score > best[0]:
            best = (score, d, assignments)
    if best is None:
        return Placement(group.key, {}, path="upstream-style")
    _, d, assignments = best
    domain = problem.domain_values[d] if group.topology_key else ""
    return Placement(group.key, assignments, domain, evaluate(snapshot, group, assignments), "upstream-style")


def _trial(problem: Problem, nodes: np.ndarray):
    free = problem.snapshot.free[nodes].copy()
    main_j = problem.main_j
    assignments: dict[str, str] = {}
    pods = [(s, pod) for s, shape in enumerate(problem.shapes) for pod in shape.pods]
    needed = max(problem.needed, 1)
    for k, (s, pod) in enumerate(pods):
        shape = problem.shapes[s]
        fits = shape.eligibility.mask[nodes] & np.all(free >= shape.vec, axis=1)
        if fits.any():
            candidates = np.nonzero(fits)[0]
            left = free[candidates, main_j] if main_j is not None else np.zeros(len(candidates))
            i = candidates[int(np.argmin(left))]
            free[i] -= shape.vec
            assignments[pod.uid] = problem.snapshot.nodes[nodes[i]].name
        elif len(assignments) + (len(pods) - k - 1) < needed:
            return None  # remaining + scheduled < minCount: abort this placement
    if len(assignments) < needed:
        return None
    free_after = int(free[:, main_j].sum()) if main_j is not None else 0
    return len(assignments), free_after, assignments
