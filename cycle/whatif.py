"""What-if: where the PodGroups of a manifest would go if it were applied now — read only.

The drafts (:mod:`cluster.whatif`, compiled by the controller's own code) are planned on what a
workload cycle sees: the live snapshot minus every plan's, record's and nomination's reservation,
with the planned members as assumed pods (:meth:`Planner.snapshot_for`, the records read as they
stand). Each group gets one of three answers:

- **fits**: the solver's placement (domain, nodes, the path and whether it is proven optimal);
- **fits after preempting**: the group preemption :meth:`GroupPreemption.plan` finds (victims with
  their priorities, the placement on the freed room) — what a cycle would start;
- **does not fit**: the solver's explanation.

Several groups are planned together, in the manifest's order: each sees the ones before it placed
(their capacity used, their pods assumed for the inter-pod rules, their victims gone). That is one
order, not a joint search: a later group may not fit where another order would have fitted both.

Nothing is written and nothing is held: no plan enters the book (its generation does not move), no
nomination, no status, event or metric; the solves run off the cycle's lock.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping

from cluster.cache import ClusterCache
from cluster.convert import podgroup_of
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

from .lock import CycleLock
from .planning import Planner
from .preemption import GroupPreemption

FITS, FITS_AFTER_PREEMPTION, DOES_NOT_FIT = "fits", "fits-after-preemption", "does-not-fit"


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


class WhatIf:
    """Plans drafts on what the cycle sees now (see the module's docstring)."""

    def __init__(self, lock: CycleLock, cache: ClusterCache, planner: Planner, preemption: GroupPreemption,
                 options: SolveOptions) -> None:
        self.lock, self.cache, self.planner, self.preemption, self.options = lock, cache, planner, preemption, options

    def plan(self, drafts: tuple[DraftGroup, ...]) -> list[WhatIfAnswer]:
        with self.lock:
            snapshot = self.planner.snapshot_for("", refresh=False)
        answers = []
        for draft in drafts:
            group = podgroup_of(draft.record, draft.members, self.cache.priority_classes)
            answer, snapshot = self._one(group, draft.source, snapshot)
            answers.append(answer)
        return answers

    def _one(self, group: PodGroup, source: str, snapshot: Snapshot) -> tuple[WhatIfAnswer, Snapshot]:
        """The answer for ``group`` and the snapshot the next group sees."""
        blank = WhatIfAnswer(group.key, source, DOES_NOT_FIT, len(group.members), group.min_count,
                             group.policy.value, group.topology_key)
        try:
            placement = place(snapshot, group, self.options)
        except InvalidInput as err:
            return replace(blank, explanation=f"phalanx: {err}"), snapshot
        pods = {p.uid: p for p in group.pending}
        if placement.assignments:
            return self._fits(blank, placement, pods), _with_group(snapshot, placement.assignments, pods)
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


def _by_name(assignments: Mapping[str, str], pods: Mapping[str, Pod]) -> dict[str, str]:
    return {pods[uid].name if uid in pods else uid: node for uid, node in sorted(assignments.items())}


def _with_group(snapshot: Snapshot, assignments: Mapping[str, str], pods: Mapping[str, Pod]) -> Snapshot:
    """``snapshot`` with a what-if group placed: its capacity used, its pods assumed on their nodes."""
    placed = {uid: pods[uid] for uid in assignments}
    charged = snapshot.with_placement(assignments, placed)
    assumed = tuple(replace(p, node=assignments[uid]) for uid, p in placed.items())
    return charged.with_context(assumed=snapshot.assumed + assumed)
