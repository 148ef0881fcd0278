"""Gang-aware scale-up with Karpenter: NodeClaims for exactly the nodes a gang lacks, in its domain,
all at once, kept from Karpenter's disruption while the gang needs them.

Karpenter provisions pod by pod from pending pods and knows nothing of a PodGroup's domain or of
all-or-nothing. With ``phalanx serve --provisioner karpenter`` a gang that lacks capacity and opts
in (the same ``scheduling.phalanx.dev/provisioning: atomic`` as the ProvisioningRequest path, or
serve's ``--provisioning atomic`` default) gets NodeClaims made by phalanx, decided in the workload
cycle that found it infeasible (:meth:`NodeClaims.consider`, lock held, no I/O):

- **where, how many, what**: the nearest domain whose shortfall is capacity (as for a
  ProvisioningRequest); its nodes' instance type — the largest node there that names one
  (``node.kubernetes.io/instance-type``) and that the NodePool allows — is the one asked for, and
  the missing pods, largest first, are packed first-fit into as few nodes of that type's allocatable
  as hold them; one NodeClaim per node, of the NodePool named by ``--karpenter-nodepool`` (or the
  one the reference node belongs to), carrying the pool's template with the instance type, the
  domain's label and the node selector the pods share pinned;
- **at once, once**: every NodeClaim of the ask is created in one queued write, named from the
  PodGroup's uid and the members it holds (:func:`cluster.karpenter.nodeclaim_prefix`), so another
  cycle or a restarted serve finds them and never asks twice;
- **kept**: each carries ``karpenter.sh/do-not-disrupt: "true"`` (Karpenter copies it to the
  node), so consolidation does not take the nodes apart while the gang waits, binds or runs;
  once the PodGroup is gone the annotation is removed and the NodePool's own disruption policy
  applies;
- **whole or not at all**: when one NodeClaim is deleted before its node registered (Karpenter
  deletes those it cannot launch for lack of capacity), or not every node registered within
  ``--provisioning-timeout``, every NodeClaim of the ask is deleted, the PodGroup says why
  (``ProvisioningFailed``) and the gang does not ask again; a PodGroup deleted before its gang
  bound takes its NodeClaims with it. No stray nodes either way.

:meth:`NodeClaims.sync` runs on the requeue thread whenever a NodeClaim of phalanx's or a member of a
gang with one changed, and when an ask's time runs out. The nodes that come are room like any other:
the cache's capacity change retries the gang.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

from cluster import names
from cluster.backend import ClusterWriter, WriteError
from cluster.cache import CacheEvent, ClusterCache
from cluster.convert import PodGroupRecord
from cluster.karpenter import NodeClaimAsk, NodeClaimRecord, NodePoolRecord, nodeclaim_prefix
from solver import Explanation, Node, PodGroup, PodSpec
from solver.model import PODS

from .dispatch import transient
from .inbox import Inbox
from .provisioning import Asked, capacity_shortfall, pod_sets
from .status import StatusWriter

CPU, MEMORY = "cpu", "memory"  # the resources that rank a domain's nodes as a model (largest first)

#: what an ask says once its gang is bound (its claims stay protected while the gang runs)
BOUND = "bound"
#: how long an ask's nodes may take to register, by default (Karpenter's own registration TTL is 15 min)
DEFAULT_TIMEOUT = 600.0


@dataclass(frozen=True)
class KarpenterOptions:
    """serve's ``--provisioner karpenter``: the NodePool whose NodeClaims a gang gets (unless its
    domain's node belongs to another), and how long their nodes may take to register."""

    nodepool: str = "default"
    timeout: float = DEFAULT_TIMEOUT


@dataclass
class Ask:
    """One ask's NodeClaims, as phalanx made them (a gang that grows makes another for its increment)."""

    group: str  # namespace/name of the PodGroup
    held: int  # the members it held when it asked
    prefix: str
    claims: tuple[str, ...]
    pool: str
    instance_type: str
    where: str  # "rack=r1" ("" without a topology key)
    pods: int
    created: float
    seen: set[str] = field(default_factory=set)  # the claims the cache has shown
    failed: str = ""  # why the ask failed ("" while it stands)
    swept: bool = False  # a failed ask's claims were all deleted once
    said: str = ""  # the words last written on the group


