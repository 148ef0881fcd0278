"""Gang-aware scale-up with the real Karpenter: phalanx makes a gang's NodeClaims, Karpenter launches
them (docs/autoscaling.md, "With Karpenter").

Karpenter ``sigs.k8s.io/karpenter`` at ``KARPENTER_VERSION`` with its KWOK cloud provider
(hack/build-karpenter.sh; harness/karpenter.py) runs against the e2e control plane with a NodePool
of the KWOK node class whose template asks for a rack (``topology.kubernetes.io/rack Exists``) and
whose disruption is the most eager there is (``WhenEmptyOrUnderutilized`` after ``0s``). phalanx
serve runs with ``--provisioner karpenter`` and a short ``--provisioning-timeout``; the nodes that
exist are KWOK nodes of a real KWOK instance type (``c-4x-amd64-linux``, 3,900m CPU allocatable),
each holding one of the gang's 2-CPU pods; each test's nodes and pods carry a pool label of its own
(which the NodePool allows), so nodes an earlier test left to consolidation are no room for it. In
each integration mode:

- a gang **StatefulSet** of 5, required in one rack and opted in to atomic provisioning, where rack
  ``ka`` holds 2 and ``kb`` 1: exactly 3 NodeClaims, all phalanx's, all in ``ka``, of that instance
  type, created at once; Karpenter launches them; the gang is bound whole in ``ka``; the new nodes
  carry ``karpenter.sh/do-not-disrupt`` while it runs and Karpenter makes no NodeClaim of its own
  for the pending pods (it counts phalanx's in-flight ones); once the StatefulSet is deleted
  phalanx lets the nodes go (or deletes them, when the pods went first) and none is left: no stray
  node;
- a gang whose rack's nodes are of an instance type the KWOK provider does not offer: its NodeClaims
  never launch (Karpenter says ``LaunchFailed``), phalanx deletes every one of them when the timeout
  runs out, the PodGroup says why, no node of them is left, and it does not ask again. Its pods
  also select a label no NodePool defines, so Karpenter's own provisioning (which would otherwise
  give them a node of another type, in a rack of its own naming) stays out of the case.

There is no in-tree side: kube-scheduler's gang scheduling asks no autoscaler for a domain's nodes
(Karpenter, left alone, provisions pod by pod; what it would do is printed for the record, not a
behaviour of phalanx's).
"""

from __future__ import annotations

import time
from typing import Any, Iterator

import pytest
from harness import RACK, create, placement, podgroup_conditions, pods, statefulset, wait_for
from harness.karpenter import (
    INSTANCE_TYPE_LABEL,
    KarpenterManager,
    conditions,
    node_args,
    requirement,
)

from cluster import names
from cluster.kube import Kube
from cycle.karpenter import KarpenterOptions

from .conftest import PHALANX_BARRIER_SECONDS, NodePool, start_phalanx_scheduler

SCHEDULER = "karpenter-phalanx"
POOL = "gangs"
TYPE = "c-4x-amd64-linux"  # 3,900m CPU allocatable: one 2-CPU pod per node
TIMEOUT_SECONDS = 20.0  # serve's --provisioning-timeout here
GANG_IN_A_RACK = {"schedulingPolicy": {"gang": {}}, "schedulingConstraints": {"topology": [{"key": RACK}]}}
CPU2 = {"cpu": "2"}
#: each test's nodes and pods carry its own value: the nodes other tests leave (Karpenter's
#: consolidation takes half a minute) are no room for this one's gang
POOL_KEY = "phalanx.dev/e2e-pool"
#: a label no NodePool here defines: Karpenter's own provisioning finds such pods incompatible
UNPROVISIONABLE = "phalanx.dev/e2e-not-karpenters"


@pytest.fixture(scope="module")
def karpenter(control_plane) -> Iterator[KarpenterManager]:
    manager = KarpenterManager(control_plane).start()
    manager.nodepool(POOL, [requirement(RACK, "Exists"), requirement(POOL_KEY, "Exists"),
                            requirement("karpenter.sh/capacity-type", "In", "on-demand")])
    yield manager
    manager.stop()


