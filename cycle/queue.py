"""The queue of PodGroups waiting for a workload cycle: order, eligibility and backoff.

kube-scheduler sends every member of a group through filter, and retries rejected pods on any
cluster event; without a memory of failures, a 1,000-pod gang that does not fit would run the
solver 1,000 times per retry. The queue remembers each group's last failed attempt:

    attempt fails  --> backoff 0.5 s, doubling per consecutive failure, capped at 10 s
    plans released past their re-plan limit --> the same backoff, doubling per release past it
    capacity freed (a node added or changed, a bound pod gone or finished) --> retry at once
    attempt succeeds --> forgotten

Groups become *eligible* once at least minCount members exist (Basic: one) and are taken highest
priority first, then oldest (:meth:`PodGroupQueue.order`), as kube-scheduler orders pods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from solver import PodGroup, Policy, Snapshot

INITIAL_BACKOFF = 0.5
MAX_BACKOFF = 10.0


@dataclass
class Attempt:
    failures: int
    retry_at: float
    capacity_version: int
    message: str
    since: float = 0.0  # the first failure of this run of failures: how long the group has waited


class PodGroupQueue:
    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.failed: dict[str, Attempt] = {}

    def backing_off(self, key: str, capacity_version: int) -> str:
        """The last failure's message while the group is backing off, else "" (try now)."""
        attempt = self.failed.get(key)
        if attempt is None:
            return ""
        if attempt.capacity_version != capacity_version or self.clock() >= attempt.retry_at:
            return ""
        return attempt.message

    def failed_attempt(self, key: str, capacity_version: int, message: str, failures: int = 0) -> None:
        """Back ``key`` off; ``failures`` (when more than the consecutive count) sets the delay, for
        failures a successful plan does not end (re-plans past their limit, see replans.py)."""
        previous = self.failed.get(key)
        failures = max(failures, previous.failures + 1 if previous else 1)
        delay = min(MAX_BACKOFF, INITIAL_BACKOFF * 2 ** (failures - 1))
        now = self.clock()
        self.failed[key] = Attempt(failures, now + delay, capacity_version, message,
                                   previous.since if previous else now)

    def succeeded(self, key: str) -> None:
        self.failed.pop(key, None)

    @staticmethod
    def order(groups: Iterable[PodGroup]) -> list[PodGroup]:
        """Eligible groups (enough members exist), highest priority first, then oldest."""
        eligible = [g for g in groups if g.pending and not g.missing_members]
        return sorted(eligible, key=lambda g: (-g.priority, g.created, g.key))


# -- queue policies -----------------------------------------------------------------------------
# The live workload cycle and ``phalanx bench trace``'s simulator run the functions below, the
# same code: the cycle feeds them its cache, the simulator its state.
#
# * **Starvation protection.** A gang that has waited long (``starvation_factor`` x its declared
#   duration, else ``starvation_after`` seconds) *holds* the domain of its required key nearest to
#   fitting it (earliest expected fit, else most pods fitting now) — of that domain, the nodes it
#   will fit on at its expected start; the rest stays open (the whole domain when the start is not
#   known from hints). Gangs of lower or equal priority stop taking those nodes — unless their
#   declared duration hint (annotation ``scheduling.phalanx.dev/expected-duration``) says they
#   finish before the holder could start (its *shadow time*, from the running gangs' own hints):
#   backfilling without guessing. No hint, or a running gang without one in the way: no backfill.
# * **Fragmentation-aware placement.** Among the domains a gang fits in, the one whose use leaves
#   the most of the queue's gang shapes still fitting (GPU-weighted), then one not wholly free
#   (whole racks stay whole), then the most whole free nodes; the solver's best fit decides among
#   equals.
# * **Preemption weighing lost work.** Victim candidates are offered cheapest first by the work
#   they would lose since their last checkpoint (GPU-seconds), lowest priority first and cheapest
#   among equals, in growing prefixes; the first
#   prefix that lets the gang in is the plan. A preemptor that declares its duration may cost at
#   most ``lost_work_budget`` x its own work (size x duration).

#: Measured by ``phalanx bench trace-defaults`` (docs/benchmarks.md, "Do the default queue policies
#: earn their place"): with holds keeping only the nodes their gang needs (:func:`_held`), each
#: default helps what it is for or does no harm on 41 of 41 workload-load cases, 8 of them looked
#: at only after this rule was chosen.
#: (Holds of a whole domain made the p95 wait worse on 3 of the 33: a 12-GPU gang held a 64-GPU rack.)
DEFAULT_STARVATION_AFTER = 3600.0
DEFAULT_STARVATION_FACTOR = 4.0
DEFAULT_LOST_WORK_BUDGET = 0.05


