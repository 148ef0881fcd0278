"""What-if: where the PodGroups of a manifest would go if it were applied now — read only.

The drafts (:mod:`cluster.whatif`, compiled by the controller's own code) are planned on what a
workload cycle sees: the live snapshot minus every plan's, record's and nomination's reservation,
with the planned members as assumed pods (:meth:`Planner.snapshot_for`, the records read as they
stand). Each group gets one of three answers:

- **fits**: the solver's placement (domain, nodes, the path and whether it is proven optimal);
- **fits after preempting**: the group preemption :meth:`GroupPreemption.plan` finds (victims with
  their priorities, the placement on the freed room) — what a cycle would start;
- **does not fit**: the solver's explanation.

Several groups are planned together, one after another, **in the manifest's order** — what the
cycle does as ``kubectl apply -f`` creates them: each sees the ones before it placed (their capacity
used, their pods assumed for the inter-pod rules, their victims gone), and the answers are what
applying the file as written does. When that leaves a group without room, other arrangements are
looked for and offered as ``advice`` on every group, never as the answer: first other orders (every
order of up to :data:`ALL_ORDERS_UP_TO` groups, else largest-first and smallest-first) — applying the
files one after another in that order gets it; else the joint solve over all of them
(:func:`solver.joint.place_joint`), which finds arrangements no order does and which the cycle finds
only for groups complete at the same moment (plan ahead plans those together).

A StatefulSet that exists already is answered as the scale (or update) of the gang it runs: its
PodGroup in the cluster is the group, at the manifest's minCount; the members it keeps (ordinals
below the new replicas) stay as they are, bound where they run, and only the ordinals it would add
are placed — inside the domain the running members hold, as the cycle places a gang that grows
(``running`` counts the kept running members; members past the new replicas are left out). A
LeaderWorkerSet's group whose pods run (LWS names them by replica and worker index) is answered the
same way as its live PodGroup; the replicas a scale adds are planned as the new groups they are.

A CompositePodGroup of the manifest is answered as one unit with the drafted groups (and
composites) that name it as parent: its tree is planned at once (:func:`solver.place_composite`),
before the manifest's other groups, and each child's answer names it (``composite``) — the nodes
where the tree fits; where it fits only by preempting lower work, the victims of the plan a cycle
would start; else the composite's explanation (which names the child that did not fit); a
child the plan leaves out (more children than ``minGroupCount``) says so. A group naming a
composite the manifest does not carry is answered alone.

Members' PersistentVolumeClaims are those of the cluster where they exist, else the ones the
manifest would create (a StatefulSet's claim templates, generic ephemeral volumes), unbound and
waiting for their pod (:meth:`DraftGroup.members_with_volumes`).

Nothing is written and nothing is held: no plan enters the book (its generation does not move), no
nomination, no status, event or metric; the solves run off the cycle's lock.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import permutations
from typing import Mapping, Sequence

from cluster import names
from cluster.cache import ClusterCache
from cluster.convert import CompositeRecord, podgroup_of
from cluster.whatif import DraftGroup
from solver import (
    InvalidInput,
    Placement,
    Pod,
    PodGroup,
    PreemptionPlan,
    PreemptionPolicy,
    Snapshot,
    SolveOptions,
    place,
)
from solver.composite import MAX_DEPTH, Composite, place_composite, plan_composite_preemption
from solver.joint import JointResult, place_joint

from .lock import CycleLock
from .planning import Planner
from .preemption import GroupPreemption

FITS, FITS_AFTER_PREEMPTION, DOES_NOT_FIT = "fits", "fits-after-preemption", "does-not-fit"
#: a manifest of at most this many groups has every order tried when its own leaves one out (3! = 6)
ALL_ORDERS_UP_TO = 3


@dataclass(frozen=True)
class Victim:
    """A pod a what-if preemption would evict: ``namespace/name``, its unit's priority and unit."""

    pod: str
    priority: int
    unit: str


