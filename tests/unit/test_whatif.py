"""What-if placement on the simulated cluster: a manifest compiled by the controller's code, planned
by the cycle on what it sees now, and nothing written."""

import copy
import io
import json

import grpc
import pytest
import yaml

from cluster import names
from controller.whatif import compile_objects
from cycle import DOES_NOT_FIT, FITS, FITS_AFTER_PREEMPTION, WorkloadCycle
from extender.http import create_app
from phalanx_cli.whatif import render_table, whatif
from proto.phalanx.v1 import workload_cycle_pb2 as pb
from proto.phalanx.v1 import workload_cycle_pb2_grpc as pb_grpc
from rpc import start_grpc_server
from rpc.servicer import whatif_message

from .k8s_objects import node as node_obj
from .k8s_objects import pod, podgroup

RACK = names.LABEL_RACK
GPU = "nvidia.com/gpu"


def statefulset(name, replicas, gpu=1, scheduling=None, namespace="default", priority_class=None, policy="Parallel"):
    """A StatefulSet with phalanx's scheduling annotation (a rack-gang unless ``scheduling`` says)."""
    spec = {"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "1", GPU: str(gpu)}}}]}
    if priority_class:
        spec["priorityClassName"] = priority_class
    if scheduling is None:
        scheduling = {"schedulingPolicy": {"gang": {}}, "schedulingConstraints": {"topology": [{"key": RACK}]}}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": name, "namespace": namespace,
                         "annotations": {names.ANNOTATION_SCHEDULING: json.dumps(scheduling)}},
            "spec": {"replicas": replicas, "podManagementPolicy": policy, "serviceName": name,
                     "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": spec}}}


def what_if(cycle, *objects, namespace="default"):
    drafts = compile_objects(list(objects), namespace)
    assert not drafts.errors, drafts.errors
    return cycle.what_if(drafts.groups)


def rack_of(sim, node_name):
    return sim.get("Node", node_name)["metadata"]["labels"][RACK]


def stored(sim):
    """Every object of the simulated cluster as stored (what a write would change)."""
    return copy.deepcopy(sim.objects)


def test_a_rack_gang_that_fits_gets_its_rack_and_nodes_exact_and_optimal_and_nothing_changes(sim, cycle):
    before, generation = stored(sim), cycle.plans.generation
    [answer] = what_if(cycle, statefulset("db", 4, gpu=2))
    assert answer.verdict == FITS and answer.source == "StatefulSet default/db"
    assert sorted(answer.nodes) == [f"db-{i}" for i in range(4)]
    assert {rack_of(sim, n) for n in answer.nodes.values()} == {answer.domain}
    assert answer.path == "exact" and answer.optimal and answer.min_count == 4 and answer.topology_key == RACK
    assert stored(sim) == before and cycle.plans.generation == generation and not list(cycle.plans.values())
    assert not sim.events


def test_the_prediction_is_where_the_applied_manifest_lands(sim, cycle):
    [answer] = what_if(cycle, podgroup("t", 3, RACK), *[pod(f"t-{i}", "t", gpu=2) for i in range(3)])
    assert answer.verdict == FITS
    sim.create(podgroup("t", 3, RACK))
    for i in range(3):
        sim.create(pod(f"t-{i}", "t", gpu=2))
    placed = cycle.place_group("default/t")
    assert not isinstance(placed, str)
    assert {cycle.cache.pods[u].pod.name: n for u, n in placed.assignments.items()} == dict(answer.nodes)


def test_a_gang_too_large_for_any_rack_does_not_fit_and_says_why(sim, cycle):
    [answer] = what_if(cycle, statefulset("big", 3, gpu=4))  # a rack holds 2 x 4 GPUs
    assert answer.verdict == DOES_NOT_FIT and not answer.nodes
    assert "nvidia.com/gpu" in answer.explanation


def test_current_plans_are_reserved_for_the_what_if(sim, cycle):
    sim.create(podgroup("held", 2, RACK))
    for i in range(2):
        sim.create(pod(f"held-{i}", "held", gpu=4))
    placed = cycle.place_group("default/held")  # a plan holds a whole rack now (not bound)
    assert not isinstance(placed, str) and placed.assignments
    [answer] = what_if(cycle, statefulset("db", 2, gpu=4))
    assert answer.verdict == FITS and answer.domain != placed.domain


def test_several_manifests_are_planned_side_by_side(sim, cycle):
    first, second, third = what_if(cycle, statefulset("a", 2, gpu=4), statefulset("b", 2, gpu=4),
                                   statefulset("c", 2, gpu=4))
    assert (first.verdict, second.verdict) == (FITS, FITS) and first.domain != second.domain
    assert third.verdict == DOES_NOT_FIT  # both racks are taken by the first two
    assert [a.order for a in (first, second, third)] == [1, 2, 3]  # no order fits all three


def test_the_answer_is_the_manifests_order_and_an_order_that_fits_more_is_advice(sim, cycle):
    # planned first, a small gang takes room a rack gang of 2 x 3 GPUs needs (every node has 4);
    # planned after the two rack gangs, it takes the GPU each of their nodes leaves
    small = statefulset("small", 2, gpu=1, scheduling={"schedulingPolicy": {"gang": {}}})
    small_answer, big_a, big_b = what_if(cycle, small, statefulset("big-a", 2, gpu=3), statefulset("big-b", 2, gpu=3))
    # as written (what applying the file does): the small gang first, and one rack gang left out
    assert [a.order for a in (small_answer, big_a, big_b)] == [1, 2, 3]
    assert (small_answer.verdict, big_a.verdict, big_b.verdict) == (FITS, FITS, DOES_NOT_FIT)
    for answer in (small_answer, big_a, big_b):
        assert answer.advice.startswith("applied one after another in the order StatefulSet big-a, StatefulSet big-b, StatefulSet small, 3 of 3 groups fit")
        assert answer.advice.endswith("as written, 2")
    assert "(this one fits, planned 3rd)" in small_answer.advice
    assert "planned 2nd" in big_b.advice and "fits in" in big_b.advice


