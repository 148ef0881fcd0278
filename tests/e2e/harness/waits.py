"""Bounded waits on cluster state: "all pods of the group bound", "nothing bound after T seconds".

Timeouts bound how long a test waits for a behaviour; they are not speed assertions.
"""

from __future__ import annotations

import time
from typing import Any, Callable, TypeVar

from cluster.kube import Kube

T = TypeVar("T")


def wait_for(probe: Callable[[], T], timeout: float, message: str, interval: float = 0.25) -> T:
    """Return the first truthy value of ``probe()``; TimeoutError (with the last value) otherwise."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{message} (not within {timeout:.0f}s; last: {_short(last)})")
        time.sleep(interval)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) < 800 else text[:800] + "..."


def pods(rest: Kube, namespace: str, label_selector: str | None = None,
         podgroup: str | None = None) -> list[dict]:
    """Pods of a namespace, optionally by label selector and/or spec.schedulingGroup.podGroupName."""
    items = rest.list_items(f"/api/v1/namespaces/{namespace}/pods", labelSelector=label_selector)
    if podgroup is not None:
        items = [p for p in items
                 if (p["spec"].get("schedulingGroup") or {}).get("podGroupName") == podgroup]
    return items


def bound(items: list[dict]) -> list[dict]:
    return [p for p in items if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")]


def placement(items: list[dict]) -> dict[str, str]:
    """pod name -> node name, for the bound pods."""
    return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in bound(items)}


def wait_all_bound(rest: Kube, namespace: str, count: int, timeout: float = 60.0,
                   label_selector: str | None = None, podgroup: str | None = None) -> dict[str, str]:
    """Wait until exactly ``count`` pods (of the selector/group) exist and all are bound."""
    seen: dict[str, Any] = {}

    def probe() -> dict[str, str] | None:
        items = pods(rest, namespace, label_selector, podgroup)
        seen["pods"], seen["bound"] = len(items), placement(items)
        return seen["bound"] if len(items) == count and len(seen["bound"]) == count else None
    try:
        return wait_for(probe, timeout, f"{count} pods bound in {namespace}")
    except TimeoutError as err:
        raise TimeoutError(f"{err}; selector={label_selector} podgroup={podgroup}: "
                           f"{seen.get('pods')} pods exist, bound: {seen.get('bound')}; "
                           f"last events: {last_events(rest, namespace)}") from None


def last_events(rest: Kube, namespace: str, count: int = 8) -> list[str]:
    """The namespace's last events, oldest first, as "time object reason: message" (what a timeout
    leaves to read once the namespace is gone)."""
    try:
        items = rest.list_items(f"/api/v1/namespaces/{namespace}/events")
    except Exception as err:  # noqa: BLE001 - a diagnostic must not hide the timeout
        return [f"(events not read: {err})"]

    def stamp(e: dict) -> str:
        return e.get("lastTimestamp") or e.get("eventTime") or e["metadata"].get("creationTimestamp") or ""
    return [f"{stamp(e)} {e['involvedObject'].get('kind')}/{e['involvedObject'].get('name')} "
            f"{e.get('reason')}: {(e.get('message') or '')[:300]}" for e in sorted(items, key=stamp)[-count:]]


def assert_none_bound(rest: Kube, namespace: str, seconds: float, label_selector: str | None = None,
                      podgroup: str | None = None, interval: float = 0.5) -> None:
    """Watch for ``seconds``: no pod of the selector/group may get bound."""
    deadline = time.monotonic() + seconds
    while True:
        where = placement(pods(rest, namespace, label_selector, podgroup))
        assert not where, f"pods got bound in {namespace} (podgroup={podgroup}): {where}"
        if time.monotonic() >= deadline:
            return
        time.sleep(interval)


def podgroup_conditions(rest: Kube, namespace: str, name: str) -> dict[str, dict]:
    """status.conditions of a scheduling.k8s.io/v1beta1 PodGroup, by type."""
    obj = rest.get(f"/apis/scheduling.k8s.io/v1beta1/namespaces/{namespace}/podgroups/{name}")
    return {c["type"]: c for c in obj.get("status", {}).get("conditions") or []}


def wait_gone(rest: Kube, path: str, timeout: float = 60.0) -> None:
    wait_for(lambda: rest.get_or_none(path) is None, timeout, f"{path} deleted")
