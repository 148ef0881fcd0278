"""A StatefulSet's scheduling configuration (KEP-6277 ``spec.scheduling``): reading and validating it.

No released StatefulSet has the field, so phalanx reads it from ``spec.scheduling`` when the server
kept it and otherwise from the annotation ``scheduling.phalanx.dev/scheduling`` (the same structure,
as JSON). Both spellings obey every rule below, including immutability.

``validate_statefulset`` is the whole admission rule set, used by the validating webhook and again
by the reconciler (so a StatefulSet admitted while the webhook was down gets an event, not objects).
Error texts are Kubernetes field errors; where KEP-6277 gives the exact text, it is used verbatim.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from cluster import names

MAX_RESOURCE_CLAIMS = 4  # KEP-5729's limit on a PodGroup, so on spec.scheduling too
MAX_TOPOLOGY_CONSTRAINTS = 1

MSG_GANG_ORDERED_READY = ("spec.scheduling.schedulingPolicy.gang: Forbidden: gang scheduling requires "
                          "podManagementPolicy: Parallel; OrderedReady creates pods sequentially, which can "
                          "never satisfy a gang")
MSG_PARTITION = ("spec.updateStrategy.rollingUpdate.partition: Forbidden: partitioned rollouts are not "
                 "supported for StatefulSets with spec.scheduling set")
MSG_MIN_COUNT = ("spec.scheduling.schedulingPolicy.gang.minCount: Forbidden: may not be set; minCount is "
                 "derived from spec.replicas")
MSG_DISRUPTION_ALL_BASIC = ("spec.scheduling.disruptionMode.all: Forbidden: disruptionMode all requires the "
                            "gang scheduling policy")
MSG_IMMUTABLE = "spec.scheduling: Invalid value: {value}: field is immutable"


class ConfigError(ValueError):
    """The scheduling configuration cannot be read (e.g. the annotation is not JSON)."""


@dataclass(frozen=True)
class SchedulingConfig:
    """The resolved configuration: what the Workload template and the PodGroup carry.

    ``gang`` False is Basic; ``scheduling: {}`` resolves to Basic with nothing else.
    """

    gang: bool = False
    topology_keys: tuple[str, ...] = ()
    disruption_mode: str | None = None  # "single" | "all" | None (scheduler default: single)
    resource_claims: tuple[Mapping[str, str], ...] = field(default_factory=tuple)


def raw_scheduling(sts: Mapping[str, Any]) -> dict | None:
    """The user's ``spec.scheduling`` as written (field first, then the annotation), or None."""
    spec_value = (sts.get("spec") or {}).get("scheduling")
    if spec_value is not None:
        if not isinstance(spec_value, dict):
            raise ConfigError("spec.scheduling: Invalid value: must be an object")
        return spec_value
    text = ((sts.get("metadata") or {}).get("annotations") or {}).get(names.ANNOTATION_SCHEDULING)
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as err:
        raise ConfigError(f"metadata.annotations[{names.ANNOTATION_SCHEDULING}]: Invalid value: "
                          f"not JSON: {err}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"metadata.annotations[{names.ANNOTATION_SCHEDULING}]: Invalid value: "
                          "must be a JSON object")
    return value


def resolve(raw: Mapping[str, Any]) -> SchedulingConfig:
    """The configuration the controller compiles (assumes ``validate_scheduling`` found no errors)."""
    policy = raw.get("schedulingPolicy") or {}
    topology = (raw.get("schedulingConstraints") or {}).get("topology") or []
    mode = raw.get("disruptionMode") or {}
    return SchedulingConfig(
        gang="gang" in policy,
        topology_keys=tuple(t["key"] for t in topology),
        disruption_mode=next(iter(mode), None),
        resource_claims=tuple(dict(c) for c in raw.get("resourceClaims") or []),
    )


def _one_of(value: Any, keys: tuple[str, ...], path: str) -> list[str]:
    if not isinstance(value, dict):
        return [f"{path}: Invalid value: must be an object"]
    unknown = sorted(set(value) - set(keys))
    if unknown:
        return [f"{path}: Invalid value: unknown field(s) {', '.join(unknown)}"]
    if len(value) != 1:
        return [f"{path}: Invalid value: exactly one of {' or '.join(keys)} must be set"]
    return []