def _fits(free: dict[str, int], requests: Mapping[str, int]) -> bool:
    return all(free.get(r, 0) >= v for r, v in requests.items() if v)


def _needs(spec: PodSpec, allocatable: Mapping[str, int]) -> dict[str, int]:
    """What one pod of ``spec`` takes of a node (its requests, and a pod slot where nodes count them)."""
    needs = {r: v for r, v in spec.requests.items() if v}
    if PODS in allocatable:
        needs[PODS] = needs.get(PODS, 0) + 1
    return needs


def pack(specs: list[PodSpec], allocatable: Mapping[str, int]) -> list[dict[str, int]] | str:
    """The pods packed first-fit, largest first, into as few empty nodes of ``allocatable`` as hold
    them: each node's summed needs; or why a pod fits no such node."""
    order = sorted(specs, key=lambda s: -sum(v / allocatable[r] for r, v in s.requests.items() if allocatable.get(r)))
    nodes: list[tuple[dict[str, int], dict[str, int]]] = []  # (free, used)
    for spec in order:
        needs = _needs(spec, allocatable)
        if not _fits(dict(allocatable), needs):
            short = [r for r, v in needs.items() if allocatable.get(r, 0) < v]
            return f"a pod needs more {', '.join(short)} than such a node has"
        slot = next((n for n in nodes if _fits(n[0], needs)), None)
        if slot is None:
            slot = (dict(allocatable), {})
            nodes.append(slot)
        for r, v in needs.items():
            slot[0][r] = slot[0].get(r, 0) - v
            slot[1][r] = slot[1].get(r, 0) + v
    return [used for _, used in nodes]


