"""A CompositePodGroup planned as one unit: its children (PodGroups and composites, any depth) placed
together, inside one domain of the composite's required topology key, each child inside one domain of
its own key within it, all-or-nothing over the children its policy requires.

The shape follows kube-scheduler v1.37.2's (``schedule_one_podgroup.go``: one candidate placement per
value of the composite's key, the children tried in each, a gang composite feasible once
``minGroupCount`` children fit, the best feasible placement kept, nothing assumed unless the whole
subtree fits). phalanx differs in three ways, each for packing:

- the parent's domains are tried **tightest first** (least free main resource among those whose
  totals can hold the required children), and the first whose children all fit is kept: the rest of
  the cluster keeps its roomiest domains;
- inside a domain the children are placed **largest first** (their pending main resource), each by
  :func:`solver.place` on what the ones before it left (capacity charged, pods assumed for the
  inter-pod rules), and when that order leaves a required child out, the children's own order is
  tried too;
- a child's running members hold it, and the composite, to the domains they run in (a composite
  whose members run is only ever planned around them).

A Basic composite places the children that fit (none is required); a gang composite needs
``minGroupCount`` of them, each whole by its own minCount. Pure: no I/O, nothing shared.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Collection, Mapping, Union

import numpy as np

from .errors import InvalidInput
from .explain import Explanation
from .model import PODS, DisruptionMode, Pod, PodGroup, Policy, PreemptionPolicy
from .objective import main_resource
from .placement import Placement, SolveOptions, place
from .preemption import PreemptionContext, PreemptionCost, VictimUnit, victim_cost, victim_units
from .snapshot import Snapshot

#: how deep composites nest (upstream's WorkloadMaxTreeDepth: the leaf PodGroups' level included)
MAX_DEPTH = 4

Child = Union[PodGroup, "Composite"]


@dataclass(frozen=True)
class Composite:
    """A CompositePodGroup and its children. ``min_group_count`` is the gang policy's (the children
    that must fit together); a Basic composite requires none."""

    namespace: str
    name: str
    children: tuple[Child, ...]
    policy: Policy = Policy.GANG
    min_group_count: int = 1
    topology_key: str = ""
    priority: int = 0
    disruption_mode: DisruptionMode = DisruptionMode.SINGLE

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidInput("compositepodgroup name must not be empty")
        count = self.min_group_count
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise InvalidInput(f"compositepodgroup {self.key}: minGroupCount must be an integer >= 1, got {count!r}")
        keys = [c.key for c in self.children]
        if len(set(keys)) != len(keys):
            raise InvalidInput(f"compositepodgroup {self.key}: a child is listed twice")
        if self.depth > MAX_DEPTH:
            raise InvalidInput(f"compositepodgroup {self.key}: nests {self.depth} levels, at most {MAX_DEPTH}")

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def depth(self) -> int:
        """Levels from this composite down to its deepest PodGroup, both counted."""
        return 1 + max((c.depth if isinstance(c, Composite) else 1 for c in self.children), default=0)

    @property
    def required(self) -> int:
        """How many children must fit together for the composite to be placed."""
        return self.min_group_count if self.policy is Policy.GANG else 0

    # the rule's one home (docs/design.md: composite/tree-ready)
    @property
    def missing_children(self) -> str:
        """Why the composite cannot be planned yet — fewer children than minGroupCount exist, or a
        required child waits for members — or "" when it can."""
        if len(self.children) < self.required:
            return (f"compositepodgroup {self.key}: waiting for children, {len(self.children)} of "
                    f"{self.required} exist")
        waiting = [c for c in self.children if c.missing_members]
        if len(self.children) - len(waiting) < self.required:
            return waiting[0].missing_members
        return ""

    @property
    def missing_members(self) -> str:
        return self.missing_children

    def leaves(self) -> tuple[PodGroup, ...]:
        """Every PodGroup of the tree, depth first in the children's order."""
        out: list[PodGroup] = []
        for child in self.children:
            out += child.leaves() if isinstance(child, Composite) else [child]
        return tuple(out)


@dataclass(frozen=True)
class LeftOut:
    """A child a composite's nearest try did not place, and the solver's explanation when it is a
    PodGroup that was tried (None: a nested composite, see its own answer, or a child not tried
    once the required ones could no longer fit)."""

    child: Child
    explanation: Explanation | None = None
    nested: "CompositePlacement | None" = None  # a nested composite's own nearest answer


