"""Fuzzing the four extender endpoints: whatever arrives, the answer is 200 or 400 with a
message — never a 500, never a crash. Arbitrary JSON (2,500 requests per endpoint), the
constraint fields corrupted at any depth (filter, preempt), and kube-scheduler-shaped requests
around realistic pods with nested fields corrupted (:mod:`.fuzz_bodies`): 10,000 per endpoint."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.sim import SimCluster
from cycle import WorkloadCycle
from extender.http import create_app

from . import fuzz_bodies
from .k8s_objects import node, pod, podgroup

JSON_LEAVES = st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False) | st.text(max_size=12)
JSON = st.recursive(JSON_LEAVES, lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=12)

SIM = SimCluster()
for i in range(3):
    SIM.create(node(f"n{i}", gpus=4))
SIM.create(podgroup("g", 2))
POD = SIM.create(pod("g-0", "g"))
SIM.create(pod("g-1", "g"))
CYCLE = WorkloadCycle(SIM.cache, SIM, barrier_timeout=0.05).start()
APP = create_app(CYCLE).test_client()

VALID = {
    "filter": {"Pod": POD, "Nodes": None, "NodeNames": ["n0", "n1", "n2"]},
    "prioritize": {"Pod": POD, "Nodes": {"metadata": {}, "items": [SIM.get("Node", "n0")]}, "NodeNames": None},
    "bind": {"PodName": "nope", "PodNamespace": "default", "PodUID": "u", "Node": "n0"},
    "preempt": {"Pod": POD, "NodeNameToVictims": None,
                "NodeNameToMetaVictims": {"n0": {"Pods": [{"UID": "a"}], "NumPDBViolations": 0}}},
}


def mutated(verb: str):
    """A valid request with one top-level or nested value replaced by arbitrary JSON."""
    base = VALID[verb]

    def mutate(args):
        key, value, nested = args
        body = json.loads(json.dumps(base))
        target = body.get("Pod") if nested and isinstance(body.get("Pod"), dict) else body
        target[key if key in target or not nested else "spec"] = value
        return body

    return st.tuples(st.sampled_from(sorted(base) + ["metadata", "spec"]), JSON, st.booleans()).map(mutate)


def bodies(verb: str):
    raw = st.binary(max_size=64)
    return st.one_of(JSON.map(json.dumps).map(str.encode), mutated(verb).map(json.dumps).map(str.encode), raw)


@pytest.mark.parametrize("verb", ["filter", "prioritize", "bind", "preempt"])
def test_endpoint_never_fails_with_500(verb):
    @settings(max_examples=2500, database=None)
    @given(bodies(verb))
    def run(body: bytes) -> None:
        resp = APP.post(f"/scheduler/{verb}", data=body, content_type="application/json")
        assert resp.status_code in (200, 400), (resp.status_code, resp.data[:300])
        if resp.status_code == 400:
            assert resp.data.startswith(b"phalanx: ")
        else:
            json.loads(resp.data)

    run()


def test_oversize_body_is_a_400():
    from extender.http.app import MAX_BODY_BYTES

    resp = APP.post("/scheduler/filter", data=b" " * (MAX_BODY_BYTES + 1), content_type="application/json")
    assert resp.status_code == 400 and b"too large" in resp.data


# -- the fields kube-scheduler's filters read, corrupted at any depth -----------------------------

RICH = json.loads(json.dumps(POD))
RICH["metadata"]["labels"] = {"app": "db"}
RICH["spec"]["affinity"] = {
    "podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "db"},
                               "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a"]}]},
             "topologyKey": "kubernetes.io/hostname", "matchLabelKeys": ["app"]}],
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 50, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "db"}},
                                               "topologyKey": "topology.kubernetes.io/zone",
                                               "namespaceSelector": {}}}]},
    "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "topology.kubernetes.io/zone",
         "namespaces": ["default"]}]},
}
RICH["spec"]["topologySpreadConstraints"] = [
    {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule",
     "labelSelector": {"matchLabels": {"app": "db"}}, "minDomains": 2, "nodeAffinityPolicy": "Honor",
     "nodeTaintsPolicy": "Ignore", "matchLabelKeys": ["app"]}]
RICH["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": 8080, "protocol": "TCP", "hostIP": ""}]
RICH["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "data-g-0"}},
                           {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}]


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, prefix + (i,))


RICH_PATHS = [p for p in _paths(RICH) if p]


def _replace(body, path, value):
    body = json.loads(json.dumps(body))
    target = body
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return body


@pytest.mark.parametrize("verb", ["filter", "preempt"])
def test_constraint_fields_corrupted_at_any_depth_never_fail_with_500(verb):
    """Affinity terms, selectors, spread constraints, ports and volumes with any nested value
    replaced by arbitrary JSON: the answer is a 200 (with phalanx's reason for every node when the
    pod cannot be read) or a 400, never a 500."""
    @settings(max_examples=1500, database=None, deadline=None)
    @given(st.sampled_from(RICH_PATHS), JSON)
    def run(path, value) -> None:
        body = dict(VALID[verb], Pod=_replace(RICH, path, value))
        resp = APP.post(f"/scheduler/{verb}", data=json.dumps(body), content_type="application/json")
        assert resp.status_code in (200, 400), (path, value, resp.status_code, resp.data[:300])

    run()


def test_a_malformed_affinity_term_is_answered_with_its_reason():
    body = dict(VALID["filter"], Pod=_replace(RICH, ("spec", "affinity", "podAntiAffinity"), "x"))
    resp = APP.post("/scheduler/filter", data=json.dumps(body), content_type="application/json")
    assert resp.status_code == 200
    answer = json.loads(resp.data)
    reasons = set((answer.get("FailedAndUnresolvableNodes") or {}).values())
    assert reasons and all(r.startswith("phalanx: ") and "podAntiAffinity" in r for r in reasons), answer


# -- kube-scheduler-shaped requests around realistic pods, corrupted at nested fields -------------
# With the fuzz above, at least 10,000 generated requests reach every verb.

STRUCTURED = {
    "filter": (fuzz_bodies.extender_args, 6000),
    "prioritize": (fuzz_bodies.extender_args, 7500),
    "bind": (fuzz_bodies.binding_args, 7500),
    "preempt": (fuzz_bodies.preemption_args, 6000),
}


@pytest.mark.parametrize("verb", sorted(STRUCTURED))
def test_kube_scheduler_shaped_requests_corrupted_at_nested_fields_never_fail_with_500(verb):
    """Real-looking ExtenderArgs / ExtenderPreemptionArgs / ExtenderBindingArgs (containers with
    resources, initContainers, tolerations, node and pod (anti-)affinity, spread constraints,
    volumes, schedulingGroup, labels) with up to three nested values corrupted: a 200 with an
    answer of the verb's shape, or a 400 saying what is wrong, never a 500."""
    strategy, examples = STRUCTURED[verb]

    @settings(max_examples=examples, deadline=None, database=None)
    @given(fuzz_bodies.corrupted(strategy(POD["metadata"]["uid"])))
    def run(body) -> None:
        resp = APP.post(f"/scheduler/{verb}", data=json.dumps(body), content_type="application/json")
        assert resp.status_code in (200, 400), (body, resp.status_code, resp.data[:300])
        if resp.status_code == 400:
            assert resp.data.startswith(b"phalanx: ")
            return
        answer = json.loads(resp.data)
        assert isinstance(answer, list if verb == "prioritize" else dict), answer

    run()


def test_a_preempt_victim_whose_metadata_is_not_an_object_is_a_400():
    """Found by the fuzz above: NodeNameToVictims with a victim pod whose metadata is a string."""
    body = dict(VALID["preempt"], NodeNameToMetaVictims=None,
                NodeNameToVictims={"n0": {"Pods": [{"metadata": "x"}], "NumPDBViolations": 0}})
    resp = APP.post("/scheduler/preempt", data=json.dumps(body), content_type="application/json")
    assert resp.status_code == 400 and b"Pods must be a list of pods with metadata" in resp.data
