"""Planning: one workload cycle for a group — snapshot, solve, then a plan or an explanation.

A cycle takes one snapshot of the cluster minus every other plan's (and nomination's and partly
bound record's) reservations, with the other plans' members not yet bound as assumed pods on their
planned nodes (kube-scheduler's cache counts them as assumed, so inter-pod rules must too), asks
the solver for every pending member at once, and either keeps the answer as the group's plan
(:meth:`Planner.keep`, capacity reserved until its deadline) or explains why nothing fits and, when
the group may preempt, starts a group preemption.

Nothing slow under the lock: the snapshot and inputs are taken under it, the solver runs off it,
and the result is committed under it only if the plan generation did not move (else it is solved
again, at most :data:`SOLVE_ATTEMPTS` times, then the pod is answered "retry"). One cycle per group
at a time: a second call for a group being solved waits for that cycle and takes its outcome.

After a restart (or a lost member) a gang is finished from its placement record instead
(:meth:`Planner.resume`): the pending members go to the recorded nodes when those still fit; a
record that no longer fits is abandoned and the members are planned afresh in the bound members'
domain.
"""

from __future__ import annotations

import contextlib
import time
from typing import AbstractSet, Iterable, Iterator, Mapping

from cluster import names
from cluster.cache import PodRecord
from cluster.convert import PlacementRecord, placement_record
from solver import (
    InvalidInput,
    Placement,
    PlacementInvalid,
    Pod,
    PodGroup,
    Policy,
    Snapshot,
    SolveOptions,
    assert_placement_valid,
    place,
)
from solver.composite import Composite, CompositePlacement, place_composite
from solver.joint import place_joint

from . import replans
from .capacity import BarrierCapacity
from .context import CycleContext
from .holds import QueuePolicies
from .plans import HOLDING, Change, Plan, PlanState, Usage, keys, total_usage
from .preemption import GroupPreemption
from .provisioning import Asked, Provisioning
from .smallest import SmallestChanges

#: a workload cycle whose inputs changed while it solved off the lock is solved again, this often
SOLVE_ATTEMPTS = 3


