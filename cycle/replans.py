"""Bounded re-plans: a group whose plans keep being released stops re-planning and says why.

A plan is released before binding for one of a small, fixed set of reasons (the ``reason`` label
of ``phalanx_plans_released_total``). Some reasons are phalanx's blind spots, which a re-plan may
repeat for ever: kube-scheduler's filters dropping the planned node (a rule phalanx does not
model: DRA devices, an out-of-tree plugin), members that never reach bind in time, bindings that
keep failing. Those are counted per group until the group binds::

    release(reason) --count < limit--> re-plan at the next filter call
    release(reason) --count >= limit--> back off (PodGroupQueue), Unschedulable with the reason
    the group's plan binds, or the PodGroup is deleted --> counts forgotten

Past the limit every further release of that reason backs off again, longer each time (the queue's
doubling backoff, capped): the group still retries — when capacity changes or the backoff ends,
since what phalanx cannot see may change unseen — but never in a loop.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

# the reasons a plan is released (metric label values: a fixed set, never free text)
FILTERED_OUT = "filtered_out"  # kube-scheduler's filters dropped a member's planned node
NODE_CHANGED = "node_changed"  # a planned node was deleted, cordoned or tainted
BARRIER_TIMEOUT = "barrier_timeout"  # not every member reached bind within the barrier timeout
EXPIRED = "expired"  # the plan's deadline passed before every member reached bind
NEW_MEMBER = "new_member"  # a member the plan does not know arrived: the group is planned again
BIND_FAILED = "bind_failed"  # the placement record or a binding could not be written
LEADERSHIP = "leadership"  # this serve stopped acting (several replicas): its plans not yet binding are dropped
REASONS = (FILTERED_OUT, NODE_CHANGED, BARRIER_TIMEOUT, EXPIRED, NEW_MEMBER, BIND_FAILED, LEADERSHIP)

#: releases of one reason after which a group stops re-planning, until it binds. Five rejected
#: plans: the verdicts learned from each filter call let the solver route around what it cannot
#: model, and the re-slot swaps members first, so a gang that can be placed at all is placed within
#: a few tries; the fifth rejection means the solver keeps choosing what kube-scheduler refuses.
#: Timeouts and failed bindings cost a barrier timeout (30 s) or an API error each, and repeat
#: a cause phalanx cannot fix by re-planning: three. Node changes and new members are the cluster
#: moving on, not a blind spot: unbounded.
LIMITS = {FILTERED_OUT: 5, BARRIER_TIMEOUT: 3, EXPIRED: 3, BIND_FAILED: 3}
#: distinct (pod, node) rejections remembered per group, for the message
MAX_REJECTIONS = 64

_WHAT = {
    BARRIER_TIMEOUT: "timed out at the bind barrier",
    EXPIRED: "expired before every member reached bind",
    BIND_FAILED: "failed to bind",
}


@dataclass
class GroupReleases:
    counts: Counter[str] = field(default_factory=Counter)  # reason -> releases
    rejections: Counter[tuple[str, str]] = field(default_factory=Counter)  # (pod name, node) -> times filtered out
    last: dict[str, str] = field(default_factory=dict)  # reason -> the last release's detail


class ReplanBudget:
    """Releases per group since it last bound. Counted under the cycle's lock; a deleted
    PodGroup's entry is dropped from the cache's thread (one atomic pop, as the cycle's domains)."""

    def __init__(self) -> None:
        self.groups: dict[str, GroupReleases] = {}

    def record(self, key: str, reason: str, detail: str = "", pod: str = "", node: str = "") -> str:
        """Count one release; the message to give up with when ``reason`` is past its limit."""
        releases = self.groups.setdefault(key, GroupReleases())
        releases.counts[reason] += 1
        releases.last[reason] = detail
        if reason == FILTERED_OUT and pod:
            releases.rejections[(pod, node)] += 1
            if len(releases.rejections) > MAX_REJECTIONS:
                (least, _), = releases.rejections.most_common()[-1:]
                del releases.rejections[least]
        limit = LIMITS.get(reason)
        if limit is None or releases.counts[reason] < limit:
            return ""
        return self._message(key, reason, releases)

    def past_limits(self, key: str) -> int:
        """How many releases beyond their limits the group has had (1 at the first give-up)."""
        releases = self.groups.get(key)
        if releases is None:
            return 0
        return sum(max(0, releases.counts[r] - limit + 1) for r, limit in LIMITS.items())

    def forget(self, key: str) -> None:
        self.groups.pop(key, None)

    @staticmethod
    def _message(key: str, reason: str, releases: GroupReleases) -> str:
        count = releases.counts[reason]
        head = f"podgroup {key}: not re-planned after {count} plans"
        if reason == FILTERED_OUT and releases.rejections:
            (pod, node), times = releases.rejections.most_common(1)[0]
            return (f"{head} were rejected: kube-scheduler's filters rejected the planned node {node} for {pod} "
                    f"{times} times (not modelled by phalanx: e.g. DRA devices or an out-of-tree plugin)")
        last = releases.last.get(reason)
        return f"{head} {_WHAT.get(reason, reason)}" + (f" (last: {last})" if last else "")
