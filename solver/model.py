"""The solver's input model: small, immutable, Kubernetes-free records.

Everything here is plain data in integer base units (milli-CPU, bytes, counts). Converters from
Kubernetes JSON live in ``cluster/``; the solver never sees an API object. Every constructor
validates its input and raises :class:`InvalidInput` with a message an operator can act on, so a
bad object is rejected at the boundary instead of producing a wrong placement deep inside.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from .errors import InvalidInput

#: The per-node pod-count capacity: every pod consumes one, as in kube-scheduler.
PODS = "pods"


def resources(values: Mapping[str, int] | None, what: str) -> Mapping[str, int]:
    """Validate a resource vector: names are non-empty strings, amounts non-negative integers."""
    if values is None:
        return {}
    if not isinstance(values, dict) and not isinstance(values, Mapping):  # dict first: fast
        raise InvalidInput(f"{what}: resources must be a mapping, got {type(values).__name__}")
    out: dict[str, int] = {}
    for name, amount in values.items():
        if not isinstance(name, str) or not name:
            raise InvalidInput(f"{what}: resource name must be a non-empty string, got {name!r}")
        if isinstance(amount, bool) or not isinstance(amount, int):
            raise InvalidInput(f"{what}: {name} must be an integer in base units, got {amount!r}")
        if amount < 0:
            raise InvalidInput(f"{what}: {name} must not be negative, got {amount}")
        out[name] = amount
    return out


def add_resources(*vectors: Mapping[str, int]) -> dict[str, int]:
    total: dict[str, int] = {}
    for vector in vectors:
        for name, amount in vector.items():
            total[name] = total.get(name, 0) + amount
    return total


def placement_usage(
    placement: Mapping[str, str], requests: Mapping[str, Mapping[str, int]]
) -> dict[str, dict[str, int]]:
    """Per node, what the pods of ``placement`` (uid -> node) use there: their ``requests`` (uid ->
    amounts) plus one ``pods`` each. Reservations, nominations and what-if snapshots all charge this."""
    usage: dict[str, dict[str, int]] = {}
    for uid, node in placement.items():
        slot = usage.setdefault(node, {PODS: 0})
        slot[PODS] += 1
        for r, amount in requests[uid].items():
            slot[r] = slot.get(r, 0) + amount
    return usage


def effective_requests(
    containers: Sequence[Mapping[str, int]],
    init_containers: Sequence[tuple[Mapping[str, int], bool]] = (),
    overhead: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """A pod's requests as kube-scheduler computes them.

    ``init_containers`` is a list of ``(requests, restartable)`` in spec order; restartable init
    containers are sidecars: they keep running, so they add to the app containers' sum and to
    every later init container. Result: max(sum(containers) + sidecars, max over init containers of
    (its requests + sidecars started before it)) per resource, plus the pod overhead.
    """
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for requests, restartable in init_containers:
        if restartable:
            sidecars = add_resources(sidecars, requests)
            candidate = sidecars
        else:
            candidate = add_resources(sidecars, requests)
        for name, amount in candidate.items():
            init_peak[name] = max(init_peak.get(name, 0), amount)
    running = add_resources(*containers, sidecars)
    out = {n: max(running.get(n, 0), init_peak.get(n, 0)) for n in set(running) | set(init_peak)}
    return add_resources(out, overhead or {})


class TaintEffect(str, enum.Enum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


@dataclass(frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: TaintEffect = TaintEffect.NO_SCHEDULE


@dataclass(frozen=True)
class Toleration:
    key: str = ""  # empty key with operator Exists tolerates everything
    operator: str = "Equal"  # Equal | Exists
    value: str = ""
    effect: str = ""  # empty matches every effect

    def __post_init__(self) -> None:
        if self.operator not in ("Equal", "Exists"):
            raise InvalidInput(f"toleration operator must be Equal or Exists, got {self.operator!r}")

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect.value:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


@dataclass(frozen=True)
class Requirement:
    """One node-selector requirement (``matchExpressions`` entry)."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.operator not in SELECTOR_OPERATORS:
            raise InvalidInput(
                f"node selector operator must be one of {', '.join(SELECTOR_OPERATORS)}, "
                f"got {self.operator!r}"
            )
        if self.operator in ("In", "NotIn") and not self.values:
            raise InvalidInput(f"node selector {self.key} {self.operator} needs at least one value")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise InvalidInput(f"node selector {self.key} {self.operator} takes no values")
        if self.operator in ("Gt", "Lt"):
            if len(self.values) != 1:
                raise InvalidInput(f"node selector {self.key} {self.operator} needs exactly one value")
            try:
                int(self.values[0])
            except ValueError:
                raise InvalidInput(
                    f"node selector {self.key} {self.operator} needs an integer, got {self.values[0]!r}"
                ) from None

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        op = self.operator
        if op == "In":
            return value is not None and value in self.values
        if op == "NotIn":
            return value is None or value not in self.values
        if op == "Exists":
            return value is not None
        if op == "DoesNotExist":
            return value is None
        try:
            number = int(value) if value is not None else None
        except ValueError:
            return False
        if number is None:
            return False
        return number > int(self.values[0]) if op == "Gt" else number < int(self.values[0])


