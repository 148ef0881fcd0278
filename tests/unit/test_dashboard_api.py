"""The dashboard's JSON API over a simulated cluster, through Flask's test client: the PodGroups
table and a group's page (owner, policy, members, domain, state, explanation, timeline, victims),
the topology (detailed, and aggregated per rack above the node threshold), and 404s."""

import threading

import pytest
from flask import Flask

from cluster import names
from cluster.sim import SimCluster
from cycle import WorkloadCycle
from extender.dashboard import dashboard_blueprint
from extender.http import create_app

from .k8s_objects import pod, podgroup


def owned(obj, kind, name):
    obj["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": f"u-{name}",
                                           "controller": True}]
    return obj


@pytest.fixture
def client(sim, cycle):
    return create_app(cycle).test_client()


def test_the_page_and_its_assets_are_served(client):
    page = client.get("/")
    assert page.status_code == 200 and b"phalanx" in page.data
    for asset in ("app.js", "style.css"):
        assert client.get(f"/dashboard/static/{asset}").status_code == 200


def test_podgroups_list_shows_owner_policy_members_state_and_domain(sim, cycle, client):
    sim.create(podgroup("db", 2, key=names.LABEL_RACK))
    for i in range(2):
        sim.create(owned(pod(f"db-{i}", "db", gpu=2), "StatefulSet", "db"))
    sim.create(podgroup("late", 3))
    sim.create(pod("late-0", "late"))
    assert not isinstance(cycle.place_group("default/db"), str)
    rows = {r["key"]: r for r in client.get("/api/v1/podgroups").json["podgroups"]}
    db = rows["default/db"]
    assert db["owner"] == {"kind": "StatefulSet", "name": "db"}
    assert (db["policy"], db["min_count"], db["members"], db["bound"]) == ("gang", 2, 2, 0)
    assert db["topology_key"] == names.LABEL_RACK and db["domain"] in ("r0", "r1")
    assert db["state"] == "planned"
    late = rows["default/late"]
    assert late["owner"]["kind"] == "" and late["state"] == "waiting for members"
    assert client.get("/api/v1/podgroups").json["states"] == {"planned": 1, "waiting for members": 1}


def test_a_bound_group_is_scheduled_with_its_time_to_place(sim, cycle, client):
    sim.create(podgroup("job", 2))
    for i in range(2):
        sim.create(owned(pod(f"job-{i}", "job"), "Job", "job"))
    cycle.place_group("default/job")
    plan = cycle.plans["default/job"]
    calls = [threading.Thread(target=cycle.bind, args=("default", sim.cache.pods[u].pod.name, u, n))
             for u, n in plan.assignments.items()]
    for t in calls:
        t.start()
    for t in calls:
        t.join()
    row = client.get("/api/v1/podgroups/default/job").json
    assert row["state"] == "scheduled" and row["bound"] == 2 and row["owner"]["kind"] == "Job"
    assert row["time_to_place_s"] is not None and row["time_to_place_s"] >= 0
    assert [e["kind"] for e in row["timeline"]] == ["created", "planned", "bound"]
    assert row["placement"]["pods"] == 2 and row["placement"]["path"] in ("greedy", "exact")


def test_an_infeasible_group_page_carries_the_solvers_explanation(sim, cycle, client):
    sim.create(podgroup("huge", 3, key=names.LABEL_RACK))
    for i in range(3):
        sim.create(pod(f"huge-{i}", "huge", gpu=4))  # 12 GPUs; a rack has 8
    assert isinstance(cycle.place_group("default/huge"), str)
    assert cycle.flush()  # the refusal is written with its smallest change, off the call
    page = client.get("/api/v1/podgroups/default/huge").json
    assert page["state"] == "unschedulable"
    assert "needs 12 nvidia.com/gpu, 8 free" in page["explanation"]
    assert any("rack" in s and "needs 12" in s for s in page["shortfalls"])
    assert [c.split(":", 1)[0] for c in page["smallest_change"]] == ["capacity", "topology"]
    assert "lacks 1 node like" in page["smallest_change"][0]
    assert page["timeline"][-1]["kind"] == "unschedulable"
    assert [p["node"] for p in page["pods"]] == ["", "", ""]


