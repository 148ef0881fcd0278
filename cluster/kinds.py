"""The controller's view of the API objects it reads and writes: typed readers and JSON writers.

``cluster.convert`` turns objects into the solver's records for the scheduling path; this module does
the same for ``phalanx controller``: StatefulSet, LeaderWorkerSet, Workload, PodGroup, Pod (labels,
annotations, owners, gates, its PodGroup), ResourceClaimTemplate, Lease, AdmissionReview and watch
events. Each reader takes the raw JSON once, at the border, and returns a frozen record; a record
passes through unchanged, so a function may be handed either. A field of the wrong type raises
:class:`MalformedObject` naming the object and the field, never a KeyError. Records keep the JSON
they were read from (``raw``) only to hand it back as it came (a patch's ``test`` value, the
PodGroup a webhook or a caller of the reconciler gets). The writers build the JSON of what the
controller creates or patches; what goes into them is the controller's decision, never this module's.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from solver import InvalidInput

from . import convert, fields, names

JSON = Mapping[str, Any]


MalformedObject = fields.MalformedObject


# -- type-checked reads (cluster.fields) --------------------------------------------------------------
_mapping, _list, _text, _string_map = fields.mapping, fields.items, fields.text, fields.string_map


def _count(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise MalformedObject(f"{where} must be an integer, got {value!r}")
    return value


def _objects(value: Any, where: str) -> tuple[JSON, ...]:
    return tuple(_mapping(item, f"{where}[{i}]") for i, item in enumerate(_list(value, where)))


@dataclass(frozen=True)
class ClaimEntry:
    """An entry of a ``resourceClaims`` list (a pod's, a pod template's, a PodGroup's or a
    scheduling block's): its name and its one source, "" when unset."""

    name: str
    claim_name: str  # resourceClaimName: an existing claim, shared as it is
    template_name: str  # resourceClaimTemplateName


def claim_entry(raw: Any, where: str) -> ClaimEntry:
    raw = _mapping(raw, where)
    return ClaimEntry(_text(raw.get("name"), f"{where}.name"),
                      _text(raw.get("resourceClaimName"), f"{where}.resourceClaimName"),
                      _text(raw.get("resourceClaimTemplateName"), f"{where}.resourceClaimTemplateName"))


def claim_entries(value: Any, where: str) -> tuple[ClaimEntry, ...]:
    return tuple(claim_entry(item, f"{where}[{i}]") for i, item in enumerate(_list(value, where)))


# -- metadata ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class OwnerRef:
    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool = False

    @property
    def group(self) -> str:
        """The API group ("" for the core group)."""
        return self.api_version.rpartition("/")[0]


@dataclass(frozen=True)
class Meta:
    name: str = ""
    namespace: str = ""
    uid: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    owners: tuple[OwnerRef, ...] = ()
    deleting: bool = False  # deletionTimestamp is set
    resource_version: str = ""
    finalizers: tuple[str, ...] = ()

    @property
    def controller(self) -> OwnerRef | None:
        return next((o for o in self.owners if o.controller), None)

    @property
    def controller_uid(self) -> str | None:
        """The UID of the controlling owner, None without one."""
        ctrl = self.controller
        return None if ctrl is None else ctrl.uid

    # the rule's one home (docs/design.md: KEP-6277/foreign-objects)
    @property
    def managed(self) -> bool:
        """Created by phalanx (the managed-by annotation), not by a user or a parent controller."""
        return self.annotations.get(names.ANNOTATION_MANAGED_BY) == names.MANAGED_BY_VALUE

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _owner(raw: JSON, where: str) -> OwnerRef:
    return OwnerRef(_text(raw.get("apiVersion"), f"{where}.apiVersion"), _text(raw.get("kind"), f"{where}.kind"),
                    _text(raw.get("name"), f"{where}.name"), _text(raw.get("uid"), f"{where}.uid"),
                    bool(raw.get("controller")))


def _named(kind: str, meta: JSON | Meta) -> str:
    """``kind namespace/name`` (or ``kind name``, or ``kind``) for error messages."""
    name, ns = (meta.name, meta.namespace) if isinstance(meta, Meta) else (meta.get("name"), meta.get("namespace"))
    return f"{kind} {ns}/{name}" if ns and name else f"{kind} {name}" if name else kind


def _meta_and_spec(obj: JSON, kind: str) -> tuple[Meta, JSON, str]:
    """An object's metadata, its spec, and ``kind namespace/name: spec`` (where a spec field is)."""
    meta = meta_of(obj, kind)
    where = f"{_named(kind, meta)}: spec"
    return meta, _mapping(obj.get("spec"), where), where


def meta_of(obj: JSON, kind: str) -> Meta:
    """An object's metadata; ``kind`` names it in errors."""
    meta = _mapping(_mapping(obj, kind).get("metadata"), f"{kind}: metadata")
    where = _named(kind, meta)
    owners = _objects(meta.get("ownerReferences"), f"{where}: metadata.ownerReferences")
    return Meta(
        name=_text(meta.get("name"), f"{where}: metadata.name"),
        namespace=_text(meta.get("namespace"), f"{where}: metadata.namespace"),
        uid=_text(meta.get("uid"), f"{where}: metadata.uid"),
        labels=_string_map(meta.get("labels"), f"{where}: metadata.labels"),
        annotations=_string_map(meta.get("annotations"), f"{where}: metadata.annotations"),
        owners=tuple(_owner(o, f"{where}: metadata.ownerReferences[{i}]") for i, o in enumerate(owners)),
        deleting=bool(meta.get("deletionTimestamp")),
        resource_version=_text(meta.get("resourceVersion"), f"{where}: metadata.resourceVersion"),
        finalizers=tuple(_text(f, f"{where}: metadata.finalizers") for f in _list(meta.get("finalizers"),
                                                                                    f"{where}: metadata.finalizers")),
    )


def kind_of(obj: JSON) -> str:
    """An object's ``kind`` ("" when absent)."""
    return _text(_mapping(obj, "object").get("kind"), "object: kind")


# -- workload owners ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class PodTemplate:
    """What the controller reads of a pod template."""

    priority_class: str = ""
    scheduling_group_set: bool = False
    claims: tuple[ClaimEntry, ...] = ()  # spec.resourceClaims


def _pod_template(raw: Any, where: str) -> PodTemplate:
    spec = _mapping(_mapping(raw, where).get("spec"), f"{where}.spec")
    return PodTemplate(_text(spec.get("priorityClassName"), f"{where}.spec.priorityClassName"),
                       spec.get("schedulingGroup") is not None,
                       claim_entries(spec.get("resourceClaims"), f"{where}.spec.resourceClaims"))


@dataclass(frozen=True)
class StatefulSet:
    meta: Meta
    replicas: int | None
    selector: JSON  # metav1.LabelSelector (see selector_query)
    pod_management_policy: str
    partition: int
    template: PodTemplate
    scheduling: Any  # spec.scheduling as written (None: unset); config.py reads and validates it
    api_version: str = "apps/v1"
    kind: str = "StatefulSet"
    raw: JSON = field(default_factory=dict, compare=False, repr=False)


def statefulset(obj: StatefulSet | JSON) -> StatefulSet:
    if isinstance(obj, StatefulSet):
        return obj
    meta, spec, where = _meta_and_spec(obj, "StatefulSet")
    rolling = _mapping(_mapping(spec.get("updateStrategy"), f"{where}.updateStrategy").get("rollingUpdate"),
                       f"{where}.updateStrategy.rollingUpdate")
    return StatefulSet(
        meta, _count(spec.get("replicas"), f"{where}.replicas"),
        _mapping(spec.get("selector"), f"{where}.selector"),
        _text(spec.get("podManagementPolicy"), f"{where}.podManagementPolicy") or "OrderedReady",
        _count(rolling.get("partition"), f"{where}.updateStrategy.rollingUpdate.partition") or 0,
        _pod_template(spec.get("template"), f"{where}.template"), spec.get("scheduling"),
        _text(obj.get("apiVersion"), "StatefulSet: apiVersion") or "apps/v1", raw=obj)


@dataclass(frozen=True)
class LeaderWorkerSet:
    meta: Meta
    replicas: int | None
    size: int  # leaderWorkerTemplate.size, 1 when unset
    startup_policy: str
    leader_template: PodTemplate  # the worker template when the LWS has no leader template
    worker_template: PodTemplate
    scheduling: Any
    api_version: str = names.LWS_API_VERSION
    kind: str = "LeaderWorkerSet"
    raw: JSON = field(default_factory=dict, compare=False, repr=False)


def leaderworkerset(obj: LeaderWorkerSet | JSON) -> LeaderWorkerSet:
    if isinstance(obj, LeaderWorkerSet):
        return obj
    meta, spec, where = _meta_and_spec(obj, "LeaderWorkerSet")
    lwt = _mapping(spec.get("leaderWorkerTemplate"), f"{where}.leaderWorkerTemplate")
    worker = _pod_template(lwt.get("workerTemplate"), f"{where}.leaderWorkerTemplate.workerTemplate")
    leader = (_pod_template(lwt.get("leaderTemplate"), f"{where}.leaderWorkerTemplate.leaderTemplate")
              if lwt.get("leaderTemplate") else worker)
    return LeaderWorkerSet(
        meta, _count(spec.get("replicas"), f"{where}.replicas"),
        _count(lwt.get("size"), f"{where}.leaderWorkerTemplate.size") or 1,
        _text(spec.get("startupPolicy"), f"{where}.startupPolicy"), leader, worker, spec.get("scheduling"),
        _text(obj.get("apiVersion"), "LeaderWorkerSet: apiVersion") or names.LWS_API_VERSION, raw=obj)


def selector_query(selector: JSON | None) -> str:
    """A metav1.LabelSelector in the API's query syntax ("" for none: everything matches)."""
    selector = _mapping(selector, "selector")
    terms = [f"{k}={v}" for k, v in sorted(_string_map(selector.get("matchLabels"), "selector.matchLabels").items())]
    for i, expr in enumerate(_objects(selector.get("matchExpressions"), "selector.matchExpressions")):
        key = _text(expr.get("key"), f"selector.matchExpressions[{i}].key")
        op = _text(expr.get("operator"), f"selector.matchExpressions[{i}].operator")
        values = ",".join(_list(expr.get("values"), f"selector.matchExpressions[{i}].values"))
        query = {"In": f"{key} in ({values})", "NotIn": f"{key} notin ({values})",
                 "Exists": key, "DoesNotExist": f"!{key}"}.get(op)
        if query is None:
            raise MalformedObject(f"selector.matchExpressions[{i}].operator: unknown operator {op!r}")
        terms.append(query)
    return ",".join(terms)


# -- Workload and PodGroup ---------------------------------------------------------------------------

@dataclass(frozen=True)
class ControllerRef:
    api_group: str
    kind: str
    name: str


@dataclass(frozen=True)
class GroupFields:
    """A PodGroupTemplate or a PodGroup spec: its gang minCount and resource claims, and the JSON
    (a PodGroup snapshots its template's fields)."""

    gang: bool
    min_count: int | None  # None for Basic (or a gang without one)
    claims: tuple[ClaimEntry, ...]
    raw: JSON = field(compare=False, repr=False)


def group_fields(raw: Any, where: str) -> GroupFields:
    raw = _mapping(raw, where)
    policy = _mapping(raw.get("schedulingPolicy"), f"{where}.schedulingPolicy")
    gang = policy.get("gang")
    min_count = None if gang is None else _count(_mapping(gang, f"{where}.schedulingPolicy.gang").get("minCount"),
                                                 f"{where}.schedulingPolicy.gang.minCount")
    return GroupFields(gang is not None, min_count, claim_entries(raw.get("resourceClaims"), f"{where}.resourceClaims"),
                       raw)


@dataclass(frozen=True)
class GroupTemplate:
    name: str
    fields: GroupFields


def group_template(raw: Any, where: str = "podGroupTemplate") -> GroupTemplate:
    return GroupTemplate(_text(_mapping(raw, where).get("name"), f"{where}.name"), group_fields(raw, where))


@dataclass(frozen=True)
class Workload:
    meta: Meta
    controller_ref: ControllerRef | None
    templates: tuple[GroupTemplate, ...]
    kind: str = "Workload"
    raw: JSON = field(default_factory=dict, compare=False, repr=False)

    def template(self, name: str) -> GroupTemplate | None:
        return next((t for t in self.templates if t.name == name), None)


def workload(obj: Workload | JSON) -> Workload:
    if isinstance(obj, Workload):
        return obj
    meta, spec, where = _meta_and_spec(obj, "Workload")
    ref = spec.get("controllerRef")
    controller_ref = None
    if ref is not None:
        ref = _mapping(ref, f"{where}.controllerRef")
        controller_ref = ControllerRef(*(_text(ref.get(k), f"{where}.controllerRef.{k}")
                                         for k in ("apiGroup", "kind", "name")))
    templates = _objects(spec.get("podGroupTemplates"), f"{where}.podGroupTemplates")
    return Workload(meta, controller_ref, tuple(
        group_template(t, f"{where}.podGroupTemplates[{i}]") for i, t in enumerate(templates)), raw=obj)


@dataclass(frozen=True)
class PodGroup:
    meta: Meta
    workload_name: str
    template_name: str
    fields: GroupFields
    kind: str = "PodGroup"
    raw: JSON = field(default_factory=dict, compare=False, repr=False)


def podgroup(obj: PodGroup | JSON) -> PodGroup:
    if isinstance(obj, PodGroup):
        return obj
    meta, spec, where = _meta_and_spec(obj, "PodGroup")
    ref = _mapping(spec.get("workloadRef"), f"{where}.workloadRef")
    return PodGroup(meta, _text(ref.get("workloadName"), f"{where}.workloadRef.workloadName"),
                    _text(ref.get("templateName"), f"{where}.workloadRef.templateName"),
                    group_fields(spec, where), raw=obj)


# -- pods --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Pod:
    """What the controller reads of a pod (the scheduler path reads it through cluster.convert)."""

    meta: Meta
    group: str  # the PodGroup it names ("" none), read as ``phalanx serve`` reads it
    gates: tuple[JSON, ...]  # spec.schedulingGates entries
    node_name: str
    phase: str
    claims: tuple[ClaimEntry, ...]  # spec.resourceClaims
    scheduler_name: str = names.DEFAULT_SCHEDULER  # spec.schedulerName
    raw: JSON = field(default_factory=dict, compare=False, repr=False)

    @property
    def gate_names(self) -> tuple[str, ...]:
        return tuple(str(g.get("name") or "") for g in self.gates)


def pod(obj: Pod | JSON) -> Pod:
    if isinstance(obj, Pod):
        return obj
    meta = meta_of(obj, "pod")
    where = _named("pod", meta)
    spec = _mapping(obj.get("spec"), f"{where}: spec")
    try:
        group = convert.pod_group_name(obj)
    except InvalidInput:
        group = ""
    return Pod(meta, group, _objects(spec.get("schedulingGates"), f"{where}: spec.schedulingGates"),
               _text(spec.get("nodeName"), f"{where}: spec.nodeName"),
               _text(_mapping(obj.get("status"), f"{where}: status").get("phase"), f"{where}: status.phase"),
               claim_entries(spec.get("resourceClaims"), f"{where}: spec.resourceClaims"),
               scheduler_name=(_text(spec.get("schedulerName"), f"{where}: spec.schedulerName")
                               or names.DEFAULT_SCHEDULER),
               raw=obj)


@dataclass(frozen=True)
class ClaimTemplate:
    """A ResourceClaimTemplate: the labels, annotations and spec of the claims made from it."""

    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    spec: JSON


def claim_template(obj: JSON) -> ClaimTemplate:
    _, spec, where = _meta_and_spec(obj, "ResourceClaimTemplate")
    claim_meta = _mapping(spec.get("metadata"), f"{where}.metadata")
    return ClaimTemplate(_string_map(claim_meta.get("labels"), f"{where}.metadata.labels"),
                         _string_map(claim_meta.get("annotations"), f"{where}.metadata.annotations"),
                         _mapping(spec.get("spec"), f"{where}.spec"))


# -- coordination, admission and watches -------------------------------------------------------------

@dataclass(frozen=True)
class Lease:
    holder: str
    renew_time: str
    duration: int | None
    transitions: int
    acquire_time: str
    raw_spec: JSON = field(compare=False, repr=False)


def lease(obj: JSON) -> Lease:
    spec = _mapping(_mapping(obj, "Lease").get("spec"), "Lease: spec")
    return Lease(_text(spec.get("holderIdentity"), "Lease: spec.holderIdentity"),
                 _text(spec.get("renewTime"), "Lease: spec.renewTime"),
                 _count(spec.get("leaseDurationSeconds"), "Lease: spec.leaseDurationSeconds"),
                 _count(spec.get("leaseTransitions"), "Lease: spec.leaseTransitions") or 0,
                 _text(spec.get("acquireTime"), "Lease: spec.acquireTime"), spec)


def with_lease_spec(obj: JSON, spec: JSON) -> dict[str, Any]:
    """The Lease ``obj`` (its resourceVersion kept: one writer wins) with ``spec``."""
    return {**obj, "spec": dict(spec)}


@dataclass(frozen=True)
class AdmissionRequest:
    uid: str
    operation: str
    namespace: str
    dry_run: bool
    object: JSON  # handed to the reader of its kind
    old_object: JSON | None


def review_request(review: JSON) -> AdmissionRequest:
    """The request of an AdmissionReview."""
    return admission_request(_mapping(_mapping(review, "AdmissionReview").get("request"), "AdmissionReview: request"))


def admission_request(request: AdmissionRequest | JSON) -> AdmissionRequest:
    """An AdmissionReview's ``request`` field."""
    if isinstance(request, AdmissionRequest):
        return request
    where = "AdmissionReview: request"
    old = request.get("oldObject")
    return AdmissionRequest(_text(request.get("uid"), f"{where}.uid"),
                            _text(request.get("operation"), f"{where}.operation"),
                            _text(request.get("namespace"), f"{where}.namespace"), bool(request.get("dryRun")),
                            _mapping(request.get("object"), f"{where}.object"),
                            None if old is None else _mapping(old, f"{where}.oldObject"))


def admission_response(request: AdmissionRequest, allowed: bool, message: str | None = None,
                       patch: list[dict[str, Any]] | None = None, warnings: list[str] | None = None) -> dict[str, Any]:
    """An AdmissionReview v1 answering ``request``."""
    answer: dict[str, Any] = {"uid": request.uid, "allowed": allowed}
    if message:
        answer["status"] = {"code": 403 if not allowed else 200, "message": message,
                            "reason": "Forbidden" if not allowed else ""}
    if patch:
        answer["patchType"] = "JSONPatch"
        answer["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    if warnings:
        answer["warnings"] = warnings
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": answer}


@dataclass(frozen=True)
class WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK, ERROR
    object: JSON
    resource_version: str
    error_code: int  # an ERROR event's Status code


def watch_event(event: JSON) -> WatchEvent:
    event = _mapping(event, "watch event")
    obj = _mapping(event.get("object"), "watch event: object")
    meta = _mapping(obj.get("metadata"), "watch event: object.metadata")
    code = obj.get("code")
    return WatchEvent(_text(event.get("type"), "watch event: type"), obj,
                      _text(meta.get("resourceVersion"), "watch event: object.metadata.resourceVersion"),
                      code if isinstance(code, int) else 0)


# -- writers -----------------------------------------------------------------------------------------

def json_pointer(*parts: str | int) -> str:
    """A JSON-patch path from its parts, ``~`` and ``/`` escaped."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def owned_pod_json(template: JSON, name: str, namespace: str, owner: Mapping[str, Any]) -> dict[str, Any]:
    """The pod a workload controller (StatefulSet, Job) creates from its pod ``template``: the
    template's metadata and spec, named ``name``, controlled by ``owner`` (an ownerReference).
    Raises MalformedObject when the template's metadata or spec is not an object."""
    parts = {part: template.get(part) or {} for part in ("metadata", "spec")}
    for part, value in parts.items():
        if not isinstance(value, Mapping):
            raise MalformedObject(f"{owner.get('kind', 'owner')} {owner.get('name', '')}: template.{part}: "
                                  f"Invalid value: must be an object")
    meta = copy.deepcopy(dict(parts["metadata"]))
    meta.update(name=name, namespace=namespace, ownerReferences=[{**owner, "controller": True}])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": copy.deepcopy(dict(parts["spec"] or {"containers": []}))}


class PatchTestFailed(ValueError):
    """A JSON patch's ``test`` op found another value (the API server answers 422)."""


def apply_patch(obj: JSON, ops: list[dict[str, Any]]) -> dict[str, Any]:
    """``obj`` with the JSON patch ``ops`` (RFC 6902 add, replace, remove, test) applied, as the API
    server applies a webhook's or a client's patch. ``obj`` itself is left unchanged: the objects
    and lists on the patched paths are copied, the rest is shared with ``obj`` (read the result,
    or patch it again; deep-copy it before changing it in place)."""
    out: dict[str, Any] = dict(obj)
    private = {id(out)}  # containers of ``out`` that are its own, not ``obj``'s
    for op in ops:
        keys = [k.replace("~1", "/").replace("~0", "~") for k in op["path"].split("/")[1:]]
        parent: Any = out
        for k in keys[:-1]:
            child = parent[int(k)] if isinstance(parent, list) else parent[k]
            if id(child) not in private:
                child = list(child) if isinstance(child, list) else dict(child)
                private.add(id(child))
                parent[int(k) if isinstance(parent, list) else k] = child
            parent = child
        _apply_op(parent, keys[-1], op)
    return out


def _apply_op(parent: Any, last: str, op: dict[str, Any]) -> None:
    """One op of :func:`apply_patch` on ``parent`` (an object or list of the result), key ``last``."""
    if op["op"] == "test":
        current = parent[int(last)] if isinstance(parent, list) else parent.get(last)
        if current != op["value"]:
            raise PatchTestFailed(f"{op['path']}: test failed")
    elif op["op"] == "remove":
        if isinstance(parent, list):
            del parent[int(last)]
        elif last in parent:
            del parent[last]
        else:
            raise PatchTestFailed(f"{op['path']}: remove of a missing member")
    elif isinstance(parent, list):
        if last == "-":
            parent.append(copy.deepcopy(op["value"]))
        else:
            parent[int(last)] = copy.deepcopy(op["value"])
    else:
        parent[last] = copy.deepcopy(op["value"])


def owner_ref_json(owner: Meta, api_version: str, kind: str, controller: bool) -> dict[str, Any]:
    ref: dict[str, Any] = {"apiVersion": api_version, "kind": kind, "name": owner.name, "uid": owner.uid,
                           "blockOwnerDeletion": True}
    if controller:
        ref["controller"] = True
    return ref


def metadata_json(name: str, namespace: str, owners: list[dict[str, Any]], labels: Mapping[str, str] | None = None,
                  annotations: Mapping[str, str] | None = None, finalizers: tuple[str, ...] = ()) -> dict[str, Any]:
    """The metadata of a new object (labels and finalizers left out when empty)."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "annotations": dict(annotations or {})}
    if labels:
        meta["labels"] = dict(labels)
    if finalizers:
        meta["finalizers"] = list(finalizers)
    meta["ownerReferences"] = owners
    return meta


def object_json(api_version: str, kind: str, metadata: Mapping[str, Any], spec: Mapping[str, Any]) -> dict[str, Any]:
    """A new object: its metadata (see ``metadata_json``) and spec."""
    return {"apiVersion": api_version, "kind": kind, "metadata": dict(metadata), "spec": dict(spec)}


def group_fields_json(gang_min_count: int | None, topology_keys: tuple[str, ...] = (),
                      disruption_mode: str | None = None, claims: tuple[Mapping[str, Any], ...] = (),
                      priority_class: str = "") -> dict[str, Any]:
    """A PodGroupTemplate's (or PodGroup spec's) scheduling fields: a gang of ``gang_min_count``
    (None: Basic), its topology constraint, disruption mode, shared claims and priority class."""
    fields: dict[str, Any] = {
        "schedulingPolicy": {"basic": {}} if gang_min_count is None else {"gang": {"minCount": gang_min_count}},
    }
    if topology_keys:
        fields["schedulingConstraints"] = {"topology": [{"key": k} for k in topology_keys]}
    if disruption_mode:
        fields["disruptionMode"] = {disruption_mode: {}}
    if claims:
        fields["resourceClaims"] = [dict(c) for c in claims]
    if priority_class:
        fields["priorityClassName"] = priority_class
    return fields


def podgroup_spec_json(fields: GroupFields, workload_name: str, template_name: str, min_count: int | None = None,
                       priority_class: str = "", parent_composite: str | None = None) -> dict[str, Any]:
    """A PodGroup's spec: a snapshot of its template's ``fields`` (gang minCount replaced by
    ``min_count`` when given, ``priority_class`` added when set), its workloadRef and, under a
    composite, its parent's name."""
    spec = {k: v for k, v in json.loads(json.dumps(fields.raw)).items() if k != "name"}
    if min_count is not None and fields.min_count is not None:
        spec["schedulingPolicy"]["gang"]["minCount"] = min_count
    if priority_class:
        spec["priorityClassName"] = priority_class
    spec["workloadRef"] = {"workloadName": workload_name, "templateName": template_name}
    if parent_composite:
        spec["parentCompositePodGroupName"] = parent_composite
    return spec


def event_json(involved: Meta, api_version: str, kind: str, kind_of_event: str, reason: str, message: str,
               stamp: str, instance: str) -> dict[str, Any]:
    """A core/v1 Event about ``involved`` (message cut to the API's 1024 characters)."""
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{involved.name}.", "namespace": involved.namespace},
        "involvedObject": {"apiVersion": api_version, "kind": kind, "name": involved.name,
                           "namespace": involved.namespace, "uid": involved.uid or None},
        "reason": reason, "message": message[:1024], "type": kind_of_event, "count": 1,
        "firstTimestamp": stamp, "lastTimestamp": stamp,
        "source": {"component": names.CONTROLLER_COMPONENT},
        "reportingComponent": names.CONTROLLER_COMPONENT, "reportingInstance": instance,
    }


def workload_owner(obj: StatefulSet | LeaderWorkerSet | JSON) -> StatefulSet | LeaderWorkerSet:
    """A StatefulSet or a LeaderWorkerSet, raw JSON read by its kind (a StatefulSet without one)."""
    if isinstance(obj, (StatefulSet, LeaderWorkerSet)):
        return obj
    return leaderworkerset(obj) if kind_of(obj) == "LeaderWorkerSet" else statefulset(obj)
