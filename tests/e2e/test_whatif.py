"""What-if on the real control plane: ask where a manifest would go, check the API server saw no
write, then apply it and check the prediction came true.

phalanx serve runs in this process with the controller's compiler (as ``phalanx serve`` composes
it), phalanx's controller and webhooks run as in ``test_controller.py``, and kube-scheduler runs
phalanx in each integration mode in turn (extender, then plugin: the prediction is one call, the
placement that must match it is each mode's). Each case:

1. ``WhatIf`` over gRPC, with the resourceVersions of every kind phalanx writes or what-if could
   touch (pods, PodGroups, Workloads, StatefulSets, Jobs, PDBs and events of the case's namespace,
   the case's nodes) listed before and after: they must be identical;
2. the manifest applied; then the same domain, and for an exact (proven optimal) plan the same
   nodes (as a multiset: which of two identical pods takes which node is the pods' UIDs' order);
   a preemption removes the predicted victims; a gang that cannot fit stays unbound.

Cases: every corpus workload (``harness/corpus.py``: ZooKeeper with its claims bound at once to
NFS-like PVs, etcd, Kafka, CockroachDB, Cassandra, Redis cluster, training workers, GPU inference,
and local PVs on 4 of 8 nodes for WaitForFirstConsumer claims — what-if plans the claims the
StatefulSet would create) and
three of this module's own: a rack gang that fits (a StatefulSet), one that fits by preempting
lower-priority pods (a PodGroup and its Pods), one that cannot fit (a PodGroup and an Indexed Job).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any, Iterator

import grpc
import pytest
from harness import GPU, RACK, assert_none_bound, create, job, pod, podgroup, priority_class, statefulset, wait_for
from harness.corpus import CASES, storage_class

from proto.phalanx.v1 import workload_cycle_pb2 as pb
from proto.phalanx.v1 import workload_cycle_pb2_grpc as pb_grpc

from .conftest import cycle_stub, serve_with_whatif, settle, start_phalanx_scheduler

CORPUS = tuple(c.name for c in CASES)
BIND_TIMEOUT = 60.0
HIGH, LOW = "phalanx-whatif-high", "phalanx-whatif-low"
GANG_IN_A_RACK = {"schedulingPolicy": {"gang": {}}, "schedulingConstraints": {"topology": [{"key": RACK}]}}


@pytest.fixture(scope="module")
def serve(control_plane) -> Iterator[Any]:
    """phalanx serve as the command composes it: with the controller's compiler for what-if."""
    with serve_with_whatif(control_plane) as service:
        yield service


@pytest.fixture(scope="module")
def scheduler(serve, control_plane, scheduler_mode):
    running = start_phalanx_scheduler(control_plane, scheduler_mode, serve, name=f"whatif-{scheduler_mode}")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def controller(registered_controller):
    return registered_controller


@pytest.fixture(scope="module")
def stub(serve) -> Iterator[pb_grpc.WorkloadCycleStub]:
    with cycle_stub(serve) as client:
        yield client


# -- what-if writes nothing ----------------------------------------------------------------------------

#: what phalanx writes or evicts (pods, bindings, PodGroup status, Workloads), what the manifests
#: would create (StatefulSets, Jobs), and what preemption reads (PDBs); per namespace (the cases' own:
#: the teardown of other tests' namespaces goes on meanwhile) plus events and the case's nodes
COLLECTIONS = ("/api/v1/namespaces/{ns}/pods", "/apis/scheduling.k8s.io/v1beta1/namespaces/{ns}/podgroups",
               "/apis/scheduling.k8s.io/v1beta1/namespaces/{ns}/workloads", "/apis/apps/v1/namespaces/{ns}/statefulsets",
               "/apis/batch/v1/namespaces/{ns}/jobs", "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
               "/apis/events.k8s.io/v1/namespaces/{ns}/events")


def versions(rest, namespace: str, node_names: list[str]) -> dict[str, str]:
    """kind/name -> resourceVersion of everything what-if could have written."""
    out = {}
    for collection in COLLECTIONS:
        for item in rest.list_items(collection.format(ns=namespace)):
            out[f"{collection}/{item['metadata']['name']}"] = item["metadata"]["resourceVersion"]
    for name in node_names:
        out[f"node/{name}"] = rest.get(f"/api/v1/nodes/{name}")["metadata"]["resourceVersion"]
    return out


