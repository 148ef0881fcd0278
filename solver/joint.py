"""Joint placement: several pending groups placed by one solve, never worse than one at a time.

Planning groups one after another (:func:`solver.placement.place_batch`, the cycle, what-if over a
manifest) lets an early group take the room a later one needed: a burst of gangs that *all* fit in
some arrangement can leave one stranded. :func:`place_joint` places a list of groups so that the
most of them land whole:

1. **the incumbent** — the groups placed one at a time in the order given (exactly what the cycle
   would do); when every group fits, that is the answer and nothing else runs;
2. **one CP-SAT model over all of them** — which groups are placed and in which domain of each one's
   required key, with their pods counted per *node class* (nodes with the same free room, the same
   domains and the same eligibility for every group's pods), maximising the groups placed whole,
   then their pods; the incumbent is the model's hint and the wall-clock ``budget`` its limit. The
   per-class room is a sum over the class's nodes (a relaxation: pods do not split across nodes), so
3. **the model's answer is confirmed** by placing its groups for real, one at a time in their chosen
   domains, largest first (each with the full single-group solver and every rule), then the groups
   it left out anywhere they still fit. The confirmed answer replaces the incumbent only when it
   places more groups whole; otherwise the incumbent stands.

Groups already planned are not part of the call (charge them to the snapshot first); groups with
inter-pod rules or volumes are placed one at a time only (:attr:`JointResult.joint_reason` says
so): the joint model covers room, node eligibility and the required key.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
from ortools.sat.python import cp_model

from .cpsat import ModelBuilder, Solved
from .model import PodGroup
from .placement import Placement, SolveOptions, place, with_group
from .problem import Problem
from .snapshot import Snapshot

#: Wall-clock budget of the joint model, seconds (the incumbent is kept when it runs out).
DEFAULT_BUDGET = 0.1


@dataclass(frozen=True)
class JointResult:
    """One answer per group, in the order given; ``snapshot`` has every placed group charged."""

    placements: tuple[Placement, ...]
    snapshot: Snapshot
    #: groups placed whole one at a time, in the order given (the incumbent)
    sequential_placed: int
    #: the joint model's confirmed answer placed more groups than the incumbent and was kept
    joint: bool = False
    #: why the joint model did not run ("" when it did)
    joint_reason: str = ""
    stats: Mapping[str, float] = field(default_factory=dict)

    @property
    def placed(self) -> int:
        return sum(1 for p in self.placements if p.assignments)


def _one_at_a_time(snapshot: Snapshot, groups: Sequence[PodGroup], order: Sequence[int], options: SolveOptions,
                   domains: Mapping[int, np.ndarray] | None = None) -> tuple[dict[int, Placement], Snapshot]:
    """Place ``groups`` in ``order``; a group in ``domains`` is first tried on those nodes only
    (then anywhere). A group that does not fit carries no explanation: the cycle plans such a group
    again alone when its members ask (which explains it), and what-if reads only where groups fit."""
    out: dict[int, Placement] = {}
    current = snapshot
    for g in order:
        group = groups[g]
        placement = None
        if domains is not None and g in domains:
            names = [current.nodes[i].name for i in domains[g]]
            allowed = {p.uid: names for p in group.pending}
            placement = place(current, group, options, allowed, explained=False)
        if placement is None or not placement.assignments:
            placement = place(current, group, options, explained=False)
        if placement.assignments:
            current = with_group(current, group, placement.assignments)
        out[g] = placement
    return out, current


def _whole(placement: Placement, group: PodGroup) -> bool:
    return len(placement.assignments) >= max(group.needed, 1)


def place_joint(snapshot: Snapshot, groups: Sequence[PodGroup], options: SolveOptions = SolveOptions(),
                budget: float = DEFAULT_BUDGET) -> JointResult:
    """Place ``groups`` (pending, none planned yet) jointly; see the module docstring."""
    started = time.perf_counter()
    order = list(range(len(groups)))
    seq, seq_snapshot = _one_at_a_time(snapshot, groups, order, options)
    seq_placed = sum(1 for g in order if _whole(seq[g], groups[g]))
    stats: dict[str, float] = {"sequential_ms": (time.perf_counter() - started) * 1000.0}

    def answer(placements: dict[int, Placement], snap: Snapshot, joint: bool, reason: str) -> JointResult:
        stats["total_ms"] = (time.perf_counter() - started) * 1000.0
        return JointResult(tuple(placements[g] for g in order), snap, seq_placed, joint, reason, stats)

    if seq_placed == len(groups):
        return answer(seq, seq_snapshot, False, "every group fits one at a time")
    problems = [Problem(snapshot, g) for g in groups]
    empty = [g.key for g, p in zip(groups, problems, strict=True) if not p.pending_total]
    if empty:
        return answer(seq, seq_snapshot, False, f"{empty[0]} has no pending member")
    ruled = [g.key for g, p in zip(groups, problems, strict=True) if p.constrained]
    if ruled:
        return answer(seq, seq_snapshot, False, f"{ruled[0]} has inter-pod rules or volumes")
    model = _JointModel(snapshot, groups, problems, seq_placed + 1)
    solved, proven = model.solve(options.seed, budget)
    stats["model_ms"] = (time.perf_counter() - started) * 1000.0 - stats["sequential_ms"]
    if solved is None:
        reason = "no arrangement places more groups (proven)" if proven else \
            "the joint model found no better answer in its budget"
        return answer(seq, seq_snapshot, False, reason)
    chosen = model.chosen(solved)
    stats["model_groups"] = float(len(chosen))
    if len(chosen) <= seq_placed:
        return answer(seq, seq_snapshot, False, "the joint model places no more groups")
    # largest first inside the chosen domains, then the rest where they still fit
    first = sorted(chosen, key=lambda g: (-problems[g].pending_total, g))
    rest = [g for g in order if g not in chosen]
    confirmed, snap = _one_at_a_time(snapshot, groups, first + rest, options, chosen)
    placed = sum(1 for g in order if _whole(confirmed[g], groups[g]))
    stats["confirmed_groups"] = float(placed)
    if placed <= seq_placed:
        return answer(seq, seq_snapshot, False, "the joint answer did not place more once confirmed")
    return answer(confirmed, snap, True, "")


class _JointModel:
    """How many groups of each *type* go in each domain, with pods counted per node class (see the
    module docstring). Groups of one type are interchangeable (same pods, same key, same minimum,
    same room per node), so a burst of 50 identical gangs is one integer per domain, not 50 choices."""

    def __init__(self, snapshot: Snapshot, groups: Sequence[PodGroup], problems: Sequence[Problem],
                 at_least: int) -> None:
        self.snapshot = snapshot
        self.groups = groups
        types: dict[tuple[object, ...], list[int]] = {}
        for g, p in enumerate(problems):
            key = (groups[g].topology_key, p.needed, p.pending_total, tuple(sh.count for sh in p.shapes),
                   tuple(sh.vec.tobytes() for sh in p.shapes), p.caps.tobytes(), tuple(p.candidate_domains))
            types.setdefault(key, []).append(g)
        self.types = list(types.values())
        self.reps = [problems[members[0]] for members in self.types]
        # joint shapes: (type, shape) pairs; their capacity rows side by side
        self.shapes = [(t, s) for t, p in enumerate(self.reps) for s in range(len(p.shapes))]
        self._classes()
        self.pods_terms: list[cp_model.LinearExprT] = []
        self.builder = ModelBuilder(0)
        self.per_class: list[list[tuple[int, cp_model.IntVar]]] = [[] for _ in range(len(self.class_counts))]
        self.x: list[dict[int, cp_model.IntVar]] = [self._type(t) for t in range(len(self.types))]
        self._room()
        m = self.builder.model
        placed: list[cp_model.LinearExprT] = [sum(xs.values()) for xs in self.x if xs]
        # only an answer that beats the incumbent is of use: ask for one (infeasible proves none
        # exists, the per-class room being a relaxation)
        if placed:
            m.add(sum(placed) >= at_least)
        else:
            m.add_bool_or([])  # no group can be placed at all: infeasible
        total_pods = sum(p.pending_total for p in problems) + 1
        m.maximize(cp_model.LinearExpr.weighted_sum(placed, [total_pods] * len(placed))
                   + cp_model.LinearExpr.sum(self.pods_terms))

    def _classes(self) -> None:
        """Node classes: hosts with the same free room, the same domain of every key and the same
        room for every joint shape."""
        snapshot = self.snapshot
        caps = np.stack([self.reps[t].caps[s] for t, s in self.shapes])
        keys = sorted({g.topology_key for g in self.groups})
        domain_rows = np.stack([snapshot.domains(k)[1] for k in keys])
        hosts = np.nonzero(caps.max(axis=0) > 0)[0]
        table = np.concatenate([snapshot.free[hosts].T, domain_rows[:, hosts], caps[:, hosts]]).T
        classes, counts = np.unique(table, axis=0, return_counts=True)
        resources = len(snapshot.resources)
        self.class_counts = [int(c) for c in counts]
        self.class_free = classes[:, :resources]
        self.class_domain = {k: classes[:, resources + i] for i, k in enumerate(keys)}
        self.class_caps = classes[:, resources + len(keys):]

    def _type(self, t: int) -> dict[int, cp_model.IntVar]:
        """A type's variables: groups per domain, pods per shape and class; the domain's pods between
        its groups' minimum and their pods."""
        b, m = self.builder, self.builder.model
        p, many = self.reps[t], len(self.types[t])
        mine = [(j, s) for j, (tt, s) in enumerate(self.shapes) if tt == t]
        dom_of_class = self.class_domain[p.group.topology_key]
        # the domains one group of the type fits in alone (its totals check), with their classes
        viable = {bd.domain for bd in p.domain_bounds() if bd.placed_ub >= max(p.needed, 1)}
        able = np.nonzero(self.class_caps[:, [j for j, _ in mine]].max(axis=1) > 0)[0]
        by_domain: dict[int, list[int]] = {}
        for c in able.tolist():
            if int(dom_of_class[c]) in viable:
                by_domain.setdefault(int(dom_of_class[c]), []).append(c)
        xs: dict[int, cp_model.IntVar] = {}
        for d in sorted(by_domain):
            terms: list[cp_model.IntVar] = []
            for j, s in mine:
                for c in by_domain[d]:
                    upper = min(p.shapes[s].count * many, int(self.class_caps[c, j]) * self.class_counts[c])
                    if upper > 0:
                        n = b.int_var(upper, f"n[type={t},shape={s},class={c}]")
                        terms.append(n)
                        self.per_class[c].append((j, n))
            if terms:
                x = b.int_var(many, f"groups[type={t},domain={d}]")
                m.add(sum(terms) <= p.pending_total * x)
                m.add(sum(terms) >= max(p.needed, 1) * x)
                self.pods_terms.append(sum(terms))
                xs[d] = x
        if xs:
            m.add(sum(xs.values()) <= many)
        return xs

    def _room(self) -> None:
        """Per class and resource, the pods placed on it ask at most the class's free room."""
        m = self.builder.model
        for c, terms in enumerate(self.per_class):
            for r in range(self.class_free.shape[1]):
                used = []
                for j, n in terms:
                    t, s = self.shapes[j]
                    a = int(self.reps[t].shapes[s].vec[r])
                    if a:
                        used.append(a * n)
                if used:
                    m.add(sum(used) <= int(self.class_free[c, r]) * self.class_counts[c])

    def solve(self, seed: int, budget: float) -> tuple[Solved | None, bool]:
        """The answer (None when there is none) and whether none exists (proven infeasible)."""
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = 1
        solver.parameters.random_seed = seed
        solver.parameters.max_time_in_seconds = budget
        status = solver.solve(self.builder.model)
        if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return Solved(solver, status == cp_model.OPTIMAL), False
        return None, status == cp_model.INFEASIBLE

    def chosen(self, solved: Solved) -> dict[int, np.ndarray]:
        """Per group the model placed: the node indices of its chosen domain (a type's groups take
        its domains in the order given)."""
        out: dict[int, np.ndarray] = {}
        for t, xs in enumerate(self.x):
            members = iter(self.types[t])
            ids = self.snapshot.domains(self.groups[self.types[t][0]].topology_key)[1]
            for d, x in xs.items():
                for _ in range(solved.value(x)):
                    out[next(members)] = np.nonzero(ids == d)[0]
        return out
