"""Planning a group before kube-scheduler asks.

Without it a group is planned when its first member reaches kube-scheduler's PreFilter (plugin
mode) or filter (extender mode): the solve sits on kube-scheduler's one scheduling loop, which
waits for it. With it, the moment the cache shows a group complete (its PodGroup and at least
``minCount`` live members, none bound yet; a Basic group's minCount is 1) the group is planned,
with every member the cache shows then, on a thread of ``phalanx serve``;
by the time its members reach kube-scheduler the plan is held (plugin mode: in the plugin's
mirror, so PreFilter answers from it without a call), and the loop and the solve run side by
side instead of one after the other.

Only pods of the kube-scheduler profiles named in ``schedulers`` (``phalanx serve
--plan-ahead-for``) are planned ahead: serve cannot know otherwise which pods a phalanx scheduler
will place, and a plan holds capacity. A solve that finds no placement changes nothing here: no
explanation, status, event or preemption — the members' own calls run the full cycle as before,
so what a user sees of an unschedulable group is unchanged. A plan made ahead is the plan a
member's call would have made (same solve, same book, same expiry).

Groups whose events came while the thread was busy (a burst, a manifest applied at once) are
planned **together**, as many as the window has room for: one joint solve
(:meth:`Planner.plan_ahead_together`, :func:`solver.joint.place_joint`) places them one at a time in
the order their events came, unless a placement of all of them fits more of them whole — a small
gang complete beside a big one no longer takes the room the big one needs.

Ahead by a few groups only (:data:`WINDOW` plans planned and not yet binding): enough to keep
kube-scheduler's loop from waiting, while every solve subtracts the plans held and the
reservations stream carries them all — planning a thousand queued gangs at once would make both
cost a thousand times more and hold capacity for minutes.

Plugin mode keeps kube-scheduler's loop from meeting a gang while plan ahead tries it (rule
``phalanx/hold-until-tried``): the reservations stream lists the gangs in the batch it is trying,
and a gang whose preemption's victims went until it is planned in the room freed
(:meth:`PlanAhead.untried`); the plugin's PreEnqueue keeps their members out of the queue until the
snapshot that carries their plan, the preemption started for them, or neither (then they run the
full cycle as before). A group merely queued, and a Basic group, reach kube-scheduler's queue as
they did (a burst's groups held until each one's plan was streamed took up to twice as long).
Without it the loop met such a gang — one that must preempt above all, whose preemption ahead takes
a victim search — and failed its members one by one, each asking serve. A plan ahead that makes no
progress for :data:`STALL_SECONDS` (its window full of plans kube-scheduler has not taken) holds
nothing back: the members then ask as before.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Iterable

from cluster.cache import CacheEvent
from solver import PodGroup, Policy

from . import replans
from .context import CycleContext
from .planning import Planner
from .plans import PlanState
from .preemption import GroupPreemption

log = logging.getLogger(__name__)

#: at most this many plans stay ``planned`` (not yet binding) while more groups are planned ahead.
#: The lead must outlast a plan's way to kube-scheduler (the reservations stream's coalescing and
#: the plugin's mirror): at 4, kube-scheduler's loop reached ~35% of the 1,000 gangs of 3 of
#: upstream's scheduler_perf before their plan had been streamed (each member then asked serve:
#: ``phalanx_plan_requests_total{plan="held"}``); at 16, a handful
WINDOW = 16
#: how often a full window is looked at again
RECHECK_SECONDS = 0.02
#: a plan ahead that tried no group for this long while groups wait for it holds none of them back
#: from kube-scheduler (``untried`` is then empty): its window is full of plans kube-scheduler has
#: not taken, and the members' own calls are the way on
STALL_SECONDS = 2.0


class PlanAhead:
    """Plans complete groups of ``schedulers``' pods as their members appear (one thread)."""

    def __init__(self, ctx: CycleContext, planner: Planner, preemption: GroupPreemption,
                 schedulers: frozenset[str]) -> None:
        """A standby (``ctx.acting`` False) plans nothing ahead."""
        self.acting = ctx.acting
        self.lock, self.book, self.cache, self.planner, self.preemption = \
            ctx.lock, ctx.book, ctx.cache, planner, preemption
        self.schedulers = schedulers
        self.clock = ctx.clock
        self._pending: dict[str, None] = {}  # groups to look at, in the order their events came
        self._trying: tuple[str, ...] = ()  # the batch being planned now (out of ``_pending``)
        self._again: set[str] = set()  # queued groups whose preemption's victims are all gone
        self._moved = 0.0  # when plan ahead last tried a batch, or groups began to wait for it
        self._tried: list[Callable[[], None]] = []  # told (no lock held) after each batch
        self._wake = threading.Condition(threading.Lock())
        self._closed = False
        self._thread: threading.Thread | None = None
        self.planned = 0  # groups planned ahead (for tests and the log)
        if schedulers:
            self.cache.subscribe(self._on_event)
            # a group whose preemption's victims are all gone is planned in the room they freed
            # (before the plugin's stream stops holding it: it is listed untried meanwhile)
            preemption.on_cleared(self._look_again)

    def start(self) -> "PlanAhead":
        if self.schedulers and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="phalanx-plan-ahead", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def pause(self) -> None:
        """This serve stood down: nothing queued is planned (and nothing is queued while it stands by)."""
        with self._wake:
            self._pending.clear()
            self._again.clear()

    def on_tried(self, listener: Callable[[], None]) -> None:
        """``listener`` is called after each batch plan ahead tried (what :meth:`untried` lists changed)."""
        self._tried.append(listener)

    # the rule's one home (docs/design.md: phalanx/hold-until-tried)
    def untried(self) -> list[str]:
        """The gangs to hold back from kube-scheduler (``phalanx/hold-until-tried``): those of the
        batch plan ahead is trying, and those whose preemption's victims went that it has still to
        plan; none while it stalls (:data:`STALL_SECONDS`) or this serve stands by. Gangs that
        hold a plan or wait for their preemption are the caller's to leave out."""
        if not self.schedulers or not self.acting():
            return []
        with self._wake:
            if not self._pending and not self._trying or self.clock() - self._moved > STALL_SECONDS:
                return []
            # the batch being tried, and groups whose victims just went, only: a group merely
            # queued goes to kube-scheduler's queue as before (holding every one back made
            # upstream's 1,000 gangs of 3 at 5,000 nodes take 26.7 s instead of 17.2, its 1,000
            # Basic groups 29.2 instead of 12.7; the next 16 as well, 18.4 and 16.4 against 17.1
            # and 14.6: each waited for a snapshot to release it)
            keys = list(dict.fromkeys((*self._trying, *(k for k in self._pending if k in self._again))))
        return [k for k in keys if self._ours(k)]

    def _ours(self, key: str) -> bool:
        """A gang whose pods are of ``schedulers`` (its first one the cache shows: a PodGroup's event
        queues it whoever its pods are). A Basic group is never held: kube-scheduler's loop meeting
        one before its plan costs one member's call, not a cycle failed member by member, and
        holding them measured no better on upstream's 1,000 Basic groups."""
        podgroup = self.cache.podgroups.get(key)
        if podgroup is None or podgroup.spec.policy is not Policy.GANG:
            return False
        uids = self.cache.pods_by_group.get(key)
        uid = next(iter(uids), None) if uids else None  # (one C call: safe beside the cache's thread)
        record = self.cache.pods.get(uid) if uid is not None else None
        return record is not None and record.scheduler_name in self.schedulers

    def busy(self) -> bool:
        """Whether groups wait for plan ahead at all (what :meth:`untried` lists can change with
        time alone: the stall)."""
        with self._wake:
            return bool(self._pending or self._trying)

    def resume(self, groups: Iterable[str]) -> None:
        """This serve started acting: look at every group ``groups`` names (what came while it stood by)."""
        if self.schedulers:
            self._queue(list(groups))

    def _queue(self, keys: Iterable[str]) -> None:
        with self._wake:
            if not self._pending and not self._trying:
                self._moved = self.clock()  # the wait starts now, not at the last batch
            for key in keys:
                self._pending[key] = None
            self._wake.notify()

    def _look_again(self, groups: tuple[str, ...]) -> None:
        if self.acting():
            with self._wake:
                self._again.update(groups)
            self._queue(groups)

    def _on_event(self, event: CacheEvent) -> None:
        if not self.acting():
            return  # a standby plans nothing; resume() looks at every group when it starts acting
        record = event.pod
        if record is not None:
            if not record.pod.group or record.pod.node or record.scheduler_name not in self.schedulers:
                return
            key = record.pod.group
        elif event.kind == "PodGroup" and event.record is not None:
            key = event.key
        else:
            return
        self._queue((key,))

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._pending and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
            slots = self._free_slots()  # (the cycle's lock is never taken under ``_wake``)
            if slots <= 0:
                with self._wake:
                    self._wake.wait(RECHECK_SECONDS)
                continue
            if not self.acting():
                self.pause()
                continue
            self.step(slots)

    def step(self, slots: int = WINDOW) -> int:
        """Try the oldest ``slots`` groups waiting (one batch, planned together when several);
        how many now hold a plan. The thread's one step; tests call it."""
        with self._wake:
            batch = list(self._pending)[:slots]  # groups whose events came meanwhile, oldest first
            for key in batch:
                del self._pending[key]
                self._again.discard(key)
            self._trying, self._moved = tuple(batch), self.clock()
        if not batch:
            return 0
        made = 0
        try:
            made = int(self.plan(batch[0])) if len(batch) == 1 else self.plan_together(batch)
        except Exception:  # noqa: BLE001 - a failed look-ahead must not stop the next one
            log.exception("planning %s ahead failed", ", ".join(batch))
        finally:
            with self._wake:
                self._trying, self._moved = (), self.clock()
            for listener in self._tried:
                listener()
        self.planned += made
        return made

    def _free_slots(self) -> int:
        """How many more plans may be made ahead now (:data:`WINDOW` less those planned, unbound)."""
        with self.lock:
            return WINDOW - sum(1 for p in self.book.holding() if p.state is PlanState.PLANNED)

    def plan(self, key: str) -> bool:
        """Plan group ``key`` now when it is complete (a Basic group: one member is), unbound, of
        ``schedulers`` and holds no plan; True when it now holds one."""
        if not self._complete(key):
            return False
        with self.lock:
            group = self._ready(key)
            return group is not None and self.planner.plan_ahead(group)

    def plan_together(self, keys: list[str]) -> int:
        """Plan the groups of ``keys`` that :meth:`plan` would plan, by one joint solve when there
        are several (:meth:`Planner.plan_ahead_together`); how many now hold a plan."""
        complete = [k for k in keys if self._complete(k)]
        with self.lock:
            groups = [g for g in (self._ready(k) for k in complete) if g is not None]
            if len(groups) == 1:
                return int(self.planner.plan_ahead(groups[0]))
            return self.planner.plan_ahead_together(groups) if groups else 0

    def _complete(self, key: str) -> bool:
        """``key`` is complete, unbound, never ran and all its pending members are ``schedulers``'."""
        record = self.cache.podgroups.get(key)
        if record is None:
            return False
        members = self.cache.members(key)
        if any(r.pod.node for r in members) or self.cache.finished_members(key):
            return False  # partly bound or ran before: the placement record's path, or a repair
        if len(members) < record.spec.min_count:
            return False  # not complete yet
        pending = [r for r in members if not r.gated]
        return bool(pending) and all(r.scheduler_name in self.schedulers for r in pending)

    def _ready(self, key: str) -> PodGroup | None:
        """The group to plan ahead now (lock held), or None: not while it is solved, waits for a
        preemption or holds a plan (a Basic group's plan made before all its members were seen, none
        asked yet, is released to be made again with them)."""
        if key in self.planner.solving or self.preemption.waiting(key):
            return None
        pending = [r for r in self.cache.members(key) if not r.gated]
        if not pending:
            return None
        plan = self.book.get(key)
        if plan is not None:
            if plan.gang or plan.state is not PlanState.PLANNED or plan.answered or plan.arrived \
                    or all(r.pod.uid in plan.assignments for r in pending):
                return None
            # a Basic group planned ahead before all its members were seen, none asked yet:
            # planned again with them here, off kube-scheduler's loop (its members' calls
            # would do it on the loop: a Basic plan is re-made for a member it does not know)
            self.planner.release(key, replans.NEW_MEMBER, "re-plan ahead: new members")
        self.planner.expire()
        group = self.planner.group_view(key, pending[0].pod)
        if isinstance(group, str) or group.bound or self.planner.held_back(group):
            return None
        return group
