"""Gang-aware scale-up with Karpenter on the simulated cluster: a gang short of capacity gets
NodeClaims for exactly the nodes it lacks, in its nearest rack, all at once; they are kept from
disruption while the gang needs them, all deleted when one does not come, and let go once the gang
is gone (docs/autoscaling.md). Karpenter itself is played by the test: it registers a node per
NodeClaim, or deletes one as Karpenter does when it cannot launch it."""

import time

import pytest

from cluster import names
from cluster.karpenter import NodeClaimAsk, nodeclaim_json, nodeclaim_prefix, nodeclaim_record, nodepool_record
from cluster.sim import SimCluster
from cycle import WorkloadCycle
from cycle.karpenter import KarpenterOptions, pack
from extender import verbs
from solver import InvalidInput, PodSpec

from .k8s_objects import node
from .test_cycle_provisioning import gang, grow
from .test_cycle_service import all_nodes, bind_all, condition, wait_until

RACK = names.LABEL_RACK
TYPE = "gpu-4x"


def pool_json(name="default", types=None, taints=None):
    requirements = [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
                    {"key": RACK, "operator": "Exists"}]
    if types:
        requirements.append({"key": names.LABEL_INSTANCE_TYPE, "operator": "In", "values": types})
    spec = {"nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "default"},
            "requirements": requirements, "expireAfter": "Never"}
    if taints:
        spec["taints"] = taints
    return {"apiVersion": names.KARPENTER_API_VERSION, "kind": "NodePool", "metadata": {"name": name},
            "spec": {"template": {"metadata": {"labels": {"team": "ml"}}, "spec": spec}}}


def typed_node(name, rack, instance_type=TYPE):
    obj = node(name, rack=rack, gpus=4)
    obj["metadata"]["labels"][names.LABEL_INSTANCE_TYPE] = instance_type
    return obj


@pytest.fixture
def cluster():
    """Racks r0 and r1 of two 4-GPU nodes each, of an instance type the NodePool offers."""
    sim = SimCluster()
    for r in range(2):
        for i in range(2):
            sim.create(typed_node(f"n-{r}-{i}", f"r{r}"))
    sim.create(pool_json())
    return sim


def serve(sim, timeout=60.0):
    return WorkloadCycle(sim.cache, sim, barrier_timeout=2.0,
                         karpenter=KarpenterOptions("default", timeout)).start()


def claims(sim):
    return sorted(sim.list("NodeClaim"), key=lambda c: c["metadata"]["name"])


def reason_of(answer):
    return next(iter(answer.unresolvable.values()), "") or next(iter(answer.failed.values()), "")


def uid_of(sim, name):
    return sim.get("PodGroup", f"default/{name}")["metadata"]["uid"]


def writes_of(cycle, kind):
    """The API writes of ``kind`` serve made (or tried), by its own metric."""
    return sum(sample.value for metric in cycle.metrics.api_writes.collect() for sample in metric.samples
               if sample.name.endswith("_total") and sample.labels["kind"] == kind)


def launch(sim, claim):
    """What Karpenter does for a NodeClaim it can launch: a node like the claim says, registered."""
    name = f"kwok-{claim['metadata']['name']}"
    obj = typed_node(name, claim["metadata"]["labels"][RACK])
    obj["metadata"]["labels"].update(claim["metadata"]["labels"])
    obj["metadata"]["annotations"] = dict(claim["metadata"].get("annotations") or {})
    sim.create(obj)

    def registered(o):
        o.setdefault("status", {}).update(nodeName=name, conditions=[
            {"type": names.NODECLAIM_LAUNCHED, "status": "True"}, {"type": names.NODECLAIM_REGISTERED, "status": "True"}])
    sim.update("NodeClaim", claim["metadata"]["name"], registered)
    return name