@dataclass(frozen=True)
class NodeAffinity:
    """Required node affinity: the node must match at least one term; a term is an AND of
    requirements. An empty term list means no constraint."""

    terms: tuple[tuple[Requirement, ...], ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if not self.terms:
            return True
        return any(all(r.matches(labels) for r in term) for term in self.terms)


LABEL_SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


@dataclass(frozen=True)
class LabelSelector:
    """A metav1.LabelSelector over pod (or namespace) labels: every ``match_labels`` pair and every
    expression must hold. An empty selector matches every object; a term that has *no* selector
    (``None`` where a selector is expected) matches none, as in kube-scheduler."""

    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[Requirement, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "match_labels", tuple(sorted(self.match_labels)))
        for expr in self.match_expressions:
            if expr.operator not in LABEL_SELECTOR_OPERATORS:
                raise InvalidInput(
                    f"label selector operator must be one of {', '.join(LABEL_SELECTOR_OPERATORS)}, "
                    f"got {expr.operator!r}"
                )

    def matches(self, labels: Mapping[str, str]) -> bool:
        for key, value in self.match_labels:
            if labels.get(key) != value:
                return False
        return all(e.matches(labels) for e in self.match_expressions)


@dataclass(frozen=True)
class PodAffinityTerm:
    """One pod (anti-)affinity term. ``namespaces`` is already resolved the kube-scheduler way
    (empty list and no namespace selector: the pod's own namespace); ``namespace_selector`` None
    means not set, an empty selector means every namespace. ``weight`` is 1-100 for a preferred
    term, 0 for a required one. ``matchLabelKeys``/``mismatchLabelKeys`` are merged into
    ``selector`` by the converter, as the API server does."""

    topology_key: str
    selector: LabelSelector | None = None
    namespaces: frozenset[str] = frozenset()
    namespace_selector: LabelSelector | None = None
    weight: int = 0

    def __post_init__(self) -> None:
        if not self.topology_key:
            raise InvalidInput("pod affinity term: topologyKey must not be empty")
        if isinstance(self.weight, bool) or not isinstance(self.weight, int) or not 0 <= self.weight <= 100:
            raise InvalidInput(f"pod affinity term: weight must be an integer 1-100, got {self.weight!r}")
        object.__setattr__(self, "namespaces", frozenset(self.namespaces))

    def selects(self, namespace: str, labels: Mapping[str, str],
                namespace_labels: Mapping[str, Mapping[str, str]]) -> bool:
        """Does the term select a pod in ``namespace`` with ``labels``?"""
        if self.selector is None:
            return False
        in_scope = namespace in self.namespaces or (
            self.namespace_selector is not None
            and self.namespace_selector.matches(namespace_labels.get(namespace, {})))
        return in_scope and self.selector.matches(labels)


DO_NOT_SCHEDULE = "DoNotSchedule"
SCHEDULE_ANYWAY = "ScheduleAnyway"
HONOR = "Honor"
IGNORE = "Ignore"


@dataclass(frozen=True)
class SpreadConstraint:
    """One ``topologySpreadConstraints`` entry (``matchLabelKeys`` merged into ``selector``). The
    pods counted are those in the pod's own namespace that ``selector`` matches."""

    max_skew: int
    topology_key: str
    when_unsatisfiable: str = DO_NOT_SCHEDULE
    selector: LabelSelector | None = None
    min_domains: int = 1
    node_affinity_policy: str = HONOR
    node_taints_policy: str = IGNORE

    def __post_init__(self) -> None:
        where = f"topology spread constraint on {self.topology_key or '(no key)'}"
        if not self.topology_key:
            raise InvalidInput("topology spread constraint: topologyKey must not be empty")
        if isinstance(self.max_skew, bool) or not isinstance(self.max_skew, int) or self.max_skew < 1:
            raise InvalidInput(f"{where}: maxSkew must be an integer >= 1, got {self.max_skew!r}")
        if self.when_unsatisfiable not in (DO_NOT_SCHEDULE, SCHEDULE_ANYWAY):
            raise InvalidInput(f"{where}: whenUnsatisfiable must be DoNotSchedule or ScheduleAnyway, "
                               f"got {self.when_unsatisfiable!r}")
        if isinstance(self.min_domains, bool) or not isinstance(self.min_domains, int) or self.min_domains < 1:
            raise InvalidInput(f"{where}: minDomains must be an integer >= 1, got {self.min_domains!r}")
        for name, value in (("nodeAffinityPolicy", self.node_affinity_policy),
                            ("nodeTaintsPolicy", self.node_taints_policy)):
            if value not in (HONOR, IGNORE):
                raise InvalidInput(f"{where}: {name} must be Honor or Ignore, got {value!r}")

    @property
    def hard(self) -> bool:
        return self.when_unsatisfiable == DO_NOT_SCHEDULE


WILDCARD_IP = "0.0.0.0"
PORT_PROTOCOLS = ("TCP", "UDP", "SCTP")


@dataclass(frozen=True)
class HostPort:
    """A container port with a ``hostPort``: two pods conflict on one node when protocol and port
    are equal and either host IP is the wildcard or both are the same (kube-scheduler NodePorts)."""

    port: int
    protocol: str = "TCP"
    host_ip: str = WILDCARD_IP

    def __post_init__(self) -> None:
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 1 <= self.port <= 65535:
            raise InvalidInput(f"hostPort must be an integer 1-65535, got {self.port!r}")
        if self.protocol not in PORT_PROTOCOLS:
            raise InvalidInput(f"hostPort {self.port}: protocol must be TCP, UDP or SCTP, got {self.protocol!r}")
        object.__setattr__(self, "host_ip", self.host_ip or WILDCARD_IP)

    def conflicts(self, other: "HostPort") -> bool:
        return (self.port == other.port and self.protocol == other.protocol
                and (self.host_ip == other.host_ip or WILDCARD_IP in (self.host_ip, other.host_ip)))


RWOP = "ReadWriteOncePod"


@dataclass(frozen=True)
class VolumeClaim:
    """A PersistentVolumeClaim a pod uses, resolved by ``cluster/`` from the claim, its bound PV and
    its StorageClass.

    - bound (``bound`` True): ``node_affinity`` is the PV's required node affinity (None: any node);
    - unbound, ``delayed`` (WaitForFirstConsumer): needs an available static PV of ``storage_class``
      with room for ``request`` and the access modes, whose node affinity matches the node — or, when
      ``dynamic`` (the class has a provisioner), a node inside ``allowed_topologies``;
    - unbound and not delayed: waits for the PV controller (immediate binding): fits nowhere yet;
    - ``missing``: the claim does not exist (kube-scheduler: not found): fits nowhere.
    ``csi_driver`` names the attach-limit budget the volume counts against on a node ("" none)."""

    name: str  # namespace/claim
    bound: bool = False
    node_affinity: NodeAffinity | None = None
    storage_class: str = ""
    request: int = 0  # bytes
    access_modes: frozenset[str] = frozenset()
    delayed: bool = False
    dynamic: bool = False
    allowed_topologies: NodeAffinity | None = None
    csi_driver: str = ""
    missing: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "access_modes", frozenset(self.access_modes))
        if isinstance(self.request, bool) or not isinstance(self.request, int) or self.request < 0:
            raise InvalidInput(f"claim {self.name}: storage request must be a non-negative integer")

    @property
    def signature(self) -> tuple[object, ...]:
        """What makes two claims interchangeable for placement (everything but the name)."""
        return (self.bound, self.node_affinity, self.storage_class, self.request, self.access_modes,
                self.delayed, self.dynamic, self.allowed_topologies, self.csi_driver, self.missing)


