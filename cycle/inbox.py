"""The requeue thread's inbox: work noted where it is found, done later off the verbs' path.

The cache's listeners run on whichever thread applied a watch event (possibly holding a backend
lock), and the verbs run under the cycle's lock: neither may make API writes or take the other's
locks. So they only note the work here and wake the requeue thread (:mod:`.requeue`), which
takes it all under this inbox's own small lock and does it.
"""

from __future__ import annotations

import threading
from typing import Iterable


class Inbox:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.woken = threading.Event()
        self._nudges: list[tuple[str, str]] = []  # (namespace, name) of pods to touch
        self._arrived: set[str] = set()  # groups waiting for members that got a schedulable one
        self._preempt_incomplete: set[str] = set()  # of those, answered at a preemption call
        self._deleted: set[str] = set()  # PodGroups deleted, pruned by the requeue thread
        self._changed_nodes: set[str] = set()  # nodes added, changed or deleted

    def wake(self) -> None:
        self.woken.set()

    def nudge(self, pods: Iterable[tuple[str, str]]) -> None:
        """Touch these pods (namespace, name) soon: kube-scheduler retries them."""
        pods = list(pods)
        if pods:
            with self._lock:
                self._nudges.extend(pods)
            self.woken.set()

    def arrived(self, key: str, preempting: bool = False) -> None:
        """Group ``key`` may have got its members: check it (``preempting``: a member of it was
        answered at kube-scheduler's preemption call, so its cycle is run there)."""
        with self._lock:
            self._arrived.add(key)
            if preempting:
                self._preempt_incomplete.add(key)
        self.woken.set()

    def deleted(self, key: str) -> None:
        with self._lock:
            self._deleted.add(key)
        self.woken.set()

    def node_changed(self, name: str) -> None:
        with self._lock:
            self._changed_nodes.add(name)
        self.woken.set()

    def take_nudges(self) -> list[tuple[str, str]]:
        with self._lock:
            nudges, self._nudges = self._nudges, []
        return nudges

    def take_arrived(self) -> set[str]:
        with self._lock:
            arrived, self._arrived = self._arrived, set()
        return arrived

    def take_preempting(self, key: str) -> bool:
        """Whether ``key`` was answered at a preemption call (and forget it)."""
        with self._lock:
            preempting = key in self._preempt_incomplete
            self._preempt_incomplete.discard(key)
        return preempting

    def has_deleted(self) -> bool:
        """PodGroup deletions are waiting to be pruned."""
        with self._lock:
            return bool(self._deleted)

    def take_deleted(self) -> set[str]:
        with self._lock:
            deleted, self._deleted = self._deleted, set()
        return deleted

    def take_changed_nodes(self) -> set[str]:
        with self._lock:
            changed, self._changed_nodes = self._changed_nodes, set()
        return changed

    def prune(self, live: Iterable[str]) -> None:
        """Forget the groups not in ``live`` (deleted, or dropped by a re-list)."""
        keep = set(live)
        with self._lock:
            self._arrived &= keep
            self._preempt_incomplete &= keep

    def sizes(self) -> dict[str, int]:
        """The maps keyed by group (the pods to touch are a queue of work the next pass drains, as
        the dispatcher's writes are)."""
        with self._lock:
            return {"arrived": len(self._arrived), "preempt_incomplete": len(self._preempt_incomplete)}