def test_a_gang_short_of_capacity_gets_nodeclaims_for_the_nodes_it_lacks_in_its_rack_at_once(cluster):
    sim = cluster
    cycle = serve(sim)
    try:
        pods = gang(sim, "train", 6)  # one 4-GPU pod per node: 2 fit in a rack, 4 nodes are missing
        answer = verbs.filter(cycle, pods[0], all_nodes(sim))
        assert answer.nodes == []
        prefix = nodeclaim_prefix(uid_of(sim, "train"))
        assert (f"NodeClaims {prefix}-{{0..3}} ask Karpenter (NodePool default) for 4 nodes of instance type "
                f"{TYPE} in {RACK}=r0 for 4 pods, all at once") in reason_of(answer)
        assert cycle.flush()
        made = claims(sim)
        assert [c["metadata"]["name"] for c in made] == [f"{prefix}-{i}" for i in range(4)]
        first = made[0]
        assert first["metadata"]["labels"][names.LABEL_KARPENTER_NODEPOOL] == "default"
        assert first["metadata"]["labels"][RACK] == "r0" and first["metadata"]["labels"]["team"] == "ml"
        assert first["metadata"]["annotations"][names.ANNOTATION_KARPENTER_DO_NOT_DISRUPT] == "true"
        assert first["metadata"]["annotations"][names.ANNOTATION_NODECLAIM_PODGROUP] == "default/train"
        assert first["metadata"]["ownerReferences"][0]["uid"] == sim.get("NodePool", "default")["metadata"]["uid"]
        requirements = {r["key"]: r for r in first["spec"]["requirements"]}
        assert requirements[RACK] == {"key": RACK, "operator": "In", "values": ["r0"]}  # the pool's Exists pinned
        assert requirements[names.LABEL_INSTANCE_TYPE]["values"] == [TYPE]
        assert requirements["karpenter.sh/capacity-type"]["values"] == ["on-demand"]
        assert first["spec"]["resources"]["requests"] == {"cpu": "1000m", "nvidia.com/gpu": "4"}
        assert first["spec"]["expireAfter"] == "Never"
        assert condition(sim, "train")["reason"] == names.REASON_PROVISIONING
        assert [e["reason"] for e in sim.events].count(names.EVENT_NODECLAIMS_CREATED) == 1

        for p in pods[1:]:  # every member asks again, and a restarted serve asks too: still four
            verbs.filter(cycle, p, all_nodes(sim))
        restarted = serve(sim)
        try:
            again = verbs.filter(restarted, pods[0], all_nodes(sim))
            assert f"NodeClaims {prefix}-{{0..3}}" in reason_of(again)
            assert restarted.flush() and cycle.flush()
        finally:
            restarted.close()
        assert len(claims(sim)) == 4

        nodes = {launch(sim, c) for c in claims(sim)}
        wait_until(lambda: "4 of 4 registered" in condition(sim, "train")["message"])
        bound, errors = bind_all(cycle, sim, pods)
        assert errors == []
        racks = {sim.get("Node", n)["metadata"]["labels"][RACK] for n in bound.values()}
        assert racks == {"r0"} and nodes <= set(bound.values())
        assert cycle.flush()
        assert all(c["metadata"]["annotations"].get(names.ANNOTATION_KARPENTER_DO_NOT_DISRUPT) == "true"
                   for c in claims(sim))  # kept while the gang runs

        sim.delete("PodGroup", "default/train")  # the gang is gone: its nodes, running its pods, are let go
        wait_until(lambda: cycle.flush() and not any(
            (o["metadata"].get("annotations") or {}).get(names.ANNOTATION_KARPENTER_DO_NOT_DISRUPT)
            for o in [*claims(sim), *(sim.get("Node", n) for n in nodes)]))
        assert len(claims(sim)) == 4  # left to the NodePool's disruption, not deleted
    finally:
        cycle.close()