@dataclass(frozen=True)
class QueuePolicy:
    """Which queue policies run. A gang holds a domain once it waited ``starvation_factor`` times
    its declared duration, or, declaring none, ``starvation_after`` seconds; both None turn holds
    off. Defaults measured by ``phalanx bench
    trace-defaults``: holds and preemption weighing on, fragmentation-aware placement off (it
    changed no outcome)."""

    starvation_after: float | None = DEFAULT_STARVATION_AFTER
    starvation_factor: float | None = DEFAULT_STARVATION_FACTOR
    max_holds: int = 1
    fragmentation_aware: bool = False
    lost_work_preemption: bool = True
    #: a preemptor that declares its duration evicts only victims whose lost work adds up to at
    #: most this share of the work it brings (its size x its duration); None: no budget
    lost_work_budget: float | None = DEFAULT_LOST_WORK_BUDGET

    def describe(self) -> str:
        rules = ([f"{self.starvation_factor:g}x its duration"] if self.starvation_factor is not None else []) + (
            [f"{self.starvation_after:.0f} s without one"] if self.starvation_after is not None else [])
        hold = f"hold after {' or '.join(rules)}" if rules else "no hold"
        return (f"{hold}, fragmentation-aware {'on' if self.fragmentation_aware else 'off'}, "
                f"lost-work preemption {'on' if self.lost_work_preemption else 'off'}")


@dataclass(frozen=True)
class Waiting:
    """A gang in the queue: since when it waits, and its declared duration (None: none)."""

    group: PodGroup
    since: float
    duration_hint: float | None = None


@dataclass(frozen=True)
class Running:
    """A running group: what it holds per node index, and when it declared it would end."""

    key: str
    usage: Mapping[int, np.ndarray]
    ends: float | None = None
    priority: int = 0


@dataclass(frozen=True)
class Hold:
    """``holder`` holds ``key``=``domain`` (node mask ``nodes``); ``shadow`` is when it is expected
    to fit there (None: not known from declared hints)."""

    holder: str
    priority: int
    key: str
    domain: str
    nodes: np.ndarray
    shadow: float | None

    def describe(self) -> str:
        where = f"{self.key}={self.domain}" if self.key else "the cluster"
        return f"holds {where} for {self.holder}"


def _shape(snapshot: Snapshot, group: PodGroup) -> tuple[np.ndarray, np.ndarray]:
    """The request vector (the largest pending member's, per resource) and the eligible-node mask."""
    pods = group.pending or group.members
    vec = np.max([snapshot.request_vector(p.spec.requests)[0] for p in pods[:8]], axis=0)
    elig = snapshot.eligibility(pods[0].spec).mask
    return vec, elig