@dataclass(frozen=True)
class CompositePlacement:
    """The answer for one composite: the children placed (PodGroups' and nested composites'
    answers, by key), the value of its key they sit in, and — when it does not fit — why, naming
    the child that did not; then ``domain`` is the value nearest to holding it (the most children
    placed) and ``left_out`` the children that did not fit there, in the order tried."""

    composite: str
    domain: str = ""
    children: Mapping[str, Union[Placement, "CompositePlacement"]] = field(default_factory=dict)
    explanation: str = ""
    left_out: tuple[LeftOut, ...] = ()

    @property
    def fits(self) -> bool:
        return not self.explanation

    @property
    def assignments(self) -> dict[str, str]:
        """Every pending pod the plan places (uid -> node), over the whole subtree."""
        out: dict[str, str] = {}
        for answer in self.children.values():
            out.update(answer.assignments)
        return out

    def leaf_placements(self) -> dict[str, Placement]:
        """Every PodGroup's answer in the plan (by key), nested composites flattened."""
        out: dict[str, Placement] = {}
        for child, answer in self.children.items():
            if isinstance(answer, CompositePlacement):
                out.update(answer.leaf_placements())
            else:
                out[child] = answer
        return out


# the rule's one home (docs/design.md: composite/one-unit)
def place_composite(snapshot: Snapshot, composite: Composite, options: SolveOptions = SolveOptions(),
                    allowed: Mapping[str, Collection[str]] | None = None) -> CompositePlacement:
    """Place ``composite`` as one unit on ``snapshot`` (see the module's docstring). ``allowed``:
    pending pod uid -> the only nodes it may take, as :func:`solver.place` reads it (kube-scheduler's
    verdicts). Raises :class:`InvalidInput` for one that cannot be planned yet (a missing child or
    member)."""
    if composite.missing_children:
        raise InvalidInput(composite.missing_children)
    return _place(snapshot, composite, _Options(options, allowed or None))


@dataclass(frozen=True)
class _Options:
    """The solver's options and kube-scheduler's verdicts, handed down the tree."""

    solve: SolveOptions
    allowed: Mapping[str, Collection[str]] | None = None


def _place(snapshot: Snapshot, composite: Composite, options: _Options) -> CompositePlacement:
    values, ids = snapshot.domains(composite.topology_key)
    held = _held_domains(snapshot, composite, ids)
    candidates = sorted(held) if held else list(range(len(values)))
    ranked = _tightest_first(snapshot, composite, ids, candidates)
    if not ranked:
        why = (f"compositepodgroup {composite.key}: no {composite.topology_key} domain holds the "
               f"{_demand_words(composite)} its required children ask for")
        roomiest = _roomiest(snapshot, composite, ids, candidates)
        if roomiest is None:
            return CompositePlacement(composite.key, explanation=why)
        # what fits in the roomiest, for what it lacks (the smallest change, a ProvisioningRequest)
        there = _in_domain(_inside(snapshot, composite, ids, roomiest), composite, values[roomiest], options)
        return replace(there, children={}, explanation=why)
    nearest: CompositePlacement | None = None
    for domain in ranked:
        value = values[domain] if composite.topology_key else ""
        answer = _in_domain(_inside(snapshot, composite, ids, domain), composite, value, options)
        if answer.fits:
            return answer
        if nearest is None or len(answer.children) > len(nearest.children):
            nearest = answer
    assert nearest is not None
    return replace(nearest, children={})


def _inside(snapshot: Snapshot, composite: Composite, ids: np.ndarray, domain: int) -> Snapshot:
    """``snapshot`` cut to one domain of the composite's key (all of it without a key)."""
    if not composite.topology_key:
        return snapshot
    return snapshot.only_nodes([snapshot.nodes[i].name for i in np.flatnonzero(ids == domain)])


def _roomiest(snapshot: Snapshot, composite: Composite, ids: np.ndarray, candidates: list[int]) -> int | None:
    """The candidate domain with the most free main resource (None without candidates)."""
    column = snapshot.rindex.get(composite_main(composite))
    if not candidates or column is None:
        return None
    free = snapshot.free[:, column]
    return max(candidates, key=lambda d: (int(free[ids == d].sum()), -d))


def _in_domain(snapshot: Snapshot, composite: Composite, value: str, options: _Options) -> CompositePlacement:
    """The children placed in one domain of the composite's key: largest first, then in their own
    order when that leaves a required child out."""
    by_size = sorted(composite.children, key=lambda c: -_main_demand(c))
    first = _in_order(snapshot, composite, value, by_size, options)
    if first.fits or list(by_size) == list(composite.children):
        return first
    second = _in_order(snapshot, composite, value, list(composite.children), options)
    return second if second.fits else first


