"""Nodes without kubelets.

``node()`` builds a Node; ``create_node`` creates it and sets its status (capacity, allocatable,
Ready) through the status subresource, as a kubelet would on registration. ``FakeKubelet`` is a
background thread that plays the kubelet's part for pods bound to any node: it marks them Running
and Ready (so OrderedReady StatefulSets progress) and finishes their graceful deletion (so
deletions, garbage collection and preemption complete).
"""

from __future__ import annotations

import datetime as _dt
import itertools
import logging
import threading
from contextlib import contextmanager
from typing import Any, Iterator, Mapping

from cluster.kube import STRATEGIC_MERGE_PATCH, Kube, KubeError

log = logging.getLogger(__name__)

ZONE = "topology.kubernetes.io/zone"
RACK = "topology.kubernetes.io/rack"  # not a well-known label; KEP-6277 uses it anyway
GPU = "nvidia.com/gpu"

_node_ips = itertools.count(1)
_pod_ips = itertools.count(1)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _ip(prefix: int, n: int) -> str:
    return f"10.{prefix}.{(n // 250) % 250}.{n % 250 + 1}"


def node(name: str, cpu: str | int = "8", memory: str = "32Gi", pods: int = 110, gpu: int = 0,
         zone: str | None = None, rack: str | None = None, labels: Mapping[str, str] | None = None,
         taints: list[dict] | None = None, unschedulable: bool = False,
         extra_resources: Mapping[str, str] | None = None) -> dict:
    """A Node object with its status (capacity == allocatable) filled in."""
    all_labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                  "kubernetes.io/arch": "amd64", "phalanx.dev/e2e-node": "true"}
    if zone:
        all_labels[ZONE] = zone
    if rack:
        all_labels[RACK] = rack
    all_labels.update(labels or {})
    resources = {"cpu": str(cpu), "memory": memory, "pods": str(pods), "ephemeral-storage": "100Gi"}
    if gpu:
        resources[GPU] = str(gpu)
    resources.update(extra_resources or {})
    now = _now()
    conditions = [{"type": t, "status": "False", "reason": f"Kubelet Has No{t}",
                   "lastHeartbeatTime": now, "lastTransitionTime": now}
                  for t in ("MemoryPressure", "DiskPressure", "PIDPressure")]
    conditions.append({"type": "Ready", "status": "True", "reason": "KubeletReady",
                       "message": "phalanx e2e node (no kubelet)",
                       "lastHeartbeatTime": now, "lastTransitionTime": now})
    spec: dict[str, Any] = {}
    if taints:
        spec["taints"] = taints
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": all_labels},
        "spec": spec,
        "status": {
            "capacity": resources, "allocatable": dict(resources), "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": _ip(1, next(_node_ips))},
                          {"type": "Hostname", "address": name}],
            "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux",
                         "kubeletVersion": "v0.0.0-phalanx-e2e", "containerRuntimeVersion": "fake://0",
                         "kernelVersion": "", "osImage": "", "kubeProxyVersion": "",
                         "machineID": "", "systemUUID": "", "bootID": ""},
        },
    }


def create_node(rest: Kube, name: str, **kwargs: Any) -> dict:
    """Create a Node (see ``node``) and set its status through the status subresource."""
    body = node(name, **kwargs)
    status = body.pop("status")
    rest.create("/api/v1/nodes", body)
    rest.patch(f"/api/v1/nodes/{name}/status", {"status": status})
    # The TaintNodesByCondition admission plugin adds node.kubernetes.io/not-ready on create; the
    # node lifecycle controller (off here: no heartbeats) would lift it once Ready. Lift it now.
    return rest.patch(f"/api/v1/nodes/{name}", {"spec": {"taints": body["spec"].get("taints")}})


def delete_node(rest: Kube, name: str) -> None:
    rest.delete(f"/api/v1/nodes/{name}", missing_ok=True)


def _ready(pod: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in pod.get("status", {}).get("conditions") or [])


def running_status(pod: dict, ip: str, host_ip: str) -> dict:
    now = _now()
    containers = pod["spec"].get("containers") or []
    return {
        "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}], "startTime": now,
        "conditions": [{"type": t, "status": "True", "lastTransitionTime": now}
                       for t in ("PodScheduled", "Initialized", "PodReadyToStartContainers",
                                 "ContainersReady", "Ready")],
        "containerStatuses": [{
            "name": c["name"], "image": c.get("image", ""), "imageID": "",
            "containerID": f"fake://{pod['metadata']['uid']}/{c['name']}",
            "ready": True, "started": True, "restartCount": 0,
            "state": {"running": {"startedAt": now}},
        } for c in containers],
    }


class FakeKubelet(threading.Thread):
    """Polls bound pods; Running+Ready for new ones, immediate removal for terminating ones."""

    def __init__(self, rest: Kube, interval: float = 0.25):
        super().__init__(name="phalanx-e2e-fake-kubelet", daemon=True)
        self.rest, self.interval = rest, interval
        self._halt = threading.Event()
        self._hold_deletions = threading.Event()
        self.errors: list[str] = []

    @contextmanager
    def deletions_held(self) -> Iterator[None]:
        """Leave terminating pods terminating meanwhile (to observe e.g. preemption victims)."""
        self._hold_deletions.set()
        try:
            yield
        finally:
            self._hold_deletions.clear()

    def stop(self) -> None:
        self._halt.set()
        self.join(10)

    def run(self) -> None:
        while not self._halt.wait(self.interval):
            try:
                self.sync_once()
            except Exception as err:  # keep playing kubelet; record for the test logs
                self.errors.append(repr(err))
                log.warning("fake kubelet: %r", err)

    def sync_once(self) -> None:
        pods = self.rest.list_items("/api/v1/pods", fieldSelector="spec.nodeName!=")
        host_ips: dict[str, str] = {}
        for pod in pods:
            meta = pod["metadata"]
            ns, name = meta["namespace"], meta["name"]
            try:
                if meta.get("deletionTimestamp"):
                    if self._hold_deletions.is_set():
                        continue
                    # What a kubelet does once containers are gone: the final, grace-0 delete.
                    self.rest.delete(f"/api/v1/namespaces/{ns}/pods/{name}",
                                     {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}, missing_ok=True)
                elif pod.get("status", {}).get("phase") in ("Pending", None) or not _ready(pod):
                    if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                        continue
                    node_name = pod["spec"]["nodeName"]
                    if node_name not in host_ips:
                        n = self.rest.get_or_none(f"/api/v1/nodes/{node_name}") or {}
                        addrs = n.get("status", {}).get("addresses") or []
                        host_ips[node_name] = next((a["address"] for a in addrs
                                                    if a["type"] == "InternalIP"), "10.1.0.1")
                    status = running_status(pod, _ip(244, next(_pod_ips)), host_ips[node_name])
                    self.rest.patch(f"/api/v1/namespaces/{ns}/pods/{name}/status", {"status": status},
                                    content_type=STRATEGIC_MERGE_PATCH)
            except KubeError as err:
                if err.status not in (404, 409):  # gone or changed meanwhile: next round
                    raise
