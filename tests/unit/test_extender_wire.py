"""The extender's wire format, checked against kube-scheduler's own Go types.

Requests are replayed byte for byte as kube-scheduler marshals them (Go field names, ``null`` for
the unused mode), in both nodeCacheCapable modes. Every reply is then decoded by a small Go
program with ``encoding/json`` into ``k8s.io/kube-scheduler/extender/v1`` types — the decoder
kube-scheduler itself uses — so a float score, a missing type or a wrong shape fails here.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from cluster.sim import SimCluster
from cycle import WorkloadCycle
from extender.http import create_app

from .k8s_objects import node, pod, podgroup

GODECODE = Path(__file__).parent / "godecode"


@pytest.fixture(scope="session")
def go_decode():
    """Build the Go decoder once (cached by source hash) and return a decode(kind, body) function."""
    go = shutil.which("go")
    assert go, "the Go toolchain is required for the wire tests (it is part of the e2e toolchain)"
    digest = hashlib.sha256(b"".join((GODECODE / f).read_bytes() for f in ("main.go", "go.mod", "go.sum"))).hexdigest()
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "phalanx" / "godecode"
    binary = cache / digest[:16]
    if not binary.exists():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run([go, "build", "-o", str(binary), "."], cwd=GODECODE, check=True)

    def decode(items: list[tuple[str, object]]) -> list[str]:
        lines = "".join(json.dumps({"type": k, "body": b}) + "\n" for k, b in items)
        out = subprocess.run([str(binary)], input=lines, capture_output=True, text=True, check=True)
        return out.stdout.splitlines()

    return decode


@pytest.fixture
def client():
    sim = SimCluster()
    for i in range(3):
        sim.create(node(f"n{i}", rack="r0", gpus=4))
    sim.create(podgroup("g", 2))
    pods = [sim.create(pod(f"g-{i}", "g")) for i in range(2)]
    loner = sim.create(pod("loner"))
    cycle = WorkloadCycle(sim.cache, sim, barrier_timeout=1.0).start()
    app = create_app(cycle)
    yield app.test_client(), sim, pods, loner
    cycle.close()


def node_objects(sim):
    return [sim.get("Node", f"n{i}") for i in range(3)]


def go_marshal_args(pod_obj, sim, cache_mode: bool) -> bytes:
    """ExtenderArgs as Go marshals it: fields in declaration order, the other mode's field null."""
    if cache_mode:
        body = {"Pod": pod_obj, "Nodes": None, "NodeNames": ["n0", "n1", "n2"]}
    else:
        body = {"Pod": pod_obj, "Nodes": {"metadata": {}, "items": node_objects(sim)}, "NodeNames": None}
    return json.dumps(body, separators=(",", ":")).encode()


FILTER_KEYS = {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}


@pytest.mark.parametrize("cache_mode", [True, False])
def test_filter_replies_in_both_modes_decode_in_go(client, go_decode, cache_mode):
    http, sim, pods, loner = client
    replies = []
    for p in (pods[0], loner):
        resp = http.post("/scheduler/filter", data=go_marshal_args(p, sim, cache_mode),
                         content_type="application/json")
        assert resp.status_code == 200
        body = resp.get_json()
        assert set(body) == FILTER_KEYS  # every key present
        if cache_mode:
            assert body["Nodes"] is None and isinstance(body["NodeNames"], list)
        else:
            assert body["NodeNames"] is None
            # kept nodes are echoed unchanged
            for item in body["Nodes"]["items"]:
                assert item == sim.get("Node", item["metadata"]["name"])
        replies.append(("filter", body))
    group_reply, loner_reply = replies[0][1], replies[1][1]
    kept = group_reply["NodeNames"] if cache_mode else [n["metadata"]["name"] for n in group_reply["Nodes"]["items"]]
    assert len(kept) == 1  # the planned node only
    loner_kept = loner_reply["NodeNames"] if cache_mode else loner_reply["Nodes"]["items"]
    assert len(loner_kept) >= 1
    assert go_decode(replies) == ["ok", "ok"]


def test_prioritize_scores_are_integers_0_to_10_in_go(client, go_decode):
    http, sim, pods, _ = client
    http.post("/scheduler/filter", data=go_marshal_args(pods[0], sim, True), content_type="application/json")
    resp = http.post("/scheduler/prioritize", data=go_marshal_args(pods[0], sim, True),
                     content_type="application/json")
    body = resp.get_json()
    assert all(set(h) == {"Host", "Score"} and type(h["Score"]) is int and 0 <= h["Score"] <= 10 for h in body)
    assert sorted(h["Score"] for h in body) == [0, 0, 10]
    assert go_decode([("prioritize", body)]) == ["ok"]


def test_bind_and_preempt_replies_decode_in_go(client, go_decode):
    http, sim, pods, loner = client
    bind = {"PodName": "loner", "PodNamespace": "default", "PodUID": loner["metadata"]["uid"], "Node": "n1"}
    resp = http.post("/scheduler/bind", data=json.dumps(bind), content_type="application/json")
    assert resp.get_json() == {"Error": ""}
    assert sim.get("Pod", "default/loner")["spec"]["nodeName"] == "n1"
    refused = http.post("/scheduler/bind", data=json.dumps({**bind, "PodName": "g-0",
                                                             "PodUID": pods[0]["metadata"]["uid"]}),
                        content_type="application/json").get_json()
    assert "has no plan" in refused["Error"]
    preempt_meta = {"Pod": loner, "NodeNameToVictims": None,
                    "NodeNameToMetaVictims": {"n0": {"Pods": [{"UID": "x"}], "NumPDBViolations": 0}}}
    preempt_full = {"Pod": loner, "NodeNameToMetaVictims": None,
                    "NodeNameToVictims": {"n0": {"Pods": [pods[1]], "NumPDBViolations": 1}}}
    group_preempt = {"Pod": pods[0], "NodeNameToVictims": None,
                     "NodeNameToMetaVictims": {"n0": {"Pods": [{"UID": "x"}], "NumPDBViolations": 0}}}
    replies = [http.post("/scheduler/preempt", data=json.dumps(b), content_type="application/json").get_json()
               for b in (preempt_meta, preempt_full, group_preempt)]
    assert replies[0]["NodeNameToMetaVictims"]["n0"]["Pods"] == [{"UID": "x"}]
    assert replies[1]["NodeNameToMetaVictims"]["n0"] == {"Pods": [{"UID": pods[1]["metadata"]["uid"]}],
                                                         "NumPDBViolations": 1}
    assert replies[2] == {"NodeNameToMetaVictims": {}}  # group pods: phalanx preempts for groups itself
    assert go_decode([("bind", {"Error": ""}), ("bind", refused)] + [("preempt", r) for r in replies]) == ["ok"] * 5


def test_request_keys_are_matched_case_insensitively(client):
    http, sim, pods, loner = client
    body = {"pod": loner, "nodenames": ["n0", "n1"], "NODES": None}
    resp = http.post("/scheduler/filter", data=json.dumps(body), content_type="application/json")
    assert resp.status_code == 200 and resp.get_json()["NodeNames"] == ["n0", "n1"]


def test_go_decoder_rejects_what_kube_scheduler_rejects(go_decode):
    """The decoder is strict where Go is: the checks above cannot pass by accident."""
    got = go_decode([("prioritize", [{"Host": "a", "Score": 5.5}]), ("filter", {"NodeNames": "a"}),
                     ("bind", {"Error": 3})])
    assert all(line.startswith("error:") for line in got)
