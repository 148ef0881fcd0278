"""The smallest change that makes a group that does not fit fit, by kind.

:func:`explain` says why a group does not fit; this module says what to change, in the domain
where the change is smallest, and whether that change is *proven* minimal or only a bound:

- **capacity**: ``k`` more nodes like one of the domain's own (or, as a bound, that many more free
  units of the binding resource on its nodes). The smallest ``k`` is tried first, from a lower
  bound by totals (what the domain can take now, plus ``k`` empty nodes at most, in pods and in
  every resource the whole group asks for); when ``k``
  equals that bound it is proven, otherwise a bound ("at most k, at least lo").
- **constraint**: nodes of the domain that only a cordon or an untolerated taint keeps out (their
  labels pass the pods' node selector and affinity), the fewest of them to uncordon/untaint,
  roomiest first; proven in the same way, from the most pods the roomiest nodes could take.
- **topology**: the group fits across two (or more) domains of the required key, which demands one;
  proven the fewest when no fewer domains' bounds add up to the group (and it fits in none alone).
- **preemption**: what phalanx may not evict: the priority the group would need to preempt (the
  victims' highest priority plus one: the preemption search minimises that first, so with a proven
  plan it is the least) and the pods with the group's priority or more that stand in the way.

Every change is checked by solving: the stated change, applied to the snapshot, makes the solver
place the group. Pure, like the rest of the solver: the snapshot edits are new snapshots.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from .composite import (
    Composite,
    CompositePlacement,
    LeftOut,
    composite_main,
    place_composite,
    plan_composite_preemption,
    required_demand,
)
from .errors import InvalidInput
from .model import HOSTNAME_KEY, PODS, Node, PodGroup, PreemptionPolicy, TaintEffect
from .placement import SolveOptions, place
from .preemption import PREEMPTION_OPTIONS, PreemptionContext, VictimUnit, plan_preemption, victim_units
from .problem import DomainBound, Problem
from .snapshot import Snapshot

KINDS = ("constraint", "capacity", "topology", "preemption")
#: domains (nearest misses first) in which a capacity or constraint change is searched
CANDIDATE_DOMAINS = 3
#: solves per domain beyond the lower bound before the search gives up on that domain
MAX_STEPS = 6
#: domains of the required key a topology change may span
MAX_SPAN = 4
#: victims named in a preemption change before the rest are counted
MAX_NAMED = 5
#: the most nodes a composite's capacity change adds to one domain before the search gives up
MAX_TREE_NODES = 256
#: a condition message carries this much of the change; explain and the event carry all of it
SHORT = 400


@dataclass(frozen=True)
class Change:
    """One change that makes the group fit. The fields after ``proven`` say it for programs."""

    kind: str  # one of KINDS
    domain: str  # "rack r7", "cluster"
    text: str  # the whole statement, for people
    proven: bool  # minimal proven (else the statement says it is a bound)
    add_nodes: tuple[Node, ...] = ()  # capacity: the nodes to add
    free: Mapping[str, int] = field(default_factory=dict)  # capacity: or this much more free
    nodes: tuple[str, ...] = ()  # constraint: the nodes to uncordon / untaint
    domains: tuple[str, ...] = ()  # topology: the domain values the group would span
    priority: int | None = None  # preemption: the least priority that preempts
    victims: tuple[str, ...] = ()  # preemption: the pods it would evict (uids)

    def __str__(self) -> str:
        return f"{self.kind}: {self.text}"


@dataclass(frozen=True)
class SmallestChange:
    group: str
    changes: tuple[Change, ...]  # in the order of KINDS

    def of(self, kind: str) -> Change | None:
        return next((c for c in self.changes if c.kind == kind), None)

    def message(self) -> str:
        """The whole statement (explain, the event)."""
        if not self.changes:
            return "no single change found that makes it fit"
        return " | ".join(str(c) for c in self.changes)

    def short(self) -> str:
        """For a condition message: every change, clipped."""
        text = self.message()
        return text if len(text) <= SHORT else text[: SHORT - 3] + "..."


# -- entry point -----------------------------------------------------------------------------
def smallest_change(snapshot: Snapshot, group: PodGroup, options: SolveOptions = SolveOptions(),
                    context: PreemptionContext | None = None) -> SmallestChange:
    """The smallest change per kind that makes ``group`` (which does not fit ``snapshot``) fit.
    ``context`` (the running pods' eviction units) enables the preemption kind. Raises
    :class:`InvalidInput` for a group that cannot be placed as given."""
    problem = Problem(snapshot, group)
    changes: list[Change] = []
    if problem.pending_total:
        bounds = problem.domain_bounds()
        ranked = sorted(bounds, key=lambda b: (-b.placed_ub, b.domain))
        for found in (_constraint(problem, ranked, options), _capacity(problem, ranked, options),
                      _topology(problem, ranked, options),
                      _preemption(snapshot, group, context) if context is not None else None):
            if found is not None:
                changes.append(found)
    return SmallestChange(group.key, tuple(changes))


# -- snapshots with a change applied -----------------------------------------------------------
def rebuilt(snapshot: Snapshot, nodes: Iterable[Node]) -> Snapshot:
    """``snapshot`` over ``nodes`` (every node of it, edited or not, plus new ones): the usage,
    bound and assumed pods, namespaces and volumes carried over; new nodes start empty."""
    fresh = Snapshot(nodes, namespaces=snapshot.namespaces, volumes=snapshot.volumes)
    missing = [n.name for n in snapshot.nodes if n.name not in fresh.index]
    if missing:
        raise InvalidInput(f"nodes {missing[:3]} would be dropped")
    used = np.zeros_like(fresh.allocatable)
    rows = [fresh.index[n.name] for n in snapshot.nodes]
    cols = [fresh.rindex[r] for r in snapshot.resources]
    used[np.ix_(rows, cols)] = snapshot.used
    out = fresh.with_used(used, bound=snapshot.bound, bound_anti=snapshot.bound_anti)
    return out.with_context(assumed=snapshot.assumed) if snapshot.assumed else out


def made_eligible(node: Node) -> Node:
    """``node`` uncordoned and without NoSchedule/NoExecute taints."""
    keep = tuple(t for t in node.taints if t.effect is TaintEffect.PREFER_NO_SCHEDULE)
    return dataclasses.replace(node, taints=keep, unschedulable=False)


def fits(snapshot: Snapshot, group: PodGroup, options: SolveOptions, nodes: Iterable[str] | None = None) -> bool:
    """Whether the solver places ``group`` on ``snapshot`` (only on ``nodes`` when given)."""
    if nodes is not None:
        snapshot = snapshot.only_nodes(nodes)
    return bool(place(snapshot, group, options).assignments)


# -- helpers -----------------------------------------------------------------------------------
def _label(problem: Problem, d: int) -> str:
    key = problem.group.topology_key
    return f"{key.rsplit('/', 1)[-1]} {problem.domain_values[d]}" if key else "cluster"


def _domain_nodes(problem: Problem, d: int) -> list[str]:
    nodes = problem.snapshot.nodes
    return [nodes[i].name for i in np.nonzero(problem.domain_ids == d)[0]]


def _per_node(problem: Problem, amounts: np.ndarray) -> int:
    """The most pods of one shape that ``amounts`` (a resource vector) holds: an upper bound on
    what a node with that much free takes of the group (one, for a shape whose members repel each
    other per node)."""
    best = 0
    for s, shape in enumerate(problem.shapes):
        cols = np.nonzero(shape.vec)[0]
        most = int(np.min(amounts[cols] // shape.vec[cols]))
        if HOSTNAME_KEY in problem.self_anti_keys(s):
            most = min(most, 1)
        best = max(best, most)
    return best


def _lower(have: int, needed: int, gains: list[int]) -> int | None:
    """The fewest of ``gains`` (largest first) that lift ``have`` to ``needed``: no set of fewer
    does, since none gains more than the largest ones. None when all of them do not."""
    total = have
    for k, gain in enumerate(sorted(gains, reverse=True), start=1):
        total += gain
        if total >= needed:
            return k
    return None


def _quantity(resource: str, amount: int) -> str:
    if resource == "cpu":
        return f"{amount // 1000}" if amount % 1000 == 0 else f"{amount}m"
    if resource == "memory" and amount % 2**30 == 0:
        return f"{amount // 2**30}Gi"
    return str(amount)


def _bound_words(proven: bool, lo: int, k: int, unit: str) -> str:
    return "minimal" if proven else f"a bound: at least {lo}, at most {k} {unit}"


# -- capacity ----------------------------------------------------------------------------------
def _template(problem: Problem, d: int) -> Node | None:
    """The node new capacity should look like: the domain's own eligible node with the most
    allocatable of the main resource, else any eligible node of the cluster."""
    eligible = np.all(np.stack([s.eligibility.mask for s in problem.shapes]), axis=0)
    main = problem.main_j if problem.main_j is not None else problem.snapshot.rindex[PODS]
    alloc = problem.snapshot.allocatable[:, main]
    for where in (eligible & (problem.domain_ids == d), eligible):
        if where.any():
            idx = np.nonzero(where)[0]
            return problem.snapshot.nodes[int(idx[np.argmax(alloc[idx])])]
    return None


def new_nodes(template: Node, count: int, key: str, value: str, taken: Iterable[str]) -> tuple[Node, ...]:
    """``count`` empty nodes like ``template`` in domain ``key=value``, named after it."""
    taken = set(taken)
    out: list[Node] = []
    i = 0
    while len(out) < count:
        i += 1
        name = f"{template.name}-new-{i}"
        if name in taken:
            continue
        labels = dict(template.labels) | {HOSTNAME_KEY: name} | ({key: value} if key else {})
        out.append(dataclasses.replace(template, name=name, labels=labels, unschedulable=False))
    return tuple(out)


def _capacity(problem: Problem, ranked: list[DomainBound], options: SolveOptions) -> Change | None:
    group, snap = problem.group, problem.snapshot
    needed = max(problem.needed, 1)
    best: Change | None = None
    for bound in ranked[:CANDIDATE_DOMAINS]:
        template = _template(problem, bound.domain)
        if template is None:
            return None  # no node anywhere takes a member: a constraint, not capacity
        per_node = _per_node(problem, snap.allocatable[snap.index[template.name]])
        if per_node == 0:
            continue
        lo = max(1, -(-(needed - bound.placed_ub) // per_node), _resource_lower(problem, bound, template))
        value = problem.domain_values[bound.domain] if group.topology_key else ""
        for k in range(lo, lo + MAX_STEPS):
            if best is not None and best.proven and k >= len(best.add_nodes):
                break
            added = new_nodes(template, k, group.topology_key, value, snap.index)
            trial = rebuilt(snap, snap.nodes + added)
            if fits(trial, group, options, _domain_nodes(problem, bound.domain) + [n.name for n in added]):
                if best is None or k < len(best.add_nodes):
                    best = _capacity_change(problem, bound, template, added, k == lo, lo)
                break
    return best


def _deficit(problem: Problem, bound: DomainBound) -> np.ndarray | None:
    """Per resource, what a whole group asks for in all beyond what the domain's eligible nodes
    have free (when every pending member is needed; else None: which members are left out is the
    solver's choice, no total to count on)."""
    if problem.needed < problem.pending_total:
        return None
    snap = problem.snapshot
    eligible = np.all(np.stack([s.eligibility.mask for s in problem.shapes]), axis=0)
    free = snap.free[eligible & (problem.domain_ids == bound.domain)].sum(axis=0)
    asked = np.zeros(len(snap.resources), dtype=np.int64)
    for shape in problem.shapes:
        asked += shape.vec * shape.count
    deficit: np.ndarray = np.maximum(asked - free, 0)
    return deficit


def _resource_lower(problem: Problem, bound: DomainBound, template: Node) -> int:
    """Nodes like ``template`` the domain needs at least for its :func:`_deficit`."""
    deficit = _deficit(problem, bound)
    if deficit is None:
        return 0
    alloc = problem.snapshot.allocatable[problem.snapshot.index[template.name]]
    short = np.nonzero((deficit > 0) & (alloc > 0))[0]
    return max((int(-(-deficit[j] // alloc[j])) for j in short), default=0)


def _capacity_change(problem: Problem, bound: DomainBound, template: Node, added: tuple[Node, ...],
                     proven: bool, lo: int) -> Change:
    label = _label(problem, bound.domain)
    key = problem.group.topology_key
    asked = sorted({r for s in problem.shapes for r in s.pods[0].spec.requests if r != PODS})
    shape = ", ".join(f"{r} {_quantity(r, template.allocatable.get(r, 0))}" for r in asked)
    where = f"{key}={problem.domain_values[bound.domain]}; " if key else ""
    k = len(added)
    text = (f"{label} lacks {k} node{'s' if k > 1 else ''} like {template.name} ({where}{shape}) "
            f"({_bound_words(proven, lo, k, 'nodes')})")
    free: dict[str, int] = {}
    if bound.binding and bound.need > bound.have:
        more = bound.need - bound.have
        deficit = _deficit(problem, bound)
        if deficit is not None:
            more = max(more, int(deficit[problem.snapshot.rindex[bound.binding]]))
        free[bound.binding] = more
        text += (f", or at least {_quantity(bound.binding, more)} more free {bound.binding} "
                 "on its eligible nodes (a bound)")
    return Change("capacity", label, text, proven, add_nodes=added, free=free)


# -- constraint --------------------------------------------------------------------------------
def _kept_out(problem: Problem) -> dict[int, str]:
    """Nodes only a cordon or an untolerated taint keeps from every member, with the words for
    why: their labels pass every shape's node selector and affinity."""
    snap = problem.snapshot
    out: dict[int, str] = {}
    for i, node in enumerate(snap.nodes):
        if not node.taints and not node.unschedulable:
            continue
        labels = node.labels
        why: list[str] = ["cordoned"] if node.unschedulable else []
        for shape in problem.shapes:
            spec = shape.pods[0].spec
            if any(labels.get(k) != v for k, v in spec.node_selector.items()):
                break
            if spec.affinity.terms and not spec.affinity.matches(labels):
                break
            why += [f"taint {t.key}{'=' + t.value if t.value else ''}:{t.effect.value}" for t in node.taints
                    if t.effect is not TaintEffect.PREFER_NO_SCHEDULE
                    and not any(tol.tolerates(t) for tol in spec.tolerations)]
        else:
            why = list(dict.fromkeys(why))
            if why:
                out[i] = ", ".join(why)
    return out


def _constraint(problem: Problem, ranked: list[DomainBound], options: SolveOptions) -> Change | None:
    kept = _kept_out(problem)
    if not kept:
        return None
    group, snap = problem.group, problem.snapshot
    needed = max(problem.needed, 1)
    free = snap.free
    tried = 0
    best: Change | None = None
    for bound in ranked:
        if tried == CANDIDATE_DOMAINS:
            break
        here = sorted((i for i in kept if problem.domain_ids[i] == bound.domain),
                      key=lambda i: (-_per_node(problem, free[i]), snap.nodes[i].name))
        gains = [_per_node(problem, free[i]) for i in here]
        lo = _lower(bound.placed_ub, needed, gains)
        if lo is None:
            continue
        tried += 1
        for k in range(lo, min(len(here), lo + MAX_STEPS) + 1):
            if best is not None and best.proven and k >= len(best.nodes):
                break
            chosen = here[:k]
            edited = {snap.nodes[i].name: made_eligible(snap.nodes[i]) for i in chosen}
            trial = rebuilt(snap, [edited.get(n.name, n) for n in snap.nodes])
            if fits(trial, group, options, _domain_nodes(problem, bound.domain)):
                if best is None or k < len(best.nodes):
                    best = _constraint_change(problem, bound, [(snap.nodes[i].name, kept[i]) for i in chosen],
                                              sum(1 for i in kept if problem.domain_ids[i] == bound.domain),
                                              k == lo, lo)
                break
    return best


def _constraint_change(problem: Problem, bound: DomainBound, chosen: list[tuple[str, str]], kept: int,
                       proven: bool, lo: int) -> Change:
    label = _label(problem, bound.domain)
    k = len(chosen)
    rule = f"{bound.rule}; " if bound.rule else ""
    listed = "; ".join(f"{name} ({why})" for name, why in chosen)
    text = (f"{label}: {rule}{k} more eligible node{'s make' if k > 1 else ' makes'} it fit: uncordon/untaint {listed} "
            f"({kept} kept out there by a cordon or taint; {_bound_words(proven, lo, k, 'nodes')})")
    return Change("constraint", label, text, proven, nodes=tuple(name for name, _ in chosen))


# -- topology ----------------------------------------------------------------------------------
def _topology(problem: Problem, ranked: list[DomainBound], options: SolveOptions) -> Change | None:
    group = problem.group
    if not group.topology_key or group.bound or len(ranked) < 2:
        return None
    needed = max(problem.needed, 1)
    relaxed = dataclasses.replace(group, topology_key="")
    # no fewer domains than the roomiest ones whose bounds add up to the group (and two at least:
    # it fits in none alone)
    lo = max(2, _lower(0, needed, [b.placed_ub for b in ranked]) or len(ranked) + 1)
    for span in range(lo, min(len(ranked), MAX_SPAN) + 1):
        chosen = ranked[:span]
        nodes = [n for b in chosen for n in _domain_nodes(problem, b.domain)]
        if fits(problem.snapshot, relaxed, options, nodes):
            values = tuple(problem.domain_values[b.domain] for b in chosen)
            short = group.topology_key.rsplit("/", 1)[-1]
            proof = "the fewest" if span == lo else f"a bound: at least {lo}, at most {span}"
            text = (f"fits across {short}s {'+'.join(values)}, but the key {group.topology_key} requires one "
                    f"{short} ({proof})")
            return Change("topology", "+".join(values), text, span == lo, domains=values)
    return None


# -- preemption --------------------------------------------------------------------------------
def _preemption(snapshot: Snapshot, group: PodGroup, context: PreemptionContext) -> Change | None:
    """What the group may not preempt: the priority it would need, or (preemptionPolicy Never)
    what it would evict if it might. None when it may preempt and that does not help either."""
    units = victim_units(snapshot, context, group.key)
    if not units:
        return None
    never = group.preemption_policy is PreemptionPolicy.NEVER
    top = max(u.priority for u in units)
    if top < group.priority and not never:
        return None  # it may preempt every running pod already, and that did not help
    raised = dataclasses.replace(group, priority=max(top + 1, group.priority),
                                 preemption_policy=PreemptionPolicy.PREEMPT_LOWER_PRIORITY)
    plan = plan_preemption(snapshot, raised, context, PREEMPTION_OPTIONS)
    if not plan.helps or not plan.victims:
        return None
    where = f" in {plan.domain}" if plan.domain else ""
    return _preemption_change(plan.units, plan.victims, group.priority, never, "it", where,
                              plan.domain or "cluster", plan.optimal and plan.pdb_violations == 0)


def _preemption_change(units: Sequence[VictimUnit], victims: tuple[str, ...], priority: int, never: bool,
                       subject: str, where: str, label: str, proven: bool) -> Change:
    """The preemption kind's change for ``subject`` (of ``priority``) whose plan evicts ``units``:
    the least priority that preempts them, and who is in the way."""
    need = max(priority, max(u.priority for u in units) + 1)
    in_way = [u for u in units if u.priority >= priority]
    named = ", ".join(f"{u.describe()} (priority {u.priority})" for u in units[:MAX_NAMED])
    more = f" and {len(units) - MAX_NAMED} more" if len(units) > MAX_NAMED else ""
    policy = "preemptionPolicy Never: with PreemptLowerPriority" if never else ""
    if need <= priority:
        text = f"{policy} {subject} would evict {len(victims)} pods{where}"
    else:
        text = (f"{policy + ' and' if never else 'with'} priority {need} or more (now {priority}) {subject} would "
                f"evict {len(victims)} pods{where} ({'the least priority' if proven else 'a bound'}); "
                f"{len(in_way)} units of priority {priority} or more are in the way")
    return Change("preemption", label, f"{text}: {named}{more}", proven, priority=need, victims=victims)


# -- a CompositePodGroup as one unit -------------------------------------------------------------
# the rule's one home (docs/design.md: composite/smallest-change)
def smallest_composite_change(snapshot: Snapshot, composite: Composite, options: SolveOptions = SolveOptions(),
                              context: PreemptionContext | None = None) -> SmallestChange:
    """The smallest change per kind that makes ``composite`` (which does not fit ``snapshot``) fit
    as one unit — capacity (nodes like one of the nearest block's own, in the rack of that node),
    topology (the blocks it would span), preemption (the priority it would need) — each confirmed
    by placing the whole tree with the change applied. The capacity change names the children that
    do not fit there now. Raises :class:`InvalidInput` for a tree that cannot be planned yet."""
    answer = place_composite(snapshot, composite, options)
    if answer.fits:
        return SmallestChange(composite.key, ())
    found = (_tree_capacity(snapshot, composite, answer, options), _tree_topology(snapshot, composite, options),
             _tree_preemption(snapshot, composite, context) if context is not None else None)
    return SmallestChange(composite.key, tuple(c for c in found if c is not None))


def _tree_label(composite: Composite, value: str) -> str:
    key = composite.topology_key
    return f"{key.rsplit('/', 1)[-1]} {value}" if key else "cluster"


def _tree_template(snapshot: Snapshot, rows: np.ndarray, main: str) -> Node | None:
    """The node new capacity for a tree should look like: the domain's uncordoned, untainted node
    with the most allocatable of the main resource (else any of its nodes)."""
    j = snapshot.rindex.get(main)
    if not len(rows) or j is None:
        return None
    open_rows = [int(i) for i in rows if not snapshot.nodes[i].unschedulable and not any(
        t.effect is not TaintEffect.PREFER_NO_SCHEDULE for t in snapshot.nodes[i].taints)]
    pool = open_rows or [int(i) for i in rows]
    return snapshot.nodes[max(pool, key=lambda i: (int(snapshot.allocatable[i, j]), snapshot.nodes[i].name))]


def _tree_capacity(snapshot: Snapshot, composite: Composite, answer: CompositePlacement,
                   options: SolveOptions) -> Change | None:
    main = composite_main(composite)
    j = snapshot.rindex.get(main)
    if j is None:
        return None
    key = composite.topology_key
    values, ids = snapshot.domains(key)
    held = {int(ids[snapshot.index[p.node]]) for leaf in composite.leaves() for p in leaf.bound
            if key and p.node in snapshot.index and ids[snapshot.index[p.node]] >= 0}
    candidates = sorted(held) if held else list(range(len(values)))
    free = snapshot.free[:, j]
    room = {d: int(free[ids == d].sum()) for d in candidates}
    nearest = values.index(answer.domain) if key and answer.domain in values else None
    ranked = sorted(candidates, key=lambda d: (d != nearest, -room[d], d))[:CANDIDATE_DOMAINS]
    need = required_demand(composite, main)
    best: Change | None = None
    for d in ranked:
        rows = np.flatnonzero(ids == d)
        template = _tree_template(snapshot, rows, main)
        if template is None:
            continue
        per_node = int(template.allocatable.get(main, 0))
        if per_node <= 0:
            continue
        lo = max(1, -(-(need - room[d]) // per_node))
        value = values[d] if key else ""
        names = [snapshot.nodes[i].name for i in rows]

        def fits_with(k: int, template: Node = template, value: str = value, names: list[str] = names) -> bool:
            added = new_nodes(template, k, key, value, snapshot.index)
            trial = rebuilt(snapshot, snapshot.nodes + added)
            return place_composite(trial.only_nodes(names + [n.name for n in added]), composite, options).fits
        k = _fewest(lo, fits_with, len(best.add_nodes) - 1 if best is not None else MAX_TREE_NODES)
        if k is not None:
            added = new_nodes(template, k, key, value, snapshot.index)
            left = answer.left_out if value == answer.domain else ()
            best = _tree_capacity_change(composite, value, template, added, k == lo, lo, main, left)
    return best


def _fewest(lo: int, fits_with: Callable[[int], bool], most: int) -> int | None:
    """The fewest ``k`` in ``lo..most`` with ``fits_with(k)``, assuming more never hurts: ``k``
    doubled from ``lo`` until it fits, then bisected (2 log k solves, not k); None when even
    ``most`` does not fit."""
    if most < lo:
        return None
    k, failed = lo, lo - 1
    while not fits_with(k):
        if k >= most:
            return None
        failed, k = k, min(2 * k, most)
    while k - failed > 1:
        middle = (failed + k) // 2
        if fits_with(middle):
            k = middle
        else:
            failed = middle
    return k


def _tree_capacity_change(composite: Composite, value: str, template: Node, added: tuple[Node, ...],
                          proven: bool, lo: int, main: str, left: tuple[LeftOut, ...]) -> Change:
    label = _tree_label(composite, value)
    k = len(added)
    where = "; ".join(f"{key}={v}" for key, v in sorted(template.labels.items())
                      if key != HOSTNAME_KEY and key.startswith("topology.") or key == composite.topology_key)
    shape = f"{main} {_quantity(main, template.allocatable.get(main, 0))}"
    children = ", ".join(f"{'compositepodgroup' if isinstance(x.child, Composite) else 'podgroup'} {x.child.key}"
                         for x in left)
    then = f"; {children} do{'es' if len(left) == 1 else ''} not fit there now" if children else ""
    text = (f"{label} lacks {k} node{'s' if k > 1 else ''} like {template.name} ({where + '; ' if where else ''}"
            f"{shape}) for compositepodgroup {composite.key} ({_bound_words(proven, lo, k, 'nodes')}){then}")
    return Change("capacity", label, text, proven, add_nodes=added)


def _tree_topology(snapshot: Snapshot, composite: Composite, options: SolveOptions) -> Change | None:
    key = composite.topology_key
    if not key or any(leaf.bound for leaf in composite.leaves()):
        return None
    relaxed = place_composite(snapshot, dataclasses.replace(composite, topology_key=""), options)
    if not relaxed.fits:
        return None
    used = sorted({snapshot.nodes[snapshot.index[n]].labels.get(key, "") for n in relaxed.assignments.values()})
    if len(used) < 2:
        return None
    short = key.rsplit("/", 1)[-1]
    proof = "the fewest" if len(used) == 2 else f"a bound: at least 2, at most {len(used)}"
    text = (f"compositepodgroup {composite.key} fits across {short}s {'+'.join(used)}, but the key {key} "
            f"requires one {short} ({proof})")
    return Change("topology", "+".join(used), text, len(used) == 2, domains=tuple(used))


def _raised(composite: Composite, priority: int) -> Composite:
    """``composite`` with ``priority`` on it and on every leaf, each allowed to preempt."""
    children = tuple(_raised(c, priority) if isinstance(c, Composite) else dataclasses.replace(
        c, priority=priority, preemption_policy=PreemptionPolicy.PREEMPT_LOWER_PRIORITY) for c in composite.children)
    return dataclasses.replace(composite, children=children, priority=priority)


def _tree_preemption(snapshot: Snapshot, composite: Composite, context: PreemptionContext) -> Change | None:
    """What the tree may not preempt: the priority it would need (see :func:`_preemption`)."""
    leaves = composite.leaves()
    own = {leaf.key for leaf in leaves} | {composite.key}
    units = [u for u in victim_units(snapshot, context) if u.key not in own]
    if not units:
        return None
    priority = max([composite.priority, *(leaf.priority for leaf in leaves)])
    never = all(leaf.preemption_policy is PreemptionPolicy.NEVER for leaf in leaves)
    top = max(u.priority for u in units)
    if top < priority and not never:
        return None  # it may preempt every running pod already, and that did not help
    plan = plan_composite_preemption(snapshot, _raised(composite, max(top + 1, priority)), context,
                                     PREEMPTION_OPTIONS, reprieve=False)
    if plan is None or not plan.victims:
        return None
    label = _tree_label(composite, plan.placement.domain)
    return _preemption_change(plan.units, plan.victims, priority, never, f"compositepodgroup {composite.key}",
                              f" in {label}", label, False)