def test_when_no_order_fits_more_a_joint_placement_that_does_is_advice(sim, cycle):
    # 16 GPUs; as written (and largest- or smallest-first) the 12-GPU gang goes first and one more
    # fits; placed jointly the three others fit side by side
    gang = {"schedulingPolicy": {"gang": {}}}
    answers = what_if(cycle, statefulset("a", 3, gpu=4, scheduling=gang), statefulset("b", 1, gpu=4),
                      statefulset("c", 3, gpu=2, scheduling=gang), statefulset("d", 3, gpu=1, scheduling=gang))
    assert [a.verdict for a in answers] == [FITS, FITS, DOES_NOT_FIT, DOES_NOT_FIT]
    for answer in answers:
        assert answer.advice.startswith("planned jointly, 3 of 4 groups fit")
        assert "as written, 2; no order of applying them does it" in answer.advice
    assert "(this one does not fit)" in answers[0].advice and "(this one fits in r" in answers[1].advice
    assert "(this one fits)" in answers[2].advice


def test_a_manifest_that_fits_as_written_carries_no_advice(sim, cycle):
    answers = what_if(cycle, statefulset("a", 2, gpu=4), statefulset("b", 2, gpu=4))
    assert [a.verdict for a in answers] == [FITS, FITS] and [a.advice for a in answers] == ["", ""]


def test_a_higher_priority_gang_fits_after_preempting_and_names_its_victims(sim, cycle):
    sim.create({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "high"},
                "value": 1000})
    for r in range(2):
        for i in range(2):
            sim.create(pod(f"low-{r}-{i}", gpu=3, node=f"n-{r}-{i}", priority=1))
    before = stored(sim)
    [answer] = what_if(cycle, statefulset("urgent", 2, gpu=4, priority_class="high"))
    assert answer.verdict == FITS_AFTER_PREEMPTION
    rack = answer.domain
    assert {v.pod for v in answer.victims} == {f"default/low-{rack[1]}-{i}" for i in range(2)}
    assert {v.priority for v in answer.victims} == {1}
    assert {rack_of(sim, n) for n in answer.nodes.values()} == {rack}
    assert "does not fit now" in answer.explanation
    assert stored(sim) == before and not cycle.preemption.nominations


def test_a_gang_that_may_not_preempt_does_not_fit(sim, cycle):
    for r in range(2):
        for i in range(2):
            sim.create(pod(f"low-{r}-{i}", gpu=3, node=f"n-{r}-{i}", priority=1))
    [answer] = what_if(cycle, statefulset("same", 2, gpu=4))  # priority 0: nobody below it
    assert answer.verdict == DOES_NOT_FIT and not answer.victims


def test_a_job_and_its_podgroup_are_planned_as_the_job_controller_runs_it(sim, cycle):
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train"},
           "spec": {"parallelism": 3, "completions": 3, "completionMode": "Indexed",
                    "template": {"spec": {**pod("x", "train", gpu=2)["spec"], "restartPolicy": "Never"}}}}
    [answer] = what_if(cycle, podgroup("train", 3, RACK), job)
    assert answer.verdict == FITS and sorted(answer.nodes) == ["train-0", "train-1", "train-2"]
    assert len({rack_of(sim, n) for n in answer.nodes.values()}) == 1


def test_a_leaderworkerset_gets_a_podgroup_per_replica(sim, cycle):
    template = {"spec": {"containers": [{"name": "c", "image": "x",
                                         "resources": {"requests": {"cpu": "1", GPU: "2"}}}]}}
    lws = {"apiVersion": names.LWS_API_VERSION, "kind": "LeaderWorkerSet",
           "metadata": {"name": "llm", "annotations": {names.ANNOTATION_SCHEDULING: json.dumps(
               {"replica": {"schedulingConstraints": {"topology": [{"key": RACK}]}}})}},
           "spec": {"replicas": 2, "leaderWorkerTemplate": {"size": 4, "workerTemplate": template}}}
    answers = what_if(cycle, lws)
    assert [a.verdict for a in answers] == [FITS, FITS] and {a.min_count for a in answers} == {4}
    assert sorted(answers[0].nodes) == ["llm-0", "llm-0-1", "llm-0-2", "llm-0-3"]
    assert answers[0].domain != answers[1].domain  # each replica takes a whole rack of 8 GPUs


@pytest.mark.parametrize(("obj", "message"), [
    (statefulset("ord", 2, policy="OrderedReady"),
     "spec.scheduling.schedulingPolicy.gang: Forbidden: gang scheduling requires podManagementPolicy: Parallel"),
    (statefulset("mc", 2, scheduling={"schedulingPolicy": {"gang": {"minCount": 2}}}),
     "spec.scheduling.schedulingPolicy.gang.minCount: Forbidden: may not be set"),
    (statefulset("none", 2, scheduling={}) | {"metadata": {"name": "none"}},
     "Required value: phalanx creates no PodGroup for a StatefulSet without a scheduling configuration"),
    ({"apiVersion": "apps/v1", "metadata": {"name": "x"}}, "kind: Required value"),
    ([1, 2], "Invalid value: must be an object"),
    (pod("lonely", "nowhere"), "spec.schedulingGroup.podGroupName: Not found: nowhere"),
    (statefulset("huge", 1_000_000), "spec.replicas: Too many: 1000000: what-if drafts at most 20000 pods"),
    (statefulset("fine", 2), "metadata.name: Duplicate value: the manifest gives this object twice"),
])
def test_invalid_objects_get_the_webhooks_messages_and_nothing_is_planned(obj, message):
    drafts = compile_objects([statefulset("fine", 1), obj])
    assert not drafts.groups
    assert any(message in m for e in drafts.errors for m in e.messages) or any(
        message in e.describe() for e in drafts.errors), drafts.errors