class Planner:
    def __init__(self, ctx: CycleContext, options: SolveOptions, plan_ttl: float, barrier_timeout: float,
                 capacity: BarrierCapacity, policies: QueuePolicies, preemption: GroupPreemption,
                 smallest: SmallestChanges, provisioning: Provisioning) -> None:
        self.lock, self.book, self.cache, self.status = ctx.lock, ctx.book, ctx.cache, ctx.status
        self.metrics, self.clock, self.inbox = ctx.metrics, ctx.clock, ctx.inbox
        self.queue, self.verdicts, self.recorded, self.parked = ctx.queue, ctx.verdicts, ctx.recorded, ctx.parked
        self.options = options
        self.plan_ttl = plan_ttl
        self.barrier_timeout = barrier_timeout
        self.capacity = capacity
        self.policies = policies
        self.preemption = preemption
        self.explanations = ctx.explanations  # group -> the last reason it did not fit
        # group -> (topology key, domain) it was placed in; forgotten when a member is disrupted
        # (evicted, preempted) or the PodGroup is deleted
        self.domains = ctx.domains
        # groups whose cycle is solving off the lock now -> whether it is planned ahead (plan_ahead)
        self.solving: dict[str, bool] = {}
        self.tenants = ctx.tenants  # per-namespace limits on this work (tenants.py)
        self.smallest = smallest  # what would make a group that does not fit fit (smallest.py)
        self.provisioning = provisioning  # a gang short of capacity asks for nodes (provisioning.py)
        # gangs whose placement record stood when this serve began acting (a start, a takeover): the
        # term before wrote it, and may still bind by it (see resume)
        self.inherited: set[str] = set()

    # -- what a cycle sees -------------------------------------------------------------------
    def reservations(self, exclude_group: str | AbstractSet[str] = "", refresh: bool = True) -> Usage:
        """Capacity held by plans (other than ``exclude_group``), per node, minus bound members;
        by partly bound gangs' records; by preemption nominations. ``refresh`` False reads the
        records' holds as they stand (a what-if changes nothing, not even the plan generation)."""
        with self.lock:  # also called by group preemption, off the lock
            if refresh:
                self.refresh_records()
            held = [plan.reservations({uid for uid in plan.assignments if self.settled(plan, uid)})
                    for plan in self.book.holding(exclude=exclude_group)]
            skip = keys(exclude_group)
            held += self.recorded.usage(lambda key: key in skip or (
                key in self.book and self.book[key].state in HOLDING))  # a plan holds it already
            held += self.preemption.reservations(exclude_group)  # under its own lock
        return total_usage(held)

    def settled(self, plan: Plan, uid: str) -> bool:
        """Member ``uid`` of ``plan`` holds no capacity of its own any more: the cache shows it
        bound (its usage counts there), or phalanx bound it and the cache has seen it deleted since
        (a short job's pods can go before any cycle looks: its plan must not hold their room until
        the plan's deadline)."""
        if self.cache.bound_node(uid):
            return True
        return (plan.state is PlanState.BOUND or uid in plan.bound) and uid not in self.cache.pods

    def refresh_records(self) -> None:
        """Bring the records' holds up to date (lock held); a change is a reservation change."""
        if self.recorded.refresh():
            self.book.bump()

    def snapshot_for(self, key: str | AbstractSet[str], refresh: bool = True) -> Snapshot:
        """What a cycle for ``key`` sees (see the module's docstring); ``refresh``: see
        :meth:`reservations`."""
        assumed = {uid: node for plan in self.book.holding(exclude=key)
                   for uid, node in plan.assignments.items()}  # the cache leaves the bound ones out
        return self.cache.snapshot(self.reservations(exclude_group=key, refresh=refresh), assumed=assumed)

    def group_view(self, key: str, pod: Pod) -> PodGroup | str:
        """The group with its members as the cache knows them plus this pod (the cache may lag
        kube-scheduler by a watch event), or the reason it cannot be planned yet."""
        members = self.cache.members(key)
        if pod.uid not in {m.pod.uid for m in members}:
            members.append(PodRecord(pod=pod))
        try:
            group = self.cache.podgroup(key, members)
        except InvalidInput as err:
            return f"phalanx: {err}"
        if group is None:
            malformed = self.cache.invalid_podgroups.get(key)
            if malformed:  # it exists but cannot be read: say why, not "does not exist" for ever
                return f"phalanx: podgroup {key} is malformed: {malformed}"
            return f"phalanx: podgroup {key} does not exist yet (a pod names a PodGroup of its own namespace)"
        if group.missing_members:
            too_large = self.too_large(group)
            if too_large:  # it can never be placed: say so at once, not "waiting" for ever
                self.status.set_status(key, False, names.REASON_MIN_COUNT_TOO_LARGE, too_large)
                return too_large
            invalid = self.cache.invalid_members(key)
            if invalid:  # it will never convert as it is: say so, not "waiting" for ever
                message = f"podgroup {key}: member {invalid[0].pod} is malformed: {invalid[0].error}"
                self.status.set_status(key, False, names.REASON_UNSCHEDULABLE, message)
                return message
            self.status.members_waiting(key, group.missing_members)
            return group.missing_members
        return group

    def too_large(self, group: PodGroup) -> str:
        """Why ``group``'s minCount can never be met on this cluster (more pods than all its nodes
        together may run), or "". Checked while the group waits for members, so a gang asking for
        1,000,000 is refused before any member or solve is spent on it."""
        if group.policy is not Policy.GANG:
            return ""
        slots = self.cache.pod_slots()
        if not slots or group.min_count <= slots:  # no node known yet: nothing to judge by
            return ""
        return (f"phalanx: podgroup {group.key}: minCount {group.min_count:,} is more pods than every node "
                f"of the cluster together may run ({slots:,}); it can never be placed")

    # -- from the placement record -----------------------------------------------------------
    def inherit(self, keys: Iterable[str]) -> None:
        """This serve begins acting (lock held): the gangs of ``keys`` whose placement record stands
        now are resumed from it even with no member bound yet (:meth:`resume`)."""
        self.inherited = {k for k in keys if (r := self.cache.podgroups.get(k)) is not None and r.placement}

    # the rule's one home (docs/design.md: phalanx/inherited-record)
    def resume(self, group: PodGroup, candidates: frozenset[str] | list[str]) -> Placement | None:
        """Finish a partly bound gang from its placement record (see the module's docstring) — or
        a gang none of whose members is bound yet, when its record was inherited from the term
        before this serve's: a former leader that froze with a binding under way sends it when it
        resumes, to the node the record names, so the new term plans the gang where the record
        says (when that still fits) and the late binding agrees with it instead of splitting it."""
        record = self.cache.podgroups.get(group.key)
        try:
            recorded = placement_record(record.placement) if record else None
        except InvalidInput:
            recorded = PlacementRecord()  # malformed: abandoned below, like a record that no longer fits
        inherited = group.key in self.inherited
        self.inherited.discard(group.key)  # looked at once: a later plan of this term is its own
        if recorded is None or not group.pending or not (group.bound or inherited):
            return None
        assignments = {p.uid: recorded.pods[p.name] for p in group.pending if p.name in recorded.pods}
        if not assignments:  # it names none of them (a Job's replacement has a name of its own)
            return None  # a cycle places them, in the bound members' domain
        snapshot = self.snapshot_for(group.key)
        try:
            if any(n not in candidates for n in assignments.values()):
                raise PlacementInvalid("recorded nodes are not among the candidates")
            assert_placement_valid(snapshot, group, assignments)
        except PlacementInvalid as err:
            why = f"placement record no longer fits: {err}"
            self.status.event(group.key, names.EVENT_PLACEMENT_ABANDONED, why, "Warning")
            self.recorded.abandon(group.key)
            self.status.remove_record(group.key, why)
            return None
        return self.keep(group, Placement(group.key, assignments, recorded.domain, path="record"), 0.0)

    # -- a plan ------------------------------------------------------------------------------
    def keep(self, group: PodGroup, placement: Placement, elapsed: float) -> Placement:
        """Hold ``placement`` as the group's plan: its capacity is reserved until the deadline —
        unless a gang's members cannot all wait at the barrier now (then no plan, and the reason)."""
        key = group.key
        need = len(placement.assignments)
        never = self.capacity.never(group, need)
        if never:
            self.metrics.attempts.labels(result="unschedulable").inc()
            self.explanations[key] = never
            self.queue.failed_attempt(key, self.cache.capacity_version, never)
            self.status.unschedulable(key, never)
            return Placement(key, {}, explanation=None)
        waiting = self.capacity.wait(group, need)
        if waiting:
            self.explanations[key] = waiting
            return Placement(key, {}, explanation=None)
        now = self.clock()
        by_uid = {p.uid: p for p in group.pending}
        self.preemption.release(key)
        self.queue.succeeded(key)
        plan = Plan(
            members={uid: by_uid[uid] for uid in placement.assignments},
            group=key,
            assignments=dict(placement.assignments),
            requests={uid: by_uid[uid].spec.requests for uid in placement.assignments},
            domain=placement.domain,
            created=now,
            deadline=now + self.plan_ttl,
            placement=placement,
            placement_ms=elapsed * 1000.0,
            gang=group.policy is Policy.GANG,
            left_out=frozenset(by_uid) - frozenset(placement.assignments),
        )
        # kube-scheduler holds them back after phalanx said "no node": retry them now
        self.inbox.nudge(self.parked.take(key, placement.assignments))
        if group.topology_key and placement.domain:
            self.domains[key] = (group.topology_key, placement.domain)
        self.book.transition(plan, PlanState.PLANNED)
        return placement

    # -- the cycle ---------------------------------------------------------------------------
    def cycle(self, group: PodGroup, fresh: str = "") -> Placement:
        """One workload cycle for ``group`` (lock held, once). ``fresh`` is the pod of the filter
        call that triggered it (its verdict is the newest, see Verdicts.allowed). A child of a
        CompositePodGroup is planned with its whole tree (:meth:`composite_cycle`)."""
        key = group.key
        root = self.cache.composite_root(key)
        if root:
            return self.composite_cycle(root, group)
        if key in self.solving:
            ahead = self.solving[key]
            deadline = self.clock() + max(self.barrier_timeout, 30.0)
            while key in self.solving and self.clock() < deadline:
                self.lock.wait(1.0)
            plan = self.book.get(key)
            if plan is not None and plan.placement is not None:
                return plan.placement
            if not ahead or key in self.solving:
                return Placement(key, {}, explanation=None)
            # a solve ahead that placed nothing changed nothing (no explanation, no preemption):
            # this call runs the full cycle, as if there had been none
        with self._solving(key):
            return self._solve_and_commit(group, fresh)

    @contextlib.contextmanager
    def _solving(self, key: str, ahead: bool = False) -> Iterator[None]:
        """``key`` is being solved meanwhile: another call for it waits (see :meth:`cycle`)."""
        self.solving[key] = ahead
        try:
            yield
        finally:
            del self.solving[key]
            self.lock.notify()

    def held_back(self, group: PodGroup) -> str:
        """Why ``group`` is not solved now although it could be planned (lock held), or "": backing
        off (nothing freed since its last attempt failed) or known not to fit the free barrier
        capacity yet."""
        return (self.queue.backing_off(group.key, self.cache.capacity_version)
                or self.namespace_limit(group.key) or self.capacity.wait(group, None)
                or self.namespace_cycle(group.key))

    def namespace_limit(self, key: str) -> str:
        """Why ``key``'s namespace may not hold one more plan now (lock held), or "": the condition
        says so, once (see tenants.py)."""
        limited = self.tenants.plans.check(key)
        if limited:
            self.metrics.namespace_limited.labels(limit="plans").inc()
            self.explanations[key] = limited
            self.status.set_status(key, False, names.REASON_NAMESPACE_LIMIT, limited)
        return limited

    def namespace_cycle(self, key: str) -> str:
        """Why ``key``'s namespace may not run a workload cycle now (lock held: it spent its failed
        cycles), or "": said to its members only (it passes within a second; no write)."""
        throttled = self.tenants.cycles.check(key)
        if throttled:
            self.metrics.namespace_limited.labels(limit="cycles").inc()
        return throttled

    def release_throttled(self) -> None:
        """Members of groups a namespace's cycle rate held back, touched once it may run them (lock held)."""
        if self.tenants.cycles.throttled:
            for key in self.tenants.cycles.due():
                self.inbox.nudge(self.parked.take_group(key))

    def _solve(self, group: PodGroup, fresh: str) -> tuple[Placement | InvalidInput, int, float, Snapshot] | None:
        """Solve off the lock until the generation held still; None when it never did. Returns the
        answer, the capacity version it was made on, the seconds the last solve took and the
        snapshot it solved on before kube-scheduler's verdicts cut it."""
        key = group.key
        for _ in range(SOLVE_ATTEMPTS):
            started = time.perf_counter()
            generation = self.book.generation
            capacity_version = self.cache.capacity_version  # before the snapshot: a later change retries
            snapshot = self.snapshot_for(key)
            allowed = self.verdicts.allowed(group, snapshot.index.keys(), fresh)
            reach = self.reach(group, allowed)
            snapshot, _ = self.policies.restrict(group, snapshot)  # holds read the whole cluster
            unfiltered = snapshot  # kube-scheduler's filters drop cordoned and tainted nodes: a change may not
            if reach is not None:
                snapshot = snapshot.only_nodes(reach)
            with self.lock.unlocked():
                try:
                    placement: Placement | InvalidInput = place(snapshot, group, self.options, allowed=allowed)
                except InvalidInput as err:
                    placement = err
            self.refresh_records()  # a record that came or went meanwhile counts as a change
            if self.book.generation == generation:
                return placement, capacity_version, time.perf_counter() - started, unfiltered
        return None

    def plan_ahead(self, group: PodGroup) -> bool:
        """Plan ``group`` before any member asks (lock held): a placement found is kept as a
        member's call would keep it. None found starts the group preemption the members' first
        call would start, when one helps and every member is there (rule ``phalanx/preempt-ahead``:
        the plugin's stream then holds the members out of kube-scheduler's queue until the victims
        are gone, instead of a pod-group cycle failing them one by one while they go); otherwise it
        changes nothing (no explanation or status: the members' own calls run the full cycle). True
        when a plan is now held."""
        if self.cache.composite_root(group.key):
            return False  # a composite's child is planned with its tree, when a member asks
        if group.key in self.solving or self.namespace_limit(group.key) or self.namespace_cycle(group.key):
            return False
        if group.key in self.inherited:  # a record the term before wrote: resumed from it if it fits
            resumed = self.resume(group, list(self.cache.nodes))
            if resumed is not None:
                return bool(resumed.assignments)
        with self._solving(group.key, ahead=True):
            solved = self._solve(group, "")
            if solved is None:
                return False
            placement, _, elapsed, _ = solved
            if isinstance(placement, InvalidInput):
                return False
            if not placement.assignments:
                self._preempt_ahead(group, placement)
                return False
            self.metrics.attempt_duration.observe(elapsed)
            return bool(self._scheduled(group, placement, elapsed).assignments)

    # the rule's one home (docs/design.md: phalanx/preempt-ahead)
    def _preempt_ahead(self, group: PodGroup, placement: Placement) -> None:
        """A complete group planned ahead that does not fit (lock held): its preemption started
        now, as its members' first call would start it — only when every member is there and
        ungated (a gang still short of members cannot be placed, so nothing is evicted for it)."""
        if group.missing_members or any(r.gated for r in self.cache.members(group.key)):
            return
        message = placement.explanation.message() if placement.explanation else "no placement"
        self._preempt(group, message)

    # the rule's one home (docs/design.md: phalanx/joint-ahead)
    def plan_ahead_together(self, groups: list[PodGroup]) -> int:
        """Plan ``groups`` (complete, none holding a plan) ahead by one joint solve (lock held):
        :func:`solver.joint.place_joint` over them in the order given — one at a time unless a
        joint placement fits more of them whole. Each placement found is kept as :meth:`plan_ahead`
        keeps one; a group none was found for is left to its members' calls, as ahead. A group the
        joint solve cannot take as it is (a composite's child, kube-scheduler's verdicts for its
        pods, a domain it keeps, the queue policies' restrictions) is planned alone. How many groups
        now hold a plan."""
        first = [g for g in groups if g.key in self.inherited]  # resumed from their records, alone
        if first:
            return sum(self.plan_ahead(g) for g in first) + self.plan_ahead_together(
                [g for g in groups if g.key not in self.inherited])
        joinable = [g for g in groups if not self.cache.composite_root(g.key) and g.key not in self.solving]
        if len(joinable) >= 2:  # a check that fails says so on the group (once); one that passes changes nothing
            joinable = [g for g in joinable if not self.namespace_limit(g.key) and not self.namespace_cycle(g.key)]
        if len(joinable) < 2:
            return sum(self.plan_ahead(g) for g in groups)
        with contextlib.ExitStack() as solving:
            for g in joinable:
                solving.enter_context(self._solving(g.key, ahead=True))
            solved = self._solve_together(joinable)
        if solved is None:  # not as they are, or other plans moved meanwhile: one by one, as before
            return sum(self.plan_ahead(g) for g in joinable)
        placements, elapsed = solved
        planned = 0
        for group, placement in zip(joinable, placements, strict=True):
            if placement.assignments:
                self.metrics.attempt_duration.observe(elapsed / len(joinable))
                planned += bool(self._scheduled(group, placement, elapsed).assignments)
        for group, placement in zip(joinable, placements, strict=True):
            if not placement.assignments:  # after the others' plans are held, as its members' call
                self._preempt_ahead(group, placement)
        return planned

    def _solve_together(self, groups: list[PodGroup]) -> tuple[tuple[Placement, ...], float] | None:
        """The joint placements, solved off the lock; None when a group is not joinable as it is, or
        when other plans changed meanwhile (one attempt: the groups are then planned one by one,
        each with its own retries, as before)."""
        started = time.perf_counter()
        generation = self.book.generation
        snapshot = self.snapshot_for(frozenset(g.key for g in groups))
        for g in groups:
            allowed = self.verdicts.allowed(g, snapshot.index.keys())
            if allowed or self.reach(g, allowed) is not None or \
                    self.policies.restrict(g, snapshot)[0] is not snapshot:
                return None
        with self.lock.unlocked():
            try:
                result = place_joint(snapshot, groups, self.options)
            except InvalidInput:
                return None
        self.refresh_records()
        if self.book.generation != generation:
            return None
        return result.placements, time.perf_counter() - started

    def _scheduled(self, group: PodGroup, placement: Placement, elapsed: float) -> Placement:
        """A solve that placed the group: counted, and held as its plan (see :meth:`keep`)."""
        self.metrics.attempts.labels(result="scheduled").inc()
        return self.keep(group, placement, elapsed)

    def _solve_and_commit(self, group: PodGroup, fresh: str) -> Placement:
        key = group.key
        solved = self._solve(group, fresh)
        if solved is None:
            self.explanations[key] = f"phalanx: podgroup {key}: other plans changed while it was being solved; retrying"
            pod = next((p for p in group.pending if p.uid == fresh), None)
            if pod is not None:  # answered "no node" for a reason that is already gone: retry it
                self.inbox.nudge([(pod.namespace, pod.name)])
            return Placement(key, {}, explanation=None)
        placement, capacity_version, elapsed, snapshot = solved
        if isinstance(placement, InvalidInput):
            self.metrics.attempts.labels(result="error").inc()
            self.status.set_status(key, False, names.REASON_SCHEDULER_ERROR, str(placement))
            return Placement(key, {}, explanation=None)
        self.metrics.attempt_duration.observe(elapsed)
        if placement.assignments:
            return self._scheduled(group, placement, elapsed)
        self.metrics.attempts.labels(result="unschedulable").inc()
        self.tenants.cycles.spend(key)
        message = placement.explanation.message() if placement.explanation else "no placement"
        if self._preempt(group, message):  # while victims terminate, the nomination makes it wait
            return placement
        # no one to evict: more nodes may be asked for instead
        asked = self.provisioning.consider(group, placement.explanation, message)
        message = f"{message}; {asked.words}" if asked.words else message
        self.explanations[key] = message
        self.queue.failed_attempt(key, capacity_version, message)
        self.smallest.submit(group, snapshot, message, asked.reason)  # off this call (smallest.py)
        return placement

    def _preempt(self, group: PodGroup, message: str) -> bool:
        """Start a group preemption for ``group``, which does not fit (``message``: why), when one
        helps (lock held; the plan is solved off it); True when it started: the group's explanation
        and status then say so, and no smallest change is searched (what would make it fit is under
        way)."""
        with self.lock.unlocked(), self.preemption.solving:  # a preemption plan is a solve too
            preempting = self.preemption.try_preempt(group)
        if not preempting:
            return False
        self.book.bump()  # a nomination now holds room
        message = f"{message}; {preempting}"
        self.explanations[group.key] = message
        self.smallest.record(group.key, None)
        self.status.unschedulable(group.key, message, names.REASON_UNSCHEDULABLE)
        return True

    # -- CompositePodGroups -----------------------------------------------------------------------
    # the rule's one home (docs/design.md: composite/one-cycle)
    def composite_cycle(self, root: str, group: PodGroup) -> Placement:
        """One workload cycle for the CompositePodGroup ``root`` that ``group`` is a leaf of (lock
        held): its whole tree solved at once (solver.composite), and every child it places held as
        a plan made with the others (``Plan.tree``: they cross the barrier and are released
        together) — or none, and every child says why. A child the plan leaves out (a gang
        composite needs only ``minGroupCount`` children) waits for the next plan of its tree."""
        key = group.key
        if root in self.solving:  # another child's call is solving the tree: take its outcome
            deadline = self.clock() + max(self.barrier_timeout, 30.0)
            while root in self.solving and self.clock() < deadline:
                self.lock.wait(1.0)
            plan = self.book.get(key)
            return plan.placement if plan is not None and plan.placement is not None else \
                Placement(key, {}, explanation=None)
        with self._solving(root):
            tree = self.cache.composite(root)
            waiting = tree if isinstance(tree, str) else tree.missing_children
            if waiting:
                self.explanations[key] = waiting
                self.status.members_waiting(key, waiting)
                return Placement(key, {}, explanation=None)
            assert not isinstance(tree, str)
            leaves = {leaf.key: leaf for leaf in tree.leaves()}
            held = [self.book[k] for k in leaves if k in self.book and self.book[k].state in HOLDING]
            if held:  # the tree is planned: this child has its plan, or was left out of it
                plan = self.book.get(key)
                if plan is not None and plan.placement is not None:
                    return plan.placement
                self.explanations[key] = (f"podgroup {key}: its compositepodgroup {root} is planned without it "
                                          f"({len(held)} of its {len(leaves)} groups placed)")
                return Placement(key, {}, explanation=None)
            answer = self._solve_composite(root, tree, group)
            if answer is None:
                self.explanations[key] = f"phalanx: compositepodgroup {root}: other plans changed while it was solved"
                return Placement(key, {}, explanation=None)
            if isinstance(answer, InvalidInput):
                for leaf in leaves:
                    self.status.set_status(leaf, False, names.REASON_SCHEDULER_ERROR, str(answer))
                return Placement(key, {}, explanation=None)
            placement, elapsed, capacity_version, snapshot = answer
            if not placement.fits:
                self._tree_unschedulable(tree, placement, capacity_version, snapshot)
                return Placement(key, {}, explanation=None)
            return self._keep_tree(group, leaves, placement, elapsed)

    def _tree_unschedulable(self, tree: Composite, placement: CompositePlacement, capacity_version: int,
                            snapshot: Snapshot) -> None:
        """A tree that does not fit (lock held): a group preemption for it when one helps, else a
        ProvisioningRequest for what it lacks when opted in; every child says why, with the
        smallest change for the whole tree once it is found (off this call, as a lone group's)."""
        self.metrics.attempts.labels(result="unschedulable").inc()
        message = placement.explanation
        with self.lock.unlocked(), self.preemption.solving:  # a preemption plan is a solve too
            preempting = self.preemption.try_preempt_composite(tree)
        asked = Asked()
        if preempting:
            self.book.bump()  # the nominations now hold room
            message = f"{message}; {preempting}"
        else:
            asked = self.provisioning.consider_composite(tree, placement, message)
            message = f"{message}; {asked.words}" if asked.words else message
        for leaf in tree.leaves():
            self.explanations[leaf.key] = message
            if not preempting:  # while victims terminate, the nominations make it wait
                self.queue.failed_attempt(leaf.key, capacity_version, message)
            else:
                self.smallest.record(leaf.key, None)
                self.status.unschedulable(leaf.key, message)
        if not preempting:  # written with the tree's smallest change, off this call
            self.smallest.submit(tree, snapshot, message, asked.reason)

    def _solve_composite(self, root: str, tree: Composite, group: PodGroup
                         ) -> tuple[CompositePlacement, float, int, Snapshot] | InvalidInput | None:
        """The tree solved off the lock until the plan generation held still (as :meth:`_solve`)."""
        for _ in range(SOLVE_ATTEMPTS):
            started = time.perf_counter()
            generation = self.book.generation
            capacity_version = self.cache.capacity_version
            snapshot, _ = self.policies.restrict(group, self.snapshot_for(frozenset(c.key for c in tree.leaves())))
            allowed: dict[str, frozenset[str]] = {}  # kube-scheduler's verdicts on every child's pods
            for leaf in tree.leaves():
                allowed.update(self.verdicts.allowed(leaf, snapshot.index.keys()))
            with self.lock.unlocked():
                try:
                    placement = place_composite(snapshot, tree, self.options, allowed=allowed)
                except InvalidInput as err:
                    return err
            self.refresh_records()
            if self.book.generation == generation:
                return placement, time.perf_counter() - started, capacity_version, snapshot
        return None

    def _keep_tree(self, group: PodGroup, leaves: Mapping[str, PodGroup], placement: CompositePlacement,
                   elapsed: float) -> Placement:
        """Hold every placed child's plan, made together — or none, when one of them cannot wait at
        the barrier now (lock held)."""
        placed = placement.leaf_placements()
        for child, answer in placed.items():
            refused = self.capacity.never(leaves[child], len(answer.assignments)) or \
                self.capacity.wait(leaves[child], len(answer.assignments))
            if refused:
                self.explanations[group.key] = refused
                return Placement(group.key, {}, explanation=None)
        self.metrics.attempts.labels(result="scheduled").inc()
        self.metrics.attempt_duration.observe(elapsed)
        tree = tuple(sorted(child for child, answer in placed.items() if answer.assignments))
        for child in tree:
            self.keep(leaves[child], placed[child], elapsed)
            plan = self.book.get(child)
            if plan is not None:
                plan.tree = tree
        mine = self.book.get(group.key)
        if mine is not None and mine.placement is not None:
            return mine.placement
        self.explanations[group.key] = f"podgroup {group.key}: its compositepodgroup is planned without it"
        return Placement(group.key, {}, explanation=None)

    def reach(self, group: PodGroup, allowed: Mapping[str, frozenset[str]]) -> set[str] | None:
        """The nodes any pending member may take, or None for all: the union of the verdicts when
        every pending member has one (no member goes outside it, whatever the solver does with the
        per-pod sets) plus the bound members' nodes, cut to the domain the group keeps."""
        reach = None
        if allowed and len(allowed) == len(group.pending):
            reach = set().union(*{id(nodes): nodes for nodes in allowed.values()}.values())
            reach |= {p.node for p in group.bound}
        chosen = self.domains.get(group.key)
        if chosen and chosen[0] == group.topology_key:
            # a group keeps the domain it was first placed in, even while the cache has not yet
            # seen its members' bindings (a Basic group's members arrive and bind one by one)
            nodes = self.cache.nodes
            reach = {n for n in (nodes if reach is None else reach)
                     if n in nodes and nodes[n].labels.get(chosen[0]) == chosen[1]}
        return reach

    def check_inputs(self, key: str, group: PodGroup) -> tuple[Snapshot, dict[str, frozenset[str]]]:
        """The inputs to check off the lock whether ``group`` would fit now (lock held)."""
        snapshot = self.snapshot_for(key)
        return snapshot, self.verdicts.allowed(group, snapshot.index.keys())

    def would_fit(self, snapshot: Snapshot, group: PodGroup, allowed: Mapping[str, frozenset[str]]) -> bool:
        """Whether the solver places ``group`` on these inputs (off the lock; nothing is held)."""
        try:
            return bool(place(snapshot, group, self.options, allowed=allowed).assignments)
        except InvalidInput:
            return False

    # -- deadlines ---------------------------------------------------------------------------
    def expire(self) -> None:
        """Plan deadlines (lock held): a plan whose bindings the cache shows is forgotten (a plan is
        kept until then, so its capacity is never counted free twice), a Basic plan whose every
        member is bound is ``bound``, and one past its deadline before its members reached bind
        expires."""
        now = self.clock()
        for plan in list(self.book.values()):
            done = all(self.settled(plan, u) for u in plan.assignments)
            if done and plan.state is PlanState.BINDING and not plan.gang:
                self.book.transition(plan, PlanState.BOUND)
            if done and plan.state in (PlanState.PLANNED, PlanState.BOUND) or (
                    plan.state is PlanState.BOUND and plan.deadline < now):
                self.book.transition(plan, PlanState.FORGOTTEN, bump=not done)
            elif plan.deadline < now and plan.state in (PlanState.PLANNED, PlanState.BINDING):
                # a gang's binding plan cannot expire: the table refuses it
                self.book.transition(plan, PlanState.EXPIRED, Change(
                    replans.EXPIRED, "plan expired before all members reached bind"))

    def release(self, key: str, reason: str, why: str, pod: str = "", node: str = "") -> None:
        """Release ``key``'s plan short of binding: ``reason`` is one of :data:`replans.REASONS`,
        ``why`` the words for people."""
        plan = self.book.get(key)
        if plan is not None:
            self.book.transition(plan, PlanState.RELEASED, Change(reason, why, pod, node))
