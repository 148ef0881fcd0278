"""The product path as a cluster admin installs it, in both API flavors: a user creates a gang
StatefulSet (annotation ``scheduling.phalanx.dev/scheduling``) → phalanx's controller makes the
Workload and PodGroup → its pod webhook stamps each pod with its group and holds it behind the
``podgroup-sync`` gate → the controller releases it → the real kube-scheduler with phalanx as
extender and binder binds the gang whole (inside one rack when asked). Then the StatefulSet's life:
scale up, to zero and back, a rolling update, a deleted pod recreated, a higher-priority gang
preempting it as one unit (``disruptionMode: all``), a shared ResourceClaim, Basic + topology with
OrderedReady, names up to the 63-character limit — and the same StatefulSet without the annotation
running as a plain StatefulSet.

Parametrised over the two flavors and the two scheduler modes (``scheduler_mode``: kube-scheduler
with phalanx as extender and binder, or phalanx-scheduler with the framework plugin), one control
plane per flavor with everything running for the whole module (tests are grouped by flavor and
mode):

- ``builtin``: the session's control plane (``scheduling.k8s.io/v1beta1`` served); pods name their
  group in ``spec.schedulingGroup.podGroupName``;
- ``crd``: a control plane started **without** ``GenericWorkload`` (``crd_control_plane``:
  ``scheduling.k8s.io`` not served, phalanx's CRDs from ``scheduler-config/crds/``); pods name their
  group in the label ``scheduling.phalanx.dev/pod-group``.

The real StatefulSet controller, garbage collector and (for the claim) DRA allocator in
kube-scheduler do their part; the nodes have no kubelets (KWOK marks bound
pods Running and Ready), and the one DRA device is published by the test in a ResourceSlice (a
simulated driver: nothing prepares it). Each test has its own namespace and its own nodes, which
its pods select by a label, so nothing else on the shared control plane is a candidate.
"""

from __future__ import annotations

import json
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

import pytest
from harness import RACK, ControlPlane, Scheduler, assert_none_bound, create, path, statefulset, wait_for
from harness.faults import record_text

from cluster import names
from cluster.kube import Kube, KubeError
from extender.server import Phalanx, ServeOptions, build

from .conftest import PHALANX_BARRIER_SECONDS, NodePool, start_phalanx_scheduler

SCHEDULER = "phalanx-product"
POOL = "e2e.phalanx.dev/pool"  # node label the test's pods select: only the test's own nodes
GANG = {"schedulingPolicy": {"gang": {}}}
HIGH, LOW = "phalanx-product-high", "phalanx-product-low"
DRIVER = "gpu.e2e.phalanx.dev"  # no driver process runs: the test publishes its ResourceSlice
DEVICE_CLASS = "phalanx-product-gpu"
RESOURCE = "/apis/resource.k8s.io/v1"
SETTLE = 4.0  # seconds a "nothing else gets bound" observation lasts


@dataclass
class Product:
    """One flavor's cluster with phalanx installed: serve + kube-scheduler + controller + webhooks."""

    flavor: str
    plane: ControlPlane
    phalanx: Phalanx
    scheduler: Scheduler
    controller: Any  # phalanx_controller.PhalanxController

    @property
    def rest(self) -> Kube:
        return self.plane.rest

    @property
    def api(self) -> str:
        group = names.SCHEDULING_GROUP if self.flavor == "builtin" else names.CRD_GROUP
        return f"{group}/{names.SCHEDULING_VERSION}"

    def objects(self, kind: str, ns: str) -> list[dict]:
        return self.rest.list_items(f"/apis/{self.api}/namespaces/{ns}/{kind}")

    def one_each(self, ns: str) -> tuple[dict, dict] | None:
        """(Workload, PodGroup) once exactly one of each exists."""
        w, g = self.objects("workloads", ns), self.objects("podgroups", ns)
        return (w[0], g[0]) if len(w) == 1 and len(g) == 1 else None

    def group_of(self, pod: dict) -> str | None:
        """The PodGroup a pod names, read the way this flavor writes it (and only that way)."""
        if self.flavor == "builtin":
            assert names.LABEL_POD_GROUP not in (pod["metadata"].get("labels") or {})
            return (pod["spec"].get("schedulingGroup") or {}).get("podGroupName")
        assert "schedulingGroup" not in pod["spec"]
        return (pod["metadata"].get("labels") or {}).get(names.LABEL_POD_GROUP)