def validate_scheduling(raw: Mapping[str, Any]) -> list[str]:
    """Structural and semantic rules of the building blocks (KEP-6089/KEP-5729/KEP-5710)."""
    errors: list[str] = []
    known = {"schedulingPolicy", "schedulingConstraints", "disruptionMode", "resourceClaims"}
    if unknown := sorted(set(raw) - known):
        errors.append(f"spec.scheduling: Invalid value: unknown field(s) {', '.join(unknown)}")
    policy = raw.get("schedulingPolicy")
    if policy is not None:
        errors += _one_of(policy, ("basic", "gang"), "spec.scheduling.schedulingPolicy")
        gang = policy.get("gang") if isinstance(policy, dict) else None
        if isinstance(gang, dict) and gang.get("minCount") is not None:
            errors.append(MSG_MIN_COUNT)
    constraints = raw.get("schedulingConstraints")
    if constraints is not None:
        topology = constraints.get("topology") if isinstance(constraints, dict) else None
        if not isinstance(topology, list) and topology is not None:
            errors.append("spec.scheduling.schedulingConstraints.topology: Invalid value: must be a list")
        elif topology:
            if len(topology) > MAX_TOPOLOGY_CONSTRAINTS:
                errors.append(f"spec.scheduling.schedulingConstraints.topology: Too many: {len(topology)}: "
                              f"must have at most {MAX_TOPOLOGY_CONSTRAINTS} items")
            for i, entry in enumerate(topology):
                if not isinstance(entry, dict) or not entry.get("key"):
                    errors.append(f"spec.scheduling.schedulingConstraints.topology[{i}].key: Required value")
    mode = raw.get("disruptionMode")
    if mode is not None:
        errors += _one_of(mode, ("single", "all"), "spec.scheduling.disruptionMode")
        is_gang = isinstance(policy, dict) and "gang" in policy
        if isinstance(mode, dict) and "all" in mode and not is_gang:
            errors.append(MSG_DISRUPTION_ALL_BASIC)
    errors += _validate_claims(raw.get("resourceClaims"))
    return errors


def _validate_claims(claims: Any) -> list[str]:
    if claims is None:
        return []
    path = "spec.scheduling.resourceClaims"
    if not isinstance(claims, list):
        return [f"{path}: Invalid value: must be a list"]
    errors = []
    if len(claims) > MAX_RESOURCE_CLAIMS:
        errors.append(f"{path}: Too many: {len(claims)}: must have at most {MAX_RESOURCE_CLAIMS} items")
    seen: set[str] = set()
    for i, claim in enumerate(claims):
        if not isinstance(claim, dict):
            errors.append(f"{path}[{i}]: Invalid value: must be an object")
            continue
        name = claim.get("name")
        if not name:
            errors.append(f"{path}[{i}].name: Required value")
        elif name in seen:
            errors.append(f"{path}[{i}].name: Duplicate value: {json.dumps(name)}")
        seen.add(name)
        sources = [k for k in ("resourceClaimName", "resourceClaimTemplateName") if claim.get(k)]
        if len(sources) != 1:
            errors.append(f"{path}[{i}]: Invalid value: exactly one of resourceClaimName or "
                          "resourceClaimTemplateName must be set")
    return errors


def validate_statefulset(sts: Mapping[str, Any], old: Mapping[str, Any] | None = None) -> tuple[list[str], list[str]]:
    """KEP-6277's admission rules for a StatefulSet create (``old`` None) or update.

    Returns (errors, warnings). A StatefulSet without scheduling is valid unless an update adds it.
    """
    try:
        raw = raw_scheduling(sts)
        old_raw = raw_scheduling(old) if old is not None else None
    except ConfigError as err:
        return [str(err)], []
    if old is not None and raw != old_raw:
        shown = "null" if raw is None else json.dumps(raw, sort_keys=True)
        return [MSG_IMMUTABLE.format(value=shown)], []
    if raw is None:
        return [], []
    spec = sts.get("spec") or {}
    errors = validate_scheduling(raw)
    policy = raw.get("schedulingPolicy")
    if isinstance(policy, dict) and "gang" in policy and spec.get("podManagementPolicy", "OrderedReady") != "Parallel":
        errors.insert(0, MSG_GANG_ORDERED_READY)
    partition = ((spec.get("updateStrategy") or {}).get("rollingUpdate") or {}).get("partition") or 0
    if partition > 0:
        errors.append(MSG_PARTITION)
    return errors, claim_warnings(raw, spec)


def claim_warnings(raw: Mapping[str, Any], spec: Mapping[str, Any]) -> list[str]:
    """A warning per shared claim the pod template does not consume (same name and same source)."""
    template_claims = ((spec.get("template") or {}).get("spec") or {}).get("resourceClaims") or []
    warnings = []
    for i, claim in enumerate(raw.get("resourceClaims") or []):
        if not isinstance(claim, dict) or not any(_same_claim(claim, t) for t in template_claims):
            warnings.append(f"spec.template.spec.resourceClaims: no entry matches spec.scheduling.resourceClaims[{i}] "
                            f"(same name and source); pods will not consume the PodGroup's shared claim")
    return warnings


def _same_claim(group_claim: Mapping[str, Any], pod_claim: Mapping[str, Any]) -> bool:
    keys = ("name", "resourceClaimName", "resourceClaimTemplateName")
    return all(group_claim.get(k) == pod_claim.get(k) for k in keys)