def test_every_webhook_message_is_given_field_by_field():
    bad = statefulset("bad", 2, policy="OrderedReady",
                      scheduling={"schedulingPolicy": {"gang": {"minCount": 2}}, "extra": 1})
    [errors] = compile_objects([bad]).errors
    assert errors.source == "StatefulSet default/bad" and len(errors.messages) == 3


# -- the entry points: gRPC WhatIf, POST /api/v1/whatif, `phalanx whatif` -----------------------------

@pytest.fixture
def grpc_server(cycle):
    running = start_grpc_server(cycle, "127.0.0.1:0", compile_manifest=compile_objects)
    yield running
    running.stop(grace=0)


@pytest.fixture
def stub(grpc_server):
    with grpc.insecure_channel(f"127.0.0.1:{grpc_server.port}") as channel:
        yield pb_grpc.WorkloadCycleStub(channel)


def test_the_grpc_call_answers_each_group_and_refuses_bad_manifests_field_by_field(sim, stub):
    reply = stub.WhatIf(pb.WhatIfRequest(objects_json=[json.dumps(statefulset("db", 2, gpu=4)),
                                                       json.dumps(statefulset("big", 3, gpu=4))]))
    fits, too_big = reply.groups
    assert (fits.verdict, fits.source, fits.policy, fits.min_count) == (FITS, "StatefulSet default/db", "gang", 2)
    assert sorted(fits.nodes) == ["db-0", "db-1"] and fits.path == "exact" and fits.optimal
    assert too_big.verdict == DOES_NOT_FIT and too_big.explanation and not too_big.nodes
    with pytest.raises(grpc.RpcError) as err:
        stub.WhatIf(pb.WhatIfRequest(objects_json=[json.dumps(statefulset("o", 2, policy="OrderedReady"))]))
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "StatefulSet default/o: spec.scheduling.schedulingPolicy.gang: Forbidden" in err.value.details()
    for request in (pb.WhatIfRequest(objects_json=["{not json"]), pb.WhatIfRequest(),
                    pb.WhatIfRequest(objects_json=["{}"], namespace="Not_A_Label")):
        with pytest.raises(grpc.RpcError) as err:
            stub.WhatIf(request)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT


def test_without_a_compiler_the_grpc_call_is_unimplemented(cycle):
    running = start_grpc_server(cycle, "127.0.0.1:0")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            with pytest.raises(grpc.RpcError) as err:
                pb_grpc.WorkloadCycleStub(channel).WhatIf(pb.WhatIfRequest(objects_json=["{}"]))
        assert err.value.code() is grpc.StatusCode.UNIMPLEMENTED
    finally:
        running.stop(grace=0)


@pytest.mark.parametrize("path", ["/api/v1/whatif", "/phalanx/api/whatif"])
def test_the_http_endpoint_answers_the_same_groups_and_refuses_bad_bodies(sim, cycle, path):
    client = create_app(cycle, compile_manifest=compile_objects).test_client()
    reply = client.post(path, json={"objects": [statefulset("db", 2, gpu=4)], "namespace": "default"})
    assert reply.status_code == 200
    [group] = reply.get_json()["groups"]
    assert (group["verdict"], group["minCount"], group["topologyKey"]) == (FITS, 2, RACK)
    assert sorted(group["nodes"]) == ["db-0", "db-1"] and group["optimal"] is True
    refused = client.post(path, json={"objects": [statefulset("o", 2, policy="OrderedReady")]})
    assert refused.status_code == 422
    assert refused.get_json()["errors"][0]["object"] == "StatefulSet default/o"
    assert any("Parallel" in m for m in refused.get_json()["errors"][0]["messages"])
    for body in (b"{nope", b"[]", b'{"objects": []}', b'{"objects": [{}], "namespace": 3}'):
        assert client.post(path, data=body, content_type="application/json").status_code == 400
    bare = WorkloadCycle(sim.cache, sim)  # a serve composed without the compiler
    try:
        assert create_app(bare).test_client().post(path, json={"objects": [{}]}).status_code == 501
    finally:
        bare.close()


def test_the_command_reads_multi_document_files_and_prints_a_table_json_or_yaml(sim, grpc_server, tmp_path, capsys):
    manifest = tmp_path / "gangs.yaml"
    manifest.write_text(yaml.safe_dump_all([statefulset("a", 2, gpu=4), {"apiVersion": "v1", "kind": "Service",
                                                                          "metadata": {"name": "a"}}]))
    second = tmp_path / "more.json"
    second.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [statefulset("b", 2, gpu=4)]}))
    addr = f"127.0.0.1:{grpc_server.port}"
    out = io.StringIO()
    assert whatif([str(manifest), str(second)], addr, out) == 0
    table = out.getvalue()
    assert table.splitlines()[0].split() == ["PODGROUP", "SOURCE", "VERDICT", "DOMAIN", "PODS", "SOLVER"]
    assert "StatefulSet default/a" in table and "StatefulSet default/b" in table and "a-0" in table
    out = io.StringIO()
    assert whatif([str(manifest), str(second)], addr, out, output="json") == 0
    groups = json.loads(out.getvalue())["groups"]
    assert [g["verdict"] for g in groups] == [FITS, FITS] and groups[0]["domain"] != groups[1]["domain"]
    out = io.StringIO()
    assert whatif([str(manifest)], addr, out, output="yaml") == 0
    assert yaml.safe_load(out.getvalue())["groups"][0]["source"] == "StatefulSet default/a"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(statefulset("o", 2, policy="OrderedReady")))
    assert whatif([str(bad)], addr, io.StringIO()) == 1
    assert "would be refused" in capsys.readouterr().err
    (tmp_path / "broken.yaml").write_text("a: [")
    assert whatif([str(tmp_path / "broken.yaml")], addr, io.StringIO()) == 1
    assert whatif([str(tmp_path / "missing.yaml")], addr, io.StringIO()) == 1
    assert "missing.yaml" in capsys.readouterr().err
    assert "planned" not in table and [g["order"] for g in groups] == [1, 2]
    reordered = tmp_path / "reordered.yaml"
    reordered.write_text(yaml.safe_dump_all([statefulset("small", 2, gpu=1, scheduling={"schedulingPolicy": {"gang": {}}}),
                                             statefulset("big-a", 2, gpu=3), statefulset("big-b", 2, gpu=3)]))
    out = io.StringIO()
    assert whatif([str(reordered)], addr, out) == 0
    text = out.getvalue()
    assert "(StatefulSet default/big-b): does-not-fit" in text
    assert "  advice: applied one after another in the order StatefulSet big-a, StatefulSet big-b, StatefulSet small, 3 of 3 groups fit" in text


