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

Ahead by a few groups only (:data:`WINDOW` plans planned and not yet binding): enough to keep
kube-scheduler's loop from waiting, while every solve subtracts the plans held and the
reservations stream carries them all — planning a thousand queued gangs at once would make both
cost a thousand times more and hold capacity for minutes.
"""

from __future__ import annotations

import logging
import threading
from typing import Iterable

from cluster.cache import CacheEvent

from . import replans
from .context import CycleContext
from .planning import Planner
from .plans import PlanState
from .preemption import GroupPreemption

log = logging.getLogger(__name__)

#: at most this many plans stay ``planned`` (not yet binding) while more groups are planned ahead
WINDOW = 4
#: how often a full window is looked at again
RECHECK_SECONDS = 0.02


class PlanAhead:
    """Plans complete groups of ``schedulers``' pods as their members appear (one thread)."""

    def __init__(self, ctx: CycleContext, planner: Planner, preemption: GroupPreemption,
                 schedulers: frozenset[str]) -> None:
        """A standby (``ctx.acting`` False) plans nothing ahead."""
        self.acting = ctx.acting
        self.lock, self.book, self.cache, self.planner, self.preemption = \
            ctx.lock, ctx.book, ctx.cache, planner, preemption
        self.schedulers = schedulers
        self._pending: dict[str, None] = {}  # groups to look at, in the order their events came
        self._wake = threading.Condition(threading.Lock())
        self._closed = False
        self._thread: threading.Thread | None = None
        self.planned = 0  # groups planned ahead (for tests and the log)
        if schedulers:
            self.cache.subscribe(self._on_event)

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

    def resume(self, groups: Iterable[str]) -> None:
        """This serve started acting: look at every group ``groups`` names (what came while it stood by)."""
        if not self.schedulers:
            return
        with self._wake:
            for key in list(groups):
                self._pending[key] = None
            self._wake.notify()

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
        with self._wake:
            self._pending[key] = None
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._pending and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
            if self._window_full():  # (the cycle's lock is never taken under ``_wake``)
                with self._wake:
                    self._wake.wait(RECHECK_SECONDS)
                continue
            if not self.acting():
                self.pause()
                continue
            with self._wake:
                if not self._pending:
                    continue
                key = next(iter(self._pending))
                del self._pending[key]
            try:
                if self.plan(key):
                    self.planned += 1
            except Exception:  # noqa: BLE001 - a failed look-ahead must not stop the next one
                log.exception("planning %s ahead failed", key)

    def _window_full(self) -> bool:
        with self.lock:
            return sum(1 for p in self.book.holding() if p.state is PlanState.PLANNED) >= WINDOW

    def plan(self, key: str) -> bool:
        """Plan group ``key`` now when it is complete (a Basic group: one member is), unbound, of
        ``schedulers`` and holds no plan; True when it now holds one."""
        record = self.cache.podgroups.get(key)
        if record is None:
            return False
        members = self.cache.members(key)
        if any(r.pod.node for r in members) or self.cache.finished_members(key):
            return False  # partly bound or ran before: the placement record's path, or a repair
        if len(members) < record.spec.min_count:
            return False  # not complete yet
        pending = [r for r in members if not r.gated]
        if not pending or any(r.scheduler_name not in self.schedulers for r in pending):
            return False
        with self.lock:
            if key in self.planner.solving or self.preemption.waiting(key):
                return False
            plan = self.book.get(key)
            if plan is not None:
                if plan.gang or plan.state is not PlanState.PLANNED or plan.answered or plan.arrived \
                        or all(r.pod.uid in plan.assignments for r in pending):
                    return False
                # a Basic group planned ahead before all its members were seen, none asked yet:
                # planned again with them here, off kube-scheduler's loop (its members' calls
                # would do it on the loop: a Basic plan is re-made for a member it does not know)
                self.planner.release(key, replans.NEW_MEMBER, "re-plan ahead: new members")
            self.planner.expire()
            group = self.planner.group_view(key, pending[0].pod)
            if isinstance(group, str) or group.bound or self.planner.held_back(group):
                return False
            return self.planner.plan_ahead(group)