class NodeClaims:
    def __init__(self, cache: ClusterCache, writer: ClusterWriter, status: StatusWriter,
                 explanations: dict[str, str], inbox: Inbox, pool: str, timeout: float = DEFAULT_TIMEOUT,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cache = cache
        self.writer = writer
        self.status = status
        self.explanations = explanations  # group -> the last reason it did not fit (shared)
        self.inbox = inbox
        self.pool = pool
        self.timeout = timeout
        self.clock = clock
        self._lock = threading.Lock()  # over the maps: the cache's thread notes, the cycle reads
        self.asks: dict[str, Ask] = {}  # name prefix -> the ask (this serve's, or found in the cache)
        self.reasons: dict[str, str] = {}  # group -> the solver's reason the ask was made for
        self.released: set[str] = set()  # claims whose protection was removed (queued)
        self.deleting: set[str] = set()  # claims whose deletion is queued
        self.dirty = False
        cache.subscribe(self._on_cache_event)
        for claim in list(cache.nodeclaims.values()):
            self._adopt(claim)

    # -- the decision (a workload cycle, lock held) ----------------------------------------------
    def consider(self, group: PodGroup, record: PodGroupRecord, explanation: Explanation | None,
                 reason: str, held: int) -> Asked:
        prefix = nodeclaim_prefix(record.uid, held)
        with self._lock:
            ask = self.asks.get(prefix)
            self.reasons[group.key] = reason
        if ask is not None:
            return self._asked(ask)
        shortfall = capacity_shortfall(explanation)
        if isinstance(shortfall, str):
            return Asked(f"no NodeClaims: {shortfall}")
        decided = self._decide(group, shortfall.value, shortfall.missing)
        if isinstance(decided, str):
            return Asked(f"no NodeClaims: {decided}")
        pool, instance_type, labels, nodes = decided
        where = ",".join(f"{k}={v}" for k, v in labels.items() if k == group.topology_key)
        claims = tuple(f"{prefix}-{i}" for i in range(len(nodes)))
        ask = Ask(group.key, held, prefix, claims, pool.name, instance_type, where, shortfall.missing, self.clock())
        with self._lock:
            self.asks[prefix] = ask
        asks = [NodeClaimAsk(name, group.namespace, group.name, record.uid, held, instance_type, labels, used)
                for name, used in zip(claims, nodes, strict=True)]
        self._create(group.key, ask, asks, pool)
        timer = threading.Timer(self.timeout, self._due)
        timer.daemon = True
        timer.start()
        note = self._words(ask, 0)
        self.status.event(group.key, names.EVENT_NODECLAIMS_CREATED, note)
        return Asked(note, names.REASON_PROVISIONING)

    def _decide(self, group: PodGroup, value: str, missing: int
                ) -> tuple[NodePoolRecord, str, dict[str, str], list[dict[str, int]]] | str:
        """The pool, the instance type, the labels and the nodes' contents of an ask; or why none."""
        key = group.topology_key
        nodes = [n for n in self.cache.nodes.values()
                 if (not key or n.labels.get(key) == value) and n.labels.get(names.LABEL_INSTANCE_TYPE)
                 and not n.unschedulable]
        where = f"{key}={value}" if key else "the cluster"
        if not nodes:
            return f"no node in {where} names its instance type ({names.LABEL_INSTANCE_TYPE})"

        def pool_of(node: Node) -> NodePoolRecord | None:
            return self.cache.nodepools.get(node.labels.get(names.LABEL_KARPENTER_NODEPOOL) or self.pool)

        usable = [n for n in nodes if (p := pool_of(n)) is not None
                  and p.refuses(names.LABEL_INSTANCE_TYPE, n.labels[names.LABEL_INSTANCE_TYPE]) is None]
        if not usable:
            if self.cache.nodepools.get(self.pool) is None:
                return f"NodePool {self.pool} not found"
            types = sorted({n.labels[names.LABEL_INSTANCE_TYPE] for n in nodes})
            return f"NodePool {self.pool} offers none of the instance types in {where} ({', '.join(types)})"
        reference = max(usable, key=lambda n: (n.allocatable.get(CPU, 0), n.allocatable.get(MEMORY, 0), n.name))
        pool = pool_of(reference)
        assert pool is not None
        labels: dict[str, str] = {}
        sets = pod_sets(group.pending, missing)
        for pod_set in sets:
            for k, v in pod_set.spec.node_selector.items():
                if labels.setdefault(k, v) != v:
                    return f"the gang's pods select different values of {k}"
        if key:
            labels[key] = value
        labels.pop(names.LABEL_INSTANCE_TYPE, None)
        for k, v in labels.items():
            if (refused := pool.refuses(k, v)) is not None:
                return (f"NodePool {pool.name} allows no {k}={v} ({refused.operator} "
                        f"{', '.join(refused.values)})")
        specs = [pod_set.spec for pod_set in sets for _ in range(pod_set.count)]
        packed = pack(specs, reference.allocatable)
        if isinstance(packed, str):
            return f"{packed} ({reference.labels[names.LABEL_INSTANCE_TYPE]}, like node {reference.name})"
        return pool, reference.labels[names.LABEL_INSTANCE_TYPE], labels, packed

    def _create(self, group_key: str, ask: Ask, asks: list[NodeClaimAsk], pool: NodePoolRecord) -> None:
        """Queue the ask's NodeClaims, all in one write; refused (not a transient error): the
        ones made are deleted and the ask fails."""
        def create() -> None:
            made: list[str] = []
            try:
                for claim in asks:
                    self.writer.create_nodeclaim(claim, pool)
                    made.append(claim.name)
            except WriteError as err:
                if transient(err):
                    raise  # the dispatcher tries again (a claim made already is kept: 409)
                for name in made:
                    self.writer.delete_nodeclaim(name)
                with self._lock:
                    ask.failed = f"NodeClaim {claims_words(ask)} not created: {err}"
                self.dirty = True
                self.inbox.wake()
        self.status.submit(group_key, "nodeclaims", create)

    # -- the cache's thread: note only -----------------------------------------------------------
    def _adopt(self, claim: NodeClaimRecord) -> None:
        """Take in a NodeClaim of phalanx's that this serve did not make (a restart, a failover)."""
        if not claim.podgroup or not claim.podgroup_uid:
            return
        prefix = nodeclaim_prefix(claim.podgroup_uid, claim.held)
        with self._lock:
            ask = self.asks.get(prefix)
            if ask is None:
                ask = Ask(claim.podgroup, claim.held, prefix, (), claim.nodepool, "", "", 0, self.clock())
                self.asks[prefix] = ask
            if claim.name not in ask.claims:
                ask.claims = tuple(sorted((*ask.claims, claim.name)))
            ask.seen.add(claim.name)

    def _on_cache_event(self, event: CacheEvent) -> None:
        if event.kind == "NodeClaim":
            if isinstance(event.record, NodeClaimRecord):
                self._adopt(event.record)
        elif event.kind in ("Pod", "PodGroup") and self.asks:
            with self._lock:
                concerned = {a.group for a in self.asks.values()}
            if not event.groups & concerned:
                return
        else:
            return
        self.dirty = True
        self.inbox.wake()

    def _due(self) -> None:
        self.dirty = True
        self.inbox.wake()

    # -- the requeue thread (lock held) ----------------------------------------------------------
    def sync(self) -> None:
        """Bring the gangs with NodeClaims up to date (see the module's docstring)."""
        if not self.dirty:
            return
        self.dirty = False
        with self._lock:
            asks = list(self.asks.values())
        for ask in asks:
            self._sync_group(ask.group, ask)

    def _claims(self, ask: Ask) -> list[NodeClaimRecord]:
        return [c for name in ask.claims if (c := self.cache.nodeclaims.get(name)) is not None]

    def _sync_group(self, group_key: str, ask: Ask) -> None:
        claims = self._claims(ask)
        with self._lock:
            ask.seen.update(c.name for c in claims)
        record = self.cache.podgroups.get(group_key)
        group = self.cache.podgroup(group_key) if record is not None else None
        if record is None or nodeclaim_prefix(record.uid, ask.held) != ask.prefix:
            self._end(group_key, ask, claims)  # gone
            return
        if group is not None and (group.bound and not group.pending or len(group.bound) + group.finished > ask.held):
            # served: the gang is bound (kept protected while it runs), or holds more members than
            # when it asked (it grew since, and an ask of its own says the increment)
            self._say(group_key, ask, BOUND, None)
            return
        if group is not None and group.finished and not group.bound and not group.pending:
            self._end(group_key, ask, claims)  # the gang ended
            return
        if not ask.failed:
            vanished = [n for n in ask.seen if n not in self.cache.nodeclaims
                        or self.cache.nodeclaims[n].deleting and not self.cache.nodeclaims[n].registered]
            if vanished:
                ask.failed = f"NodeClaim {sorted(vanished)[0]} was deleted before its node registered"
            elif self.clock() - ask.created >= self.timeout and not all(c.registered for c in claims):
                trouble = next((t for c in claims if (t := c.trouble())), "")
                ask.failed = (f"not every node registered within {self.timeout:g} s"
                              + (f" ({trouble})" if trouble else ""))
        if ask.failed:
            self._fail(group_key, ask, claims)
            return
        registered = sum(c.registered for c in claims)
        self._say(group_key, ask, self._words(ask, registered), names.REASON_PROVISIONING)

    def _say(self, group_key: str, ask: Ask, words: str, reason: str | None, warning: bool = False) -> None:
        with self._lock:
            if ask.said == words:
                return
            ask.said = words
            why = self.reasons.get(group_key, "")
        if reason is None:
            return
        self.explanations[group_key] = f"{why}; {words}" if why else words
        self.status.set_status(group_key, False, reason, self.explanations[group_key])
        self.status.event(group_key, names.EVENT_NODECLAIMS_FAILED if warning else names.EVENT_NODECLAIMS_CHANGED,
                          words, "Warning" if warning else "Normal")

    def _fail(self, group_key: str, ask: Ask, claims: list[NodeClaimRecord]) -> None:
        """Delete every claim of a failed ask — all it made the first time, then those the cache
        still shows (a later sync deletes nothing twice) — and say why."""
        words = f"NodeClaims {claims_words(ask)} failed: {ask.failed}; all {len(ask.claims)} deleted"
        for name in [c.name for c in claims] if ask.swept else ask.claims:
            self._delete(group_key, name)
        ask.swept = True
        self._say(group_key, ask, words, names.REASON_PROVISIONING_FAILED, warning=True)

    def _asked(self, ask: Ask) -> Asked:
        if ask.failed:
            return Asked(f"NodeClaims {claims_words(ask)} failed: {ask.failed}", names.REASON_PROVISIONING_FAILED)
        return Asked(ask.said if ask.said and ask.said != BOUND else self._words(ask, 0), names.REASON_PROVISIONING)

    def _words(self, ask: Ask, registered: int) -> str:
        where = f" in {ask.where}" if ask.where else ""
        what = f" of instance type {ask.instance_type}" if ask.instance_type else ""
        pods = f" for {ask.pods} pods" if ask.pods else ""  # (an ask found after a restart does not say)
        return (f"NodeClaims {claims_words(ask)} ask Karpenter (NodePool {ask.pool}) for {len(ask.claims)} "
                f"nodes{what}{where}{pods}, all at once: {registered} of {len(ask.claims)} registered")

    def _delete(self, group_key: str, name: str) -> None:
        with self._lock:
            if name in self.deleting:
                return
            self.deleting.add(name)
        self.status.submit(group_key, "nodeclaims", lambda: self.writer.delete_nodeclaim(name),
                           coalesce=f"nodeclaim-delete:{name}")

    def _end(self, group_key: str, ask: Ask, claims: list[NodeClaimRecord]) -> None:
        """The PodGroup is gone or its gang ended: a claim whose node runs pods is let go to the
        NodePool's disruption, the others (never registered, or empty) are deleted — no stray
        nodes; the ask is forgotten once none is left protected."""
        kept = []
        for claim in claims:
            if not self.cache.pods_by_node.get(claim.node_name):
                self._delete(group_key, claim.name)
                kept.append(claim)
            elif claim.protected:
                kept.append(claim)
                with self._lock:
                    if claim.name in self.released:
                        continue
                    self.released.add(claim.name)
                self._release(group_key, claim)
        if not kept:
            with self._lock:
                self.asks.pop(ask.prefix, None)
                if not any(a.group == group_key for a in self.asks.values()):
                    self.reasons.pop(group_key, None)

    def _release(self, group_key: str, claim: NodeClaimRecord) -> None:
        name, node = claim.name, claim.node_name
        self.status.submit(group_key, "nodeclaims", lambda: self.writer.release_nodeclaim(name, node),
                           coalesce=f"nodeclaim-release:{name}")
        if self.cache.podgroups.get(group_key) is not None:
            self.status.event(group_key, names.EVENT_NODECLAIMS_RELEASED,
                              f"NodeClaim {name} (node {node or 'not registered'}) left to its NodePool's "
                              "disruption: the gang no longer runs on it")

    def prune(self, live: Mapping[str, object]) -> None:
        """Forget what the cache no longer shows of groups not in ``live``."""
        with self._lock:
            self.deleting &= set(self.cache.nodeclaims)
            self.released &= set(self.cache.nodeclaims)
            gone = [a for a in self.asks.values() if a.group not in live]
        if gone:
            self.dirty = True
            self.inbox.wake()


def claims_words(ask: Ask) -> str:
    """The ask's NodeClaims in a few words: ``phalanx-<uid>-0-{0..2}``."""
    if len(ask.claims) == 1:
        return ask.claims[0]
    return f"{ask.prefix}-{{0..{len(ask.claims) - 1}}}"
