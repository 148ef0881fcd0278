"""The simulated cluster: an in-memory API server for the demo, the fast tests and the benchmarks.

It is a simulation, and only as big as phalanx needs: it stores raw Kubernetes objects, feeds a
:class:`~cluster.cache.ClusterCache` the same ADDED/MODIFIED/DELETED events a watch would, and
implements :class:`~cluster.backend.ClusterWriter`. Of the built-in controllers it simulates only
what phalanx relies on: StatefulSet pod creation (Parallel and OrderedReady) and scaling,
ownerReference garbage collection, bound pods becoming Running/Ready, and pods finishing after a
duration (annotation ``sim.phalanx.dev/duration-seconds``). Time is a deterministic clock that
only moves when :meth:`SimCluster.advance` is called.
"""

from __future__ import annotations

import builtins
import copy
import itertools
import threading
from typing import Any, Callable, Mapping

import yaml

from . import kinds, names
from .backend import Expected, WriteError
from .cache import KINDS as CACHED_KINDS
from .cache import ClusterCache
from .karpenter import NodeClaimAsk, NodePoolRecord, nodeclaim_json
from .provisioning import ProvisioningAsk, pod_template_json, provisioning_request_json

SIM_DURATION = "sim.phalanx.dev/duration-seconds"
KINDS = (*CACHED_KINDS, "StatefulSet", "PodTemplate")
CLUSTER_SCOPED = ("Node", "PriorityClass", "PersistentVolume", "StorageClass", "CSINode", "Namespace", "NodeClaim",
                  "NodePool")

#: A stored object: raw JSON the simulation owns and mutates in place.
Object = dict[str, Any]