def pods_fitting(free: np.ndarray, vec: np.ndarray, elig: np.ndarray | None = None) -> np.ndarray:
    """Per node, how many pods of ``vec`` fit in ``free``."""
    need = np.where(vec > 0, vec, 1)
    counts = np.min(np.where(vec > 0, free // need, np.iinfo(np.int64).max), axis=1)
    return np.where(elig, counts, 0) if elig is not None else counts


def plan_holds(snapshot: Snapshot, waiting: Sequence[Waiting], running: Sequence[Running], now: float,
               policy: QueuePolicy) -> list[Hold]:
    """The holds for this round: gangs waiting past the threshold, in queue order, each the
    domain nearest to fitting it that no earlier hold took, at most ``policy.max_holds``."""
    if policy.starvation_after is None and policy.starvation_factor is None:
        return []
    holds: list[Hold] = []
    taken = np.zeros(len(snapshot.nodes), dtype=bool)
    for w in waiting:
        if len(holds) >= policy.max_holds:
            break
        group = w.group
        waited = now - w.since
        if w.duration_hint is not None:
            due = policy.starvation_factor is not None and waited >= policy.starvation_factor * w.duration_hint
        else:
            due = policy.starvation_after is not None and waited >= policy.starvation_after
        if not due or not group.pending:
            continue
        vec, elig = _shape(snapshot, group)
        values, ids = snapshot.domains(group.topology_key)
        need = max(group.needed, 1) if group.policy is Policy.GANG else 1
        best: tuple[Any, ...] | None = None
        for d, value in enumerate(values):
            mask = (ids == d) & ~taken & elig
            if not mask.any() or int((ids == d).sum()) != int(((ids == d) & ~taken).sum()):
                continue
            if int(pods_fitting(snapshot.allocatable[mask], vec).sum()) < need:
                continue  # never fits there, even empty
            now_fit = int(pods_fitting(snapshot.free[mask], vec).sum())
            shadow = _shadow(snapshot, mask, vec, need, running, now) if now_fit < need else now
            score = (shadow if shadow is not None else np.inf, -now_fit, value)
            if best is None or score < best[0]:
                best = (score, d, value, mask, shadow)
        if best is None:
            continue
        _, d, value, mask, shadow = best
        taken |= ids == d  # one hold per domain
        nodes = _held(snapshot, mask, vec, need, running, shadow)
        holds.append(Hold(group.key, group.priority, group.topology_key, value or "", nodes, shadow))
    return holds


def _held(snapshot: Snapshot, mask: np.ndarray, vec: np.ndarray, need: int, running: Sequence[Running],
          shadow: float | None) -> np.ndarray:
    """The nodes of domain ``mask`` a hold keeps: as few as hold ``need`` pods of ``vec`` at
    ``shadow`` (the capacity free then, as the running groups there end by their declared hints),
    those holding the most pods then first, and of those the busiest now (a hold on a busy node
    costs nothing until it frees). The rest of the domain stays open: a hold keeps what its gang
    needs, not the whole rack. The whole domain when the shadow is not known."""
    if shadow is None:
        return mask
    free = snapshot.free.copy()
    for r in running:
        if r.ends is not None and r.ends <= shadow and any(mask[i] for i in r.usage):
            for i, used in r.usage.items():
                free[i] += used
    idx = np.nonzero(mask)[0]
    then = pods_fitting(np.minimum(free[idx], snapshot.allocatable[idx]), vec)
    now = pods_fitting(snapshot.free[idx], vec)
    out = np.zeros(len(snapshot.nodes), dtype=bool)
    left = need
    for k in sorted(range(len(idx)), key=lambda k: (-then[k], now[k], idx[k])):
        if left <= 0 or then[k] <= 0:
            break
        out[idx[k]] = True
        left -= int(then[k])
    return out if left <= 0 else mask


def _shadow(snapshot: Snapshot, mask: np.ndarray, vec: np.ndarray, need: int, running: Sequence[Running],
            now: float) -> float | None:
    """When ``need`` pods of ``vec`` fit in ``mask`` as the running groups there end by their
    declared hints; None when a group without a hint is in the way or it never gets there."""
    free = snapshot.free.copy()
    inside = [r for r in running if any(mask[i] for i in r.usage)]
    inside.sort(key=lambda r: r.ends if r.ends is not None else np.inf)
    for r in inside:
        if r.ends is None:
            return None
        for i, used in r.usage.items():
            free[i] += used
        if int(pods_fitting(np.minimum(free[mask], snapshot.allocatable[mask]), vec).sum()) >= need:
            return max(r.ends, now)
    return None


def blocked_nodes(group: PodGroup, duration_hint: float | None, now: float, holds: Sequence[Hold]) -> np.ndarray | None:
    """The nodes ``group`` may not take because of other gangs' holds (None: none)."""
    out = None
    for h in holds:
        if h.holder == group.key or group.priority > h.priority:
            continue
        if duration_hint is not None and h.shadow is not None and now + duration_hint <= h.shadow:
            continue  # declared to finish before the holder can start: backfill
        out = h.nodes.copy() if out is None else out | h.nodes
    return out


def fragmentation_domains(snapshot: Snapshot, group: PodGroup, queue: Sequence[PodGroup],
                          blocked: np.ndarray | None = None, max_shapes: int = 16) -> np.ndarray | None:
    """The nodes of the domains where placing ``group`` keeps the most of the queue's gang shapes
    fitting (GPU-weighted), then does not break a wholly free domain, then leaves the most whole
    free nodes; None when there is no choice to make."""
    key = group.topology_key
    if not key or not queue:
        return None
    free = snapshot.free.copy()
    if blocked is not None:
        free[blocked] = 0
    vec, elig = _shape(snapshot, group)
    values, ids = snapshot.domains(key)
    counts = pods_fitting(free, vec, elig)
    need = len(group.pending)
    sums = np.bincount(ids[ids >= 0], weights=counts[ids >= 0], minlength=len(values))
    candidates = [d for d in range(len(values)) if sums[d] >= need]
    if len(candidates) <= 1:
        return None
    share = np.maximum(snapshot.allocatable.max(axis=0), 1)
    shapes: dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray, int, str, float]] = {}
    for other in queue:
        if other.key == group.key or not other.pending or len(shapes) >= max_shapes:
            continue
        ovec, oelig = _shape(snapshot, other)
        sig = (tuple(ovec), len(other.pending), other.topology_key)
        if sig not in shapes:
            shapes[sig] = (ovec, oelig, len(other.pending), other.topology_key, float((ovec / share).max()))
    if not shapes:
        return None
    # the resource the gang asks the largest share of a node of (GPUs, for an accelerator gang)
    main = int(np.argmax(vec / share))
    fits_before = {sig: _fits_anywhere(snapshot, free, s) for sig, s in shapes.items()}
    scores = []
    for d in candidates:
        after = _packed(free, counts, vec, ids == d, need)
        lost = sum(s[2] * s[4] for sig, s in shapes.items()
                   if fits_before[sig] and not _fits_anywhere(snapshot, after, s))
        whole = int(np.all(after[:, main:main + 1] >= snapshot.allocatable[:, main:main + 1], axis=1).sum())
        in_d = ids == d
        broken = bool(np.all(free[in_d, main] >= snapshot.allocatable[in_d, main]))  # a whole free domain
        scores.append((lost, broken, -whole))
    best = min(scores)
    keep = np.zeros(len(snapshot.nodes), dtype=bool)
    for d, score in zip(candidates, scores, strict=True):
        if score == best:
            keep |= ids == d
    return keep


