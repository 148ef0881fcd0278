"""An in-memory stand-in for ``cluster.kube.Kube`` (the calls the controller makes) and builders of
StatefulSets and pods, for the controller's unit tests."""

from __future__ import annotations

import copy
import itertools
import json
import uuid
from typing import Any

from cluster import kinds, names
from cluster.kube import KubeError


def _split(path: str) -> tuple[str, str | None, str | None]:
    """``/apis/g/v/namespaces/ns/res[/name]`` -> (collection key, namespace, name)."""
    parts = path.strip("/").split("/")
    root = parts[:2] if parts[0] == "api" else parts[:3]
    rest = parts[len(root):]
    ns = None
    if rest and rest[0] == "namespaces" and len(rest) >= 3:
        ns, rest = rest[1], rest[2:]
    return "/".join(root + rest[:1]), ns, (rest[1] if len(rest) > 1 else None)


def apply_json_patch(obj: dict, ops: list[dict]) -> dict:
    try:
        return kinds.apply_patch(copy.deepcopy(obj), ops)
    except kinds.PatchTestFailed as err:
        raise KubeError("PATCH", str(err).split(":")[0], 422, json.dumps({"message": str(err)})) from None


def _selected(obj: dict, selector: str | None) -> bool:
    """Equality terms (``k=v``) and existence terms (``k``) of a label selector; others unsupported."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, (selector or "").split(",")):
        key, eq, value = term.partition("=")
        if any(c in term for c in "!() "):
            raise NotImplementedError(f"label selector term {term!r}")
        if key not in labels or (eq and labels[key] != value):
            return False
    return True


class FakeKube:
    def __init__(self) -> None:
        self.store: dict[str, dict[tuple[str | None, str], dict]] = {}
        self.calls: list[tuple[str, str]] = []
        self.fail_create: set[str] = set()  # collection suffixes whose creates fail with 500
        self.lists: list[tuple[str, str | None]] = []  # (path, labelSelector) of every list
        self._rv = itertools.count(1)

    def _coll(self, path: str) -> dict:
        return self.store.setdefault(_split(path)[0], {})

    def add(self, collection: str, obj: dict) -> dict:
        """Seed an object at a collection path (uid/resourceVersion filled in)."""
        return self.create(collection, obj, record=False)

    def create(self, path: str, body: dict, record: bool = True) -> dict:
        if record:
            self.calls.append(("POST", path))
        if any(path.endswith(s) for s in self.fail_create):
            raise KubeError("POST", path, 500, json.dumps({"message": "injected failure"}))
        _, ns, _ = _split(path)
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if ns:
            meta["namespace"] = ns
        if "generateName" in meta and "name" not in meta:
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        coll = self._coll(path)
        if (ns, meta["name"]) in coll:
            raise KubeError("POST", path, 409, json.dumps({"message": "already exists", "reason": "AlreadyExists"}))
        meta.setdefault("uid", str(uuid.uuid4()))
        meta["resourceVersion"] = str(next(self._rv))
        coll[(ns, meta["name"])] = obj
        return copy.deepcopy(obj)

    def list_pages(self, path: str, **params: Any) -> tuple[list[dict], str]:
        _, ns, _ = _split(path)
        self.lists.append((path, params.get("labelSelector")))
        items = [copy.deepcopy(o) for (ons, _), o in self._coll(path).items()
                 if (ns is None or ons == ns) and _selected(o, params.get("labelSelector"))]
        return items, str(next(self._rv))

    def get_or_none(self, path: str, **params: Any) -> Any:
        _, ns, name = _split(path)
        obj = self._coll(path).get((ns, name))
        return copy.deepcopy(obj) if obj else None

    def patch(self, path: str, body: Any, content_type: str = "") -> dict:
        self.calls.append(("PATCH", path))
        _, ns, name = _split(path)
        coll = self._coll(path)
        if (ns, name) not in coll:
            raise KubeError("PATCH", path, 404, "{}")
        obj = apply_json_patch(coll[(ns, name)], body)
        obj["metadata"]["resourceVersion"] = str(next(self._rv))
        coll[(ns, name)] = obj
        return copy.deepcopy(obj)

    def delete(self, path: str, body: Any = None) -> None:
        """Honours ``preconditions`` (uid, resourceVersion) with 409, as the API server does."""
        self.calls.append(("DELETE", path))
        _, ns, name = _split(path)
        coll = self._coll(path)
        if (ns, name) not in coll:
            raise KubeError("DELETE", path, 404, "{}")
        meta = coll[(ns, name)]["metadata"]
        for field, wanted in ((body or {}).get("preconditions") or {}).items():
            if wanted is not None and meta.get(field) != wanted:
                raise KubeError("DELETE", path, 409, json.dumps({"message": f"precondition failed: {field}",
                                                                 "reason": "Conflict"}))
        del coll[(ns, name)]

    def request(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        assert method == "PUT"
        _, ns, name = _split(path)
        coll = self._coll(path)
        current = coll.get((ns, name))
        if current is None or current["metadata"]["resourceVersion"] != body["metadata"].get("resourceVersion"):
            raise KubeError("PUT", path, 409, json.dumps({"message": "conflict", "reason": "Conflict"}))
        obj = copy.deepcopy(body)
        obj["metadata"]["resourceVersion"] = str(next(self._rv))
        coll[(ns, name)] = obj
        return copy.deepcopy(obj)

    def objects(self, resource: str, group: str = names.SCHEDULING_GROUP) -> list[dict]:
        key = f"apis/{group}/{names.SCHEDULING_VERSION}/{resource}"
        return list(self.store.get(key, {}).values())


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def event(self, obj: Any, kind: str, reason: str, message: str) -> None:
        self.seen.append((reason, message))

    def reasons(self) -> list[str]:
        return [r for r, _ in self.seen]


def statefulset(name: str = "db", replicas: int | None = 3, scheduling: dict | None = None,
                policy: str | None = "Parallel", annotations: dict | None = None, partition: int | None = None,
                owner: dict | None = None, template_claims: list | None = None, as_field: bool = False) -> dict:
    ann = dict(annotations or {})
    spec: dict[str, Any] = {"selector": {"matchLabels": {"app": name}},
                            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": []}}}
    if replicas is not None:
        spec["replicas"] = replicas
    if policy:
        spec["podManagementPolicy"] = policy
    if scheduling is not None:
        if as_field:
            spec["scheduling"] = scheduling
        else:
            ann[names.ANNOTATION_SCHEDULING] = json.dumps(scheduling)
    if partition is not None:
        spec["updateStrategy"] = {"type": "RollingUpdate", "rollingUpdate": {"partition": partition}}
    if template_claims is not None:
        spec["template"]["spec"]["resourceClaims"] = template_claims
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"uid-{name}", "annotations": ann}
    if owner:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta, "spec": spec}


def sts_pod(sts: dict, ordinal: int, **spec: Any) -> dict:
    meta = sts["metadata"]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{meta['name']}-{ordinal}", "namespace": meta["namespace"],
                         "labels": {"app": meta["name"], names.LABEL_STATEFULSET_POD_NAME: f"{meta['name']}-{ordinal}"},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": meta["name"],
                                              "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}]},
            "spec": {"containers": [{"name": "main", "image": "pause"}], **spec}}
