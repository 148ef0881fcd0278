"""The e2e control plane's nodes: Node objects that KWOK (``kwok.py``) plays.

``node()`` builds a Node; ``create_node`` creates it and sets its status (capacity, allocatable,
Ready) through the status subresource, as a kubelet would on registration. Every node carries
``E2E_NODE_LABEL``, the label KWOK manages nodes by: it renews their Leases, makes the pods bound
to them Running and Ready and finishes their graceful deletion. ``set_not_ready`` has KWOK take a
node NotReady; ``deletions_held`` keeps chosen pods terminating.
"""

from __future__ import annotations

import datetime as _dt
import itertools
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Mapping

from cluster.kube import Kube, KubeError

ZONE = "topology.kubernetes.io/zone"
RACK = "topology.kubernetes.io/rack"  # not a well-known label; KEP-6277 uses it anyway
GPU = "nvidia.com/gpu"

# KWOK manages the nodes with this label (and only those); the other two steer its stages.
E2E_NODE_LABEL = "phalanx.dev/e2e-node"
NOT_READY_LABEL = "phalanx.dev/e2e-node-not-ready"
HOLD_DELETION_LABEL = "phalanx.dev/e2e-hold-deletion"
# a running pod labelled with it has its containers end with that exit code and goes to phase
# Succeeded (0) or Failed, as a kubelet reports a finished pod (harness/kwok.py)
FINISH_LABEL = "phalanx.dev/e2e-finish"

_node_ips = itertools.count(1)


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
                  "kubernetes.io/arch": "amd64", E2E_NODE_LABEL: "true"}
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
                       "message": "phalanx e2e node (KWOK)",
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
                         "kubeletVersion": "v0.0.0-phalanx-e2e", "containerRuntimeVersion": "kwok",
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
    # node lifecycle controller lifts it once it saw the node Ready. Lift it now, as it would.
    return rest.patch(f"/api/v1/nodes/{name}", {"spec": {"taints": body["spec"].get("taints")}})


def delete_node(rest: Kube, name: str) -> None:
    rest.delete(f"/api/v1/nodes/{name}", missing_ok=True)


def set_not_ready(rest: Kube, name: str, not_ready: bool = True) -> None:
    """Have KWOK take the node NotReady (its Ready condition False, as a kubelet reporting a failed
    node would), or bring it back; the node lifecycle controller then taints it and the taint
    eviction controller evicts what does not tolerate the taint."""
    rest.patch(f"/api/v1/nodes/{name}", {"metadata": {"labels": {NOT_READY_LABEL: "true" if not_ready else None}}})


@contextmanager
def deletions_held(rest: Kube, held: Iterable[dict]) -> Iterator[None]:
    """Leave the ``held`` pods terminating when they are deleted meanwhile (to observe e.g.
    preemption victims): KWOK finishes no deletion of a pod that carries ``HOLD_DELETION_LABEL``."""
    keys = [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in held]
    for ns, name in keys:
        rest.patch(f"/api/v1/namespaces/{ns}/pods/{name}", {"metadata": {"labels": {HOLD_DELETION_LABEL: "true"}}})
    try:
        yield
    finally:
        for ns, name in keys:
            try:
                rest.patch(f"/api/v1/namespaces/{ns}/pods/{name}",
                           {"metadata": {"labels": {HOLD_DELETION_LABEL: None}}})
            except KubeError as err:
                if err.status != 404:
                    raise