@dataclass(frozen=True)
class PersistentVolume:
    """A static PersistentVolume still available for a WaitForFirstConsumer claim (phase Available,
    no claim bound). ``claim_ref`` is ``namespace/claim`` when it is pre-bound to one claim."""

    name: str
    storage_class: str = ""
    capacity: int = 0
    access_modes: frozenset[str] = frozenset()
    node_affinity: NodeAffinity | None = None
    claim_ref: str = ""
    csi_driver: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "access_modes", frozenset(self.access_modes))

    def serves(self, claim: VolumeClaim) -> bool:
        """Could this PV bind ``claim`` (ignoring the node)? As the PV controller matches them."""
        if self.claim_ref and self.claim_ref != claim.name:
            return False
        return (self.storage_class == claim.storage_class and self.capacity >= claim.request
                and claim.access_modes <= self.access_modes)


@dataclass(frozen=True)
class VolumeInventory:
    """Cluster-wide volume facts for one snapshot: the available static PVs, and per node the CSI
    attach limit per driver (from CSINode ``allocatable.count``)."""

    available: tuple[PersistentVolume, ...] = ()
    attach_limits: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # node -> driver -> max


@dataclass(frozen=True)
class Node:
    name: str
    allocatable: Mapping[str, int]
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidInput("node name must not be empty")
        object.__setattr__(self, "allocatable", resources(self.allocatable, f"node {self.name}"))