@pytest.fixture(scope="module", params=["builtin", "crd"])
def flavor(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def product(flavor: str, scheduler_mode: str, request: pytest.FixtureRequest) -> Iterator[Product]:
    from phalanx_controller import PhalanxController

    plane: ControlPlane = request.getfixturevalue("control_plane" if flavor == "builtin" else "crd_control_plane")
    phalanx = build(ServeOptions(insecure_loopback_no_auth=True, http_addr="127.0.0.1:0", grpc_addr="127.0.0.1:0", http_threads=128,
                                 barrier_timeout=PHALANX_BARRIER_SECONDS, plan_ttl=30.0),
                    kubeconfig=str(plane.admin_kubeconfig)).start()
    scheduler = start_phalanx_scheduler(plane, scheduler_mode, phalanx, scheduler_name=SCHEDULER,
                                        name=f"product-{flavor}-{scheduler_mode}")
    controller = PhalanxController(plane)
    try:
        assert phalanx.cycle.writer.flavor == flavor  # serve and the controller agree on the flavor
        assert controller.flavor.builtin == (flavor == "builtin")
        for name, value in ((HIGH, 100000), (LOW, 10)):
            if plane.rest.get_or_none(f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}") is None:
                plane.rest.create("/apis/scheduling.k8s.io/v1/priorityclasses", {
                    "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
                    "value": value})
        controller.start()
        controller.register()
        yield Product(flavor, plane, phalanx, scheduler, controller)
    finally:
        controller.close()
        scheduler.stop()
        phalanx.stop()


@pytest.fixture
def ns(product: Product, request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"pp-{product.flavor}-{request.node.originalname[5:25].replace('_', '-').strip('-')}-{uuid.uuid4().hex[:4]}"
    product.rest.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    product.rest.delete(f"/api/v1/namespaces/{name}", missing_ok=True)
    product.rest.request("DELETE", f"/api/v1/namespaces/{name}/pods", params={"gracePeriodSeconds": 0})


@pytest.fixture
def pool(product: Product, ns: str) -> Iterator[NodePool]:
    """This test's nodes (labelled with the namespace's name, which the test's pods select)."""
    nodes = NodePool(product.rest)
    yield nodes
    nodes.cleanup()


# -- helpers ---------------------------------------------------------------------------------------

def add_racks(pool: NodePool, ns: str, racks: dict[str, int], cpu: int = 1) -> dict[str, str]:
    """Nodes of ``cpu`` CPUs in the named racks; returns node -> rack."""
    where = {}
    for rack, count in racks.items():
        for i in range(count):
            name = f"{ns}-{rack}-{i}"
            pool.add(name, cpu=cpu, rack=f"{ns}-{rack}", labels={POOL: ns})
            where[name] = rack
    return where


def make(product: Product, ns: str, name: str, replicas: int, scheduling: dict | None = GANG,
         **kwargs: Any) -> dict:
    body = statefulset(name, replicas, scheduling=scheduling, scheduler_name=SCHEDULER,
                       node_selector={POOL: ns}, **kwargs)
    return create(product.rest, body, ns)


def sts_path(ns: str, name: str | None = None) -> str:
    return path("apps/v1", "StatefulSet", ns, name)


def scale(product: Product, ns: str, name: str, replicas: int) -> None:
    product.rest.patch(sts_path(ns, name), {"spec": {"replicas": replicas}})


def live_pods(product: Product, ns: str, app: str) -> list[dict]:
    return [p for p in product.rest.list_items(f"/api/v1/namespaces/{ns}/pods", labelSelector=f"app={app}")
            if not p["metadata"].get("deletionTimestamp")]


def min_counts(product: Product, ns: str) -> tuple[int, int]:
    workload, group = product.one_each(ns) or ({}, {})
    return (workload["spec"]["podGroupTemplates"][0]["schedulingPolicy"]["gang"]["minCount"],
            group["spec"]["schedulingPolicy"]["gang"]["minCount"])


def bound_in_group(product: Product, ns: str, app: str, count: int, group: dict) -> dict[str, str] | None:
    """pod -> node once exactly ``count`` live pods exist, all bound and all naming ``group``."""
    items = live_pods(product, ns, app)
    if len(items) != count or not all(p["spec"].get("nodeName") for p in items):
        return None
    assert all(product.group_of(p) == group["metadata"]["name"] for p in items), \
        {p["metadata"]["name"]: product.group_of(p) for p in items}
    return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in items}


def wait_bound(product: Product, ns: str, app: str, count: int, group: dict, timeout: float = 60.0) -> dict[str, str]:
    seen: dict[str, Any] = {}

    def probe() -> dict[str, str] | None:
        seen["pods"] = {p["metadata"]["name"]: p["spec"].get("nodeName") or [
            [g["name"] for g in p["spec"].get("schedulingGates") or []],
            [c.get("message") or c.get("reason") for c in p["status"].get("conditions") or []
             if c["type"] == "PodScheduled"]] for p in live_pods(product, ns, app)}
        return bound_in_group(product, ns, app, count, group)
    try:
        return wait_for(probe, timeout, f"{count} pods of {ns}/{app} bound in their PodGroup")
    except TimeoutError as err:
        events = [f"{e.get('reason')}: {e.get('note') or e.get('message')}"
                  for e in product.rest.list_items(f"/apis/events.k8s.io/v1/namespaces/{ns}/events")
                  if (e.get("regarding") or {}).get("name") == group["metadata"]["name"]]
        key = f"{ns}/{group['metadata']['name']}"
        cycle = product.phalanx.cycle
        said = (cycle.explanations.get(key), [(r.pod.name, "gated" if r.gated else "", r.pod.node)
                                              for r in cycle.cache.members(key)])
        raise TimeoutError(f"{err}; pods now: {seen.get('pods')}; podgroup status: "
                           f"{group_status(product, ns, group)}; its events: {events}; "
                           f"phalanx's explanation: {said}; {victims_seen(product, key)}") from None


def victims_seen(product: Product, key: str) -> str:
    """The victims a nomination of ``key`` still waits for, as phalanx's cache and as the API server
    show them (a failure's diagnosis: which of the two still holds the pod, and in what state)."""
    cycle = product.phalanx.cycle
    nomination = cycle.preemption.nominations.get(key)
    if nomination is None:
        return "no nomination"
    rows = []
    for uid in sorted(nomination.victims):
        record = cycle.cache.pods.get(uid)
        if record is None:
            rows.append((uid, "not in phalanx's cache"))
            continue
        pod = record.pod
        got = product.rest.get_or_none(f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}") or {}
        meta = got.get("metadata") or {}
        rows.append((pod.name, {"cache": {"phase": record.phase, "terminating": record.terminating,
                                          "disrupted": record.disrupted, "node": pod.node},
                                "api": {"uid": meta.get("uid"), "deletion": meta.get("deletionTimestamp"),
                                        "finalizers": meta.get("finalizers"),
                                        "phase": (got.get("status") or {}).get("phase"),
                                        "node": (got.get("spec") or {}).get("nodeName")} if got else "gone"}))
    return f"victims still awaited: {rows}"


def group_status(product: Product, ns: str, group: dict) -> Any:
    got = product.rest.get_or_none(f"/apis/{product.api}/namespaces/{ns}/podgroups/{group['metadata']['name']}")
    return (got or {}).get("status")


def racks_of(placement: dict[str, str], where: dict[str, str]) -> set[str]:
    return {where[node] for node in placement.values()}


def one_rack(placement: dict[str, str], where: dict[str, str]) -> str:
    racks = racks_of(placement, where)
    assert len(racks) == 1, f"the gang spans racks {racks}: {placement}"
    return racks.pop()


def initially_scheduled(product: Product, ns: str, group: dict) -> dict:
    status = group_status(product, ns, group) or {}
    return next((c for c in status.get("conditions") or [] if c["type"] == names.CONDITION_INITIALLY_SCHEDULED), {})


class AdmittedPods(threading.Thread):
    """Every pod of a namespace as the API server announced it first (its ADDED watch event), i.e.
    as admitted — the evidence that the webhook stamped and gated it before anyone else saw it."""

    def __init__(self, kubeconfig: str, ns: str):
        super().__init__(name=f"admitted-pods-{ns}", daemon=True)
        self.kube, self.path = Kube(kubeconfig), f"/api/v1/namespaces/{ns}/pods"
        self.first: dict[str, dict] = {}
        self._lock, self._halt = threading.Lock(), threading.Event()
        items, self._rv = self.kube.list_pages(self.path)
        assert not items, "start watching before the StatefulSet is created"

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                for event in self.kube.watch(self.path, self._rv, timeout_seconds=5):
                    obj = event.get("object") or {}
                    self._rv = (obj.get("metadata") or {}).get("resourceVersion") or self._rv
                    if event.get("type") == "ADDED":
                        with self._lock:
                            self.first.setdefault(obj["metadata"]["uid"], obj)
            except KubeError:
                self._halt.wait(0.2)

    def admitted(self) -> list[dict]:
        with self._lock:
            return list(self.first.values())

    def stop(self) -> None:
        self._halt.set()


def gated(pod: dict) -> bool:
    return names.GATE_PODGROUP_SYNC in {g["name"] for g in pod["spec"].get("schedulingGates") or []}


def owned_by_group(pod: dict, group: dict) -> bool:
    return any(r["kind"] == "PodGroup" and r["uid"] == group["metadata"]["uid"]
               for r in pod["metadata"].get("ownerReferences") or [])


# -- the tests -------------------------------------------------------------------------------------

def test_gang_statefulset_is_stamped_gated_released_and_bound_whole_in_one_rack_through_its_life(product, ns, pool):
    where = add_racks(pool, ns, {"a": 2, "b": 5})  # 3 fit only in rack b
    watch = AdmittedPods(str(product.plane.admin_kubeconfig), ns)
    watch.start()
    try:
        sts = make(product, ns, "db", 3, scheduling={**GANG, "schedulingConstraints": {"topology": [{"key": RACK}]}})
        workload, group = wait_for(lambda: product.one_each(ns), 30, "one Workload and one PodGroup")
        assert workload["spec"]["controllerRef"] == {"apiGroup": "apps", "kind": "StatefulSet", "name": "db"}
        assert {r["uid"] for r in group["metadata"]["ownerReferences"]} == {
            sts["metadata"]["uid"], workload["metadata"]["uid"]}
        assert group["spec"]["schedulingConstraints"] == {"topology": [{"key": RACK}]}
        assert min_counts(product, ns) == (3, 3)

        placed = wait_bound(product, ns, "db", 3, group)
        assert one_rack(placed, where) == "b"
        admitted = watch.admitted()
        assert len(admitted) == 3 and all(gated(p) and owned_by_group(p, group) for p in admitted), admitted
        assert all(product.group_of(p) == group["metadata"]["name"] for p in admitted)
        assert initially_scheduled(product, ns, group).get("status") == "True"
        stored = product.rest.get(f"/apis/{product.api}/namespaces/{ns}/podgroups/{group['metadata']['name']}")
        assert set(json.loads(record_text(stored))["pods"]) >= set(placed)

        scale(product, ns, "db", 5)  # scale up: the new members join the gang in its rack
        wait_for(lambda: min_counts(product, ns) == (5, 5), 30, "minCount 5")
        assert one_rack(wait_bound(product, ns, "db", 5, group), where) == "b"

        scale(product, ns, "db", 0)  # to zero and back: same PodGroup, bound whole again
        wait_for(lambda: not live_pods(product, ns, "db") and min_counts(product, ns) == (1, 1), 60,
                 "no pods, minCount clamped to 1")
        scale(product, ns, "db", 3)
        wait_for(lambda: min_counts(product, ns) == (3, 3), 30, "minCount 3")
        before = wait_bound(product, ns, "db", 3, group)
        assert one_rack(before, where) == "b"

        old = {p["metadata"]["uid"] for p in live_pods(product, ns, "db")}
        product.rest.patch(sts_path(ns, "db"), {"spec": {"template": {"metadata": {"annotations": {"rev": "2"}}}}})

        def rolled() -> dict[str, str] | None:
            placed = bound_in_group(product, ns, "db", 3, group)
            fresh = [p for p in live_pods(product, ns, "db")
                     if p["metadata"]["uid"] not in old and (p["metadata"].get("annotations") or {}).get("rev") == "2"]
            return placed if placed and len(fresh) == 3 else None
        assert one_rack(wait_for(rolled, 120, "a rolling update: 3 new pods bound in the PodGroup"), where) == "b"

        victim = live_pods(product, ns, "db")[1]
        product.rest.delete(f"/api/v1/namespaces/{ns}/pods/{victim['metadata']['name']}", missing_ok=True)
        again = wait_for(lambda: (placed := bound_in_group(product, ns, "db", 3, group)) and victim["metadata"][
            "uid"] not in {p["metadata"]["uid"] for p in live_pods(product, ns, "db")} and placed, 60,
            "the deleted pod recreated and bound")
        assert one_rack(again, where) == "b"
        assert product.one_each(ns)[1]["metadata"]["uid"] == group["metadata"]["uid"]  # one PodGroup for life
        assert all(gated(p) and owned_by_group(p, group) and product.group_of(p) == group["metadata"]["name"]
                   for p in watch.admitted()), "every pod the StatefulSet made was stamped and gated at admission"
    finally:
        watch.stop()


def test_statefulset_without_the_annotation_runs_as_a_plain_statefulset(product, ns, pool):
    add_racks(pool, ns, {"a": 2})
    make(product, ns, "plain", 2, scheduling=None)

    def running() -> list[dict] | None:
        items = live_pods(product, ns, "plain")
        return items if len(items) == 2 and all(p["status"].get("phase") == "Running" for p in items) else None
    items = wait_for(running, 60, "2 plain pods bound and Running")
    for p in items:
        assert product.group_of(p) is None and not p["spec"].get("schedulingGates")
        assert not any(r["kind"] == "PodGroup" for r in p["metadata"].get("ownerReferences") or [])
    assert product.objects("workloads", ns) == [] and product.objects("podgroups", ns) == []


def test_higher_priority_gang_preempts_a_disruption_mode_all_gang_as_one_unit(product, ns, pool):
    add_racks(pool, ns, {"a": 4})
    make(product, ns, "low", 4, scheduling={**GANG, "disruptionMode": {"all": {}}}, priority_class_name=LOW)
    _, low = wait_for(lambda: product.one_each(ns), 30, "the low gang's PodGroup")
    wait_bound(product, ns, "low", 4, low)
    victims = {p["metadata"]["uid"] for p in live_pods(product, ns, "low")}

    make(product, ns, "high", 2, priority_class_name=HIGH)  # needs 2 of the 4 nodes
    high = wait_for(lambda: next((g for g in product.objects("podgroups", ns)
                                  if g["spec"]["workloadRef"]["workloadName"].startswith("high-")), None),
                    30, "the high gang's PodGroup")
    wait_bound(product, ns, "high", 2, high, timeout=90)
    # one unit: every member of the low gang went, not only the two whose room was needed
    wait_for(lambda: not victims & {p["metadata"]["uid"] for p in product.rest.list_items(
        f"/api/v1/namespaces/{ns}/pods", labelSelector="app=low")}, 60, "the whole low gang evicted")
    # its StatefulSet recreates the 4 pods; 2 nodes are free, so none of them may be bound
    wait_for(lambda: len(live_pods(product, ns, "low")) == 4, 30, "the low gang's pods recreated")
    assert_none_bound(product.rest, ns, SETTLE, label_selector="app=low")
    reasons = {e.get("reason") for e in product.rest.list_items(f"/apis/events.k8s.io/v1/namespaces/{ns}/events")}
    assert "Preempted" in reasons


@pytest.fixture
def simulated_device(product: Product) -> Iterator[str]:
    """A DeviceClass and one network-attached device (``allNodes``) in a ResourceSlice published by
    the test, as a DRA driver would publish it; kube-scheduler allocates claims from it."""
    rest = product.rest
    slice_name = "phalanx-product-shared-gpu"
    rest.delete(f"{RESOURCE}/deviceclasses/{DEVICE_CLASS}", missing_ok=True)
    rest.delete(f"{RESOURCE}/resourceslices/{slice_name}", missing_ok=True)
    rest.create(f"{RESOURCE}/deviceclasses", {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}})
    rest.create(f"{RESOURCE}/resourceslices", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": slice_name},
        "spec": {"driver": DRIVER, "allNodes": True,
                 "pool": {"name": "shared", "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "gpu-0"}]}})
    yield DEVICE_CLASS
    rest.delete(f"{RESOURCE}/resourceslices/{slice_name}", missing_ok=True)
    rest.delete(f"{RESOURCE}/deviceclasses/{DEVICE_CLASS}", missing_ok=True)


def test_a_gang_sharing_one_resource_claim_is_bound_whole_with_the_claim_allocated_once(
        product, ns, pool, simulated_device, scheduler_mode):
    add_racks(pool, ns, {"a": 3})
    product.rest.create(f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "shared-gpu"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": simulated_device}}]}}}})
    entry = {"name": "gpu", "resourceClaimTemplateName": "shared-gpu"}
    body = statefulset("train", 3, scheduling={**GANG, "resourceClaims": [entry]}, scheduler_name=SCHEDULER,
                       node_selector={POOL: ns})
    body["spec"]["template"]["spec"]["resourceClaims"] = [dict(entry)]
    body["spec"]["template"]["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    create(product.rest, body, ns)
    _, group = wait_for(lambda: product.one_each(ns), 30, "the PodGroup")
    wait_bound(product, ns, "train", 3, group, timeout=90)
    claims = [c for c in product.rest.list_items(f"{RESOURCE}/namespaces/{ns}/resourceclaims")
              if any(r["kind"] == "PodGroup" for r in c["metadata"].get("ownerReferences") or [])]
    assert len(claims) == 1, claims
    claim = claims[0]
    assert claim["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"
    members = {p["metadata"]["uid"] for p in live_pods(product, ns, "train")}
    assert {r["uid"] for r in claim["status"].get("reservedFor") or []} == members
    for p in live_pods(product, ns, "train"):
        assert p["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimName": claim["metadata"]["name"]}]


def test_basic_with_topology_and_ordered_ready_progresses_in_one_rack(product, ns, pool):
    where = add_racks(pool, ns, {"a": 3, "b": 3})
    make(product, ns, "seq", 3, pod_management_policy="OrderedReady",
         scheduling={"schedulingPolicy": {"basic": {}}, "schedulingConstraints": {"topology": [{"key": RACK}]}})
    _, group = wait_for(lambda: product.one_each(ns), 30, "the PodGroup")
    assert group["spec"]["schedulingPolicy"] == {"basic": {}}

    def progressed() -> bool:
        by_ordinal = {int(p["metadata"]["name"].rsplit("-", 1)[1]): p for p in live_pods(product, ns, "seq")}
        for k in by_ordinal:  # at every observation: pod k exists only once pod k-1 is Ready
            assert k == 0 or ready(by_ordinal.get(k - 1)), f"seq-{k} exists before seq-{k - 1} is Ready"
        return len(by_ordinal) == 3 and all(ready(p) for p in by_ordinal.values())
    wait_for(progressed, 90, "OrderedReady through all 3 pods", interval=0.1)
    placed = bound_in_group(product, ns, "seq", 3, group)
    assert placed is not None
    one_rack(placed, where)


def ready(pod: dict | None) -> bool:
    return bool(pod) and any(c["type"] == "Ready" and c["status"] == "True"
                             for c in (pod.get("status") or {}).get("conditions") or [])


def test_names_up_to_the_statefulset_limit(product, ns, pool):
    """The longest StatefulSet name whose pods Kubernetes can create (52: its pods carry the label
    ``controller-revision-hash: <name>-<hash of up to 10>``) runs as a gang; at 63, the most the API
    server accepts, phalanx's objects are still valid and the pods fail only on upstream's labels."""
    add_racks(pool, ns, {"a": 2})
    longest = ("cockroachdb-production-cluster-" + "x" * 40)[:51] + "z"
    make(product, ns, longest, 2)
    _, group = wait_for(lambda: product.one_each(ns), 30, "one Workload and one PodGroup")
    assert len(group["metadata"]["name"]) <= 63
    wait_bound(product, ns, longest, 2, group)

    too_long = "y" * 62 + "z"
    make(product, ns, too_long, 1)
    (second,) = wait_for(lambda: [g for g in product.objects("podgroups", ns)
                                  if g["metadata"]["uid"] != group["metadata"]["uid"]] or None, 30, "a second PodGroup")
    assert len(second["metadata"]["name"]) <= 63
    failed = wait_for(lambda: [e["message"] for e in product.rest.list_items(f"/api/v1/namespaces/{ns}/events")
                               if e["reason"] == "FailedCreate" and e["involvedObject"]["name"] == too_long],
                      30, "the StatefulSet controller's FailedCreate")
    # upstream's own values are too long (controller-revision-hash, pod-name, hostname); the
    # PodGroup reference the webhook stamped is not among them
    assert f'Invalid value: "{too_long}-' in failed[0], failed[0]
    assert f'"{second["metadata"]["name"]}"' not in failed[0], failed[0]
    with pytest.raises(KubeError):  # nothing phalanx made is in the way: the pod never existed
        product.rest.get(f"/api/v1/namespaces/{ns}/pods/{too_long}-0")