def test_a_nodeclaim_deleted_before_its_node_registered_fails_the_ask_and_deletes_every_one(cluster):
    sim = cluster
    cycle = serve(sim)
    try:
        pods = gang(sim, "train", 5)
        verbs.filter(cycle, pods[0], all_nodes(sim))
        assert cycle.flush()
        made = claims(sim)
        assert len(made) == 3
        launch(sim, made[0])
        sim.delete("NodeClaim", made[1]["metadata"]["name"])  # Karpenter: insufficient capacity
        wait_until(lambda: cycle.flush() and claims(sim) == [])
        said = condition(sim, "train")
        assert said["reason"] == names.REASON_PROVISIONING_FAILED
        assert f"{made[1]['metadata']['name']} was deleted before its node registered" in said["message"]
        assert "all 3 deleted" in said["message"]
        answer = verbs.filter(cycle, pods[1], all_nodes(sim))  # it does not ask again
        assert "failed" in reason_of(answer)
        assert cycle.flush() and claims(sim) == []
        assert [e["reason"] for e in sim.events].count(names.EVENT_NODECLAIMS_CREATED) == 1
        deletes = writes_of(cycle, "nodeclaim")
        cycle.provisioning.prune(sim.cache.podgroups)  # the requeue thread's full prune: deletions landed
        for i in range(3):  # the gang's pods change: syncs run, and delete nothing again
            sim.annotate_pod("default", pods[i]["metadata"]["name"], {"touched": str(i)})
        time.sleep(1.0)
        assert cycle.flush() and writes_of(cycle, "nodeclaim") == deletes
    finally:
        cycle.close()


def test_nodes_that_do_not_all_register_in_time_are_all_deleted(cluster):
    sim = cluster
    cycle = serve(sim, timeout=0.3)
    try:
        pods = gang(sim, "train", 5)
        verbs.filter(cycle, pods[0], all_nodes(sim))
        assert cycle.flush()
        made = claims(sim)
        launch(sim, made[0])  # one comes, two never do
        sim.update("NodeClaim", made[1]["metadata"]["name"], lambda o: o.setdefault("status", {}).update(
            conditions=[{"type": names.NODECLAIM_LAUNCHED, "status": "Unknown", "reason": "LaunchFailed",
                         "message": "instance type not found"}]))
        wait_until(lambda: cycle.flush() and claims(sim) == [], seconds=10)
        message = condition(sim, "train")["message"]
        assert "not every node registered within 0.3 s (LaunchFailed: instance type not found)" in message
    finally:
        cycle.close()


def test_a_podgroup_deleted_before_its_gang_bound_takes_its_nodeclaims_with_it(cluster):
    sim = cluster
    cycle = serve(sim)
    try:
        pods = gang(sim, "train", 5)
        verbs.filter(cycle, pods[0], all_nodes(sim))
        assert cycle.flush() and len(claims(sim)) == 3
        launch(sim, claims(sim)[0])
        sim.delete("PodGroup", "default/train")
        wait_until(lambda: cycle.flush() and claims(sim) == [])
    finally:
        cycle.close()


def test_no_nodeclaims_without_opt_in_without_the_pool_or_for_a_type_it_does_not_offer(cluster):
    sim = cluster
    cycle = serve(sim)
    try:
        plain = gang(sim, "plain", 5, mode=None)
        assert "NodeClaims" not in reason_of(verbs.filter(cycle, plain[0], all_nodes(sim)))
        sim.delete("NodePool", "default")
        pods = gang(sim, "train", 5)
        assert "no NodeClaims: NodePool default not found" in reason_of(verbs.filter(cycle, pods[0], all_nodes(sim)))
        sim.create(pool_json(types=["cpu-8x"]))
        sim.delete("PodGroup", "default/train")
        for p in pods:
            sim.delete("Pod", f"default/{p['metadata']['name']}")
        pods = gang(sim, "again", 5)
        assert (f"no NodeClaims: NodePool default offers none of the instance types in {RACK}=r0 ({TYPE})"
                in reason_of(verbs.filter(cycle, pods[0], all_nodes(sim))))
        assert cycle.flush() and claims(sim) == []
    finally:
        cycle.close()


def test_pods_are_packed_largest_first_into_as_few_nodes_as_hold_them():
    allocatable = {"cpu": 8000, "memory": 32 << 30, "pods": 110}
    big, small = PodSpec(requests={"cpu": 6000}), PodSpec(requests={"cpu": 2000})
    assert pack([small, small, big, small, big], allocatable) == [
        {"cpu": 8000, "pods": 2}, {"cpu": 8000, "pods": 2}, {"cpu": 2000, "pods": 1}]
    assert pack([PodSpec(requests={"cpu": 9000})], allocatable) == "a pod needs more cpu than such a node has"