# -- the benchmark, tiny ---------------------------------------------------------------------------------

def test_the_benchmark_reports_checked_answers_for_every_case():
    from bench import SUITES, whatif_bench

    assert SUITES["whatif"] == "bench.whatif_bench"
    rows = whatif_bench.run(nodes=160, calls=2)  # 5 racks of 32 nodes, half their GPUs used
    assert [r["verdict"] for r in rows] == [FITS, FITS, DOES_NOT_FIT]
    assert [r["calls"] for r in rows] == [2, 2, 10]  # the slow does-not-fit answer: a fifth, at least 10
    assert all(0 < r["p50_ms"] <= r["p99_ms"] <= r["max_ms"] for r in rows)
    assert "| 64-pod gang, one rack | 160 | 2 | fits (exact, optimal) |" in whatif_bench.markdown(rows)


def test_the_http_endpoint_reads_a_yaml_manifest_as_the_dashboards_form_sends_it(sim, cycle):
    client = create_app(cycle, compile_manifest=compile_objects).test_client()
    text = yaml.safe_dump_all([statefulset("a", 2, gpu=4), None, {"kind": "List", "items": [statefulset("b", 2, gpu=4)]}])
    reply = client.post("/api/v1/whatif", json={"manifest": text})
    assert reply.status_code == 200
    assert [g["source"] for g in reply.get_json()["groups"]] == ["StatefulSet default/a", "StatefulSet default/b"]
    assert client.post("/api/v1/whatif", json={"manifest": "a: ["}).status_code == 400
    assert client.post("/api/v1/whatif", json={"manifest": ""}).status_code == 400


def test_a_patch_leaves_the_object_it_was_applied_to_unchanged():
    from cluster import kinds

    original = {"metadata": {"labels": {"a": "1"}, "name": "p"}, "spec": {"gates": [{"name": "g"}], "x": {"y": 1}}}
    before = copy.deepcopy(original)
    patched = kinds.apply_patch(original, [
        {"op": "add", "path": "/metadata/labels/b", "value": "2"},
        {"op": "add", "path": "/spec/gates/-", "value": {"name": "h"}},
        {"op": "test", "path": "/spec/gates/0", "value": {"name": "g"}},
        {"op": "replace", "path": "/spec/gates/0", "value": {"name": "z"}},
        {"op": "remove", "path": "/metadata/name"}])
    assert original == before
    assert patched == {"metadata": {"labels": {"a": "1", "b": "2"}},
                       "spec": {"gates": [{"name": "z"}, {"name": "h"}], "x": {"y": 1}}}
    with pytest.raises(kinds.PatchTestFailed):
        kinds.apply_patch(original, [{"op": "test", "path": "/spec/x", "value": 2}])


def test_the_http_endpoint_is_behind_the_dashboards_token_gate_as_a_create(sim, cycle):
    asked = []

    def gate(token, path, verb):
        asked.append((path, verb))
        return (200, "ok") if token == "planner" else (401, "who are you?") if token is None else (403, "no")

    client = create_app(cycle, gate=gate, compile_manifest=compile_objects).test_client()
    body = {"objects": [statefulset("db", 2, gpu=4)]}
    assert client.post("/api/v1/whatif", json=body).status_code == 401
    assert client.post("/api/v1/whatif", json=body, headers={"Authorization": "Bearer other"}).status_code == 403
    assert client.post("/api/v1/whatif", json=body, headers={"Authorization": "Bearer planner"}).status_code == 200
    assert asked[-1] == ("/api/v1/whatif", "create")


def test_the_grpc_call_is_a_read_behind_the_same_token_gate_as_explain(sim, cycle):
    asked = []

    def gate(token, path, verb):
        asked.append((path, verb))
        return (200, "ok") if token == "viewer" else (401, "who are you?")

    running = start_grpc_server(cycle, "127.0.0.1:0", gate=gate, compile_manifest=compile_objects)
    request = pb.WhatIfRequest(objects_json=[json.dumps(statefulset("db", 2, gpu=4))])
    try:
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            call = pb_grpc.WorkloadCycleStub(channel).WhatIf
            with pytest.raises(grpc.RpcError) as err:
                call(request)
            assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED
            assert call(request, metadata=[("authorization", "Bearer viewer")]).groups[0].verdict == FITS
        assert asked[-1] == ("/phalanx.v1.WorkloadCycle/WhatIf", "get")
    finally:
        running.stop(grace=0)