@pytest.fixture(scope="module")
def phalanx(control_plane, karpenter) -> Iterator[Any]:
    """phalanx serve with --provisioner karpenter (Karpenter's CRDs installed before its watch)."""
    from extender.server import ServeOptions, build

    service = build(ServeOptions(insecure_loopback_no_auth=True, http_addr="127.0.0.1:0", grpc_addr="127.0.0.1:0",
                                 http_threads=256, barrier_timeout=PHALANX_BARRIER_SECONDS, plan_ttl=30.0,
                                 karpenter=KarpenterOptions(POOL, TIMEOUT_SECONDS)),
                    kubeconfig=str(control_plane.admin_kubeconfig)).start()
    yield service
    service.stop()


@pytest.fixture(scope="module")
def ours(control_plane, scheduler_mode, phalanx) -> Iterator[Any]:
    scheduler = start_phalanx_scheduler(control_plane, scheduler_mode, phalanx, scheduler_name=SCHEDULER,
                                        name=f"karpenter-phalanx-{scheduler_mode}")
    yield scheduler
    scheduler.stop()


def gang_statefulset(name: str, replicas: int, selector: dict[str, str]) -> dict:
    obj = statefulset(name, replicas, requests=CPU2, scheduling=GANG_IN_A_RACK, scheduler_name=SCHEDULER,
                      node_selector=selector)
    obj["metadata"]["annotations"][names.ANNOTATION_PROVISIONING] = names.PROVISIONING_ATOMIC
    return obj


def rack(nodes: NodePool, prefix: str, name: str, count: int, labels: dict[str, str],
         instance_type: str = TYPE) -> list[str]:
    made = []
    for i in range(count):
        args = node_args(TYPE, {RACK: name, **labels})
        args["labels"][INSTANCE_TYPE_LABEL] = instance_type
        nodes.add(f"{prefix}-{name}-{i}", **args)
        made.append(f"{prefix}-{name}-{i}")
    return made


def members(rest: Kube, namespace: str, name: str) -> list[dict]:
    return [p for p in pods(rest, namespace) if p["metadata"]["name"].startswith(f"{name}-")
            and not p["metadata"].get("deletionTimestamp")]


def ours_of(claims: list[dict], uid: str) -> list[dict]:
    return [c for c in claims if c["metadata"].get("labels", {}).get(names.LABEL_NODECLAIM_PODGROUP_UID) == uid]


def podgroup_of(rest: Kube, namespace: str, name: str) -> dict:
    """The PodGroup phalanx's controller made for StatefulSet ``name``."""
    def find() -> dict | None:
        return next((g for g in rest.list_items(f"/apis/scheduling.k8s.io/v1beta1/namespaces/{namespace}/podgroups")
                     if g["metadata"]["name"].startswith(name)), None)
    return wait_for(find, 60, f"the PodGroup of {name}")


def test_a_gang_short_of_nodes_gets_its_nodeclaims_in_one_rack_at_once_and_binds_whole(
        rest, namespace, nodes, karpenter, ours, registered_controller, scheduler_mode) -> None:
    prefix = "k" + namespace[-6:]
    selector = {POOL_KEY: prefix}  # a label the NodePool allows: Karpenter could provision for these pods itself
    rack(nodes, prefix, "ka", 2, selector)  # room for 2 of the gang's 5
    rack(nodes, prefix, "kb", 1, selector)
    before = {c["metadata"]["name"] for c in karpenter.nodeclaims()}
    create(rest, gang_statefulset("train", 5, selector), namespace)
    bound = wait_for(lambda: placement(members(rest, namespace, "train"))
                     if len(placement(members(rest, namespace, "train"))) == 5 else None,
                     120, "the gang bound whole on the nodes Karpenter launched")
    group = podgroup_of(rest, namespace, "train")
    made = [c for c in karpenter.nodeclaims() if c["metadata"]["name"] not in before]
    mine = ours_of(made, group["metadata"]["uid"])
    assert len(mine) == 3 and mine == made, [c["metadata"]["name"] for c in made]  # none of Karpenter's own
    for claim in mine:
        labels = claim["metadata"]["labels"]
        assert labels[RACK] == "ka" and labels[names.LABEL_KARPENTER_NODEPOOL] == POOL
        assert conditions(claim).get(names.NODECLAIM_REGISTERED) == "True"
    new_nodes = {c["status"]["nodeName"] for c in mine}
    racks = {rest.get(f"/api/v1/nodes/{n}")["metadata"]["labels"][RACK] for n in bound.values()}
    assert racks == {"ka"} and new_nodes <= set(bound.values()), (bound, new_nodes)
    for node in new_nodes:  # Karpenter copied the protection to the node, where its disruption reads it
        meta = rest.get(f"/api/v1/nodes/{node}")["metadata"]
        assert meta["annotations"].get(names.ANNOTATION_KARPENTER_DO_NOT_DISRUPT) == "true"
        assert meta["labels"][INSTANCE_TYPE_LABEL] == TYPE
    print(f"\n  {scheduler_mode}: 3 NodeClaims in rack ka, gang bound on {sorted(set(bound.values()))}")

    rest.delete(f"/apis/apps/v1/namespaces/{namespace}/statefulsets/train")
    # the PodGroup gone, phalanx lets the nodes that still run its pods go (Karpenter's consolidation
    # then removes them: a 10 s loop, 15 s of validation, 5 s of drain) and deletes the empty ones;
    # which, depends on whether the pods or the PodGroup went first. Either way none is left, and a
    # NodeClaim goes a moment after its node (its finalizer)
    wait_for(lambda: not any(rest.get_or_none(f"/api/v1/nodes/{n}") for n in new_nodes)
             and not ours_of(karpenter.nodeclaims(), group["metadata"]["uid"]) or None, 150,
             "the gang's nodes and NodeClaims gone once its PodGroup went")