def what_if(stub, rest, namespace: str, node_names: list[str], *objects: dict) -> list[pb.WhatIfGroup]:
    """The WhatIf answer for ``objects``; fails if the API server saw any write meanwhile."""
    before = versions(rest, namespace, node_names)
    reply = stub.WhatIf(pb.WhatIfRequest(objects_json=[json.dumps(o) for o in objects], namespace=namespace),
                        timeout=60)
    assert versions(rest, namespace, node_names) == before, "what-if changed the cluster"
    return list(reply.groups)


# -- reading the applied result ----------------------------------------------------------------------

def bound_pods(rest, namespace: str, prefix: str) -> dict[str, str]:
    return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in rest.list_items(f"/api/v1/namespaces/{namespace}/pods")
            if p["metadata"]["name"].startswith(prefix) and p["spec"].get("nodeName")
            and not p["metadata"].get("deletionTimestamp")}


def wait_bound(rest, namespace: str, prefix: str, count: int) -> dict[str, str]:
    return wait_for(lambda: (placed := bound_pods(rest, namespace, prefix)) and len(placed) == count and placed,
                    BIND_TIMEOUT, f"{count} pods {prefix}* bound", interval=0.3)


def label(rest, node: str, key: str) -> str:
    return rest.get(f"/api/v1/nodes/{node}")["metadata"]["labels"].get(key, "")


def came_true(rest, group: pb.WhatIfGroup, placed: dict[str, str]) -> None:
    """The applied placement is the predicted one: the domain, and for an exact plan the nodes."""
    assert len(placed) == group.members
    if group.topology_key:
        assert {label(rest, n, group.topology_key) for n in placed.values()} == {group.domain}
    if group.path == "exact" and group.optimal:
        assert Counter(placed.values()) == Counter(group.nodes.values()), (dict(group.nodes), placed)


# -- the cases ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", CORPUS)
def test_corpus_workloads_land_where_what_if_said(rest, namespace, nodes, serve, scheduler, controller, stub, name):
    case = next(c for c in CASES if c.name == name)
    names = case.node_names("wi")
    for node_name, (_, kwargs) in zip(names, case.nodes, strict=True):
        nodes.add(node_name, **kwargs)
    sc_name, cluster_paths = None, []
    try:
        if case.storage:  # the class and static PVs the chart's claims bind to
            sc_name = f"{namespace}-{case.storage.binding.lower()}"
            rest.create("/apis/storage.k8s.io/v1/storageclasses", storage_class(sc_name, case.storage.binding))
            cluster_paths.append(f"/apis/storage.k8s.io/v1/storageclasses/{sc_name}")
            pvs = []
            for pv in case.persistent_volumes("wi", sc_name, f"wi-{case.short}-{namespace[-5:]}"):
                rest.create("/api/v1/persistentvolumes", pv)
                pvs.append(pv["metadata"]["name"])
                cluster_paths.append(f"/api/v1/persistentvolumes/{pvs[-1]}")
            wait_for(lambda: set(pvs) <= serve.cycle.cache.persistent_volumes.keys(), 30, "the PVs in phalanx's cache")
        sts = case.statefulset(namespace, "default-scheduler", sc_name, None)
        settle(rest, serve.cycle.cache, names)
        [group] = what_if(stub, rest, namespace, names, sts)
        assert group.verdict == "fits" and group.source == f"StatefulSet {namespace}/{case.name}"
        assert group.members == case.replicas and sorted(group.nodes) == [f"{case.name}-{i}" for i in range(case.replicas)]
        if case.storage and case.storage.pv_nodes:  # local PVs: exactly the nodes that hold one
            assert sorted(group.nodes.values()) == sorted(names[i] for i in case.storage.pv_nodes)
        create(rest, sts, namespace)
        came_true(rest, group, wait_bound(rest, namespace, f"{case.name}-", case.replicas))
    finally:  # the namespace fixture drops the StatefulSet, its pods and claims; the PVs are cluster-wide
        for path in cluster_paths:
            rest.delete(path, missing_ok=True)


