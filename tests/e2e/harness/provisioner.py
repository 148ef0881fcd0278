"""A STAND-IN for cluster-autoscaler's ``best-effort-atomic-scale-up.autoscaling.x-k8s.io`` class,
for the e2e tests of gang-aware autoscaling. It is not cluster-autoscaler (whose binary the Go
module proxy this repository builds from does not serve): it does only what those tests need of it.

It installs cluster-autoscaler's own ProvisioningRequest CRD (fetched pinned by
``hack/fetch-provisioning-crd.sh``) and polls the requests of that class. For each new request it
reads the PodTemplates its pod sets refer to and the one rack their ``nodeSelector`` names, works
out how many nodes of its one node shape (``node_cpu``, ``node_gpu``) hold the requested pods, and

- creates them **all at once**, in that rack (and the zone the selector names, if any: a node
  group's template carries both), as KWOK nodes (``nodes.create_node``), then sets
  ``Provisioned=True``, as the atomic class does once every node came up; or
- when that would take the rack's node group past ``max_nodes`` (nodes it created there
  before included), creates none and sets ``Failed=True``, as the atomic class does when a node
  group cannot grow enough.

Every request it answered is remembered in ``seen`` (by namespace/name, with its outcome), so a
test can count them after the request is gone.
"""

from __future__ import annotations

import math
import os
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from cluster.kube import Kube, KubeError
from cluster.quantity import parse_quantity

from .binaries import read_versions
from .nodes import GPU, RACK, ZONE, create_node, delete_node
from .waits import wait_for

CRD_API = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
CRD_FILE = "autoscaling.x-k8s.io_provisioningrequests.yaml"
API = "/apis/autoscaling.x-k8s.io/v1"
ATOMIC = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"


class MissingCrd(RuntimeError):
    """The ProvisioningRequest CRD has not been fetched (run hack/fetch-provisioning-crd.sh)."""


def crd_path() -> Path:
    version = read_versions()["AUTOSCALER_APIS_VERSION"]
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    path = Path(base) / "phalanx" / "provisioning-crd" / version / CRD_FILE
    if not path.is_file():
        raise MissingCrd(f"ProvisioningRequest CRD not fetched: no {path}. Run `bash hack/fetch-provisioning-crd.sh` "
                         "(or `make e2e`) first.")
    return path


def install_crd(rest: Kube) -> None:
    """Install cluster-autoscaler's ProvisioningRequest CRD (once) and wait until it is served."""
    crd = yaml.safe_load(crd_path().read_text())
    name = crd["metadata"]["name"]
    if rest.get_or_none(f"{CRD_API}/{name}") is None:
        rest.create(CRD_API, crd)
    wait_for(lambda: "provisioningrequests" in {r["name"] for r in (rest.get_or_none(API) or {}).get("resources", [])},
             60, "provisioningrequests served")


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class StandInProvisioner:
    """The stand-in (see the module's docstring): ``start()``, then ``stop()`` deletes its nodes."""

    def __init__(self, rest: Kube, max_nodes: int, node_cpu: int = 1, node_gpu: int = 0, interval: float = 0.5):
        self.rest = rest
        self.max_nodes = max_nodes  # per rack: the node group's maximum
        self.node_cpu, self.node_gpu = node_cpu, node_gpu
        self.interval = interval
        self.seen: dict[str, str] = {}  # namespace/name -> "Provisioned" | "Failed"
        self.created: dict[str, list[str]] = {}  # rack -> nodes made there
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="stand-in-provisioner", daemon=True)

    def start(self) -> "StandInProvisioner":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for names in self.created.values():
            for name in names:
                delete_node(self.rest, name)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                for request in self.rest.list_items(f"{API}/provisioningrequests"):
                    key = f"{request['metadata']['namespace']}/{request['metadata']['name']}"
                    if request["spec"].get("provisioningClassName") == ATOMIC and key not in self.seen:
                        self.seen[key] = self._answer(request)
            except (KubeError, KeyError, ValueError) as err:  # shown by the test when it fails
                self.errors.append(str(err))

    def _answer(self, request: dict[str, Any]) -> str:
        namespace = request["metadata"]["namespace"]
        racks, zones, nodes = set(), set(), 0
        for pod_set in request["spec"]["podSets"]:
            template = self.rest.get(f"/api/v1/namespaces/{namespace}/podtemplates/"
                                     f"{pod_set['podTemplateRef']['name']}")["template"]["spec"]
            racks.add((template.get("nodeSelector") or {}).get(RACK, ""))
            zones.add((template.get("nodeSelector") or {}).get(ZONE))
            nodes += math.ceil(pod_set["count"] / self._per_node(template))
        if len(racks) != 1 or "" in racks:
            return self._set(request, "Failed", "NotOneRack", f"the pod sets name racks {sorted(racks)}, not one")
        if len(zones) != 1:
            return self._set(request, "Failed", "NotOneZone", f"the pod sets name zones {sorted(map(str, zones))}")
        rack, zone = racks.pop(), zones.pop()
        made = self.created.setdefault(rack, [])
        if len(made) + nodes > self.max_nodes:
            return self._set(request, "Failed", "NodeGroupMaxSize",
                             f"{nodes} more nodes in rack {rack} exceed its node group's maximum of {self.max_nodes}")
        for _ in range(nodes):
            name = f"prov-{rack}-{len(made)}"
            create_node(self.rest, name, cpu=str(self.node_cpu), gpu=self.node_gpu, rack=rack, zone=zone)
            made.append(name)
        return self._set(request, "Provisioned", "Provisioned", f"{nodes} nodes created in rack {rack}")

    def _per_node(self, spec: dict[str, Any]) -> int:
        """Pods of this template one node of the stand-in's shape holds."""
        requests: dict[str, int] = {}
        for container in spec.get("containers") or []:
            for resource, quantity in ((container.get("resources") or {}).get("requests") or {}).items():
                requests[resource] = requests.get(resource, 0) + parse_quantity(quantity, resource)
        room = {"cpu": self.node_cpu * 1000, GPU: self.node_gpu}
        fits = [room.get(r, 0) // amount for r, amount in requests.items() if amount]
        per_node = min(fits) if fits else 1
        if per_node < 1:
            raise ValueError(f"a pod of {requests} does not fit one stand-in node {room}")
        return per_node

    def _set(self, request: dict[str, Any], type_: str, reason: str, message: str) -> str:
        meta = request["metadata"]
        condition = {"type": type_, "status": "True", "reason": reason, "message": message,
                     "lastTransitionTime": _now(), "observedGeneration": meta.get("generation", 1)}
        self.rest.patch(f"{API}/namespaces/{meta['namespace']}/provisioningrequests/{meta['name']}/status",
                        {"status": {"conditions": [condition]}})
        return type_
