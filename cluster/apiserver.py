"""The real API server behind the cluster interface: list + watch into the cache, and the writes.

One thread per watched resource: a paginated list (a full re-list replaces the cache's records of
that kind), then a watch with bookmarks from the list's resourceVersion, resumed from the last
resourceVersion seen when the server closes it; ``410 Gone`` (or an ERROR event carrying it)
starts a full re-list; any other error backs off exponentially (capped) and retries. While a
watch is down the cache keeps serving what it has; :meth:`ApiServerBackend.ready` turns false
once a resource has not been confirmed fresh for ``stale_after`` seconds.

The API flavor is chosen by discovery at start (:func:`detect_flavor`, the one rule ``phalanx serve``
and ``phalanx controller`` share): the built-in ``scheduling.k8s.io/v1beta1`` when it serves both
Workloads and PodGroups, else the CRD fallback ``scheduling.phalanx.dev/v1beta1`` when that does.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from datetime import datetime, timezone
from typing import Any, Mapping

from . import names
from .backend import Expected, WriteError
from .cache import ClusterCache
from .karpenter import NodeClaimAsk, NodePoolRecord, nodeclaim_json
from .kube import JSON_PATCH, MERGE_PATCH, Kube, KubeError, api_path
from .provisioning import ProvisioningAsk, pod_template_json, provisioning_request_json

log = logging.getLogger("phalanx.apiserver")


BUILTIN, CRD = "builtin", "crd"
FLAVOR_GROUPS = {BUILTIN: names.SCHEDULING_GROUP, CRD: names.CRD_GROUP}
FLAVOR_RESOURCES = frozenset({"workloads", "podgroups"})


#: kinds whose API may not be served (yet): a 404 counts as synced, with nothing to cache
#: (ProvisioningRequests are served only where cluster-autoscaler's CRD is installed, NodeClaims and
#: NodePools where Karpenter's are)
OPTIONAL_KINDS = frozenset({"PodGroup", "Workload", "ProvisioningRequest", "CompositePodGroup", "NodeClaim",
                            "NodePool"})


class FlavorUnavailable(RuntimeError):
    """Neither the built-in Workload API nor phalanx's CRDs are served."""


def detect_flavor(kube: Kube) -> str:
    """``builtin`` when the API server serves scheduling.k8s.io/v1beta1 workloads and podgroups,
    else ``crd`` when it serves phalanx's scheduling.phalanx.dev/v1beta1 CRDs; raises
    FlavorUnavailable when it serves neither (phalanx would watch nothing)."""
    for flavor, group in FLAVOR_GROUPS.items():
        if FLAVOR_RESOURCES <= (kube.served_resources(f"{group}/{names.SCHEDULING_VERSION}") or set()):
            return flavor
    raise FlavorUnavailable(
        f"the API server serves neither {names.SCHEDULING_GROUP}/{names.SCHEDULING_VERSION} nor "
        f"{names.CRD_GROUP}/{names.SCHEDULING_VERSION} workloads and podgroups: enable the built-in API "
        "(GenericWorkload and --runtime-config=scheduling.k8s.io/v1beta1=true on kube-apiserver) or "
        "apply phalanx's CRDs (kubectl apply -k scheduler-config/crds/)")


#: how the API server's JSON patch says a ``test`` operation failed (422): the value differs, or
#: the map it names is absent
_TEST_FAILED = ("test failed", "test operation does not apply")


def guarded_annotations_patch(annotations: Mapping[str, str | None], expect: Expected) -> list[dict[str, Any]]:
    """A JSON patch (RFC 6902) writing ``annotations`` (None removes one) only while the object's
    annotations read as ``expect`` says: its ``test`` operations make the API server refuse it
    otherwise, whatever else changed (a ``test`` of null passes where the key is absent, as the
    API server's JSON patch implements it)."""
    if not expect.annotated:  # no annotations at all: the whole map is added
        added = {k: v for k, v in annotations.items() if v is not None}
        ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/annotations", "value": None}]
        return ops + ([{"op": "add", "path": "/metadata/annotations", "value": added}] if added else [])
    ops = []
    for key, value in annotations.items():
        path = "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")
        known = expect.values.get(key)
        ops.append({"op": "test", "path": path, "value": known})
        if value is not None:
            ops.append({"op": "add", "path": path, "value": value})
        elif known is not None:
            ops.append({"op": "remove", "path": path})
    return ops


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