@pytest.mark.parametrize(("scheduling", "counts"), [
    ({"schedulingPolicy": {"gang": {}}}, [8]),  # the whole LWS: one PodGroup of replicas x size
    ({"replica": {"leader": {}, "worker": {}}}, [1, 3, 1, 3]),  # per replica a leader and a worker group
])
def test_a_leaderworkerset_at_the_whole_and_role_levels(sim, cycle, scheduling, counts):
    template = {"spec": {"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "1", GPU: "1"}}}]}}
    lws = {"apiVersion": names.LWS_API_VERSION, "kind": "LeaderWorkerSet",
           "metadata": {"name": "llm", "annotations": {names.ANNOTATION_SCHEDULING: json.dumps(scheduling)}},
           "spec": {"replicas": 2, "leaderWorkerTemplate": {"size": 4, "workerTemplate": template}}}
    answers = what_if(cycle, lws)
    assert [a.min_count for a in answers] == counts and {a.verdict for a in answers} == {FITS}
    assert sorted(p for a in answers for p in a.nodes) == sorted(
        [f"llm-{i}" for i in range(2)] + [f"llm-{i}-{j}" for i in range(2) for j in range(1, 4)])


# -- volumes: the claims a manifest would create ---------------------------------------------------

def local_class(sim, name="local", default=False):
    meta = {"name": name}
    if default:
        meta["annotations"] = {"storageclass.kubernetes.io/is-default-class": "true"}
    sim.create({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": meta,
                "provisioner": names.PROVISIONER_NONE, "volumeBindingMode": "WaitForFirstConsumer"})


def local_pv(sim, name, node, cls="local", size="100Gi"):
    sim.create({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
                "spec": {"storageClassName": cls, "capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"],
                         "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                             {"key": names.LABEL_HOSTNAME, "operator": "In", "values": [node]}]}]}}},
                "status": {"phase": "Available"}})


def with_claims(sts, cls="local", size="10Gi"):
    """``sts`` with a claim template ``data`` (of class ``cls``; None: names no class) mounted."""
    spec = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}
    if cls is not None:
        spec["storageClassName"] = cls
    sts["spec"]["volumeClaimTemplates"] = [{"metadata": {"name": "data"}, "spec": spec}]
    sts["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/d"}]
    return sts


def test_a_statefulsets_claims_go_where_its_local_volumes_are(sim, cycle):
    local_class(sim)
    for pv_name, node in (("pv-a", "n-1-0"), ("pv-b", "n-0-1")):  # one local PV in each rack
        local_pv(sim, pv_name, node)
    sts = with_claims(statefulset("db", 2, gpu=1, scheduling={"schedulingPolicy": {"gang": {}}}))
    [answer] = what_if(cycle, sts)
    assert answer.verdict == FITS and sorted(answer.nodes.values()) == ["n-0-1", "n-1-0"]
    [in_a_rack] = what_if(cycle, with_claims(statefulset("rack", 2, gpu=1)))  # no rack holds two PVs
    assert in_a_rack.verdict == DOES_NOT_FIT and "PersistentVolume" in in_a_rack.explanation


def test_a_claim_that_names_no_class_gets_the_default_one(sim, cycle):
    local_class(sim, "other")
    local_class(sim, "local", default=True)
    local_pv(sim, "pv-a", "n-1-1")
    [answer] = what_if(cycle, with_claims(statefulset("one", 1, scheduling={"schedulingPolicy": {"gang": {}}}), cls=None))
    assert answer.verdict == FITS and dict(answer.nodes) == {"one-0": "n-1-1"}


def test_a_claim_that_exists_already_is_reused_as_the_statefulset_controller_does(sim, cycle):
    local_class(sim)
    local_pv(sim, "pv-a", "n-0-0")  # available, but the existing claim is bound elsewhere
    sim.create({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv-old"},
                "spec": {"storageClassName": "local", "capacity": {"storage": "100Gi"}, "accessModes": ["ReadWriteOnce"],
                         "claimRef": {"namespace": "default", "name": "data-old-0"},
                         "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                             {"key": names.LABEL_HOSTNAME, "operator": "In", "values": ["n-1-1"]}]}]}}},
                "status": {"phase": "Bound"}})
    sim.create({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data-old-0", "namespace": "default"},
                "spec": {"storageClassName": "local", "volumeName": "pv-old", "accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": "10Gi"}}}})
    [answer] = what_if(cycle, with_claims(statefulset("old", 1, scheduling={"schedulingPolicy": {"gang": {}}})))
    assert answer.verdict == FITS and dict(answer.nodes) == {"old-0": "n-1-1"}


