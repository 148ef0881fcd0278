"""Hostile and careless tenants on the real control plane, the short version of ``phalanx bench
tenants`` (docs/operations.md, "Tenants"): one namespace makes 1,000 PodGroups whose pods never all
arrive, asks minCount 1,000,000, names another namespace's PodGroup and writes a 250 KiB annotation;
each gets its refusal, and another tenant's gang of 8 is still bound whole.

kube-scheduler runs phalanx as its extender (the shipped configuration); the limits are ``phalanx
serve``'s defaults.
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import pytest
from conftest import start_phalanx_scheduler
from harness import GPU, create, pod, podgroup, wait_all_bound, wait_for

from cluster import names
from cluster.kube import KubeError

PODGROUPS = "/apis/scheduling.k8s.io/v1beta1/namespaces/{ns}/podgroups"
HOSTILE_GROUPS = 1_000


@pytest.fixture(scope="module")
def scheduler(control_plane: Any, phalanx: Any) -> Iterator[Any]:
    started = start_phalanx_scheduler(control_plane, "extender", phalanx)
    yield started
    started.stop()


@pytest.fixture
def hostile(rest: Any) -> Iterator[str]:
    """A second tenant's namespace, removed afterwards."""
    name = f"e2e-hostile-{uuid.uuid4().hex[:5]}"
    rest.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    rest.delete(f"/api/v1/namespaces/{name}", missing_ok=True)
    rest.request("DELETE", f"/api/v1/namespaces/{name}/pods", params={"gracePeriodSeconds": 0})


def condition(rest: Any, namespace: str, group: str) -> dict | None:
    pg = rest.get(PODGROUPS.format(ns=namespace) + f"/{group}")
    return next((c for c in (pg.get("status") or {}).get("conditions") or []
                 if c["type"] == names.CONDITION_INITIALLY_SCHEDULED), None)


def pod_events(rest: Any, namespace: str, pod_name: str) -> str:
    items = rest.list_items(f"/api/v1/namespaces/{namespace}/events")
    return " ".join(e.get("message", "") for e in items
                    if (e.get("involvedObject") or {}).get("name") == pod_name)


def test_hostile_namespace_is_refused_and_another_tenant_s_gang_binds(rest, namespace, hostile, nodes, scheduler,
                                                                        phalanx):
    for i in range(4):
        nodes.add(f"tn-{i}", gpu=4, rack="rt")

    # 1,000 PodGroups of minCount 2 whose second pod never comes
    def lonely(i: int) -> None:
        create(rest, podgroup(f"lonely-{i}", min_count=2), hostile)
        create(rest, pod(f"lonely-{i}-0", f"lonely-{i}", {"cpu": "10m"}), hostile)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lonely, range(HOSTILE_GROUPS)))

    # minCount 1,000,000: refused at once, saying why
    create(rest, podgroup("huge", min_count=1_000_000), hostile)
    create(rest, pod("huge-0", "huge", {"cpu": "10m"}), hostile)

    # another namespace's PodGroup: the API server refuses the name; the same name in its own
    # namespace resolves there only
    create(rest, podgroup("gang", min_count=8), namespace)
    with pytest.raises(KubeError) as refused:
        create(rest, pod("cross-0", f"{namespace}/gang", {"cpu": "10m"}), hostile)
    assert refused.value.status == 422 and "podGroupName" in str(refused.value)
    create(rest, pod("local-0", "gang", {"cpu": "10m"}), hostile)

    # an annotation at the API's limit: refused with its size
    big = podgroup("big", min_count=1)
    big["metadata"]["annotations"] = {names.ANNOTATION_PREFERRED_TOPOLOGY: "k" * (250 * 1024)}
    create(rest, big, hostile)
    create(rest, pod("big-0", "big", {"cpu": "10m"}), hostile)

    # the other tenant's gang of 8 is bound whole meanwhile
    for i in range(8):
        create(rest, pod(f"gang-{i}", "gang", {"cpu": "1", GPU: 1}), namespace)
    placement = wait_all_bound(rest, namespace, count=8, timeout=90, podgroup="gang")
    assert len(placement) == 8

    wait_for(lambda: (condition(rest, hostile, "huge") or {}).get("reason") == names.REASON_MIN_COUNT_TOO_LARGE,
             timeout=60, message="minCount 1,000,000 refused")
    assert "minCount 1,000,000 is more pods than every node of the cluster together may run" in \
        condition(rest, hostile, "huge")["message"]
    wait_for(lambda: "is malformed: annotation scheduling.phalanx.dev/preferred-topology is 256,000 bytes"
             in pod_events(rest, hostile, "big-0"), timeout=60, message="the oversized annotation refused")
    wait_for(lambda: f"podgroup {hostile}/gang does not exist yet" in pod_events(rest, hostile, "local-0"),
             timeout=60, message="a same-named group in another namespace is not resolved")
    assert phalanx.cycle.cache.members(f"{namespace}/gang") and all(
        m.pod.namespace == namespace for m in phalanx.cycle.cache.members(f"{namespace}/gang"))
    assert "waiting for members, 1 of 2 exist" in pod_events(rest, hostile, "lonely-0-0") or \
        phalanx.cycle.group_state(f"{hostile}/lonely-0") == "waiting"