def _in_order(snapshot: Snapshot, composite: Composite, value: str, children: list[Child],
              options: _Options) -> CompositePlacement:
    placed: dict[str, Placement | CompositePlacement] = {}
    why: list[str] = []
    left_out: list[LeftOut] = []
    current = snapshot
    where = f" in {composite.topology_key}={value}" if composite.topology_key else ""
    for left, child in enumerate(children):
        if why and len(placed) + len(children) - left < composite.required:
            left_out += [LeftOut(c) for c in children[left:]]
            break  # the required children can no longer all fit here (as in-tree's feasibility check)
        if child.missing_members:
            why.append(child.missing_members)
            left_out.append(LeftOut(child))
            continue
        answer = _child(current, child, options)
        if answer is None:
            placed[child.key] = Placement(child.key, {}, optimal=True)  # running whole: nothing to place
            continue
        if isinstance(answer, LeftOut):
            why.append(_refused(answer))
            left_out.append(answer)
            continue
        placed[child.key] = answer
        current = _charged(current, child, answer.assignments)
    if len(placed) >= max(composite.required, 1 if composite.policy is Policy.BASIC else 0) or not why:
        return CompositePlacement(composite.key, value, placed)
    return CompositePlacement(composite.key, value, placed, explanation=(
        f"compositepodgroup {composite.key}{where}: {len(placed)} of {len(composite.children)} children fit, "
        f"{composite.required} required; {why[0]}"), left_out=tuple(left_out))


def _refused(left: LeftOut) -> str:
    """Why a child tried did not fit, for the composite's explanation."""
    if left.nested is not None:
        return left.nested.explanation
    reason = left.explanation.message() if left.explanation else "no placement"
    return f"podgroup {left.child.key} does not fit: {reason}"


def _child(snapshot: Snapshot, child: Child, options: _Options) -> Placement | CompositePlacement | LeftOut | None:
    """A child's answer on ``snapshot``; what it was refused with (:class:`LeftOut`) when it does not
    fit; None when it has nothing to place (its members all run)."""
    if isinstance(child, Composite):
        answer = _place(snapshot, child, options)
        return answer if answer.fits else LeftOut(child, nested=answer)
    if not child.pending:
        return None
    mine = {p.uid: options.allowed[p.uid] for p in child.pending if options.allowed and p.uid in options.allowed}
    placement = place(snapshot, child, options.solve, allowed=mine or None)
    if placement.assignments:
        return placement
    return LeftOut(child, placement.explanation)


def _charged(snapshot: Snapshot, child: Child, assignments: Mapping[str, str]) -> Snapshot:
    """``snapshot`` with ``child``'s placed pods charged and assumed (for the next child's rules)."""
    pods: dict[str, Pod] = {p.uid: p for leaf in _leaves(child) for p in leaf.pending if p.uid in assignments}
    charged = snapshot.with_placement(assignments, pods)
    assumed = tuple(replace(p, node=assignments[uid]) for uid, p in pods.items())
    return charged.with_context(assumed=snapshot.assumed + assumed)


def _leaves(child: Child) -> tuple[PodGroup, ...]:
    return child.leaves() if isinstance(child, Composite) else (child,)


def _held_domains(snapshot: Snapshot, composite: Composite, ids: np.ndarray) -> set[int]:
    """The domains of the composite's key its running members sit in."""
    if not composite.topology_key:
        return set()
    return {int(ids[snapshot.index[p.node]]) for leaf in composite.leaves() for p in leaf.bound
            if p.node in snapshot.index and ids[snapshot.index[p.node]] >= 0}


def composite_main(composite: Composite) -> str:
    """The main resource of the tree's pending pods (:func:`solver.objective.main_resource`)."""
    return main_resource([p for leaf in composite.leaves() for p in leaf.pending])


def _main_demand(child: Child) -> int:
    resource = composite_main(child) if isinstance(child, Composite) else main_resource(list(child.pending))
    return sum(1 if resource == PODS else p.spec.requests.get(resource, 0) for leaf in _leaves(child)
               for p in leaf.pending)


def required_demand(composite: Composite, resource: str) -> int:
    """The least of ``resource`` the required children ask for together: the smallest ones' pods
    that must be placed."""
    def demand(child: Child) -> int:
        if isinstance(child, Composite):
            parts = sorted(demand(c) for c in child.children)
            return sum(parts[:child.required])
        pods = sorted((1 if resource == PODS else p.spec.requests.get(resource, 0) for p in child.pending))
        return sum(pods[:child.needed])
    parts = sorted(demand(c) for c in composite.children)
    return sum(parts[:composite.required])


def _tightest_first(snapshot: Snapshot, composite: Composite, ids: np.ndarray, candidates: list[int]) -> list[int]:
    """The candidate domains whose free main resource can hold the required children, least free
    first (then by value)."""
    resource = composite_main(composite)
    column = snapshot.rindex.get(resource)
    if column is None:
        return candidates
    free = snapshot.free[:, column]
    need = required_demand(composite, resource)
    room = {d: int(free[ids == d].sum()) for d in candidates}
    return sorted((d for d in candidates if room[d] >= need), key=lambda d: (room[d], d))


