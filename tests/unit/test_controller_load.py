"""What the controller asks of the API server per StatefulSet: the pod list is filtered by the
StatefulSet's selector on the server, and the watch event of an object the controller just created
does not cause a second sync."""

import pytest

from controller import BUILTIN, Reconciler
from controller.reconciler import label_selector
from controller.runtime import Controller
from tests.unit.controller_fakes import Events, FakeKube, statefulset, sts_pod

STS = "/apis/apps/v1/namespaces/ns/statefulsets"
PODS = "/api/v1/namespaces/ns/pods"


@pytest.mark.parametrize("selector,query", [
    (None, ""),
    ({"matchLabels": {"b": "2", "a": "1"}}, "a=1,b=2"),
    ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["db", "cache"]},
                           {"key": "old", "operator": "DoesNotExist"},
                           {"key": "zone", "operator": "NotIn", "values": ["x"]},
                           {"key": "team", "operator": "Exists"}]},
     "tier in (db,cache),!old,zone notin (x),team"),
])
def test_label_selector_in_query_syntax(selector, query):
    assert label_selector(selector) == query


def test_pods_are_listed_by_the_statefulsets_selector():
    kube = FakeKube()
    sts = kube.add(STS, statefulset(scheduling={}))
    other = kube.add(STS, statefulset(name="web", scheduling={}))
    kube.add(PODS, sts_pod(sts, 0))
    kube.add(PODS, sts_pod(other, 0))
    reconciler = Reconciler(kube, BUILTIN, Events())
    assert [p["metadata"]["name"] for p in reconciler.pods_of(sts)] == ["db-0"]
    assert (PODS, "app=db") in kube.lists


def test_own_creations_are_remembered_once():
    kube = FakeKube()
    reconciler = Reconciler(kube, BUILTIN, Events())
    group = reconciler.sync(kube.add(STS, statefulset(scheduling={"schedulingPolicy": {"gang": {}}}))).podgroup
    assert reconciler.created_here(group["metadata"]["uid"])
    assert not reconciler.created_here(group["metadata"]["uid"])
    assert not reconciler.created_here("someone-elses") and not reconciler.created_here(None)


def test_watch_event_of_an_own_creation_enqueues_nothing_and_others_do():
    kube = FakeKube()
    controller = Controller(kube, "me", flavor=BUILTIN)
    group = controller.reconciler.sync(kube.add(STS, statefulset(scheduling={"schedulingPolicy": {"gang": {}}}))).podgroup
    controller._on_scheduling_object("ADDED", group)
    assert controller.queue._due == {}
    controller._on_scheduling_object("MODIFIED", group)  # a change by someone else: sync
    assert list(controller.queue._due) == ["ns/db"]