def test_a_nodepool_is_read_once_and_a_nodeclaim_copies_its_template():
    pool = nodepool_record({**pool_json(taints=[{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]),
                            "metadata": {"name": "default", "uid": "u-1"}})
    ask = NodeClaimAsk("c-0", "ns", "train", "uid-1", 2, TYPE, {RACK: "r1"}, {"cpu": 1500, "pods": 1})
    body = nodeclaim_json(ask, pool)
    assert body["spec"]["taints"] == [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]
    assert body["spec"]["resources"]["requests"] == {"cpu": "1500m"}
    assert body["metadata"]["labels"][names.LABEL_NODECLAIM_HELD] == "2"
    record = nodeclaim_record(body)
    assert (record.podgroup, record.podgroup_uid, record.held, record.protected) == ("ns/train", "uid-1", 2, True)
    assert not record.registered and record.trouble() == ""
    with pytest.raises(InvalidInput, match="requirements\\[0\\]: key and operator are required"):
        nodepool_record({"metadata": {"name": "bad"}, "spec": {"template": {"spec": {"requirements": [{}]}}}})
    with pytest.raises(InvalidInput, match="unknown taint effect"):
        nodepool_record({"metadata": {"name": "bad"}, "spec": {"template": {"spec": {
            "taints": [{"key": "a", "effect": "Sometimes"}]}}}})


def test_the_timeout_is_measured_from_the_ask(cluster):
    """A standing ask within its time is not failed by a sync (the timer is what ends it)."""
    sim = cluster
    cycle = serve(sim, timeout=30.0)
    try:
        pods = gang(sim, "train", 5)
        verbs.filter(cycle, pods[0], all_nodes(sim))
        assert cycle.flush()
        time.sleep(0.3)
        launch(sim, claims(sim)[0])
        wait_until(lambda: "1 of 3 registered" in condition(sim, "train")["message"])
        assert len(claims(sim)) == 3
    finally:
        cycle.close()


def test_a_gang_that_grows_gets_nodeclaims_of_its_own_for_the_increment_and_the_first_stay_kept(cluster):
    sim = cluster
    cycle = serve(sim)
    try:
        pods = gang(sim, "train", 3)  # 2 fit in a rack: one node asked for
        verbs.filter(cycle, pods[0], all_nodes(sim))
        assert cycle.flush()
        [first] = claims(sim)
        launch(sim, first)
        wait_until(lambda: "1 of 1 registered" in condition(sim, "train")["message"])
        current = [sim.get("Pod", f"default/{p['metadata']['name']}") for p in pods]
        planned, errors = bind_all(cycle, sim, current)
        assert errors == []
        [held] = {sim.get("Node", n)["metadata"]["labels"][RACK] for n in planned.values()}
        new = grow(sim, "train", 4)
        answer = verbs.filter(cycle, new[0], all_nodes(sim))
        increment = nodeclaim_prefix(uid_of(sim, "train"), 3)
        assert f"NodeClaims {increment}-0 ask Karpenter" in reason_of(answer)
        assert f"in {RACK}={held} for 1 pods" in reason_of(answer)
        assert cycle.flush()
        assert [c["metadata"]["name"] for c in claims(sim)] == sorted([first["metadata"]["name"], f"{increment}-0"])
        launch(sim, sim.get("NodeClaim", f"{increment}-0"))
        wait_until(lambda: any(e["reason"] == names.EVENT_NODECLAIMS_CHANGED and increment in e["note"]
                               and "1 of 1 registered" in e["note"] for e in sim.events))
        _, errors = bind_all(cycle, sim, [sim.get("Pod", f"default/{p['metadata']['name']}") for p in new])
        assert errors == []
        assert all(c["metadata"]["annotations"].get(names.ANNOTATION_KARPENTER_DO_NOT_DISRUPT) == "true"
                   for c in claims(sim))  # both asks' nodes kept while the gang runs
    finally:
        cycle.close()


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_serve_refuses_a_provisioning_timeout_that_is_not_a_number_of_seconds(value):
    from phalanx_cli.main import main

    with pytest.raises(SystemExit, match="--provisioning-timeout must be a number of seconds > 0"):
        main(["serve", "--sim", "/nonexistent", "--insecure-loopback-no-auth", "--provisioner", "karpenter",
              "--provisioning-timeout", value])