@dataclass(frozen=True)
class PodSpec:
    """The scheduling-relevant part of a pod. ``requests`` are effective requests
    (see :func:`effective_requests`) without the implicit pod count."""

    requests: Mapping[str, int] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    affinity: NodeAffinity = NodeAffinity()
    tolerations: tuple[Toleration, ...] = ()
    priority: int = 0
    #: required / preferred inter-pod affinity and anti-affinity terms
    pod_affinity: tuple[PodAffinityTerm, ...] = ()
    pod_anti_affinity: tuple[PodAffinityTerm, ...] = ()
    preferred_affinity: tuple[PodAffinityTerm, ...] = ()
    preferred_anti_affinity: tuple[PodAffinityTerm, ...] = ()
    spread: tuple[SpreadConstraint, ...] = ()
    host_ports: tuple[HostPort, ...] = ()
    #: everything that decides node eligibility (not capacity): pods sharing it share a mask
    eligibility_key: tuple[object, ...] = field(init=False, repr=False, compare=False)
    #: eligibility plus requests: pods sharing it are one shape to the solver
    shape_key: tuple[object, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "requests", resources(self.requests, "pod requests"))
        if PODS in self.requests:
            raise InvalidInput(f"pod requests must not name {PODS!r}: every pod counts as one")
        # computed once here, so grouping 1,000 pods into shapes is 1,000 lookups, not 1,000 sorts
        eligibility = (tuple(sorted(self.node_selector.items())), self.affinity, self.tolerations)
        object.__setattr__(self, "eligibility_key", eligibility)
        terms = (self.pod_affinity, self.pod_anti_affinity, self.preferred_affinity,
                 self.preferred_anti_affinity, self.spread, tuple(sorted(set(self.host_ports), key=repr)))
        object.__setattr__(self, "shape_key", (tuple(sorted(self.requests.items())), eligibility, terms))

    @property
    def has_pod_constraints(self) -> bool:
        """Carries anything beyond requests and node eligibility (inter-pod terms, spread, ports)."""
        return bool(self.pod_affinity or self.pod_anti_affinity or self.preferred_affinity
                    or self.preferred_anti_affinity or self.spread or self.host_ports)


@dataclass(frozen=True)
class Pod:
    """A pod: pending (``node`` empty) or bound. ``group`` is ``namespace/name`` of its PodGroup."""

    uid: str
    name: str
    spec: PodSpec = PodSpec()
    node: str = ""
    namespace: str = "default"
    group: str = ""
    #: the pod's labels (what other pods' affinity, anti-affinity and spread selectors match)
    labels: Mapping[str, str] = field(default_factory=dict, compare=False)
    #: the PersistentVolumeClaims it mounts, resolved (see :class:`VolumeClaim`)
    volumes: tuple[VolumeClaim, ...] = ()

    def __post_init__(self) -> None:
        if not self.uid or not self.name:
            raise InvalidInput(f"pod needs a uid and a name, got uid={self.uid!r} name={self.name!r}")

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def by_shape(pods: Iterable[Pod]) -> dict[tuple[object, ...], list[Pod]]:
    """``pods`` grouped by ``spec.shape_key``, keys and members in the order given. Pods sharing a
    spec object (the watch cache gives equal specs one) are grouped by its identity first: a shape
    key is a nested tuple whose hash is recomputed at every lookup (tolerations, affinity terms)."""
    by_spec: dict[int, list[tuple[int, Pod]]] = {}
    for k, pod in enumerate(pods):
        by_spec.setdefault(id(pod.spec), []).append((k, pod))
    # first-seen spec order is first-seen shape order; equal shapes of distinct spec objects merge,
    # their pods back in the order given
    merged: dict[tuple[object, ...], list[tuple[int, Pod]]] = {}
    for members in by_spec.values():
        key = members[0][1].spec.shape_key
        if key in merged:
            merged[key] = sorted(merged[key] + members, key=lambda m: m[0])
        else:
            merged[key] = members
    return {key: [pod for _, pod in members] for key, members in merged.items()}


class Policy(str, enum.Enum):
    BASIC = "basic"
    GANG = "gang"