def test_a_rack_gang_that_fits_lands_in_the_predicted_rack_on_the_predicted_nodes(rest, namespace, nodes, serve,
                                                                                  scheduler, controller, stub):
    names = [nodes.add(f"wf-{rack}-{i}", gpu=gpus, rack=rack)["metadata"]["name"]
             for rack, gpus in (("wfa", 2), ("wfb", 4)) for i in range(2)]
    sts = statefulset("fit", 3, requests={"cpu": "1", GPU: 2}, scheduling=GANG_IN_A_RACK)
    settle(rest, serve.cycle.cache, names)
    [group] = what_if(stub, rest, namespace, names, sts)
    assert (group.verdict, group.domain, group.path, group.optimal) == ("fits", "wfb", "exact", True)
    create(rest, sts, namespace)
    came_true(rest, group, wait_bound(rest, namespace, "fit-", 3))


def test_a_gang_that_fits_by_preemption_evicts_the_predicted_victims(rest, namespace, nodes, serve, scheduler, stub):
    for name, value in ((HIGH, 100000), (LOW, 10)):
        if rest.get_or_none(f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}") is None:
            create(rest, priority_class(name, value))
    names = [nodes.add(f"wp-{rack}-{i}", gpu=2, rack=rack)["metadata"]["name"] for rack in ("wpa", "wpb")
             for i in range(2)]
    create(rest, podgroup("low", min_count=4, priority_class_name=LOW), namespace)
    for i in range(4):
        create(rest, pod(f"low-{i}", "low", {"cpu": "1", GPU: 2}, priority_class_name=LOW), namespace)
    wait_bound(rest, namespace, "low-", 4)
    cache = serve.cycle.cache
    wait_for(lambda: sum(1 for r in list(cache.pods.values()) if r.pod.namespace == namespace
                         and r.pod.name.startswith("low-") and r.pod.node) == 4, 30, "phalanx saw the low gang bound")
    manifest = [podgroup("high", min_count=2, topology_key=RACK, priority_class_name=HIGH)] + [
        pod(f"high-{i}", "high", {"cpu": "1", GPU: 2}, priority_class_name=HIGH) for i in range(2)]
    settle(rest, serve.cycle.cache, names)
    [group] = what_if(stub, rest, namespace, names, *manifest)
    assert group.verdict == "fits-after-preemption" and group.domain in ("wpa", "wpb")
    victims = {v.pod.split("/", 1)[1] for v in group.victims}
    assert len(victims) == 2 and {v.priority for v in group.victims} == {10}
    for obj in manifest:
        create(rest, obj, namespace)
    placed = wait_bound(rest, namespace, "high-", 2)
    came_true(rest, group, placed)
    wait_for(lambda: not victims & set(bound_pods(rest, namespace, "low-")), 60, "the predicted victims evicted")
    assert len(bound_pods(rest, namespace, "low-")) == 2  # only those


def test_a_gang_that_cannot_fit_stays_pending_as_predicted(rest, namespace, nodes, serve, scheduler, stub):
    names = [nodes.add(f"wn-{rack}-{i}", gpu=1, rack=rack)["metadata"]["name"] for rack in ("wna", "wnb")
             for i in range(3)]
    manifest = [podgroup("train", min_count=4, topology_key=RACK), job("train", 4, "train", {"cpu": "1", GPU: 1})]
    settle(rest, serve.cycle.cache, names)
    [group] = what_if(stub, rest, namespace, names, *manifest)
    assert group.verdict == "does-not-fit" and not group.nodes and "nvidia.com/gpu" in group.explanation
    assert group.source == f"PodGroup {namespace}/train" and group.members == 4
    for obj in manifest:
        create(rest, obj, namespace)
    wait_for(lambda: len(rest.list_items(f"/api/v1/namespaces/{namespace}/pods")) == 4, 60, "the Job's 4 pods")
    assert_none_bound(rest, namespace, seconds=8, podgroup="train")


def test_an_invalid_manifest_gets_the_webhooks_messages_and_nothing_is_written(rest, namespace, stub):
    bad = statefulset("bad", 3, pod_management_policy="OrderedReady", scheduling=GANG_IN_A_RACK)
    before = versions(rest, namespace, [])
    with pytest.raises(grpc.RpcError) as err:
        stub.WhatIf(pb.WhatIfRequest(objects_json=[json.dumps(bad)], namespace=namespace), timeout=30)
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "gang scheduling requires podManagementPolicy: Parallel" in err.value.details()
    assert versions(rest, namespace, []) == before