def _demand_words(composite: Composite) -> str:
    resource = composite_main(composite)
    return f"{required_demand(composite, resource)} {resource}"


# -- group preemption for a composite ---------------------------------------------------------------
@dataclass(frozen=True)
class CompositePreemption:
    """Victims whose eviction lets ``composite`` be placed whole, and that placement on the freed
    room. ``units`` highest priority first; every unit is needed (each was tried back)."""

    composite: str
    units: tuple[VictimUnit, ...]
    cost: PreemptionCost
    placement: CompositePlacement

    @property
    def victims(self) -> tuple[str, ...]:
        return tuple(uid for unit in self.units for uid in unit.pods)


# the rule's one home (docs/design.md: composite/preempt-whole)
def plan_composite_preemption(snapshot: Snapshot, composite: Composite, context: PreemptionContext,
                              options: SolveOptions = SolveOptions(), reprieve: bool = True
                              ) -> CompositePreemption | None:
    """The cheapest set of lower-priority units whose eviction lets ``composite`` be placed whole
    (upstream's order of victim sets: fewest PodDisruptionBudget violations, lowest highest victim
    priority, fewest pods, least priority), or None when preemption cannot help. Per value of the
    composite's key (the running members' values only, once any run): every lower unit with a pod
    there is removed; when the tree then fits, the units are given back one by one, most important
    first, each kept out only if the tree no longer fits without evicting it. A unit whose pods sit
    only on nodes the standing placement does not use is given back without a solve when no member
    of the tree carries inter-pod rules (it cannot change that placement). ``reprieve=False`` (a
    bound, for the smallest change): without such rules, every unit on the standing placement's
    nodes is kept out without trying it back — one solve per value of the key. Pure."""
    if composite.missing_children:
        return None
    leaves = composite.leaves()
    if all(leaf.preemption_policy is PreemptionPolicy.NEVER for leaf in leaves):
        return None
    priority = max([composite.priority, *(leaf.priority for leaf in leaves)])
    own = {leaf.key for leaf in leaves} | {composite.key}
    mine = {p.uid for leaf in leaves for p in leaf.bound}  # the tree's own running members
    lower = [u for u in victim_units(snapshot, context) if u.priority < priority and u.key not in own
             and not set(u.pods) & mine]
    if not lower:
        return None
    values, ids = snapshot.domains(composite.topology_key)
    held = _held_domains(snapshot, composite, ids)
    node_of = {p.uid: p.node for p in snapshot.bound}
    constrained = any(p.spec.has_pod_constraints for leaf in leaves for p in leaf.pending)
    best: CompositePreemption | None = None
    for domain in sorted(held) if held else range(len(values)):
        names = {snapshot.nodes[i].name for i in np.flatnonzero(ids == domain)}
        there = [u for u in lower if any(node_of.get(uid) in names for uid in u.pods)]
        if not there:
            continue
        found = _reprieved(snapshot, composite, there, names, node_of, constrained, options, reprieve)
        if found is None:
            continue
        kept, placement = found
        cost = victim_cost(kept, context.budgets)
        if best is None or cost < best.cost:
            best = CompositePreemption(composite.key, tuple(sorted(kept, key=lambda u: (-u.priority, u.key))),
                                       cost, placement)
    return best


def _reprieved(snapshot: Snapshot, composite: Composite, units: list[VictimUnit], names: set[str],
               node_of: Mapping[str, str], constrained: bool, options: SolveOptions, reprieve: bool = True
               ) -> tuple[list[VictimUnit], CompositePlacement] | None:
    """``units`` (all of a domain's lower units) less those the tree fits without, and its
    placement; None when it does not fit even with all of them gone."""
    def fits(victims: list[VictimUnit]) -> CompositePlacement | None:
        freed = snapshot.without_pods([uid for u in victims for uid in u.pods])
        inside = freed.only_nodes(names) if composite.topology_key else freed
        answer = _place(inside, composite, _Options(options))
        return answer if answer.fits else None
    placement = fits(units)
    if placement is None:
        return None
    kept = list(units)
    if not reprieve and not constrained:
        used = set(placement.assignments.values())
        return [u for u in units if any(node_of.get(uid) in used for uid in u.pods)], placement
    for unit in sorted(units, key=lambda u: (-u.priority, u.key)):  # the most important back first
        trial = [u for u in kept if u is not unit]
        used = set(placement.assignments.values())
        if not constrained and not any(node_of.get(uid) in used for uid in unit.pods):
            kept = trial  # off the standing placement's nodes: it stands without evicting the unit
            continue
        again = fits(trial)
        if again is not None:
            kept, placement = trial, again
    return kept, placement
