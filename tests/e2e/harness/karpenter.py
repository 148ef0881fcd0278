"""The real Karpenter, with its KWOK cloud provider, against the e2e control plane.

``hack/build-karpenter.sh`` builds the KWOK provider's controller (``sigs.k8s.io/karpenter/kwok``) at
``KARPENTER_VERSION`` (hack/versions.env) into ``${XDG_CACHE_HOME:-$HOME/.cache}/phalanx/karpenter/<version>/``,
with the module's CRDs (NodePool, NodeClaim, NodeOverlay, CapacityBuffer, KWOKNodeClass) and the provider's
``instance_types.json`` beside it. ``KarpenterManager`` installs the CRDs, runs the controller as a process
(no leader election, short provisioning batches, probes on free ports) as ``system:karpenter`` (in
``system:masters``, as every harness component) and creates the ``KWOKNodeClass`` ``default`` its NodePools
refer to.

The KWOK provider launches a NodeClaim by creating a Node (named ``kwok-<claim>-...``, provider ID
``kwok://<node>``) carrying the NodeClaim's labels and annotations, the labels of its single-valued ``In``
requirements and of the chosen instance type and offering; it needs a ``node.kubernetes.io/instance-type``
requirement naming types it knows (:func:`instance_type_names`). The harness's KWOK (``kwok.py``) plays only
nodes labelled ``E2E_NODE_LABEL``: :meth:`KarpenterManager.nodepool` puts that label in the NodePool's
template, and :func:`nodeclaim` on a NodeClaim made by hand, so those nodes go Ready and run their pods.

Initial nodes that look like Karpenter's: :func:`instance_type` gives a type's capacity and allocatable
(capacity less the provider's fixed overhead, 100m CPU and 10Mi memory) and its labels, and
:func:`node_args` the keyword arguments of ``nodes.create_node`` for one.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from cluster.kube import KubeError
from cluster.quantity import parse_quantity

from .binaries import cache_dir, read_versions
from .managers import CRD_API, served, wait_established
from .nodes import E2E_NODE_LABEL
from .process import Component, free_ports
from .waits import wait_for

KARPENTER_API = "/apis/karpenter.sh/v1"
KWOK_API = "/apis/karpenter.kwok.sh/v1alpha1"
NODE_CLASS = "default"
NODE_CLASS_REF = {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": NODE_CLASS}
NODEPOOL_LABEL = "karpenter.sh/nodepool"
CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
PROVIDER_PREFIX = "kwok://"  # the provider ID prefix of the nodes the KWOK provider creates
#: the overhead (kube-reserved) the KWOK provider takes off every instance type's capacity, in base units
OVERHEAD = {"cpu": 100, "memory": 10 * 2**20}
_KWOK_GROUP = "karpenter.kwok.sh"
_AWS_NAME = re.compile(r"^\w+\.(nano|micro|small|medium|large|\d*xlarge|metal)$")  # the provider's size pattern


class MissingKarpenter(RuntimeError):
    """Karpenter's KWOK provider has not been built (run ``make e2e`` or hack/build-karpenter.sh)."""


def karpenter_dir() -> Path:
    return cache_dir("karpenter") / read_versions()["KARPENTER_VERSION"]


def locate_karpenter() -> Path:
    directory = karpenter_dir()
    if (not os.access(directory / "karpenter-kwok", os.X_OK) or not (directory / "crds").is_dir()
            or not (directory / "instance_types.json").is_file()):
        raise MissingKarpenter(f"Karpenter (KWOK provider) not built: nothing in {directory}. Run `make e2e` or "
                               "`bash hack/build-karpenter.sh` first.")
    return directory


# -- the KWOK provider's instance types --------------------------------------------------------------
@functools.cache
def _instance_types() -> dict[str, dict[str, Any]]:
    raw = json.loads((locate_karpenter() / "instance_types.json").read_text())
    return {t["name"]: t for t in raw}


def instance_type_names() -> list[str]:
    """The names of the KWOK provider's instance types, in its file's order (e.g. ``c-4x-amd64-linux``)."""
    return list(_instance_types())