class SimCluster:
    """In-memory cluster. Thread-safe; every change is pushed to the attached caches."""

    flavor = "builtin"

    def __init__(self, cache: ClusterCache | None = None) -> None:
        self.cache = cache or ClusterCache()
        self.objects: dict[tuple[str, str], Object] = {}  # (kind, ns/name) -> object
        # indexes over ``objects``, kept by _index/_unindex: per kind, and owner uid -> dependents,
        # so listing a kind and collecting garbage do not scan every object (10,000s in the tests)
        self._by_kind: dict[str, dict[str, Object]] = {}
        self._dependents: dict[str, set[tuple[str, str]]] = {}
        self._owners_of: dict[tuple[str, str], tuple[str, ...]] = {}
        self.events: list[Object] = []
        self.now = 0.0
        self.binding_delay = 0.0  # seconds of simulated time a binding takes (for the demo)
        self._uids = itertools.count(1)
        self._rv = itertools.count(1)
        self._lock = threading.RLock()
        self._finish_at: dict[str, float] = {}  # pod uid -> simulated time it completes

    # -- object store -----------------------------------------------------------------------
    @staticmethod
    def _key(obj: Mapping[str, Any]) -> str:
        meta = obj["metadata"]
        ns = meta.get("namespace")
        return f"{ns}/{meta['name']}" if ns else meta["name"]

    def create(self, raw: Mapping[str, Any]) -> Object:
        obj = copy.deepcopy(dict(raw))
        kind = obj.get("kind")
        if kind not in KINDS:
            raise WriteError(f"simulated cluster does not serve kind {kind!r}", 400)
        meta = obj.setdefault("metadata", {})
        if kind not in CLUSTER_SCOPED:
            meta.setdefault("namespace", "default")
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = f"{meta['generateName']}{next(self._uids):05d}"
        with self._lock:
            key = (kind, self._key(obj))
            if key in self.objects:
                raise WriteError(f"{kind} {key[1]} already exists", 409, "AlreadyExists")
            meta.setdefault("uid", f"uid-{next(self._uids)}")
            meta.setdefault("creationTimestamp", f"2026-01-01T00:00:{int(self.now) % 60:02d}Z")
            meta["resourceVersion"] = str(next(self._rv))
            if kind == "Pod":
                obj.setdefault("status", {}).setdefault("phase", "Pending")
            self.objects[key] = obj
            self._index(key, obj)
            self._publish(kind, "ADDED", obj)
            if kind == "StatefulSet":
                self._reconcile_statefulset(obj)
        return obj

    def get(self, kind: str, key: str) -> Object | None:
        with self._lock:
            return self.objects.get((kind, key))

    def list(self, kind: str) -> builtins.list[Object]:
        with self._lock:
            return list(self._by_kind.get(kind, {}).values())

    def _index(self, key: tuple[str, str], obj: Object) -> None:
        self._unown(key)
        self._by_kind.setdefault(key[0], {})[key[1]] = obj  # an update keeps its place: lists stay in creation order
        owners = tuple(str(ref.get("uid")) for ref in obj["metadata"].get("ownerReferences") or ()
                       if isinstance(ref, Mapping) and ref.get("uid"))
        if owners:
            self._owners_of[key] = owners
            for uid in owners:
                self._dependents.setdefault(uid, set()).add(key)

    def _unindex(self, key: tuple[str, str]) -> None:
        self._by_kind.get(key[0], {}).pop(key[1], None)
        self._unown(key)

    def _unown(self, key: tuple[str, str]) -> None:
        for uid in self._owners_of.pop(key, ()):
            deps = self._dependents.get(uid)
            if deps is not None:
                deps.discard(key)
                if not deps:
                    del self._dependents[uid]

    def update(self, kind: str, key: str, mutate: Callable[[Object], object]) -> Object:
        with self._lock:
            obj = self.objects.get((kind, key))
            if obj is None:
                raise WriteError(f"{kind} {key} not found", 404, "NotFound")
            mutate(obj)
            self._index((kind, key), obj)  # owner references may have changed
            obj["metadata"]["resourceVersion"] = str(next(self._rv))
            self._publish(kind, "MODIFIED", obj)
            if kind == "StatefulSet":
                self._reconcile_statefulset(obj)
            return obj

    def delete(self, kind: str, key: str) -> None:
        with self._lock:
            obj = self.objects.pop((kind, key), None)
            if obj is None:
                raise WriteError(f"{kind} {key} not found", 404, "NotFound")
            self._unindex((kind, key))
            self._publish(kind, "DELETED", obj)
            self._collect_garbage(obj["metadata"]["uid"])
            for sts in self.list("StatefulSet"):
                self._reconcile_statefulset(sts)

    def load_yaml(self, text: str) -> builtins.list[Object]:
        """Create every object of a multi-document YAML manifest (the ``--sim`` file: Nodes, Pods —
        bound ones with ``spec.nodeName`` —, PodGroups, PriorityClasses, StatefulSets, ...; see
        docs/operations.md). Raises ValueError naming the document that cannot be created."""
        try:
            documents = [doc for doc in yaml.safe_load_all(text) if doc]
        except yaml.YAMLError as err:
            raise ValueError(f"not YAML: {err}") from None
        created = []
        for i, doc in enumerate(documents, 1):
            meta = doc.get("metadata") if isinstance(doc, dict) else None
            if not isinstance(meta, dict) or not isinstance(meta.get("name") or meta.get("generateName"), str):
                raise ValueError(f"document {i}: not a Kubernetes object with metadata.name")
            try:
                created.append(self.create(doc))
            except (WriteError, KeyError, TypeError, AttributeError, ValueError) as err:
                raise ValueError(f"document {i} ({doc.get('kind')} {meta.get('name')}): {err}") from None
        return created

    def _publish(self, kind: str, event: str, obj: Mapping[str, Any]) -> None:
        if kind in CACHED_KINDS:
            self.cache.apply(kind, event, copy.deepcopy(obj))

    # -- generators -------------------------------------------------------------------------
    def add_nodes(self, zones: int, racks_per_zone: int, nodes_per_rack: int, gpus: int = 8,
                  cpu: str = "64", memory: str = "512Gi", prefix: str = "node") -> builtins.list[str]:
        created = []
        for z in range(zones):
            for r in range(racks_per_zone):
                rack = f"z{z}-r{r}"
                for i in range(nodes_per_rack):
                    name = f"{prefix}-{rack}-{i}"
                    allocatable = {"cpu": cpu, "memory": memory, "pods": "110"}
                    if gpus:
                        allocatable["nvidia.com/gpu"] = str(gpus)
                    self.create({
                        "kind": "Node", "apiVersion": "v1",
                        "metadata": {"name": name, "labels": {
                            names.LABEL_HOSTNAME: name, names.LABEL_ZONE: f"zone-{z}", names.LABEL_RACK: rack}},
                        "status": {"allocatable": allocatable, "capacity": dict(allocatable),
                                   "conditions": [{"type": "Ready", "status": "True"}]},
                    })
                    created.append(name)
        return created

    # -- ClusterWriter ----------------------------------------------------------------------
    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        key = f"{namespace}/{name}"
        with self._lock:
            pod = self.objects.get(("Pod", key))
            if pod is None or pod["metadata"]["uid"] != uid:
                raise WriteError(f"pod {key} (uid {uid}) not found", 404, "NotFound")
            if pod["spec"].get("nodeName"):
                raise WriteError(f"pod {key} is already assigned to {pod['spec']['nodeName']}", 409, "Conflict")
            if ("Node", node) not in self.objects:
                raise WriteError(f"node {node} not found", 404, "NotFound")

            def assign(obj: Object) -> None:
                obj["spec"]["nodeName"] = node
                obj["status"]["phase"] = "Running"
                obj["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"},
                                               {"type": "Ready", "status": "True"}]

            self.update("Pod", key, assign)
            duration = (pod["metadata"].get("annotations") or {}).get(SIM_DURATION)
            if duration:
                self._finish_at[uid] = self.now + float(duration)
            for sts in self.list("StatefulSet"):
                self._reconcile_statefulset(sts)

    def evict(self, namespace: str, name: str, uid: str, message: str, respect_pdb: bool) -> None:
        key = f"{namespace}/{name}"
        with self._lock:
            pod = self.objects.get(("Pod", key))
            if pod is None or pod["metadata"]["uid"] != uid:
                raise WriteError(f"pod {key} not found", 404, "NotFound")
            if respect_pdb and self._pdb_blocks(pod):
                raise WriteError(f"evicting {key} would violate a PodDisruptionBudget", 429, "TooManyRequests")
            self.update("Pod", key, lambda obj: obj["status"].setdefault("conditions", []).append({
                "type": names.CONDITION_DISRUPTION_TARGET, "status": "True",
                "reason": names.REASON_PREEMPTION_BY_SCHEDULER, "message": message}))
            self.delete("Pod", key)

    def _pdb_blocks(self, pod: Mapping[str, Any]) -> bool:
        labels = pod["metadata"].get("labels") or {}
        for pdb in self.list("PodDisruptionBudget"):
            if pdb["metadata"].get("namespace") != pod["metadata"].get("namespace"):
                continue
            selector = (pdb.get("spec") or {}).get("selector", {}).get("matchLabels") or {}
            if selector and all(labels.get(k) == v for k, v in selector.items()):
                if int((pdb.get("status") or {}).get("disruptionsAllowed", 0)) <= 0:
                    return True
        return False

    def patch_podgroup_status(self, namespace: str, name: str, status: Mapping[str, Any],
                              resource_version: str = "") -> str:
        def patch(obj: Object) -> None:
            _at_version(obj, resource_version)
            obj.setdefault("status", {}).update(copy.deepcopy(dict(status)))
        return str(self.update("PodGroup", f"{namespace}/{name}", patch)["metadata"]["resourceVersion"])

    def annotate_podgroup(self, namespace: str, name: str, annotations: Mapping[str, str | None],
                          resource_version: str = "", expect: Expected | None = None) -> str:
        def patch(obj: Object) -> None:
            _at_version(obj, resource_version)
            _as_expected(obj, expect)
            _annotate(obj, annotations)
        return str(self.update("PodGroup", f"{namespace}/{name}", patch)["metadata"]["resourceVersion"])

    def annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        self.update("Pod", f"{namespace}/{name}", lambda obj: _annotate(obj, annotations))

    def create_provisioning_request(self, ask: ProvisioningAsk) -> None:
        api_version = f"{names.SCHEDULING_GROUP}/{names.SCHEDULING_VERSION}"
        bodies = [pod_template_json(ask, i, api_version) for i in range(len(ask.pod_sets))]
        for body in [*bodies, provisioning_request_json(ask, api_version)]:
            try:
                self.create(body)
            except WriteError as err:
                if err.status != 409:
                    raise

    def delete_provisioning_request(self, namespace: str, name: str, templates: tuple[str, ...]) -> None:
        for kind, obj in [("ProvisioningRequest", name), *(("PodTemplate", t) for t in templates)]:
            try:
                self.delete(kind, f"{namespace}/{obj}")
            except WriteError as err:
                if err.status != 404:
                    raise

    def create_nodeclaim(self, ask: NodeClaimAsk, pool: NodePoolRecord) -> None:
        try:
            self.create(nodeclaim_json(ask, pool))
        except WriteError as err:
            if err.status != 409:
                raise

    def delete_nodeclaim(self, name: str) -> None:
        try:
            self.delete("NodeClaim", name)
        except WriteError as err:
            if err.status != 404:
                raise

    def release_nodeclaim(self, name: str, node: str) -> None:
        for kind, key in [("NodeClaim", name), *([("Node", node)] if node else [])]:
            try:
                self.update(kind, key, lambda obj: _annotate(obj, {names.ANNOTATION_KARPENTER_DO_NOT_DISRUPT: None}))
            except WriteError as err:
                if err.status != 404:
                    raise

    def event(self, regarding: Mapping[str, str], reason: str, note: str, type_: str = "Normal") -> None:
        with self._lock:
            self.events.append({"regarding": dict(regarding), "reason": reason, "note": note, "type": type_,
                                "time": self.now})

    # -- simulated controllers --------------------------------------------------------------
    def advance(self, seconds: float) -> None:
        """Move the simulated clock; pods whose duration ran out finish (phase Succeeded)."""
        with self._lock:
            self.now += seconds
            due = [uid for uid, t in self._finish_at.items() if t <= self.now]
            for uid in due:
                del self._finish_at[uid]
                pod = next((p for p in self.list("Pod") if p["metadata"]["uid"] == uid), None)
                if pod is not None:
                    self.update("Pod", self._key(pod), lambda obj: obj["status"].update(phase="Succeeded"))

    def _collect_garbage(self, owner_uid: str) -> None:
        for kind, key in sorted(self._dependents.get(owner_uid, ())):
            if (kind, key) in self.objects:
                self.delete(kind, key)

    def _reconcile_statefulset(self, sts: Mapping[str, Any]) -> None:
        """StatefulSet pod creation and deletion, Parallel or OrderedReady, as far as phalanx needs."""
        ns, name = sts["metadata"]["namespace"], sts["metadata"]["name"]
        spec = sts.get("spec") or {}
        replicas = int(spec.get("replicas", 1))
        ordered = spec.get("podManagementPolicy", "OrderedReady") != "Parallel"
        template = spec.get("template") or {}
        for ordinal in range(replicas):
            pod_key = f"{ns}/{name}-{ordinal}"
            existing = self.objects.get(("Pod", pod_key))
            if existing is None:
                self.create(self._sts_pod(sts, template, ordinal))
                if ordered:
                    return
            elif ordered and not _ready(existing):
                return
        for pod in self.list("Pod"):
            owner: Mapping[str, Any] = next(
                (r for r in pod["metadata"].get("ownerReferences") or () if r.get("controller")), {})
            if owner.get("uid") != sts["metadata"]["uid"]:
                continue
            ordinal = pod["metadata"]["name"].rsplit("-", 1)[-1]
            if ordinal.isdigit() and int(ordinal) >= replicas and ("Pod", self._key(pod)) in self.objects:
                self.delete("Pod", self._key(pod))  # (a nested reconcile may have deleted it already)

    @staticmethod
    def _sts_pod(sts: Mapping[str, Any], template: Mapping[str, Any], ordinal: int) -> Object:
        meta = sts["metadata"]
        return kinds.owned_pod_json(template, f"{meta['name']}-{ordinal}", meta["namespace"],
                                    {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": meta["name"],
                                     "uid": meta["uid"]})


def _at_version(obj: Object, resource_version: str) -> None:
    """A write conditional on ``resource_version`` refused as the API server refuses it (409)."""
    current = obj["metadata"].get("resourceVersion")
    if resource_version and current != resource_version:
        raise WriteError(f"Operation cannot be fulfilled on {obj.get('kind', 'object')} "
                         f"{obj['metadata'].get('name')}: the object has been modified (version {current}, "
                         f"not {resource_version})", 409, "Conflict")


def _as_expected(obj: Object, expect: Expected | None) -> None:
    """A guarded annotation write refused (409) as the API server refuses its JSON patch's tests."""
    if expect is None:
        return
    current = obj["metadata"].get("annotations") or {}
    if bool(current) != expect.annotated or any(current.get(k) != v for k, v in expect.values.items()):
        raise WriteError(f"Operation cannot be fulfilled on {obj.get('kind', 'object')} "
                         f"{obj['metadata'].get('name')}: its annotations changed", 409, "Conflict")


def _annotate(obj: Object, annotations: Mapping[str, str | None]) -> None:
    current = obj["metadata"].setdefault("annotations", {})
    for k, v in annotations.items():
        if v is None:
            current.pop(k, None)
        else:
            current[k] = v


def _ready(pod: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or ())