def _fits_anywhere(snapshot: Snapshot, free: np.ndarray, shape: tuple[Any, ...]) -> bool:
    vec, elig, need, key, _ = shape
    counts = pods_fitting(free, vec, elig)
    values, ids = snapshot.domains(key)
    sums = np.bincount(ids[ids >= 0], weights=counts[ids >= 0], minlength=len(values))
    return bool(sums.max(initial=0) >= need)


def _packed(free: np.ndarray, counts: np.ndarray, vec: np.ndarray, mask: np.ndarray, need: int) -> np.ndarray:
    """``free`` after ``need`` pods of ``vec`` are packed into ``mask`` as the solver packs: the
    nodes that hold the most first, the last chunk on the tightest node that holds it."""
    after = free.copy()
    nodes = [int(i) for i in np.nonzero(mask & (counts > 0))[0]]
    nodes.sort(key=lambda i: (-counts[i], i))
    left = need
    for i in nodes:
        if left <= 0:
            break
        if counts[i] >= left:
            i = min((n for n in nodes if counts[n] >= left), key=lambda n: (counts[n], n))
        take = int(min(counts[i], left))
        after[i] -= vec * take
        counts = counts.copy()
        counts[i] = 0
        left -= take
    return after


def restrict(snapshot: Snapshot, group: PodGroup, duration_hint: float | None, now: float,
             holds: Sequence[Hold], queue: Sequence[PodGroup], policy: QueuePolicy) -> tuple[Snapshot, str]:
    """The snapshot ``group`` is placed on under the queue policies, and what they did ("" nothing)."""
    blocked = blocked_nodes(group, duration_hint, now, holds)
    notes = []
    if blocked is not None:
        notes.append("; ".join(h.describe() for h in holds if h.holder != group.key))
    keep = fragmentation_domains(snapshot, group, queue, blocked) if policy.fragmentation_aware else None
    if keep is not None:
        notes.append("fragmentation-aware domain choice")
    if blocked is None and keep is None:
        return snapshot, ""
    allowed = np.ones(len(snapshot.nodes), dtype=bool) if keep is None else keep.copy()
    if blocked is not None:
        allowed &= ~blocked
    return snapshot.only_nodes(n.name for n, ok in zip(snapshot.nodes, allowed, strict=True) if ok), "; ".join(notes)


def lost_work(started: float, now: float, checkpoint_interval: float) -> float:
    """Seconds of work lost when a group that started at ``started`` stops at ``now``: since its
    last checkpoint (every ``checkpoint_interval`` s; 0 = none, everything is lost)."""
    ran = max(now - started, 0.0)
    return ran % checkpoint_interval if checkpoint_interval > 0 else ran


def preemptor_work(size: float, duration_hint: float | None) -> float | None:
    """The work a preemptor brings, in the victims' cost unit x seconds: ``size`` (GPUs or pods)
    times its declared duration; None when it declares none (then no budget applies)."""
    return None if duration_hint is None else size * duration_hint


def victim_prefixes(costs: Mapping[str, float], budget: float | None = None,
                    priorities: Mapping[str, int] | None = None) -> list[list[str]]:
    """Candidate victim groups lowest priority first and, among equals, cheapest lost work first,
    in prefixes of 1, 2, 4, ... and all; with ``budget``, only as many as keep the lost work within
    it. Priority stays first: lost work never makes a more important group the victim."""
    order = sorted(costs, key=lambda k: ((priorities or {}).get(k, 0), costs[k], k))
    if budget is not None:
        total, kept = 0.0, []
        for k in order:
            total += costs[k]
            if total > budget:
                break
            kept.append(k)
        order = kept
    out, n = [], 1
    while n < len(order):
        out.append(order[:n])
        n *= 2
    if order:
        out.append(order)
    return out


def victim_budget(policy: QueuePolicy, work: float | None) -> float | None:
    """The lost work ``policy`` lets a preemption cost, for a preemptor bringing ``work``."""
    if not policy.lost_work_preemption or policy.lost_work_budget is None or work is None:
        return None
    return policy.lost_work_budget * work
