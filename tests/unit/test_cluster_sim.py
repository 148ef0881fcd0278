"""The simulated cluster does what phalanx relies on from the built-in controllers — and feeds the
cache the same events a watch would."""

import pytest

from cluster.backend import WriteError
from cluster.sim import SIM_DURATION, SimCluster

from .k8s_objects import node, pod


def statefulset(name, replicas, policy="Parallel"):
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name, "namespace": "default"},
            "spec": {"replicas": replicas, "podManagementPolicy": policy,
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}}}}


def names(sim, prefix):
    return sorted(p["metadata"]["name"] for p in sim.list("Pod") if p["metadata"]["name"].startswith(prefix))


def test_parallel_statefulset_creates_every_pod_and_scales_down_from_the_top():
    sim = SimCluster()
    sim.create(statefulset("db", 3))
    assert names(sim, "db") == ["db-0", "db-1", "db-2"]
    sim.update("StatefulSet", "default/db", lambda o: o["spec"].update(replicas=1))
    assert names(sim, "db") == ["db-0"]
    assert [r.pod.name for r in sim.cache.pods.values()] == ["db-0"]  # the cache followed


def test_ordered_ready_waits_for_each_pod_to_run():
    sim = SimCluster()
    sim.create(node("n0"))
    sim.create(statefulset("zk", 3, "OrderedReady"))
    assert names(sim, "zk") == ["zk-0"]
    first = sim.get("Pod", "default/zk-0")
    sim.bind("default", "zk-0", first["metadata"]["uid"], "n0")  # bound pods become Running/Ready
    assert names(sim, "zk") == ["zk-0", "zk-1"]


def test_owner_deletion_garbage_collects_pods():
    sim = SimCluster()
    sim.create(statefulset("web", 2))
    sim.delete("StatefulSet", "default/web")
    assert names(sim, "web") == [] and not sim.cache.pods


def test_pods_finish_after_their_duration():
    sim = SimCluster()
    sim.create(node("n0"))
    job = pod("job-0")
    job["metadata"]["annotations"] = {SIM_DURATION: "30"}
    created = sim.create(job)
    sim.bind("default", "job-0", created["metadata"]["uid"], "n0")
    assert sim.cache.usage["n0"]["cpu"] == 1000
    sim.advance(29)
    assert sim.get("Pod", "default/job-0")["status"]["phase"] == "Running"
    sim.advance(1)
    assert sim.get("Pod", "default/job-0")["status"]["phase"] == "Succeeded"
    assert "n0" not in sim.cache.usage  # a finished pod holds nothing (no pod left: no entry)


def test_writes_refuse_what_the_api_server_refuses():
    sim = SimCluster()
    sim.create(node("n0"))
    p = sim.create(pod("p"))
    with pytest.raises(WriteError, match="not found"):
        sim.bind("default", "p", "wrong-uid", "n0")
    with pytest.raises(WriteError, match="node ghost not found"):
        sim.bind("default", "p", p["metadata"]["uid"], "ghost")
    sim.bind("default", "p", p["metadata"]["uid"], "n0")
    with pytest.raises(WriteError, match="already assigned"):
        sim.bind("default", "p", p["metadata"]["uid"], "n0")
    with pytest.raises(WriteError, match="already exists"):
        sim.create(node("n0"))


def test_eviction_honours_a_pdb_and_marks_the_disruption():
    sim = SimCluster()
    guarded = sim.create(pod("g", labels={"app": "g"}))
    sim.create({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "pdb", "namespace": "default"},
                "spec": {"selector": {"matchLabels": {"app": "g"}}}, "status": {"disruptionsAllowed": 0}})
    with pytest.raises(WriteError, match="PodDisruptionBudget"):
        sim.evict("default", "g", guarded["metadata"]["uid"], "test", respect_pdb=True)
    seen = []
    sim.cache.subscribe(lambda event: seen.append((event.type, getattr(event.record, "disrupted", None))))
    sim.evict("default", "g", guarded["metadata"]["uid"], "test", respect_pdb=False)
    assert ("MODIFIED", True) in seen and sim.get("Pod", "default/g") is None


def test_load_yaml_and_generated_topology():
    sim = SimCluster()
    sim.load_yaml("apiVersion: v1\nkind: Node\nmetadata: {name: a}\nstatus: {allocatable: {cpu: '2', pods: '10'}}\n"
                  "---\napiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {name: high}\nvalue: 1000\n")
    created = sim.add_nodes(zones=2, racks_per_zone=2, nodes_per_rack=3, gpus=8)
    assert len(created) == 12 and len(sim.cache.nodes) == 13
    assert sim.cache.priority_classes == {"high": 1000}
    racks = {n.labels["topology.kubernetes.io/rack"] for n in sim.cache.nodes.values() if n.name != "a"}
    assert len(racks) == 4
