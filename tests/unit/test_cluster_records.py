"""The records the watch cache keeps, read once when an event arrives: PodGroups (conditions,
owner, preferences), PodDisruptionBudgets, and the typed events the cache's listeners get."""

import pytest

from cluster import names
from cluster.cache import CacheEvent, ClusterCache
from cluster.convert import Condition, conditions_from_json, disruption_budget, pdb_record, podgroup_record, read_pod
from solver import InvalidInput

from .k8s_objects import pod, podgroup


def test_a_podgroup_record_holds_what_the_cycle_reads():
    obj = podgroup("db", 3, key=names.LABEL_RACK)
    obj["metadata"].update(uid="u-1", creationTimestamp="2026-01-02T03:04:05Z", annotations={
        names.ANNOTATION_PREFERRED_TOPOLOGY: f"{names.LABEL_RACK},zone", "other": "x"},
        ownerReferences=[{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "s", "controller": True}])
    obj["status"] = {"conditions": [
        {"type": names.CONDITION_INITIALLY_SCHEDULED, "status": "False", "reason": "Unschedulable",
         "message": "no room", "lastTransitionTime": "2026-01-02T03:04:06Z", "observedGeneration": 2},
        "not a condition", {"status": "True"}]}
    record = podgroup_record(obj)
    assert (record.key, record.uid, record.spec.min_count) == ("default/db", "u-1", 3)
    assert record.preferred_keys == ("zone",)  # the required key is left out
    assert record.annotations["other"] == "x" and record.created > 0
    assert (record.owner.kind, record.owner.name) == ("StatefulSet", "db")
    # malformed entries are left out; the rest round-trips
    assert [c.type for c in record.conditions] == [names.CONDITION_INITIALLY_SCHEDULED]
    assert record.condition(names.CONDITION_INITIALLY_SCHEDULED).to_json() == obj["status"]["conditions"][0]
    assert record.condition("Other") is None


def test_conditions_of_an_object_without_a_readable_status_are_none():
    assert conditions_from_json({"status": "x"}) == () == conditions_from_json({})
    assert Condition("T", "True").to_json() == {"type": "T", "status": "True", "reason": "", "message": "",
                                                "lastTransitionTime": ""}


def test_a_malformed_podgroup_is_refused_naming_the_field():
    obj = podgroup("db", 3)
    obj["metadata"]["annotations"] = {names.ANNOTATION_PLACEMENT_PREFERENCE: "everywhere"}
    with pytest.raises(InvalidInput, match="placement-preference"):
        podgroup_record(obj)


def pdb(allowed=1, selector=None):
    return {"metadata": {"name": "p", "namespace": "default"},
            "spec": {"selector": selector if selector is not None else {"matchLabels": {"app": "a"}}},
            "status": {"disruptionsAllowed": allowed}}


def test_a_pdb_record_protects_the_pods_its_selector_matches():
    record = pdb_record(pdb(allowed=-3))
    budget = disruption_budget(record, [("u1", "default", {"app": "a"}), ("u2", "default", {"app": "b"}),
                                        ("u3", "other", {"app": "a"})])
    assert budget.pods == frozenset({"u1"}) and budget.allowed == 0  # never below zero
    with pytest.raises(InvalidInput, match="disruptionsAllowed"):
        pdb_record(pdb(allowed="1"))


def test_the_cache_skips_a_malformed_pdb_and_hands_listeners_typed_events():
    cache, seen = ClusterCache(), []
    cache.subscribe(seen.append)
    assert not cache.apply("PodDisruptionBudget", "ADDED", pdb(allowed=True))
    assert cache.skipped == 1 and cache.pdbs == {} and seen == []
    assert cache.apply("PodDisruptionBudget", "ADDED", pdb())
    member = pod("db-0", "db", gpu=0)
    member["metadata"]["uid"] = "uid-db-0"
    cache.apply("Pod", "ADDED", member)
    cache.apply("Pod", "DELETED", member)
    kinds = [(e.kind, e.type, e.deleted) for e in seen]
    assert kinds == [("PodDisruptionBudget", "ADDED", False), ("Pod", "ADDED", False), ("Pod", "DELETED", True)]
    added, deleted = seen[1], seen[2]
    assert added.pod is not None and added.pod.pod.group == "default/db" and added.key == added.pod.pod.uid
    assert isinstance(deleted, CacheEvent) and deleted.pod is None and deleted.key == added.key


def test_a_request_pod_is_read_once_or_refused_with_the_reason():
    assert read_pod(pod("a", "g")).group == "default/g"
    assert read_pod({"metadata": "x"}).startswith("phalanx: ")
    assert read_pod([1]).startswith("phalanx: ")


def test_a_pods_spec_is_read_again_only_when_its_generation_or_labels_move(monkeypatch):
    """The binding and the status updates after it keep a pod's generation: its solver pod is kept
    (with the new node); a spec change (generation moved) or a label change is read anew."""
    import copy

    from cluster import cache as cache_module

    reads = []
    real = cache_module.pod_from_json  # (the assertions' own calls of it are not counted)
    monkeypatch.setattr(cache_module, "pod_from_json", lambda obj: (reads.append(1), real(obj))[1])
    cache = ClusterCache()
    created = pod("p-0", "g", gpu=1)
    created["metadata"].update(uid="u-0", generation=1)
    cache.apply("Pod", "ADDED", created)
    first = cache.pods["u-0"].pod
    bound = copy.deepcopy(created)
    bound["spec"]["nodeName"] = "n-1"
    cache.apply("Pod", "MODIFIED", bound)
    assert cache.pods["u-0"].pod.node == "n-1" and cache.pods["u-0"].pod.spec is first.spec
    assert cache.pods["u-0"].pod == real(bound)  # what is kept is what a full read gives
    running = copy.deepcopy(bound)
    running["status"] = {"phase": "Running"}
    cache.apply("Pod", "MODIFIED", running)
    assert cache.pods["u-0"].phase == "Running" and cache.pods["u-0"].pod == real(running)
    assert len(reads) == 1  # created: read; bound and running: kept
    resized = copy.deepcopy(running)
    resized["metadata"]["generation"] = 2
    resized["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "3"
    cache.apply("Pod", "MODIFIED", resized)
    assert len(reads) == 2 and cache.pods["u-0"].pod.spec.requests["cpu"] == 3000
    relabeled = copy.deepcopy(resized)
    relabeled["metadata"]["labels"]["tier"] = "web"
    cache.apply("Pod", "MODIFIED", relabeled)
    assert len(reads) == 3 and cache.pods["u-0"].pod.labels["tier"] == "web"
    unversioned = copy.deepcopy(relabeled)
    del unversioned["metadata"]["generation"]  # an API server that sets none: always read
    cache.apply("Pod", "MODIFIED", unversioned)
    cache.apply("Pod", "MODIFIED", unversioned)
    assert len(reads) == 5