def test_a_preemption_is_recorded_on_both_sides(sim, cycle, client):
    sim.create(podgroup("low", 4, mode="all", priority=1))  # fills all 16 GPUs
    for i in range(4):
        sim.create(pod(f"low-{i}", "low", gpu=4))
    cycle.place_group("default/low")
    plan = cycle.plans["default/low"]
    for uid, n in plan.assignments.items():
        sim.bind("default", sim.cache.pods[uid].pod.name, uid, n)
    sim.create(podgroup("high", 2, key=names.LABEL_RACK, priority=100))
    for i in range(2):
        sim.create(pod(f"high-{i}", "high", gpu=4))
    cycle.place_group("default/high")
    high = client.get("/api/v1/podgroups/default/high").json
    assert high["victims"] == [{"group": "default/low", "pods": 4}]
    assert "preempting" in [e["kind"] for e in high["timeline"]]
    low = client.get("/api/v1/podgroups/default/low").json
    assert low["preempted_by"] == "default/high"


def test_unknown_groups_and_racks_are_404(client):
    assert client.get("/api/v1/podgroups/default/nope").status_code == 404
    assert client.get("/api/v1/podgroups/default/nope").json == {"error": "podgroup default/nope not found"}
    assert client.get("/api/v1/topology/z0/nope").status_code == 404
    assert client.get("/api/v1/events?since=x").status_code == 400


def test_topology_lists_every_rack_with_its_nodes_and_groups(sim, cycle, client):
    sim.create(pod("loose", gpu=3, node="n-1-0"))
    topo = client.get("/api/v1/topology").json
    assert topo["nodes"] == 4 and not topo["aggregated"]
    racks = {r["name"]: r for z in topo["zones"] for r in z["racks"]}
    assert sorted(racks) == ["r0", "r1"]
    r1 = racks["r1"]
    assert (r1["resource"], r1["total"], r1["used"]) == ("nvidia.com/gpu", 8, 3)
    by_name = {n["name"]: n for n in r1["nodes"]}
    assert by_name["n-1-0"]["groups"] == [["", 3]] and by_name["n-1-0"]["pods"] == 1
    assert topo["totals"]["nvidia.com/gpu"] == {"total": 16, "used": 3, "reserved": 0}


def test_topology_is_aggregated_per_rack_above_the_threshold():
    sim = SimCluster()
    sim.add_nodes(zones=2, racks_per_zone=3, nodes_per_rack=5, gpus=8)
    sim.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu-only"},
                "status": {"allocatable": {"cpu": "32", "memory": "64Gi", "pods": "110"}}})
    cycle = WorkloadCycle(sim.cache, sim).start()
    app = Flask("t")
    app.register_blueprint(dashboard_blueprint(cycle, detail_limit=10))
    client = app.test_client()
    topo = client.get("/api/v1/topology").json
    assert topo["aggregated"] and topo["nodes"] == 31
    racks = [r for z in topo["zones"] for r in z["racks"]]
    assert len(racks) == 7 and all("nodes" not in r for r in racks)
    unlabelled = next(r for r in racks if r["zone"] == "(no zone)")
    assert (unlabelled["resource"], unlabelled["total"], unlabelled["node_count"]) == ("cpu", 32, 1)
    drill = client.get("/api/v1/topology/zone-1/z1-r2").json
    assert [n["name"] for n in drill["nodes"]] == [f"node-z1-r2-{i}" for i in range(5)]
    cycle.close()


def test_metrics_count_attempts_paths_and_verbs(sim, cycle, client):
    sim.create(podgroup("g", 1))
    sim.create(pod("g-0", "g"))
    cycle.place_group("default/g")
    client.post("/scheduler/filter", json={"Pod": {}, "NodeNames": []})
    m = client.get("/api/v1/metrics").json
    assert m["attempts"] == {"scheduled": 1}
    assert m["attempt_latency"]["count"] == 1 and m["attempt_latency"]["buckets"][-1]["le"] is None
    assert sum(m["solver"]["paths"].values()) == 1
    assert m["requests"] == {"filter": 1}


def test_events_are_read_incrementally(sim, cycle, client):
    first = client.get("/api/v1/events?since=0").json
    sim.create(podgroup("g", 1))
    later = client.get(f"/api/v1/events?since={first['seq']}").json
    assert [e["kind"] for e in later["events"]] == ["created"] and later["seq"] == first["seq"] + 1