def test_a_generic_ephemeral_volume_gets_a_claim_owned_by_its_pod(sim, cycle):
    local_class(sim)
    local_pv(sim, "pv-a", "n-0-1")
    members = [pod("e-0", "e", gpu=1)]
    members[0]["spec"]["volumes"] = [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {
        "storageClassName": "local", "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}}}]
    [answer] = what_if(cycle, podgroup("e", 1), *members)
    assert answer.verdict == FITS and dict(answer.nodes) == {"e-0": "n-0-1"}
    members[0]["spec"]["volumes"][0]["ephemeral"]["volumeClaimTemplate"]["spec"]["resources"] = {
        "requests": {"storage": "1Ti"}}  # larger than any PV
    [too_big] = what_if(cycle, podgroup("e", 1), *members)
    assert too_big.verdict == DOES_NOT_FIT


def test_a_claim_template_without_a_name_is_refused_with_the_field():
    sts = with_claims(statefulset("bad", 1))
    del sts["spec"]["volumeClaimTemplates"][0]["metadata"]
    drafts = compile_objects([sts], "default")
    assert not drafts.groups
    assert "spec.volumeClaimTemplates[0].metadata.name: Required value" in drafts.errors[0].describe()


# -- every door refuses what the solver cannot take; members left out are named ------------------------

def _min_count(value):
    group = podgroup("bad", 2)
    group["spec"]["schedulingPolicy"]["gang"]["minCount"] = value
    return group


def _basic_all():
    group = podgroup("bad", 2)
    group["spec"]["schedulingPolicy"] = {"basic": {}}
    group["spec"]["disruptionMode"] = {"all": {}}
    return group


@pytest.mark.parametrize(("group", "message"), [
    (_min_count(0), "minCount must be between 1 and 2147483647, got 0"),
    (_min_count(-3), "minCount must be between 1 and 2147483647, got -3"),
    (_min_count(2**31), "minCount must be between 1 and 2147483647, got 2147483648"),
    (_basic_all(), "disruptionMode all requires the gang policy"),
])
def test_a_podgroup_the_solver_cannot_take_is_refused_at_every_door_never_a_5xx(sim, cycle, stub, grpc_server,
                                                                               tmp_path, capsys, group, message):
    objects = [group, pod("bad-0", "bad"), pod("bad-1", "bad")]
    reply = create_app(cycle, compile_manifest=compile_objects).test_client().post(
        "/api/v1/whatif", json={"objects": objects})
    assert reply.status_code == 422 and message in json.dumps(reply.get_json())
    with pytest.raises(grpc.RpcError) as err:
        stub.WhatIf(pb.WhatIfRequest(objects_json=[json.dumps(o) for o in objects]))
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT and message in err.value.details()
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(yaml.safe_dump_all(objects))
    assert whatif([str(manifest)], f"127.0.0.1:{grpc_server.port}", io.StringIO()) == 1
    err_text = capsys.readouterr().err
    assert err_text.startswith("phalanx whatif: the manifest would be refused") and message in err_text
    assert "Traceback" not in err_text


def test_members_beyond_min_count_left_out_are_listed_as_waiting_with_why(sim, cycle, grpc_server, tmp_path):
    """minCount 2 of 6 pods of 4 GPUs in one rack of two 4-GPU nodes: 2 placed, 4 named as waiting,
    with the solver's reason no more fits; ``--exit-code`` says so (4)."""
    objects = [podgroup("six", 2, RACK)] + [pod(f"six-{i}", "six", gpu=4) for i in range(6)]
    [group] = create_app(cycle, compile_manifest=compile_objects).test_client().post(
        "/api/v1/whatif", json={"objects": objects}).get_json()["groups"]
    assert group["verdict"] == FITS and len(group["nodes"]) == 2
    assert group["waiting"] == ["six-2", "six-3", "six-4", "six-5"]
    assert "nvidia.com/gpu" in group["waitingWhy"] and f"rack {group['domain']}" in group["waitingWhy"]
    manifest = tmp_path / "six.yaml"
    manifest.write_text(yaml.safe_dump_all(objects))
    out = io.StringIO()
    addr = f"127.0.0.1:{grpc_server.port}"
    assert whatif([str(manifest)], addr, out, with_exit_code=True) == 4
    assert "  would wait (4 of 6 pods; minCount 2 placed): six-2, six-3, six-4, six-5" in out.getvalue()
    assert whatif([str(manifest)], addr, io.StringIO()) == 0  # without --exit-code: an answer is a 0
    fits = tmp_path / "fits.yaml"
    fits.write_text(yaml.safe_dump(statefulset("db", 2, gpu=1)))
    assert whatif([str(fits)], addr, io.StringIO(), with_exit_code=True) == 0
    big = tmp_path / "big.yaml"
    big.write_text(yaml.safe_dump(statefulset("big", 3, gpu=4)))  # 12 GPUs in one rack of 8
    assert whatif([str(big)], addr, io.StringIO(), with_exit_code=True) == 4


def test_what_if_manifests_corrupted_at_nested_fields_never_answer_5xx_or_internal(sim, cycle, stub):
    """StatefulSets, PodGroups with pods, Jobs and LeaderWorkerSets as users write them, up to three
    nested values corrupted (the extender fuzzing's corruptions): HTTP answers 200, 400 or 422, gRPC
    OK or INVALID_ARGUMENT — never a 5xx, never INTERNAL."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from .fuzz_bodies import corrupted

    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
           "spec": {"parallelism": 2, "completions": 2, "completionMode": "Indexed",
                    "template": {"spec": {"schedulingGroup": {"podGroupName": "pj"}, "restartPolicy": "Never",
                                          "containers": [{"name": "c", "image": "x",
                                                          "resources": {"requests": {"cpu": "1"}}}]}}}}
    lws = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
           "metadata": {"name": "llm", "annotations": {names.ANNOTATION_SCHEDULING: "{}"}},
           "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": 2, "workerTemplate": {"spec": {
               "containers": [{"name": "w", "image": "x", "resources": {"requests": {GPU: "1"}}}]}}}}}
    manifests = st.sampled_from([
        {"objects": [statefulset("db", 2)]},
        {"objects": [podgroup("pg", 2, RACK), pod("pg-0", "pg"), pod("pg-1", "pg")], "namespace": "default"},
        {"objects": [podgroup("pj", 2), job]},
        {"objects": [lws]},
    ])
    client = create_app(cycle, compile_manifest=compile_objects).test_client()

    @settings(max_examples=400, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(corrupted(manifests))
    def run(body) -> None:
        reply = client.post("/api/v1/whatif", data=json.dumps(body), content_type="application/json")
        assert reply.status_code in (200, 400, 422), (body, reply.status_code, reply.data[:300])
        objects = body.get("objects") if isinstance(body, dict) else None
        if not isinstance(objects, list):
            return
        try:
            stub.WhatIf(pb.WhatIfRequest(objects_json=[json.dumps(o) for o in objects]))
        except grpc.RpcError as err:
            assert err.code() is grpc.StatusCode.INVALID_ARGUMENT, (body, err.code(), err.details())

    run()


def running_statefulset(sim, cycle, name, replicas, gpu=2):
    """A gang StatefulSet's objects as phalanx's controller and the StatefulSet controller leave
    them (a PodGroup owned by the StatefulSet, its pods), placed by the cycle and bound."""
    group = podgroup(f"{name}-live", replicas, RACK)
    group["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": name,
                                             "uid": f"uid-{name}", "controller": True}]
    sim.create(group)
    for i in range(replicas):
        sim.create(pod(f"{name}-{i}", f"{name}-live", gpu=gpu))
    placed = cycle.place_group(f"default/{name}-live")
    assert not isinstance(placed, str), placed
    for uid, node_name in placed.assignments.items():
        sim.bind("default", cycle.cache.pods[uid].pod.name, uid, node_name)
    return {cycle.cache.pods[u].pod.name: n for u, n in placed.assignments.items()}


def test_a_running_statefulset_scaled_up_places_only_its_new_members_in_the_rack_it_holds(sim, cycle):
    running = running_statefulset(sim, cycle, "db", 2)  # 2 x 2 GPUs on one node of one rack
    held = {rack_of(sim, n) for n in running.values()}
    [answer] = what_if(cycle, statefulset("db", 4, gpu=2))
    assert answer.group == "default/db-live" and answer.verdict == FITS  # the gang it runs, not a new one
    assert (answer.running, answer.members, answer.min_count) == (2, 4, 4)
    assert sorted(answer.nodes) == ["db-2", "db-3"] and {answer.domain} == held
    assert {rack_of(sim, n) for n in answer.nodes.values()} == held
    # applied as the controller and the StatefulSet controller would: the prediction comes true
    sim.update("PodGroup", "default/db-live",
               lambda o: o["spec"]["schedulingPolicy"]["gang"].update(minCount=4))
    for i in (2, 3):
        sim.create(pod(f"db-{i}", "db-live", gpu=2))
    placed = cycle.place_group("default/db-live")
    assert not isinstance(placed, str)
    assert {cycle.cache.pods[u].pod.name: n for u, n in placed.assignments.items()} == dict(answer.nodes)


def test_a_scale_up_with_no_room_in_the_held_rack_does_not_fit_though_its_new_member_would_elsewhere(sim, cycle):
    running = running_statefulset(sim, cycle, "db", 2, gpu=4)  # a whole rack: 2 nodes x 4 GPUs
    [held] = {rack_of(sim, n) for n in running.values()}
    other = ({"r0", "r1"} - {held}).pop()
    [answer] = what_if(cycle, statefulset("db", 3, gpu=4))
    assert answer.verdict == DOES_NOT_FIT and answer.running == 2 and not answer.nodes
    assert f"rack {held}" in answer.explanation and f"rack {other}" not in answer.explanation, answer.explanation
    [alone] = what_if(cycle, statefulset("other", 1, gpu=4))  # the same pod as a gang of its own fits
    assert alone.verdict == FITS and alone.domain == other and alone.running == 0


def test_a_running_statefulset_scaled_down_or_unchanged_has_nothing_new_to_place(sim, cycle):
    running = running_statefulset(sim, cycle, "db", 3, gpu=1)
    for replicas in (3, 1):
        [answer] = what_if(cycle, statefulset("db", replicas, gpu=1))
        assert (answer.verdict, answer.running, answer.members, dict(answer.nodes)) == (FITS, replicas, replicas, {})
        assert answer.domain == rack_of(sim, running["db-0"])


def test_the_table_says_which_members_run_and_which_are_placed(sim, cycle):
    running_statefulset(sim, cycle, "db", 2)
    reply = pb.WhatIfReply(groups=[])
    [answer] = what_if(cycle, statefulset("db", 4, gpu=2))
    reply.groups.append(whatif_message(answer))
    assert reply.groups[0].running == 2
    assert "2 running stay where they are; 2 to place beside them" in render_table(reply)


def composite_manifest(children=2, gpu=4, min_group_count=2):
    """A CompositePodGroup (a job in one zone), its rack-gang children of 2 pods, and their pods."""
    from .test_cycle_composite import composite

    objects = [composite("job", min_group_count=min_group_count)]
    for r in range(children):
        group = podgroup(f"rep-{r}", 2, RACK)
        group["spec"]["parentCompositePodGroupName"] = "job"
        objects += [group] + [pod(f"rep-{r}-{i}", f"rep-{r}", gpu=gpu) for i in range(2)]
    return objects


def test_a_composite_of_the_manifest_is_answered_as_one_unit():
    from .test_cycle_composite import ZONE, blocks

    sim = blocks()
    for i in range(2):  # rack r2 (zone z0) full: only zone z1 holds both replicas
        sim.create(pod(f"busy-{i}", gpu=4, node=f"n-2-{i}"))
    cycle = WorkloadCycle(sim.cache, sim, barrier_timeout=2.0).start()
    try:
        drafts = compile_objects(composite_manifest(), "default")
        assert not drafts.errors and [c.key for c in drafts.composites] == ["default/job"]
        answers = cycle.what_if(drafts.groups, drafts.composites)
        assert [(a.group, a.verdict, a.composite) for a in answers] == [
            ("default/rep-0", FITS, "default/job"), ("default/rep-1", FITS, "default/job")]
        zones = {sim.get("Node", n)["metadata"]["labels"][ZONE] for a in answers for n in a.nodes.values()}
        assert zones == {"z1"}
        alone = cycle.what_if(drafts.groups)  # without its composite: each answered alone
        assert all(a.composite == "" and a.verdict == FITS for a in alone)
        assert len({sim.get("Node", n)["metadata"]["labels"][ZONE] for a in alone for n in a.nodes.values()}) == 2
        reply = pb.WhatIfReply(groups=[whatif_message(a) for a in answers])
        assert "answered with compositepodgroup default/job, as one unit" in render_table(reply)
    finally:
        cycle.close()


def test_the_crd_flavors_composite_is_read_as_the_built_in_one():
    """``scheduling.phalanx.dev/v1alpha3`` (the CRD flavor's third CRD) is a CompositePodGroup too."""
    objects = composite_manifest()
    objects[0]["apiVersion"] = f"{names.CRD_GROUP}/{names.COMPOSITE_VERSION}"
    drafts = compile_objects(objects, "default")
    assert not drafts.errors and [c.key for c in drafts.composites] == ["default/job"]
    objects[0]["apiVersion"] = "example.com/v1alpha3"  # someone else's kind of that name: nothing
    assert not compile_objects(objects, "default").composites


def test_a_composite_no_block_holds_says_why_naming_the_child_that_does_not_fit():
    from .test_cycle_composite import blocks

    sim = blocks()
    # 2 GPUs used on every node but rack r0's: zone z0 has 8 + 4 free, z1 4 + 4
    for rack in (1, 2, 3):
        for i in range(2):
            sim.create(pod(f"busy-{rack}-{i}", gpu=2, node=f"n-{rack}-{i}"))
    cycle = WorkloadCycle(sim.cache, sim, barrier_timeout=2.0).start()
    try:
        drafts = compile_objects(composite_manifest(children=2, gpu=3), "default")  # 12 GPUs asked in all
        answers = cycle.what_if(drafts.groups, drafts.composites)
        assert all(a.verdict == DOES_NOT_FIT and not a.nodes for a in answers), answers
        why = answers[0].explanation
        assert why == answers[1].explanation
        assert why.startswith("compositepodgroup default/job in topology.kubernetes.io/zone=z0: 1 of 2 children "
                              "fit, 2 required; podgroup default/rep-"), why
        bigger = compile_objects(composite_manifest(children=2, gpu=4), "default")  # 16 GPUs: no zone's total
        [first, _] = cycle.what_if(bigger.groups, bigger.composites)
        assert "no topology.kubernetes.io/zone domain holds the 16 nvidia.com/gpu" in first.explanation
    finally:
        cycle.close()


def test_a_malformed_composite_is_refused_by_field():
    bad = composite_manifest()
    bad[0]["spec"]["schedulingPolicy"]["gang"]["minGroupCount"] = 0
    drafts = compile_objects(bad, "default")
    assert drafts.errors and "minGroupCount must be between 1" in drafts.errors[0].describe()


def test_a_composite_that_fits_only_by_preempting_names_its_victims():
    from .test_cycle_composite import ZONE, blocks

    sim = blocks()
    for r in range(4):  # every node full; z1's pods the cheaper
        for i in range(2):
            sim.create(pod(f"low-{r}-{i}", gpu=4, node=f"n-{r}-{i}", priority=5 if r % 2 else 50))
    cycle = WorkloadCycle(sim.cache, sim, barrier_timeout=2.0).start()
    try:
        objects = composite_manifest()
        objects[0]["spec"]["priority"] = 1000
        for obj in objects[1:]:
            obj["spec"]["priority"] = 1000
        drafts = compile_objects(objects, "default")
        before = stored(sim)
        answers = cycle.what_if(drafts.groups, drafts.composites)
        assert [a.verdict for a in answers] == [FITS_AFTER_PREEMPTION] * 2, answers
        assert sorted(v.pod for v in answers[0].victims) == [f"default/low-{r}-{i}" for r in (1, 3) for i in range(2)]
        assert {sim.get("Node", n)["metadata"]["labels"][ZONE] for a in answers for n in a.nodes.values()} == {"z1"}
        assert stored(sim) == before and not cycle.preemption.nominations  # nothing evicted, nothing held
    finally:
        cycle.close()


def running_lws(sim, cycle, name, replicas, size, gpu=1):
    """A LeaderWorkerSet's objects as LWS and phalanx's controller leave them at the replica level:
    per replica a PodGroup named with its leader's incarnation, the leader ``<lws>-<i>`` and its
    workers ``<lws>-<i>-<j>`` labelled by LWS, placed by the cycle and bound."""
    for i in range(replicas):
        group = f"{name}-{i}-inc{i}"
        sim.create(podgroup(group, size, RACK))
        for j in range(size):
            labels = {names.LABEL_LWS_NAME: name, names.LABEL_LWS_GROUP_INDEX: str(i),
                      names.LABEL_LWS_WORKER_INDEX: str(j)}
            sim.create(pod(f"{name}-{i}" + (f"-{j}" if j else ""), group, gpu=gpu, labels=labels))
        placed = cycle.place_group(f"default/{group}")
        assert not isinstance(placed, str), placed
        for uid, node_name in placed.assignments.items():
            sim.bind("default", cycle.cache.pods[uid].pod.name, uid, node_name)


def test_a_running_leaderworkerset_scaled_up_places_only_its_new_replicas(sim, cycle):
    """A running LWS asked at more replicas: the replicas it runs are answered as they run (their
    live PodGroups, nothing new to place), only the added replica is planned — not every replica
    again beside the ones running, which counted their room twice."""
    running_lws(sim, cycle, "llm", 2, 4, gpu=2)  # each replica 8 GPUs: both racks full
    template = {"spec": {"containers": [{"name": "c", "image": "x",
                                         "resources": {"requests": {"cpu": "1", GPU: "2"}}}]}}

    def asked(replicas, gpu=2):
        template["spec"]["containers"][0]["resources"]["requests"][GPU] = str(gpu)
        return what_if(cycle, {"apiVersion": names.LWS_API_VERSION, "kind": "LeaderWorkerSet",
                               "metadata": {"name": "llm", "annotations": {names.ANNOTATION_SCHEDULING: json.dumps(
                                   {"replica": {"schedulingConstraints": {"topology": [{"key": RACK}]}}})}},
                               "spec": {"replicas": replicas, "leaderWorkerTemplate": {"size": 4,
                                                                                      "workerTemplate": template}}})

    unchanged = asked(2)
    assert [(a.group, a.verdict, a.running, dict(a.nodes)) for a in unchanged] == [
        ("default/llm-0-inc0", FITS, 4, {}), ("default/llm-1-inc1", FITS, 4, {})]
    *kept, added = asked(3)
    assert [(a.group, a.verdict, a.running) for a in kept] == [("default/llm-0-inc0", FITS, 4),
                                                              ("default/llm-1-inc1", FITS, 4)]
    assert added.verdict == DOES_NOT_FIT and added.running == 0  # no rack has 8 GPUs left
    sim.create(node_obj("n-2-0", rack="r2", gpus=4))
    sim.create(node_obj("n-2-1", rack="r2", gpus=4))
    *kept, added = asked(3)
    assert added.verdict == FITS and added.domain == "r2" and sorted(added.nodes) == [
        "llm-2", "llm-2-1", "llm-2-2", "llm-2-3"]