class DisruptionMode(str, enum.Enum):
    SINGLE = "single"
    ALL = "all"


class PreemptionPolicy(str, enum.Enum):
    """Whether a group may evict lower-priority pods to fit (upstream ``preemptionPolicy``)."""

    PREEMPT_LOWER_PRIORITY = "PreemptLowerPriority"
    NEVER = "Never"


DEFAULT_PREFERENCES = ("pack", "spread")
HOSTNAME_KEY = "kubernetes.io/hostname"


@dataclass(frozen=True)
class PodGroup:
    """A PodGroup and its member pods (bound and pending).

    ``topology_key`` is the required key (at most one, as upstream); ``preferred_keys`` is
    phalanx's ordered list of keys to keep the group compact along, inside the chosen domain.
    """

    namespace: str
    name: str
    members: tuple[Pod, ...]
    policy: Policy = Policy.GANG
    min_count: int = 1
    topology_key: str = ""
    preferred_keys: tuple[str, ...] = ()
    disruption_mode: DisruptionMode = DisruptionMode.SINGLE
    priority: int = 0
    created: float = 0.0
    preemption_policy: PreemptionPolicy = PreemptionPolicy.PREEMPT_LOWER_PRIORITY
    #: what members that state no placement preference of their own get: "pack" (fewest nodes:
    #: what gangs of accelerators want) or "spread" (as if they carried a ScheduleAnyway spread over
    #: kubernetes.io/hostname with maxSkew 1 among the group's members, like kube-scheduler's soft
    #: default spreading of a controller's pods)
    default_preference: str = "pack"
    #: members that ran and finished and still count toward minCount: the gang's history
    #: (docs/design.md: phalanx/gang-history); they are not in ``members`` and hold no capacity
    finished: int = 0

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidInput("podgroup name must not be empty")
        if self.default_preference not in DEFAULT_PREFERENCES:
            raise InvalidInput(f"podgroup {self.key}: placement preference must be one of "
                               f"{', '.join(DEFAULT_PREFERENCES)}, got {self.default_preference!r}")
        try:
            object.__setattr__(self, "preemption_policy", PreemptionPolicy(self.preemption_policy))
        except ValueError:
            raise InvalidInput(
                f"podgroup {self.key}: preemptionPolicy must be PreemptLowerPriority or Never, "
                f"got {self.preemption_policy!r}"
            ) from None
        if isinstance(self.min_count, bool) or not isinstance(self.min_count, int) or self.min_count < 1:
            raise InvalidInput(f"podgroup {self.key}: minCount must be an integer >= 1, got {self.min_count!r}")
        if isinstance(self.finished, bool) or not isinstance(self.finished, int) or self.finished < 0:
            raise InvalidInput(f"podgroup {self.key}: finished members must be an integer >= 0, got {self.finished!r}")
        if self.disruption_mode is DisruptionMode.ALL and self.policy is Policy.BASIC:
            raise InvalidInput(f"podgroup {self.key}: disruptionMode all requires the gang policy")
        uids = [p.uid for p in self.members]
        if len(set(uids)) != len(uids):
            raise InvalidInput(f"podgroup {self.key}: duplicate member pod uid")
        if self.topology_key in self.preferred_keys:
            raise InvalidInput(
                f"podgroup {self.key}: {self.topology_key} is both the required and a preferred key"
            )

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def pending(self) -> tuple[Pod, ...]:
        return tuple(p for p in self.members if not p.node)

    @property
    def bound(self) -> tuple[Pod, ...]:
        return tuple(p for p in self.members if p.node)

    # these rules' one home (docs/design.md: KEP-6277/gang-all-or-nothing, LWS/whole-level-surge)
    @property
    def needed(self) -> int:
        """How many pending members must be placed for the placement to count: minCount less the
        bound members and the finished ones (a gang that ran repairs what it lost: phalanx/gang-history)."""
        if self.policy is Policy.BASIC:
            return 1 if self.pending else 0
        return max(0, self.min_count - len(self.bound) - self.finished)

    # the rule's one home (docs/design.md: KEP-6277/gang-waits-for-members)
    @property
    def missing_members(self) -> str:
        """Why a gang cannot be placed yet — fewer than minCount members exist, finished ones
        counted (phalanx/gang-history) — or "" when it can."""
        count = len(self.members) + self.finished
        if self.policy is Policy.GANG and count < self.min_count:
            finished = f" ({self.finished} of them finished)" if self.finished else ""
            return f"podgroup {self.key}: waiting for members, {count} of {self.min_count} exist{finished}"
        return ""

    def check_ready(self) -> None:
        if self.missing_members:
            raise InvalidInput(self.missing_members)