@dataclass(frozen=True)
class WhatIfAnswer:
    """Where one drafted group would go. ``nodes``: pod name -> node (the placement, or for a
    preemption the placement on the freed room); empty when it does not fit."""

    group: str
    source: str
    verdict: str
    members: int
    min_count: int
    policy: str
    topology_key: str = ""
    domain: str = ""
    nodes: Mapping[str, str] = field(default_factory=dict)
    path: str = ""
    optimal: bool = False
    gap: float | None = None
    victims: tuple[Victim, ...] = ()
    pdb_violations: int = 0
    explanation: str = ""
    order: int = 1  # the group's place in the manifest's order, the order it is planned in (1 first)
    #: members (names) the placement leaves out — beyond minCount, they would wait — and why
    waiting: tuple[str, ...] = ()
    waiting_why: str = ""
    #: members already running that the manifest keeps where they are (a StatefulSet that exists,
    #: scaled): the answer places only the others
    running: int = 0
    #: the root CompositePodGroup (namespace/name) the group was answered with ("" alone)
    composite: str = ""
    #: when the manifest's order leaves a group out: an arrangement that fits more, and this
    #: group's place in it ("" otherwise)
    advice: str = ""


class WhatIf:
    """Plans drafts on what the cycle sees now (see the module's docstring)."""

    def __init__(self, lock: CycleLock, cache: ClusterCache, planner: Planner, preemption: GroupPreemption,
                 options: SolveOptions) -> None:
        self.lock, self.cache, self.planner, self.preemption, self.options = lock, cache, planner, preemption, options

    def plan(self, drafts: tuple[DraftGroup, ...], composites: tuple[CompositeRecord, ...] = ()) -> list[WhatIfAnswer]:
        """Every draft's answer; raises InvalidInput, naming the draft, for one that is no group the
        solver can take (the doors answer it as a refusal of the manifest)."""
        with self.lock:
            snapshot = self.planner.snapshot_for("", refresh=False)
            running = self._running_namesakes(drafts)
            everything = [(self._live(draft, running) or self._group(draft), draft.source) for draft in drafts]
        parent_of = {d.record.key: d.record.parent for d in drafts if d.record.parent}
        by_key: dict[str, WhatIfAnswer] = {}
        for tree in _trees(composites, [g for g, _ in everything], parent_of):
            answers, snapshot = self._tree(tree, dict((g.key, s) for g, s in everything), snapshot)
            by_key.update(answers)
        groups = [(g, s) for g, s in everything if g.key not in by_key]
        rest = self._groups(groups, snapshot)
        answered = iter(rest)
        return [by_key[g.key] if g.key in by_key else next(answered) for g, _ in everything]

    def _tree(self, tree: Composite | str, sources: Mapping[str, str], snapshot: Snapshot
              ) -> tuple[dict[str, WhatIfAnswer], Snapshot]:
        """Every child's answer for a drafted composite (one unit), and the snapshot after it."""
        if isinstance(tree, str):
            return {}, snapshot
        leaves = tree.leaves()
        blanks = {leaf.key: WhatIfAnswer(leaf.key, sources.get(leaf.key, ""), DOES_NOT_FIT, len(leaf.members),
                                         leaf.min_count, leaf.policy.value, leaf.topology_key, composite=tree.key)
                  for leaf in leaves}
        why = tree.missing_children
        if why:
            return {k: replace(b, explanation=why) for k, b in blanks.items()}, snapshot
        try:
            placement = place_composite(snapshot, tree, self.options)
        except InvalidInput as err:
            return {k: replace(b, explanation=f"phalanx: {err}") for k, b in blanks.items()}, snapshot
        if not placement.fits:
            return self._tree_preempting(tree, blanks, placement.explanation, snapshot)
        placed = placement.leaf_placements()
        answers = {}
        for leaf in leaves:
            pods = {p.uid: p for p in leaf.pending}
            answer = placed.get(leaf.key)
            if answer is None or (pods and not answer.assignments):
                answers[leaf.key] = replace(blanks[leaf.key], explanation=(
                    f"compositepodgroup {tree.key} is placed without it (minGroupCount {tree.min_group_count} "
                    "met by the others): it would wait"))
                continue
            answers[leaf.key] = self._fits(blanks[leaf.key], answer, pods)
            snapshot = _with_group(snapshot, answer.assignments, pods)
        return answers, snapshot

    def _tree_preempting(self, tree: Composite, blanks: Mapping[str, WhatIfAnswer], explanation: str,
                         snapshot: Snapshot) -> tuple[dict[str, WhatIfAnswer], Snapshot]:
        """A drafted composite that does not fit now: fits after preemption where evicting lower
        units lets the whole tree fit (the plan a cycle would start), else does not fit."""
        plan = plan_composite_preemption(snapshot, tree, self.cache.preemption_context(), self.options)
        if plan is None:
            return {k: replace(b, explanation=explanation) for k, b in blanks.items()}, snapshot
        victims = []
        for unit in plan.units:
            for uid in unit.pods:
                record = self.cache.pods.get(uid)
                victims.append(Victim(record.pod.key if record else uid, unit.priority, unit.describe()))
        on_bound = {p.uid for p in snapshot.bound}
        freed = snapshot.without_pods([uid for uid in plan.victims if uid in on_bound])
        answers = {}
        placed = plan.placement.leaf_placements()
        for leaf in tree.leaves():
            pods = {p.uid: p for p in leaf.pending}
            answer = placed.get(leaf.key)
            nodes = _by_name(answer.assignments, pods) if answer is not None else {}
            answers[leaf.key] = replace(blanks[leaf.key], verdict=FITS_AFTER_PREEMPTION, nodes=nodes,
                                        domain=answer.domain if answer is not None else "",
                                        victims=tuple(victims), pdb_violations=plan.cost.pdb_violations,
                                        explanation=f"does not fit now: {explanation}")
            if answer is not None and answer.assignments:
                freed = _with_group(freed, answer.assignments, pods)
        return answers, freed

    def _groups(self, groups: list[tuple[PodGroup, str]], snapshot: Snapshot) -> list[WhatIfAnswer]:
        """The answers of groups planned one after another in the manifest's order, with advice when
        another arrangement fits more of them (see the module's docstring)."""
        own = tuple(range(len(groups)))
        answers = self._in_order(groups, own, snapshot)
        fitting = sum(a.verdict == FITS for a in answers)
        if fitting == len(groups):
            return answers
        order, best = own, fitting
        for other in _other_orders([len(g.pending) for g, _ in groups]):
            placed = self._fitting(groups, other, snapshot)
            if placed > best:
                order, best = other, placed
        total = len(groups)
        if order != own:
            names = ", ".join(_short(groups[i][1]) for i in order)
            there = self._in_order(groups, order, snapshot)
            return [replace(a, advice=f"applied one after another in the order {names}, {best} of {total} groups "
                                      f"fit (this one {_where(t)}, planned {_ordinal(t.order)}); as written, {fitting}")
                    for a, t in zip(answers, there, strict=True)]
        joint = self._joint([g for g, _ in groups], snapshot)
        if joint is None or joint.placed <= fitting:
            return answers
        advice = []
        for a, p in zip(answers, joint.placements, strict=True):
            this = ("does not fit" if not p.assignments else f"fits in {p.domain}" if p.domain else "fits")
            advice.append(replace(a, advice=f"planned jointly, {joint.placed} of {total} groups fit (this one {this}); "
                                            f"as written, {fitting}; no order of applying them does it: phalanx "
                                            "plans groups together only when they are complete at the same moment"))
        return advice

    def _joint(self, groups: list[PodGroup], snapshot: Snapshot) -> JointResult | None:
        try:
            return place_joint(snapshot, groups, self.options)
        except InvalidInput:
            return None

    def _group(self, draft: DraftGroup) -> PodGroup:
        try:
            return podgroup_of(draft.record, draft.members_with_volumes(
                self.cache.claims, self.cache.persistent_volumes, self.cache.storage_classes),
                self.cache.priority_classes)
        except InvalidInput as err:
            raise InvalidInput(f"{draft.source}: {err}") from None

    def _running_namesakes(self, drafts: Sequence[DraftGroup]) -> dict[tuple[str, str], str]:
        """(namespace, name) -> PodGroup of the live pods named as a drafted LeaderWorkerSet's
        members (an LWS names its pods by replica and worker index, so a running replica's pods
        are the drafted ones of the same name), built once per request (lock held)."""
        wanted = {(p.namespace, p.name) for d in drafts for p in d.members if names.LABEL_LWS_NAME in p.labels}
        if not wanted:
            return {}
        return {(r.pod.namespace, r.pod.name): r.pod.group for r in self.cache.pods.values()
                if r.pod.group and (r.pod.namespace, r.pod.name) in wanted}

    def _live(self, draft: DraftGroup, running: Mapping[tuple[str, str], str]) -> PodGroup | None:
        """The gang a drafted StatefulSet, or a drafted LeaderWorkerSet's group, already runs, as
        the manifest would leave it (see the module's docstring), or None when it runs none (lock
        held). An LWS's group is the live one its drafted members' namesakes belong to (an LWS
        PodGroup's name carries its leader's incarnation, new in every draft); a replica the
        scale adds has none and is planned as the new group it is."""
        owner = draft.record.owner
        if owner.kind == "StatefulSet":
            live = next((r for r in self.cache.podgroups.values() if r.namespace == draft.record.namespace
                         and r.owner.kind == owner.kind and r.owner.name == owner.name), None)
        else:
            keys = {running[(p.namespace, p.name)] for p in draft.members if (p.namespace, p.name) in running}
            live = self.cache.podgroups.get(keys.pop()) if len(keys) == 1 else None
        if live is None:
            return None
        wanted = {p.name: p for p in draft.members}
        kept = {r.pod.name: r.pod for r in self.cache.members(live.key) if r.pod.name in wanted and not r.gated}
        added = tuple(replace(p, group=live.key) for name, p in wanted.items() if name not in kept)
        spec = replace(live.spec, min_count=draft.record.spec.min_count)
        return podgroup_of(replace(live, spec=spec), tuple(kept.values()) + added, self.cache.priority_classes,
                           finished=len(self.cache.finished_members(live.key)))

    def _in_order(self, groups: Sequence[tuple[PodGroup, str]], order: tuple[int, ...],
                  snapshot: Snapshot) -> list[WhatIfAnswer]:
        """Every group's answer, planned in ``order`` (indexes into ``groups``), in the groups' order."""
        answers: dict[int, WhatIfAnswer] = {}
        for place_, index in enumerate(order, 1):
            group, source = groups[index]
            answer, snapshot = self._one(group, source, snapshot)
            answers[index] = replace(answer, order=place_)
        return [answers[i] for i in range(len(groups))]

    def _fitting(self, groups: Sequence[tuple[PodGroup, str]], order: tuple[int, ...], snapshot: Snapshot) -> int:
        """How many groups fit without preemption when planned in ``order``."""
        fitting = 0
        for index in order:
            group = groups[index][0]
            try:
                placement = place(snapshot, group, self.options)
            except InvalidInput:
                continue
            if placement.assignments:
                fitting += 1
                snapshot = _with_group(snapshot, placement.assignments, {p.uid: p for p in group.pending})
        return fitting

    def _one(self, group: PodGroup, source: str, snapshot: Snapshot) -> tuple[WhatIfAnswer, Snapshot]:
        """The answer for ``group`` and the snapshot the next group sees."""
        blank = WhatIfAnswer(group.key, source, DOES_NOT_FIT, len(group.members), group.min_count,
                             group.policy.value, group.topology_key, running=len(group.bound))
        if not group.pending and not group.missing_members:  # scaled down, or as it runs: nothing new
            return replace(blank, verdict=FITS, domain=_held_domain(group, snapshot)), snapshot
        try:
            placement = place(snapshot, group, self.options)
        except InvalidInput as err:
            return replace(blank, explanation=f"phalanx: {err}"), snapshot
        pods = {p.uid: p for p in group.pending}
        if placement.assignments:
            after = _with_group(snapshot, placement.assignments, pods)
            answer = self._fits(blank, placement, pods)
            return self._left_out(answer, group, placement.assignments, after), after
        explanation = placement.explanation.message() if placement.explanation else "no placement"
        preemption = self._preemption(group, snapshot)
        if preemption is None:
            return replace(blank, explanation=explanation), snapshot
        on_bound = {p.uid for p in snapshot.bound}
        freed = snapshot.without_pods([uid for uid in preemption.victims if uid in on_bound])
        return (self._preempting(blank, preemption, pods, explanation),
                _with_group(freed, preemption.placement, pods))

    def _preemption(self, group: PodGroup, snapshot: Snapshot) -> PreemptionPlan | None:
        if group.preemption_policy is PreemptionPolicy.NEVER:
            return None
        try:
            return self.preemption.plan(group, snapshot)
        except InvalidInput:
            return None

    def _left_out(self, answer: WhatIfAnswer, group: PodGroup, placed: Mapping[str, str],
                  after: Snapshot) -> WhatIfAnswer:
        """``answer`` with the members the placement leaves out (it placed at least minCount) and
        why not one more fits: the solver asked for one of them beside the placed ones."""
        left = [p for p in group.pending if p.uid not in placed]
        if not left:
            return answer
        members = tuple(replace(p, node=placed[p.uid]) if p.uid in placed else p for p in group.members)
        one_more = replace(group, members=members, min_count=len(group.members) - len(left) + 1, finished=0)
        try:
            retry = place(after, one_more, self.options)
        except InvalidInput as err:
            why = f"phalanx: {err}"
        else:
            why = (retry.explanation.message() if retry.explanation else
                   "the solver kept them out for its objective; they would be placed as they come")
        return replace(answer, waiting=tuple(sorted(p.name for p in left)), waiting_why=why)

    @staticmethod
    def _fits(blank: WhatIfAnswer, placement: Placement, pods: Mapping[str, Pod]) -> WhatIfAnswer:
        return replace(blank, verdict=FITS, domain=placement.domain, nodes=_by_name(placement.assignments, pods),
                       path=placement.path, optimal=placement.optimal, gap=placement.gap)

    def _preempting(self, blank: WhatIfAnswer, plan: PreemptionPlan, pods: Mapping[str, Pod],
                    explanation: str) -> WhatIfAnswer:
        victims = []
        for unit in plan.units:
            for uid in unit.pods:
                record = self.cache.pods.get(uid)
                victims.append(Victim(record.pod.key if record else uid, unit.priority, unit.describe()))
        return replace(blank, verdict=FITS_AFTER_PREEMPTION, domain=plan.domain,
                       nodes=_by_name(plan.placement, pods), path=plan.path, optimal=plan.optimal,
                       victims=tuple(victims), pdb_violations=plan.pdb_violations,
                       explanation=f"does not fit now: {explanation}")


