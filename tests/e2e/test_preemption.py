"""phalanx's group preemption against the real control plane, kube-scheduler and all.

Compare tests/e2e/README.md: upstream 1.37.2 evicts an `all` group whole too, but picks victims
without minimality across units; here the planner evicts the fewest pods in upstream's order and
the freed room is held for the preemptor until the victims are gone.
"""

from __future__ import annotations

from harness import GPU, create, pod, podgroup, priority_class, wait_all_bound, wait_for

HIGH, LOW = "phalanx-e2e-high", "phalanx-e2e-low"


def ensure_classes(rest):
    for name, value in ((HIGH, 100000), (LOW, 10)):
        if rest.get_or_none(f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}") is None:
            create(rest, priority_class(name, value))


def gang(rest, namespace, name, size, gpu, klass, mode=None):
    group = podgroup(name, min_count=size, disruption_mode=mode, priority_class_name=klass)
    create(rest, group, namespace)
    for i in range(size):
        create(rest, pod(f"{name}-{i}", name, {"cpu": "1", GPU: gpu}, priority_class_name=klass), namespace)


def alive(rest, namespace, prefix):
    return [p for p in rest.list_items(f"/api/v1/namespaces/{namespace}/pods")
            if p["metadata"]["name"].startswith(prefix + "-") and not p["metadata"].get("deletionTimestamp")]


def test_high_priority_gang_evicts_a_whole_all_gang_not_one_pod(rest, namespace, nodes, phalanx_scheduler):
    ensure_classes(rest)
    for i in range(8):
        nodes.add(f"pre-{i}", gpu=1, rack="rp")
    gang(rest, namespace, "low", 8, 1, LOW, mode="all")
    wait_all_bound(rest, namespace, count=8, timeout=60, podgroup="low")
    gang(rest, namespace, "high", 1, 1, HIGH)  # needs one GPU: one pod's room
    wait_all_bound(rest, namespace, count=1, timeout=90, podgroup="high")
    # the low gang is one unit: all 8 went, not the single pod whose room was needed
    wait_for(lambda: not alive(rest, namespace, "low"), timeout=60, message="whole low gang evicted")
    events = rest.list_items(f"/apis/events.k8s.io/v1/namespaces/{namespace}/events")
    assert any(e.get("reason") == "Preempted" and f"{namespace}/high" in e.get("note", "") for e in events)


def test_single_ensemble_loses_only_the_pods_it_must(rest, namespace, nodes, phalanx_scheduler):
    ensure_classes(rest)
    for i in range(4):
        nodes.add(f"single-{i}", gpu=1, rack="rs")
    gang(rest, namespace, "ens", 4, 1, LOW)  # disruptionMode single (default)
    wait_all_bound(rest, namespace, count=4, timeout=60, podgroup="ens")
    gang(rest, namespace, "hi", 2, 1, HIGH)
    wait_all_bound(rest, namespace, count=2, timeout=90, podgroup="hi")
    wait_for(lambda: len(alive(rest, namespace, "ens")) == 2, timeout=30, message="exactly two evicted")
    assert len(alive(rest, namespace, "ens")) == 2


def test_pdb_protected_victim_is_spared_when_an_alternative_exists(rest, namespace, nodes, phalanx_scheduler):
    ensure_classes(rest)
    for i in range(2):
        nodes.add(f"pdb-{i}", gpu=1, rack="rq")
    for name in ("guarded", "free"):
        create(rest, pod(name, None, {"cpu": "1", GPU: 1}, labels={"app": name}, priority_class_name=LOW), namespace)
    wait_for(lambda: all(p["spec"].get("nodeName") for p in rest.list_items(f"/api/v1/namespaces/{namespace}/pods")),
             timeout=60, message="both low pods bound")
    create(rest, {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "guard"},
                  "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "guarded"}}}}, namespace)
    wait_for(lambda: (rest.get(f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/guard")
                      .get("status", {}).get("observedGeneration")), timeout=30, message="PDB observed")
    gang(rest, namespace, "urgent", 1, 1, HIGH)
    wait_all_bound(rest, namespace, count=1, timeout=90, podgroup="urgent")
    names = {p["metadata"]["name"] for p in rest.list_items(f"/api/v1/namespaces/{namespace}/pods")
             if not p["metadata"].get("deletionTimestamp")}
    assert "guarded" in names and "free" not in names
