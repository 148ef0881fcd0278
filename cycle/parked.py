"""Members kube-scheduler has parked because phalanx answered them with no node.

A member filtered before its group is complete (or while the group backs off) is answered "no
node"; kube-scheduler puts it among its unschedulable pods and retries it only on a later cluster
event. When the group's plan then forms from another member's call, the parked ones must reach
bind before the barrier gives up: phalanx touches each of them (annotation
``scheduling.phalanx.dev/retry``), an update that makes kube-scheduler retry the pod at once.

A member answered "waiting for members" (at filter, or at kube-scheduler's preemption call when
its own filters left no node) may be the last one: the cache had not yet seen a sibling's creation
or the lifting of its scheduling gate. Once the cache shows the group with its members, every
parked member is touched, so one of them makes the group's cycle (and its preemption) run.

A member may name a PodGroup the cache has not seen yet (its watch lagging kube-scheduler's, as
under a slow API-server link): it is answered "does not exist yet" and parked *unseen*. Such a
group is *young* for :data:`UNSEEN_GRACE` seconds after its last parking, and the prune of groups a
re-list dropped keeps it: forgetting it would leave its members untouched when the PodGroup lands and its
plan forms, and kube-scheduler would hold them until its own periodic flush (minutes).

Bounded: a pod leaves when it is filtered again, deleted or bound, a group when its PodGroup is
deleted, its plan takes the pods or its members are complete, and a group the cache never shows
once it is no longer young.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Collection, Iterable

#: seconds a group parked without its PodGroup in the cache is kept by the prune (see the module's
#: doc): far beyond any watch lag phalanx has met, short against kube-scheduler's periodic flush
UNSEEN_GRACE = 60.0


class ParkedMembers:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self.clock = clock
        self._by_group: dict[str, dict[str, tuple[str, str]]] = {}
        self._group_of: dict[str, str] = {}
        self._incomplete: set[str] = set()  # groups whose members were parked "waiting for members"
        self._unseen_at: dict[str, float] = {}  # group -> when a member was last parked without it in the cache

    def park(self, group: str, uid: str, namespace: str, name: str, incomplete: bool = False,
             unseen: bool = False) -> None:
        """``incomplete``: answered because the group had fewer than minCount schedulable members
        (as the cache saw it): such members are touched again once it has them (:meth:`complete`).
        ``unseen``: the cache had not seen the group's PodGroup."""
        with self._lock:
            self._by_group.setdefault(group, {})[uid] = (namespace, name)
            self._group_of[uid] = group
            if unseen:
                self._unseen_at[group] = self.clock()
            if incomplete:
                self._incomplete.add(group)

    def young(self) -> set[str]:
        """Groups a member of which was parked unseen less than :data:`UNSEEN_GRACE` seconds ago."""
        since = self.clock() - UNSEEN_GRACE
        with self._lock:
            return {g for g, at in self._unseen_at.items() if at > since}

    def waits_for_members(self, group: str) -> bool:
        with self._lock:
            return group in self._incomplete

    def complete(self, group: str) -> list[tuple[str, str]]:
        """The group has its members now: every parked member (namespace, name), no longer parked."""
        with self._lock:
            self._incomplete.discard(group)
        return self.take_group(group)

    def here(self, uid: str) -> None:
        """The pod is in a filter call now: kube-scheduler is not holding it back."""
        self.forget_pod(uid)

    def take(self, group: str, uids: Iterable[str]) -> list[tuple[str, str]]:
        """The parked members among ``uids`` (namespace, name), no longer parked."""
        with self._lock:
            parked = self._by_group.get(group)
            if not parked:
                return []
            out = []
            for uid in uids:
                ref = parked.pop(uid, None)
                if ref is not None:
                    self._group_of.pop(uid, None)
                    out.append(ref)
            if not parked:
                del self._by_group[group]
                self._unseen_at.pop(group, None)
            return out

    def forget_pod(self, uid: str) -> None:
        with self._lock:
            group = self._group_of.pop(uid, None)
            if group is None:
                return
            parked = self._by_group.get(group)
            if parked is not None:
                parked.pop(uid, None)
                if not parked:
                    del self._by_group[group]
                    self._unseen_at.pop(group, None)

    def forget_group(self, group: str) -> None:
        with self._lock:
            self._incomplete.discard(group)
            self._unseen_at.pop(group, None)
            for uid in self._by_group.pop(group, {}):
                self._group_of.pop(uid, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._group_of)

    def take_group(self, group: str) -> list[tuple[str, str]]:
        """Every parked member of ``group`` (namespace, name), no longer parked."""
        with self._lock:
            parked = self._by_group.pop(group, {})
            self._unseen_at.pop(group, None)
            for uid in parked:
                self._group_of.pop(uid, None)
            return list(parked.values())

    def prune(self, groups: Collection[str]) -> None:
        """Forget the members of groups not in ``groups`` (after a re-list; the caller keeps the
        young ones). Pods are left to their own events: the cache may not have seen a pod that
        filter already parked."""
        with self._lock:
            self._incomplete &= set(groups)
            for group in [g for g in self._unseen_at if g not in groups]:
                del self._unseen_at[group]
            for group in [g for g in self._by_group if g not in groups]:
                for uid in self._by_group.pop(group):
                    self._group_of.pop(uid, None)