def _short(source: str) -> str:
    """``StatefulSet default/db`` -> ``StatefulSet db`` (a manifest's objects share the request's namespace)."""
    kind, _, name = source.partition(" ")
    return f"{kind} {name.rsplit('/', 1)[-1]}" if name else source


def _where(answer: WhatIfAnswer) -> str:
    if answer.verdict == FITS:
        return f"fits in {answer.domain}" if answer.domain else "fits"
    return "fits after preempting" if answer.verdict == FITS_AFTER_PREEMPTION else "does not fit"


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _other_orders(sizes: Sequence[int]) -> list[tuple[int, ...]]:
    """The orders tried after the manifest's: all of them for a few groups, else largest-first and
    smallest-first by pod count (the manifest's order among equals)."""
    own = tuple(range(len(sizes)))
    if len(sizes) <= ALL_ORDERS_UP_TO:
        return [o for o in permutations(own) if o != own]
    largest = tuple(sorted(own, key=lambda i: -sizes[i]))
    smallest = tuple(sorted(own, key=lambda i: sizes[i]))
    return [o for o in dict.fromkeys((largest, smallest)) if o != own]


def _trees(composites: tuple[CompositeRecord, ...], groups: list[PodGroup],
           parent_of: Mapping[str, str]) -> list[Composite | str]:
    """The drafted composites' trees (their roots: those naming no drafted composite as parent),
    children from the drafted groups and composites that name them; a tree the solver refuses (too
    deep, a bad count) is the reason (its children are then answered alone)."""
    drafted = {c.key: c for c in composites}
    def build(record: CompositeRecord, depth: int) -> Composite | str:
        if depth > MAX_DEPTH:
            return f"compositepodgroup {record.key}: deeper than {MAX_DEPTH} levels"
        children: list[PodGroup | Composite] = [g for g in groups if g.namespace == record.namespace
                                                and parent_of.get(g.key) == record.name]
        for child in sorted((c for c in composites if c.parent == record.name and c.namespace == record.namespace),
                            key=lambda c: c.name):
            built = build(child, depth + 1)
            if isinstance(built, str):
                return built
            children.append(built)
        spec = record.spec
        try:
            return Composite(record.namespace, record.name, tuple(children), spec.policy, spec.min_count,
                             spec.topology_key, spec.priority or 0, spec.disruption_mode)
        except InvalidInput as err:
            return str(err)
    return [build(c, 1) for c in composites if f"{c.namespace}/{c.parent}" not in drafted]


def _held_domain(group: PodGroup, snapshot: Snapshot) -> str:
    """The value of the group's required key its running members hold ("" none, or several)."""
    values = {snapshot.nodes[snapshot.index[p.node]].labels.get(group.topology_key, "")
              for p in group.bound if p.node in snapshot.index}
    return values.pop() if group.topology_key and len(values) == 1 else ""


def _by_name(assignments: Mapping[str, str], pods: Mapping[str, Pod]) -> dict[str, str]:
    return {pods[uid].name if uid in pods else uid: node for uid, node in sorted(assignments.items())}


def _with_group(snapshot: Snapshot, assignments: Mapping[str, str], pods: Mapping[str, Pod]) -> Snapshot:
    """``snapshot`` with a what-if group placed: its capacity used, its pods assumed on their nodes."""
    placed = {uid: pods[uid] for uid in assignments}
    charged = snapshot.with_placement(assignments, placed)
    assumed = tuple(replace(p, node=assignments[uid]) for uid, p in placed.items())
    return charged.with_context(assumed=snapshot.assumed + assumed)