def _format(resource: str, amount: int) -> str:
    """Base units (milli for CPU) as the shortest exact Kubernetes quantity."""
    if resource == "cpu":
        return str(amount // 1000) if amount % 1000 == 0 else f"{amount}m"
    for suffix, unit in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if amount and amount % unit == 0:
            return f"{amount // unit}{suffix}"
    return str(amount)


def instance_type(name: str) -> dict[str, Any]:
    """A KWOK instance type as Karpenter sees it: ``capacity`` and ``allocatable`` (quantities, as
    Karpenter computes them: ``pods`` 110 when the file gives none, allocatable = capacity - OVERHEAD),
    ``labels`` (those Karpenter puts on its nodes whatever the offering: instance type, arch, os and
    the ``karpenter.kwok.sh/instance-*`` ones), and ``offerings`` ({capacity_type, zone, price})."""
    try:
        raw = _instance_types()[name]
    except KeyError:
        raise KeyError(f"no KWOK instance type {name!r}; known: {', '.join(instance_type_names())}") from None
    capacity = {"pods": "110", **{k: str(v) for k, v in raw["resources"].items()}}
    allocatable = {}
    for resource, text in capacity.items():
        amount = parse_quantity(text, resource) - OVERHEAD.get(resource, 0)
        allocatable[resource] = _format(resource, max(amount, 0))
    oses = raw.get("operatingSystems") or []
    cpu, memory = str(raw["resources"].get("cpu", "")), str(raw["resources"].get("memory", ""))
    size = _AWS_NAME.match(name)
    family = re.split(r"[.-]", name, maxsplit=1)
    labels = {INSTANCE_TYPE_LABEL: name, "kubernetes.io/arch": raw["architecture"],
              f"{_KWOK_GROUP}/instance-family": family[0] if len(family) == 2 else name[:1],
              f"{_KWOK_GROUP}/instance-size": size.group(1) if size else cpu,
              f"{_KWOK_GROUP}/instance-cpu": cpu, f"{_KWOK_GROUP}/instance-memory": memory}
    if len(oses) == 1:
        labels["kubernetes.io/os"] = oses[0]
    offerings = []
    for offer in raw.get("offerings") or []:
        reqs = {r["key"]: r.get("values") or [] for r in offer.get("Requirements") or []}
        offerings.append({"capacity_type": (reqs.get(CAPACITY_TYPE_LABEL) or [""])[0],
                          "zone": (reqs.get("topology.kubernetes.io/zone") or [""])[0], "price": offer.get("Price")})
    return {"name": name, "capacity": capacity, "allocatable": allocatable, "labels": labels,
            "architecture": raw["architecture"], "operating_systems": oses, "offerings": offerings}


def node_args(type_name: str, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Keyword arguments of ``nodes.create_node``/``nodes.node`` for a node of KWOK instance type
    ``type_name``: its allocatable (the harness's nodes have capacity == allocatable) and its labels,
    ``labels`` added (e.g. a rack or zone)."""
    t = instance_type(type_name)
    alloc = dict(t["allocatable"])
    extra = {k: v for k, v in alloc.items() if k not in ("cpu", "memory", "pods")}
    return {"cpu": alloc["cpu"], "memory": alloc["memory"], "pods": int(alloc["pods"]),
            "extra_resources": extra, "labels": {**t["labels"], **(labels or {})}}


# -- the objects a Karpenter user writes ---------------------------------------------------------------
def requirement(key: str, operator: str, *values: str) -> dict[str, Any]:
    """A NodeSelectorRequirement (``In``, ``NotIn``, ``Exists``, ``DoesNotExist``, ``Gt``, ``Lt``)."""
    req: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        req["values"] = list(values)
    return req


def nodeclaim(name: str, nodepool: str, instance_types: Iterable[str], requirements: Iterable[dict[str, Any]] = (),
              labels: Mapping[str, str] | None = None, annotations: Mapping[str, str] | None = None,
              requests: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A NodeClaim made by hand (not by Karpenter's provisioner) for NodePool ``nodepool``: the
    ``karpenter.sh/nodepool`` and ``E2E_NODE_LABEL`` labels set, the instance-type requirement the KWOK
    provider needs, then ``requirements``. Karpenter launches it as it is (no owner reference to the pool,
    no ``karpenter.sh/nodepool-hash`` needed), but its labels must satisfy the pool's requirements, or
    Karpenter marks it Drifted (and disrupts it)."""
    return {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": name, "labels": {NODEPOOL_LABEL: nodepool, E2E_NODE_LABEL: "true", **(labels or {})},
                         "annotations": dict(annotations or {})},
            "spec": {"nodeClassRef": dict(NODE_CLASS_REF),
                     "requirements": [requirement(INSTANCE_TYPE_LABEL, "In", *instance_types), *requirements],
                     "resources": {"requests": dict(requests or {})}}}


def conditions(obj: Mapping[str, Any]) -> dict[str, str]:
    """An object's status conditions, type -> status ("True", "False", "Unknown")."""
    return {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions") or []}


class KarpenterManager:
    """One Karpenter (KWOK provider) process. ``start()`` installs the CRDs, runs it and creates the
    KWOKNodeClass ``default``; ``stop()`` deletes what it provisioned (NodePools, NodeClaims, their nodes)
    while it still runs, then stops it. The CRDs and the node class stay. Also a context manager."""

    def __init__(self, control_plane: Any):
        self.control_plane = control_plane
        self.rest = control_plane.rest
        self.directory = locate_karpenter()
        self.version = read_versions()["KARPENTER_VERSION"]
        self.component: Component | None = None
        self.metrics_port = self.health_port = 0

    def __enter__(self) -> "KarpenterManager":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def log(self) -> Path | None:
        return self.component.log if self.component else None

    def start(self) -> "KarpenterManager":
        try:
            return self._start()
        except BaseException:
            self.stop(clean=False)
            raise

    def _start(self) -> "KarpenterManager":
        self._install_crds()
        workdir: Path = self.control_plane.workdir / "karpenter"
        workdir.mkdir(parents=True, exist_ok=True)
        kubeconfig = self.control_plane.component_kubeconfig("karpenter", "system:karpenter")
        self.metrics_port, self.health_port = free_ports(2)
        env = {"KUBECONFIG": str(kubeconfig), "DISABLE_LEADER_ELECTION": "true",
               "METRICS_PORT": str(self.metrics_port), "HEALTH_PROBE_PORT": str(self.health_port),
               "SYSTEM_NAMESPACE": "kube-system",  # as its chart sets it (v1.15.0 reads it nowhere)
               "BATCH_IDLE_DURATION": "1s", "BATCH_MAX_DURATION": "3s", "LOG_LEVEL": "debug"}
        # Component runs argv with the harness's environment: env(1) sets Karpenter's configuration
        argv = [shutil.which("env") or "/usr/bin/env", *(f"{k}={v}" for k, v in env.items()),
                str(self.directory / "karpenter-kwok")]
        self.component = Component("karpenter", argv, self.control_plane.workdir / "logs" / "karpenter.log",
                                   cwd=workdir)
        from .controlplane import _insecure_get  # the control plane's probe helper

        # /readyz: the informer caches synced and the NodePool and NodeClaim kinds mapped (/healthz only pings)
        self.component.wait_ready(lambda: _insecure_get(f"http://127.0.0.1:{self.health_port}/readyz")[0] == 200,
                                  90)
        if self.rest.get_or_none(f"{KWOK_API}/kwoknodeclasses/{NODE_CLASS}") is None:
            self.rest.create(f"{KWOK_API}/kwoknodeclasses", {
                "apiVersion": "karpenter.kwok.sh/v1alpha1", "kind": "KWOKNodeClass", "metadata": {"name": NODE_CLASS}})
        return self

    def _install_crds(self) -> None:
        names = []
        for path in sorted((self.directory / "crds").glob("*.yaml")):
            crd = yaml.safe_load(path.read_text())
            names.append(crd["metadata"]["name"])
            if self.rest.get_or_none(f"{CRD_API}/{crd['metadata']['name']}") is None:
                self.rest.create(CRD_API, crd)
        wait_established(self.rest, names, KARPENTER_API, "nodepools")
        wait_for(lambda: served(self.rest, KWOK_API, "kwoknodeclasses"), 30, "kwoknodeclasses served")

    def stop(self, clean: bool = True, timeout: float = 60.0) -> None:
        """Stop the process; with ``clean``, first delete every NodePool and NodeClaim and wait for the
        nodes of Karpenter to go (what is left then is forced away once the process is gone)."""
        running = self.component is not None and self.component.alive()
        if clean and running:
            for collection in ("nodepools", "nodeclaims"):
                for obj in self.rest.list_items(f"{KARPENTER_API}/{collection}"):
                    self.rest.delete(f"{KARPENTER_API}/{collection}/{obj['metadata']['name']}", missing_ok=True)
            try:
                wait_for(lambda: not self.nodeclaims() and not self.nodes_of_karpenter(), timeout,
                         "Karpenter's NodeClaims and nodes deleted")
            except TimeoutError:
                pass
        if self.component is not None:
            self.component.stop()
            self.component = None
        if clean:
            self._force_clean()

    def _force_clean(self) -> None:
        """Without Karpenter its finalizers stay: drop them from what is left, and delete it."""
        left = [(f"{KARPENTER_API}/nodeclaims/{c['metadata']['name']}", c) for c in self.nodeclaims()]
        left += [(f"/api/v1/nodes/{n['metadata']['name']}", n) for n in self.nodes_of_karpenter()]
        for path, obj in left:
            try:
                if obj["metadata"].get("finalizers"):
                    self.rest.patch(path, {"metadata": {"finalizers": None}})
                self.rest.delete(path, missing_ok=True)
            except KubeError:
                pass

    # -- the objects ---------------------------------------------------------------------------------
    def nodepool(self, name: str, requirements: Iterable[dict[str, Any]], consolidate_after: str = "0s",
                 policy: str = "WhenEmptyOrUnderutilized", limits: Mapping[str, Any] | None = None,
                 labels: Mapping[str, str] | None = None, taints: Iterable[dict[str, Any]] = (),
                 budgets: Iterable[dict[str, Any]] | None = None, weight: int | None = None) -> dict[str, Any]:
        """Create a NodePool of the KWOK node class (its nodes labelled ``E2E_NODE_LABEL`` and ``labels``)
        and return it. ``budgets``: the disruption budgets (Karpenter's default: 10% of the nodes)."""
        disruption: dict[str, Any] = {"consolidationPolicy": policy, "consolidateAfter": consolidate_after}
        if budgets is not None:
            disruption["budgets"] = list(budgets)
        template_spec: dict[str, Any] = {"requirements": list(requirements), "nodeClassRef": dict(NODE_CLASS_REF)}
        if taints:
            template_spec["taints"] = list(taints)
        spec: dict[str, Any] = {
            "template": {"metadata": {"labels": {E2E_NODE_LABEL: "true", **(labels or {})}}, "spec": template_spec},
            "disruption": disruption}
        if limits is not None:
            spec["limits"] = {k: str(v) for k, v in limits.items()}
        if weight is not None:
            spec["weight"] = weight
        created: dict[str, Any] = self.rest.create(f"{KARPENTER_API}/nodepools", {
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name}, "spec": spec})
        return created

    def create_nodeclaim(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create a NodeClaim (see :func:`nodeclaim`) and return it."""
        created: dict[str, Any] = self.rest.create(f"{KARPENTER_API}/nodeclaims", dict(body))
        return created

    def nodeclaims(self, nodepool: str | None = None) -> list[dict[str, Any]]:
        """The NodeClaims (of ``nodepool``)."""
        selector = f"{NODEPOOL_LABEL}={nodepool}" if nodepool else None
        items: list[dict[str, Any]] = self.rest.list_items(f"{KARPENTER_API}/nodeclaims", labelSelector=selector)
        return items

    def nodes_of_karpenter(self, nodepool: str | None = None) -> list[dict[str, Any]]:
        """The Nodes the KWOK provider launched (provider ID ``kwok://``), of ``nodepool``."""
        selector = f"{NODEPOOL_LABEL}={nodepool}" if nodepool else None
        return [n for n in self.rest.list_items("/api/v1/nodes", labelSelector=selector)
                if (n.get("spec") or {}).get("providerID", "").startswith(PROVIDER_PREFIX)]