def test_a_gang_whose_nodes_never_launch_has_every_nodeclaim_deleted_and_says_why(
        rest, namespace, nodes, karpenter, ours, registered_controller, scheduler_mode) -> None:
    prefix = "k" + namespace[-6:]
    # Karpenter left alone would provision for these pods itself (a node of another type, in a rack
    # of its own naming, could hold them all): a label it does not know keeps it to phalanx's ask
    selector = {POOL_KEY: prefix, UNPROVISIONABLE: "true"}
    rack(nodes, prefix, "kc", 2, selector, instance_type="phalanx-e2e-no-such-type")  # the provider offers none
    create(rest, gang_statefulset("stuck", 4, selector), namespace)
    group = podgroup_of(rest, namespace, "stuck")
    uid = group["metadata"]["uid"]
    # the ask's claims are created one after the other in one queued write (and Karpenter may
    # delete one it cannot launch soon after): every name seen counts; two, and no third after
    seen: set[str] = set()

    def claims_seen() -> int:
        seen.update(c["metadata"]["name"] for c in ours_of(karpenter.nodeclaims(), uid))
        return len(seen)

    wait_for(lambda: claims_seen() >= 2 or None, 60, "the gang's two NodeClaims")
    for _ in range(10):
        time.sleep(0.2)
        claims_seen()
    assert len(seen) == 2, sorted(seen)
    wait_for(lambda: any("LaunchFailed" in str(c.get("status")) for c in ours_of(karpenter.nodeclaims(), uid))
             or None, 60, "Karpenter failing to launch them")

    def failed() -> dict | None:
        condition = podgroup_conditions(rest, namespace, group["metadata"]["name"]).get(
            names.CONDITION_INITIALLY_SCHEDULED)
        return condition if condition and condition["reason"] == names.REASON_PROVISIONING_FAILED else None

    condition = wait_for(failed, TIMEOUT_SECONDS + 60, "the PodGroup says its NodeClaims failed")
    assert f"not every node registered within {TIMEOUT_SECONDS:g} s" in condition["message"], condition
    assert "all 2 deleted" in condition["message"]
    wait_for(lambda: not ours_of(karpenter.nodeclaims(), uid) or None, 60, "every NodeClaim of the gang deleted")
    assert not [n for n in karpenter.nodes_of_karpenter()
                if n["metadata"]["labels"].get(names.LABEL_NODECLAIM_PODGROUP_UID) == uid]
    assert not placement(members(rest, namespace, "stuck"))  # nothing bound: all or nothing
    time.sleep(3)  # a cycle or two: it does not ask again
    assert not ours_of(karpenter.nodeclaims(), uid)
    others = [c["metadata"]["name"] for c in karpenter.nodeclaims()]
    print(f"\n  {scheduler_mode}: NodeClaims deleted after {TIMEOUT_SECONDS:g} s; Karpenter's own: {others}")
    rest.delete(f"/apis/apps/v1/namespaces/{namespace}/statefulsets/stuck")
