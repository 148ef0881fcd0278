"""What the dashboard remembers: a bounded in-memory log of the workload cycle's events, per group.

The cycle calls :meth:`GroupHistory.on_cycle_event` inside a scheduling cycle, holding its lock,
and the cache calls :meth:`GroupHistory.on_cache_event` on every watch event; both only append to
bounded deques under the history's own small lock and return, so the dashboard never slows
scheduling. Everything the API serves is read from here, from the cache and from the cycle's
plans, never by running a cycle.

Per group it keeps: when phalanx first saw it, its timeline (plans, releases, barrier outcomes,
binds, preemptions, evictions), the last placement (domain, solver path, optimality, certified
gap) and who preempted whom.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

from cluster.cache import CacheEvent

#: Events kept over all groups, and per group.
LOG_CAPACITY = 5000
GROUP_LOG_CAPACITY = 200
#: Groups remembered (oldest forgotten first) so a long trace does not grow memory without bound
#: (``phalanx serve --history-groups``; each costs a few KiB: see docs/benchmarks.md, Soak).
GROUP_CAPACITY = 20000


@dataclass(frozen=True)
class LoggedEvent:
    seq: int
    time: float  # wall clock, seconds
    kind: str  # a cycle event kind, or "evicted" / "created"
    group: str
    text: str
    repeats: int = 1  # the same kind and text in a row for its group: one line, counted

    def json(self) -> dict:
        return {"seq": self.seq, "time": self.time, "kind": self.kind, "group": self.group, "text": self.text,
                "repeats": self.repeats}


@dataclass
class GroupFacts:
    first_seen: float
    events: deque = field(default_factory=lambda: deque(maxlen=GROUP_LOG_CAPACITY))
    placement: dict | None = None  # the last plan: domain, path, ms, optimal, gap, nodes, pods
    planned_at: float | None = None
    bound_at: float | None = None
    victims: list[dict] = field(default_factory=list)  # as preemptor: {"unit", "pods"}
    preempted_by: str = ""


def _count(n: int, word: str) -> str:
    """"1 pod", "2 pods"."""
    return f"{n} {word}{'' if n == 1 else 's'}"


class GroupHistory:
    def __init__(self, plan_of: Callable[[str], Any] = lambda key: None,
                 group_of_pod: Callable[[str], str] = lambda uid: "",
                 clock: Callable[[], float] = time.time, capacity: int = GROUP_CAPACITY) -> None:
        """``plan_of(key)`` reads the cycle's current plan (to keep its optimality and gap);
        ``group_of_pod(uid)`` maps a victim pod to its group (both are cheap dictionary reads);
        ``capacity``: groups remembered, the oldest forgotten first."""
        if capacity < 1:
            raise ValueError(f"the dashboard's history must keep at least 1 group, not {capacity}")
        self.capacity = capacity
        self._plan_of = plan_of
        self._group_of_pod = group_of_pod
        self._clock = clock
        self._lock = threading.Lock()
        self._seq = 0
        self.started = clock()
        # never more events than groups remembered (a small history keeps a short log too)
        self.log: deque[LoggedEvent] = deque(maxlen=min(LOG_CAPACITY, capacity))
        self.groups: dict[str, GroupFacts] = {}
        self.paths: Counter[str] = Counter()  # plans by solver path
        self.gaps: deque[dict] = deque(maxlen=500)  # certified gap of each exact plan

    @property
    def SIZE_CAPS(self) -> dict[str, int]:  # noqa: N802 - the name cluster/sizes.py reads
        """Most entries each map keeps (cluster/sizes.py): the oldest group is dropped past the
        limit; plans are counted per solver path, of which there are a handful."""
        return {"groups": self.capacity, "paths": 16}

    # -- feeding ---------------------------------------------------------------------------
    def on_cycle_event(self, kind: str, data: Mapping[str, Any]) -> None:
        """The cycle's listener (called under the cycle's lock: append and return)."""
        key = str(data.get("group", ""))
        now = self._clock()
        if kind == "planned":
            self._planned(key, data, now)
        elif kind == "plan_released":
            self._add(key, kind, f"plan released: {data.get('reason', '')}", now)
        elif kind == "unschedulable":
            self._add(key, kind, str(data.get("message", "")), now)
        elif kind == "bound":
            pods = len(data.get("assignments") or {})
            with self._lock:
                self._facts(key, now).bound_at = now
            self._add(key, kind, f"barrier released, bound {_count(pods, 'pod')}", now)
        elif kind == "bind_failed":
            self._add(key, kind, f"binding failed: {data.get('error', '')}", now)
        elif kind == "preempting":
            self._preempting(key, data, now)
        else:
            self._add(key, kind, str(dict(data))[:300], now)

    def on_cache_event(self, event: CacheEvent) -> None:
        """The cache's listener: note new groups and evicted members."""
        now = self._clock()
        record = event.pod
        if event.kind == "PodGroup" and event.type == "ADDED" and not event.deleted:
            with self._lock:
                if event.key not in self.groups:
                    self._facts(event.key, now)
                    self._append(event.key, "created", "PodGroup created", now)
        elif record is not None and record.disrupted and record.pod.group:
            self._add(record.pod.group, "evicted", f"pod {record.pod.name} evicted from {record.pod.node or '-'}", now)

    def _planned(self, key: str, data: Mapping[str, Any], now: float) -> None:
        assignments = data.get("assignments") or {}
        plan = self._plan_of(key)
        placement = getattr(plan, "placement", None)
        path = str(data.get("path", ""))
        facts = {
            "domain": str(data.get("domain", "")),
            "path": path,
            "ms": round(float(data.get("ms", 0.0)), 2),
            "pods": len(assignments),
            "nodes": sorted(set(assignments.values())),
            "optimal": bool(getattr(placement, "optimal", False)),
            "gap": getattr(placement, "gap", None),
        }
        with self._lock:
            group = self._facts(key, now)
            group.placement, group.planned_at = facts, now
            self.paths[path] += 1
            if path == "exact":
                self.gaps.append({"group": key, "gap": facts["gap"], "optimal": facts["optimal"]})
        where = f" in {facts['domain']}" if facts["domain"] else ""
        pods, nodes = _count(facts["pods"], "pod"), _count(len(facts["nodes"]), "node")
        self._add(key, "planned", f"planned {pods} on {nodes}{where} ({path}, {facts['ms']:.1f} ms)", now)

    def _preempting(self, key: str, data: Mapping[str, Any], now: float) -> None:
        victims = [str(u) for u in data.get("victims") or ()]
        by_group = Counter(self._group_of_pod(uid) or "(no group)" for uid in victims)
        units = [str(u) for u in data.get("units") or ()]
        with self._lock:
            facts = self._facts(key, now)
            facts.victims = [{"group": g, "pods": n} for g, n in sorted(by_group.items())]
            for victim_group in by_group:
                if victim_group != "(no group)":
                    self._facts(victim_group, now).preempted_by = key
        self._add(key, "preempting", f"preempting {_count(len(victims), 'pod')}: {', '.join(units[:5])}", now)
        for victim_group, n in by_group.items():
            if victim_group != "(no group)":
                self._add(victim_group, "preempted", f"{_count(n, 'pod')} preempted by podgroup {key}", now)

    def _add(self, key: str, kind: str, text: str, now: float) -> None:
        with self._lock:
            self._facts(key, now)
            self._append(key, kind, text, now)

    def _append(self, key: str, kind: str, text: str, now: float) -> None:
        """A group's event; the same kind and text as its last one (an explanation said again at
        each retry) is folded into that line, counted, and not logged again."""
        events = self.groups[key].events
        last = events[-1] if events else None
        if last is not None and (last.kind, last.text) == (kind, text):
            events[-1] = replace(last, time=now, repeats=last.repeats + 1)
            return
        self._seq += 1
        event = LoggedEvent(self._seq, now, kind, key, text)
        self.log.append(event)
        events.append(event)

    def _facts(self, key: str, now: float) -> GroupFacts:
        facts = self.groups.get(key)
        if facts is None:
            if len(self.groups) >= self.capacity:
                del self.groups[next(iter(self.groups))]
            facts = self.groups[key] = GroupFacts(first_seen=now)
        return facts

    # -- reading ---------------------------------------------------------------------------
    @property
    def seq(self) -> int:
        return self._seq

    def since(self, seq: int, limit: int = 500) -> list[dict]:
        """Events after ``seq``, oldest first (at most ``limit``, the newest ones)."""
        with self._lock:
            events = [e for e in self.log if e.seq > seq]
        return [e.json() for e in events[-limit:]]

    def facts(self, key: str) -> GroupFacts | None:
        with self._lock:
            return self.groups.get(key)

    def timeline(self, key: str) -> list[dict]:
        with self._lock:
            facts = self.groups.get(key)
            return [e.json() for e in facts.events] if facts else []

    def solver_summary(self) -> dict:
        with self._lock:
            gaps = list(self.gaps)
            paths = dict(self.paths)
        proven = [g for g in gaps if g["optimal"]]
        open_gaps = [g for g in gaps if not g["optimal"] and g["gap"] is not None]
        return {"paths": paths, "exact_plans": len(gaps), "proven_optimal": len(proven),
                "open_gaps": sorted(open_gaps, key=lambda g: -g["gap"])[:20],
                "max_gap": max((g["gap"] for g in open_gaps), default=0.0)}