#: a watch's wait before trying again after a failure (s): doubled from the first after each
#: failure in a row, up to the most
WATCH_BACKOFF_FIRST = 0.2
WATCH_BACKOFF_MAX = 10.0


def watch_backoff(backoff: float, delivered: bool) -> float:
    """The wait after a failed try of a watch: the first wait again when the try had delivered
    (listed, or streamed an event) — a stream that ran for minutes and broke is a new failure, not
    the last one repeating, and the backoff a past outage had built up (10 s) would keep phalanx's
    view that much behind kube-scheduler's after the link healed — else ``backoff``."""
    return WATCH_BACKOFF_FIRST if delivered else backoff


class ApiServerBackend:
    def __init__(self, kube: Kube, cache: ClusterCache, stale_after: float = 60.0,
                 identity: str = "phalanx", karpenter: bool = False) -> None:
        self.kube = kube
        self.cache = cache
        self.stale_after = stale_after
        self.identity = identity
        self.flavor = detect_flavor(kube)
        self.scheduling_gv = f"{FLAVOR_GROUPS[self.flavor]}/{names.SCHEDULING_VERSION}"
        self.resources: dict[str, tuple[str, str]] = {
            "Node": ("v1", "nodes"),
            "Pod": ("v1", "pods"),
            "PodGroup": (self.scheduling_gv, "podgroups"),
            "Workload": (self.scheduling_gv, "workloads"),
            "PriorityClass": ("scheduling.k8s.io/v1", "priorityclasses"),
            "PodDisruptionBudget": ("policy/v1", "poddisruptionbudgets"),
            "PersistentVolumeClaim": ("v1", "persistentvolumeclaims"),
            "PersistentVolume": ("v1", "persistentvolumes"),
            "StorageClass": ("storage.k8s.io/v1", "storageclasses"),
            "CSINode": ("storage.k8s.io/v1", "csinodes"),
            "Namespace": ("v1", "namespaces"),
            "ProvisioningRequest": (names.PROVISIONING_API_VERSION, "provisioningrequests"),
        }
        # built in: served only with the CompositePodGroup gate and v1alpha3 on; the CRD flavor's
        # is the third CRD of scheduler-config/crds (optional: absent, said once)
        self.resources["CompositePodGroup"] = (f"{FLAVOR_GROUPS[self.flavor]}/{names.COMPOSITE_VERSION}",
                                               "compositepodgroups")
        if karpenter:  # serve --provisioner karpenter: a gang's NodeClaims, the NodePool they copy
            self.resources["NodeClaim"] = (names.KARPENTER_API_VERSION, "nodeclaims")
            self.resources["NodePool"] = (names.KARPENTER_API_VERSION, "nodepools")
        self.synced: dict[str, bool] = {k: False for k in self.resources}
        self.fresh_at: dict[str, float] = {k: 0.0 for k in self.resources}
        self.relists = 0
        self._absent: set[str] = set()  # optional kinds found not served (said once)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # -- watching ---------------------------------------------------------------------------
    def start(self) -> None:
        for kind in self.resources:
            thread = threading.Thread(target=self._run, args=(kind,), name=f"watch-{kind}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()

    def wait_synced(self, timeout: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(self.synced.values()):
                return True
            time.sleep(0.05)
        return False

    def ready(self) -> tuple[bool, str]:
        now = time.monotonic()
        unsynced = [k for k, ok in self.synced.items() if not ok]
        if unsynced:
            return False, f"caches not synced: {', '.join(unsynced)}"
        stale = [k for k, t in self.fresh_at.items() if now - t > self.stale_after]
        if stale:
            return False, f"caches stale (no watch progress for {self.stale_after:.0f}s): {', '.join(stale)}"
        return True, "ok"

    def _run(self, kind: str) -> None:
        group_version, resource = self.resources[kind]
        path = api_path(group_version, resource)
        backoff = WATCH_BACKOFF_FIRST
        resource_version = ""
        while not self._stop.is_set():
            tried = time.monotonic()
            try:
                if not resource_version:
                    items, resource_version = self.kube.list_pages(path)
                    self._absent.discard(kind)
                    self.cache.replace(kind, items)
                    self.relists += 1
                    self.synced[kind] = True
                    self.fresh_at[kind] = time.monotonic()
                resource_version = self._watch(kind, path, resource_version)
                backoff = WATCH_BACKOFF_FIRST
            except KubeError as err:
                if err.status == 410:
                    resource_version = ""  # too old: full re-list
                    continue
                backoff = watch_backoff(backoff, self.fresh_at[kind] > tried)
                if err.status == 404 and kind in OPTIONAL_KINDS:
                    self.synced[kind] = True  # not served (yet): nothing to cache
                    self.fresh_at[kind] = time.monotonic()
                    # said once, not every 10 s for the life of the process (an optional CRD that is
                    # not installed is the common case, not a fault)
                    (log.debug if kind in self._absent else log.info)(
                        "%s is not served by the API server (its CRD is not installed); looking again "
                        "every %.0fs at most", kind, WATCH_BACKOFF_MAX)
                    self._absent.add(kind)
                else:
                    log.warning("watch %s: %s; retrying in %.1fs", kind, err, backoff)
            except Exception as err:  # noqa: BLE001 - a watch thread must survive anything
                backoff = watch_backoff(backoff, self.fresh_at[kind] > tried)
                log.warning("watch %s failed: %s; retrying in %.1fs", kind, err, backoff)
            self._stop.wait(backoff)
            backoff = min(backoff * 2, WATCH_BACKOFF_MAX)

    def _watch(self, kind: str, path: str, resource_version: str) -> str:
        for event in self.kube.watch(path, resource_version, timeout_seconds=240):
            if self._stop.is_set():
                break
            etype, obj = event.get("type") or "", event.get("object") or {}
            if etype == "ERROR":
                code = obj.get("code", 0)
                raise KubeError("WATCH", path, int(code or 500), obj.get("message", ""))
            resource_version = str((obj.get("metadata") or {}).get("resourceVersion") or resource_version)
            self.fresh_at[kind] = time.monotonic()
            if etype == "BOOKMARK":
                continue
            self.cache.apply(kind, etype, obj)
        self.fresh_at[kind] = time.monotonic()
        return resource_version

    # -- ClusterWriter ----------------------------------------------------------------------
    def _write(self, method: str, path: str, body: Any, content_type: str = "application/json") -> Any:
        try:
            return self.kube.request(method, path, body, content_type=content_type)
        except KubeError as err:
            raise WriteError(str(err), err.status, err.reason) from None

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        body = {"apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": name, "namespace": namespace, "uid": uid},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        self._write("POST", api_path("v1", "pods", namespace, name, "binding"), body)

    def evict(self, namespace: str, name: str, uid: str, message: str, respect_pdb: bool) -> None:
        """The ``DisruptionTarget`` condition goes on a pod only when it really goes: with PDBs
        respected the Eviction comes first (a refusal, 429, leaves the pod untouched, as the API
        server's own eviction does), else the condition and then a plain DELETE."""
        pod_path = api_path("v1", "pods", namespace, name)
        preconditions = {"uid": uid}
        if respect_pdb:
            body = {"apiVersion": "policy/v1", "kind": "Eviction",
                    "metadata": {"name": name, "namespace": namespace},
                    "deleteOptions": {"preconditions": preconditions}}
            self._write("POST", pod_path + "/eviction", body)
            self._mark_disruption_target(pod_path, namespace, name, message)
        else:
            self._mark_disruption_target(pod_path, namespace, name, message)
            self._write("DELETE", pod_path, {"apiVersion": "v1", "kind": "DeleteOptions",
                                             "preconditions": preconditions})

    def _mark_disruption_target(self, pod_path: str, namespace: str, name: str, message: str) -> None:
        condition = {"type": names.CONDITION_DISRUPTION_TARGET, "status": "True",
                     "reason": names.REASON_PREEMPTION_BY_SCHEDULER, "message": message,
                     "lastTransitionTime": _now()[:19] + "Z"}
        try:
            self._write("PATCH", pod_path + "/status", {"status": {"conditions": [condition]}},
                        "application/strategic-merge-patch+json")
        except WriteError as err:
            log.info("could not mark %s/%s as a disruption target: %s", namespace, name, err)

    def patch_podgroup_status(self, namespace: str, name: str, status: Mapping[str, Any],
                              resource_version: str = "") -> str:
        path = api_path(self.scheduling_gv, "podgroups", namespace, name, "status")
        return self._patch_versioned(path, {"status": dict(status)}, resource_version)

    def annotate_podgroup(self, namespace: str, name: str, annotations: Mapping[str, str | None],
                          resource_version: str = "", expect: Expected | None = None) -> str:
        path = api_path(self.scheduling_gv, "podgroups", namespace, name)
        if expect is None:
            return self._patch_versioned(path, {"metadata": {"annotations": dict(annotations)}}, resource_version)
        try:
            answer = self._write("PATCH", path, guarded_annotations_patch(annotations, expect), JSON_PATCH)
        except WriteError as err:
            if err.status == 422 and any(text in str(err) for text in _TEST_FAILED):
                raise WriteError(f"the annotations of podgroup {namespace}/{name} changed: {err}",
                                 409, "Conflict") from None
            raise
        return str(((answer or {}).get("metadata") or {}).get("resourceVersion") or "")

    def _patch_versioned(self, path: str, body: dict[str, Any], resource_version: str) -> str:
        """A merge patch that the API server applies only to ``resource_version`` of the object
        (a resourceVersion in a patch is a precondition: 409 Conflict when the object moved on);
        the version the write made."""
        if resource_version:
            body.setdefault("metadata", {})["resourceVersion"] = resource_version
        answer = self._write("PATCH", path, body, MERGE_PATCH)
        return str(((answer or {}).get("metadata") or {}).get("resourceVersion") or "")

    def annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        self._write("PATCH", api_path("v1", "pods", namespace, name), {"metadata": {"annotations": dict(annotations)}},
                    MERGE_PATCH)

    def create_provisioning_request(self, ask: ProvisioningAsk) -> None:
        for i in range(len(ask.pod_sets)):
            self._create_once(api_path("v1", "podtemplates", ask.namespace),
                              pod_template_json(ask, i, self.scheduling_gv))
        self._create_once(api_path(names.PROVISIONING_API_VERSION, "provisioningrequests", ask.namespace),
                          provisioning_request_json(ask, self.scheduling_gv))

    def _create_once(self, path: str, body: Mapping[str, Any]) -> None:
        """Create ``body``; one of that name that exists already is kept (409 AlreadyExists)."""
        try:
            self._write("POST", path, body)
        except WriteError as err:
            if err.status != 409:
                raise

    def delete_provisioning_request(self, namespace: str, name: str, templates: tuple[str, ...]) -> None:
        paths = [api_path(names.PROVISIONING_API_VERSION, "provisioningrequests", namespace, name)]
        paths += [api_path("v1", "podtemplates", namespace, t) for t in templates]
        for path in paths:
            try:
                self._write("DELETE", path, None)
            except WriteError as err:
                if err.status != 404:
                    raise

    def create_nodeclaim(self, ask: NodeClaimAsk, pool: NodePoolRecord) -> None:
        self._create_once(api_path(names.KARPENTER_API_VERSION, "nodeclaims"), nodeclaim_json(ask, pool))

    def delete_nodeclaim(self, name: str) -> None:
        try:
            self._write("DELETE", api_path(names.KARPENTER_API_VERSION, "nodeclaims", name=name), None)
        except WriteError as err:
            if err.status != 404:
                raise

    def release_nodeclaim(self, name: str, node: str) -> None:
        body = {"metadata": {"annotations": {names.ANNOTATION_KARPENTER_DO_NOT_DISRUPT: None}}}
        paths = [api_path(names.KARPENTER_API_VERSION, "nodeclaims", name=name)]
        paths += [api_path("v1", "nodes", name=node)] if node else []
        for path in paths:
            try:
                self._write("PATCH", path, body, MERGE_PATCH)
            except WriteError as err:
                if err.status != 404:
                    raise

    def event(self, regarding: Mapping[str, str], reason: str, note: str, type_: str = "Normal") -> None:
        namespace = regarding.get("namespace") or "default"
        body = {
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": f"{regarding.get('name', 'phalanx')}.{uuid.uuid4().hex[:10]}",
                         "namespace": namespace},
            "eventTime": _now(),
            "reportingController": "phalanx.dev/scheduler",
            "reportingInstance": self.identity,
            "action": "Scheduling",
            "reason": reason,
            "note": note[:1024],
            "type": type_,
            "regarding": {"apiVersion": self.scheduling_gv if regarding.get("kind") == "PodGroup" else "v1",
                          **{k: v for k, v in regarding.items() if v}},
        }
        self._write("POST", api_path("events.k8s.io/v1", "events", namespace), body)


