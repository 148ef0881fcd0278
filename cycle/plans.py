"""The plan book: every group's plan, and the one state machine a plan moves through.

A plan is a group's answer from the solver held as *reserved* capacity until its members bind.
Like kube-scheduler's cache of assumed pods (assumed -> added, or expired / forgotten), a plan
holds capacity from ``planned`` until the cache shows its bindings::

    (new) --> planned --barrier complete (gang) / first member at bind (Basic)--> binding
    planned --stale node, new member, barrier timeout, group deleted--> released
    planned --deadline--> expired           binding (Basic only) --deadline / re-plan--> expired / released
    binding --every binding made--> bound   binding --any error while binding--> failed
    planned, bound --the cache shows the bindings, or the group moved on--> forgotten

Every rule is in :data:`TRANSITIONS`, one table per kind of group: a *gang* binding cannot be
released or expired (its members are being bound as one; only ``bound`` or ``failed`` end it),
while a *Basic* group's members bind one by one, so its unbound rest may be re-planned. No plan
enters or leaves the book except through :meth:`PlanBook.transition`, which then hands the change
to the cycle's one listener (status, events, metrics, notifications: :mod:`.service`).

The book is not thread-safe on its own: the cycle calls it with its lock held.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum
from typing import AbstractSet, Callable, Iterator, Mapping

from solver import Placement, Pod
from solver.model import DO_NOT_SCHEDULE, add_resources, by_shape, placement_usage


class PlanState(str, Enum):
    """Where a plan is in its life (see the module's diagram)."""

    PLANNED = "planned"
    BINDING = "binding"
    BOUND = "bound"
    RELEASED = "released"
    EXPIRED = "expired"
    FAILED = "failed"
    FORGOTTEN = "forgotten"


_FINAL: frozenset[PlanState] = frozenset()
#: the allowed transitions by kind of group (True: gang, False: Basic); None is a plan being made
TRANSITIONS: dict[bool, dict[PlanState | None, frozenset[PlanState]]] = {
    True: {
        None: frozenset({PlanState.PLANNED}),
        PlanState.PLANNED: frozenset({PlanState.BINDING, PlanState.RELEASED, PlanState.EXPIRED, PlanState.FORGOTTEN}),
        # a binding gang cannot be released or expired: it ends bound or failed, as one
        PlanState.BINDING: frozenset({PlanState.BOUND, PlanState.FAILED}),
        PlanState.BOUND: frozenset({PlanState.FORGOTTEN}),
        PlanState.RELEASED: _FINAL, PlanState.EXPIRED: _FINAL, PlanState.FAILED: _FINAL, PlanState.FORGOTTEN: _FINAL,
    },
    False: {
        None: frozenset({PlanState.PLANNED}),
        PlanState.PLANNED: frozenset({PlanState.BINDING, PlanState.RELEASED, PlanState.EXPIRED, PlanState.FORGOTTEN}),
        # a Basic group's members bind one by one: the unbound rest may be released or expire
        PlanState.BINDING: frozenset({PlanState.BOUND, PlanState.FAILED, PlanState.RELEASED, PlanState.EXPIRED}),
        PlanState.BOUND: frozenset({PlanState.FORGOTTEN}),
        PlanState.RELEASED: _FINAL, PlanState.EXPIRED: _FINAL, PlanState.FAILED: _FINAL, PlanState.FORGOTTEN: _FINAL,
    },
}
#: states in which a plan is in the book and holds capacity
HOLDING = frozenset({PlanState.PLANNED, PlanState.BINDING, PlanState.BOUND})
#: a plan's members may still be waiting for a node or at the barrier
OPEN = frozenset({PlanState.PLANNED, PlanState.BINDING})

Usage = dict[str, dict[str, int]]  # node -> resource -> amount


def keys(groups: str | AbstractSet[str]) -> AbstractSet[str]:
    """One group key or several, as a set ("" none)."""
    return (frozenset({groups}) if groups else frozenset()) if isinstance(groups, str) else groups


def placed_in_order(pod: Pod) -> bool:
    """kube-scheduler's filters judge each member against the members already assumed: with
    required inter-pod (anti-)affinity or a DoNotSchedule spread constraint, a plan's nodes can be
    right for the group and still refused to one member, depending on the order they come in."""
    spec = pod.spec
    return bool(spec.pod_affinity or spec.pod_anti_affinity
                or any(c.when_unsatisfiable == DO_NOT_SCHEDULE for c in spec.spread))


def interchangeable(a: Pod, b: Pod) -> bool:
    """Two members may trade planned nodes: the same shape and no volumes (a volume may tie a pod
    to its node)."""
    return not a.volumes and not b.volumes and a.spec.shape_key == b.spec.shape_key


@dataclass
class Plan:
    group: str
    assignments: dict[str, str]  # pending pod uid -> node
    requests: dict[str, Mapping[str, int]]  # pod uid -> requests (for reservations)
    domain: str
    created: float
    deadline: float
    placement: Placement | None = None
    placement_ms: float = 0.0  # how long the solve took (for the listeners)
    gang: bool = True  # Basic groups bind member by member, with no barrier
    state: PlanState | None = None  # None until it is held (see PlanState)
    arrived: set[str] = field(default_factory=set)
    bound: set[str] = field(default_factory=set)  # members phalanx bound (a Basic plan's, one by one)
    failed_uids: set[str] = field(default_factory=set)
    error: str = ""
    members: dict[str, Pod] = field(default_factory=dict)  # pending pod uid -> its record when planned
    answered: set[str] = field(default_factory=set)  # members filter answered with their node
    #: pending members the solve saw and left out (minCount met without them): not new members
    left_out: frozenset[str] = frozenset()
    #: kube-scheduler's pod-group cycle writes PodGroupInitiallyScheduled (plugin mode, GenericWorkload)
    condition_by_scheduler: bool = False
    #: the groups whose plans were made together with this one, itself included: the children of
    #: one CompositePodGroup, planned as one unit, cross the barrier together and are released
    #: together (empty: a group planned alone)
    tree: tuple[str, ...] = ()
    _classes: dict[str, int] | None = field(default=None, repr=False, compare=False)

    def trade_classes(self) -> dict[str, int]:
        """Members kube-scheduler may place on each other's planned nodes, by class: those whose
        filters depend on the order members are placed in (required inter-pod terms, a hard spread
        constraint), grouped with the identical ones (same shape, no volumes). A member alone in
        its shape is left out. Worked out once: a trade exchanges nodes, never members."""
        if self._classes is None:
            pods = (self.members.get(uid) for uid in self.assignments)
            shapes = by_shape(p for p in pods if p is not None and placed_in_order(p) and not p.volumes)
            self._classes = {pod.uid: n for n, same in enumerate(m for m in shapes.values() if len(m) > 1)
                             for pod in same}
        return self._classes

    def swap(self, a: str, b: str) -> None:
        """Exchange two identical members' nodes (re-slot): the plan's nodes stay the same."""
        self.assignments[a], self.assignments[b] = self.assignments[b], self.assignments[a]
        if self.placement is not None:
            self.placement = replace(self.placement, assignments=dict(self.assignments))

    def reservations(self, exclude_bound: AbstractSet[str] = frozenset()) -> Usage:
        held = {uid: node for uid, node in self.assignments.items() if uid not in exclude_bound}
        return placement_usage(held, self.requests)

    def not_planned_there(self, uid: str, node: str = "") -> str:
        """Why member ``uid`` is not planned here (on ``node``, when given), or "" when it is."""
        if uid not in self.assignments:
            return f"phalanx: podgroup {self.group} holds no plan for pod {uid}; re-planning"
        if node and self.assignments[uid] != node:
            return f"phalanx: pod {uid} is planned on {self.assignments[uid]}, not {node}"
        return ""


@dataclass(frozen=True)
class Change:
    """What a transition is about, for the listener: ``reason`` one of :data:`.replans.REASONS`
    for a counted release, ``why`` the words for people, ``pod``/``node`` what was rejected."""

    reason: str = ""
    why: str = ""
    pod: str = ""
    node: str = ""


Listener = Callable[[Plan, "PlanState | None", PlanState, Change], None]


def total_usage(usages: list[Usage]) -> Usage:
    """Per-node usages added up, per node."""
    total: Usage = {}
    for usage in usages:
        for node, amounts in usage.items():
            total[node] = add_resources(total.get(node, {}), amounts)
    return total


class PlanBook(Mapping[str, Plan]):
    """Plans by group (read as a mapping; changed only by :meth:`transition`) and the plan
    generation: it moves whenever what another group's solve sees may have changed (a plan made or
    dropped, a record's hold, a nomination, a pod bound without a plan), so a solve made off the
    lock commits only if it did not move."""

    def __init__(self, listener: Listener | None = None) -> None:
        self._plans: dict[str, Plan] = {}
        self._listener = listener
        self.generation = 0

    def listen(self, listener: Listener) -> None:
        self._listener = listener

    def __getitem__(self, key: str) -> Plan:
        return self._plans[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._plans)

    def __len__(self) -> int:
        return len(self._plans)

    def of_member(self, uid: str) -> Plan | None:
        """The plan that assigns pod ``uid``, if any."""
        return next((p for p in self._plans.values() if uid in p.assignments), None)

    def holding(self, exclude: str | AbstractSet[str] = "") -> list[Plan]:
        """Plans holding capacity, but ``exclude``'s (a group, or several: a composite's children)."""
        skip = keys(exclude)
        return [p for k, p in self._plans.items() if k not in skip and p.state in HOLDING]

    def bump(self) -> None:
        """Something other groups' solves see changed outside the book."""
        self.generation += 1

    @staticmethod
    def allows(plan: Plan, to: PlanState) -> bool:
        return to in TRANSITIONS[plan.gang][plan.state]

    def transition(self, plan: Plan, to: PlanState, change: Change = Change(), bump: bool = True) -> bool:
        """The one door between plan states: the table is checked, the book and the generation
        updated, then the listener told. Returns False (changing nothing) for a transition the table
        does not allow. ``bump=False``: leaving the book changes nothing others see (a plan
        forgotten once the cache shows every member bound)."""
        came = plan.state
        if not self.allows(plan, to):
            return False
        plan.state = to
        key = plan.group
        if to is PlanState.PLANNED:
            self._plans[key] = plan
        elif to not in HOLDING and self._plans.get(key) is plan:
            del self._plans[key]
        if (came not in HOLDING or to not in HOLDING) and bump:
            # a plan made or dropped changes what other groups' solves see; planned -> binding ->
            # bound holds the same capacity on the same nodes, so a solve in flight stays valid
            self.generation += 1
        if self._listener is not None:
            self._listener(plan, came, to, change)
        if plan.tree and to in (PlanState.RELEASED, PlanState.EXPIRED):
            self._release_tree(plan, to, change)
        return True

    def tree_of(self, plan: Plan) -> list[Plan]:
        """The plans made with ``plan`` (a composite's children) that are still in the book, itself
        first; ``[plan]`` for a plan made alone."""
        others = [p for k in plan.tree if k != plan.group and (p := self._plans.get(k)) is not None
                  and p.tree == plan.tree]
        return [plan, *others]

    def _release_tree(self, plan: Plan, to: PlanState, change: Change) -> None:
        """A composite's child plan let go short of binding: its siblings still planned go too (the
        composite is planned again as one unit, never child by child)."""
        why = f"compositepodgroup child {plan.group}'s plan was {to.value}: {change.why or change.reason}"
        for sibling in self.tree_of(plan)[1:]:
            if sibling.state is PlanState.PLANNED:
                self.transition(sibling, to, Change(change.reason, why))
