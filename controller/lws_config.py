"""A LeaderWorkerSet's gang-scheduling configuration (the LWS gang-scheduling guide's
``spec.scheduling``): reading and validating it — pure functions.

LWS v0.9.0 has no ``spec.scheduling`` (its CRD prunes the field), so phalanx reads the same block
from the annotation ``scheduling.phalanx.dev/scheduling`` on the LeaderWorkerSet, exactly as for
StatefulSets (``config.raw_scheduling``). Its shapes are the guide's, with exactly one active level:

    {} or {"replica": {...}}                        replica level: a PodGroup per replica (size pods)
    {"schedulingPolicy"|"schedulingConstraints"|"disruptionMode": ...}
                                                    whole-LWS level: one PodGroup (replicas x size)
    {"replica": {"leader": {...}, "worker": {...}}} role level: a leader and a worker PodGroup per
                                                    replica (a role left out gets the default)

Each block holds the StatefulSet building blocks (``schedulingPolicy``, ``schedulingConstraints``,
``disruptionMode``, ``resourceClaims``); a block without ``schedulingPolicy`` is a gang (the guide's
default). minCount is never written by the user: it follows ``leaderWorkerTemplate.size`` (and
``replicas`` at the whole-LWS level).

``validate_lws`` is the whole admission rule set, used by the validating webhook and again by the
reconciler (an LWS admitted while the webhook was down gets an event, not objects).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

from cluster import kinds, names

from .config import MSG_MIN_COUNT, ConfigError, SchedulingConfig, raw_scheduling, resolve, validate_scheduling

LEVEL_REPLICA, LEVEL_WHOLE, LEVEL_ROLE = "replica", "whole", "role"
TEMPLATE_REPLICA, TEMPLATE_WHOLE = "replica", "leaderworkerset"  # Workload template names per level
ROLES = ("leader", "worker")
BLOCK_FIELDS = ("schedulingPolicy", "schedulingConstraints", "disruptionMode", "resourceClaims")
WHOLE_FIELDS = ("schedulingPolicy", "schedulingConstraints", "disruptionMode")  # select the whole level

MSG_LEVELS = ("spec.scheduling: Invalid value: exactly one scheduling level may be active: the whole-LWS "
              "level (top-level schedulingPolicy, schedulingConstraints or disruptionMode), the replica level "
              "(replica) or the role level (replica.leader, replica.worker); hierarchical gang-of-gangs "
              "scheduling is not supported")
MSG_CLAIMS_LEVEL = ("spec.scheduling.resourceClaims: Invalid value: top-level claims belong to the whole-LWS level "
                    "(with schedulingPolicy, schedulingConstraints or disruptionMode); at the replica or role "
                    "level set them inside replica (or replica.leader, replica.worker)")
MSG_ROLE_MIXED = ("spec.scheduling.replica: Invalid value: either the replica's own fields (replica level) or "
                  "leader/worker (role level), not both")
MSG_ADDED = ("spec.scheduling: Forbidden: can only be set when the LeaderWorkerSet is created; it cannot be "
             "added or removed later")
MSG_IMMUTABLE = ("spec.scheduling: Invalid value: {value}: field is immutable (the scheduling level, policy, "
                 "constraints, disruption mode and claims cannot change after creation)")
MSG_LWS_MIN_COUNT = ("{path}.schedulingPolicy.gang.minCount: Forbidden: may not be set; minCount is derived "
                     "from spec.leaderWorkerTemplate.size (and spec.replicas at the whole-LWS level)")
MSG_LEADER_READY = ("spec.startupPolicy: Forbidden: LeaderReady cannot be combined with gang scheduling: workers "
                    "are not created until the leader is ready, so the complete gang could never form; use "
                    "LeaderCreated")
MSG_EXCLUSIVE = (f"metadata.annotations[{names.ANNOTATION_LWS_EXCLUSIVE_TOPOLOGY}]: Forbidden: cannot be combined "
                 "with gang scheduling; use schedulingConstraints.topology instead")
MSG_PRIORITY = ("spec.leaderWorkerTemplate.leaderTemplate.spec.priorityClassName: Invalid value: {leader}: the "
                "leader and worker templates must use the same priorityClassName (worker: {worker})")
MSG_PRIORITY_CHANGED = ("spec.leaderWorkerTemplate.workerTemplate.spec.priorityClassName: Invalid value: {new}: the "
                        "priority class of a gang-scheduled LeaderWorkerSet cannot change after creation (was {old})")
MSG_SCHEDULING_GROUP = ("spec.leaderWorkerTemplate.{template}.spec.schedulingGroup: Forbidden: must not be set; "
                        "phalanx derives and sets revision-aware PodGroup names")


@dataclass(frozen=True)
class LwsScheduling:
    """The resolved configuration: the level and, per Workload template name, what it carries
    (``replica`` / ``leaderworkerset`` / ``leader`` and ``worker``)."""

    level: str
    units: tuple[tuple[str, SchedulingConfig], ...]

    def unit(self, template: str) -> SchedulingConfig:
        return dict(self.units)[template]

    @property
    def gang(self) -> bool:
        return any(c.gang for _, c in self.units)


def _with_default(block: Mapping[str, Any]) -> dict[str, Any]:
    """The block as resolved: no ``schedulingPolicy`` means a gang (the guide's default)."""
    # the rule's one home (docs/design.md: LWS/default-gang)
    out = dict(block)
    out.setdefault("schedulingPolicy", {"gang": {}})
    return out


def _blocks(raw: Mapping[str, Any]) -> tuple[str, list[tuple[str, str, Any]]] | str:
    """(level, [(template, path, block)]) for ``raw``, or the level error."""
    # these rules' one home (docs/design.md: LWS/one-level, LWS/default-replica-level)
    whole = [k for k in WHOLE_FIELDS if k in raw]
    if whole and "replica" in raw:
        return MSG_LEVELS
    if whole:
        return LEVEL_WHOLE, [(TEMPLATE_WHOLE, "spec.scheduling", raw)]
    if "resourceClaims" in raw:
        return MSG_CLAIMS_LEVEL
    replica = raw.get("replica", {})
    if not isinstance(replica, dict):
        return "spec.scheduling.replica: Invalid value: must be an object"
    roles = [r for r in ROLES if r in replica]
    if roles:
        if set(replica) - set(ROLES):
            return MSG_ROLE_MIXED
        return LEVEL_ROLE, [(r, f"spec.scheduling.replica.{r}", replica.get(r, {})) for r in ROLES]
    return LEVEL_REPLICA, [(TEMPLATE_REPLICA, "spec.scheduling.replica", replica)]


def validate_blocks(raw: Mapping[str, Any]) -> list[str]:
    """The structural rules: one level, each block as KEP-6277's building blocks, no minCount."""
    # the rule's one home (docs/design.md: LWS/no-user-min-count)
    found = _blocks(raw)
    if isinstance(found, str):
        return [found]
    _, blocks = found
    top_known = set(BLOCK_FIELDS) | {"replica"}
    errors = []
    if unknown := sorted(set(raw) - top_known):
        errors.append(f"spec.scheduling: Invalid value: unknown field(s) {', '.join(unknown)}")
    for _, path, block in blocks:
        if not isinstance(block, dict):
            errors.append(f"{path}: Invalid value: must be an object")
            continue
        if path == "spec.scheduling":  # the whole level: `replica` was ruled out above
            block = {k: v for k, v in block.items() if k in BLOCK_FIELDS}
        for error in validate_scheduling(_with_default(block)):
            errors.append(MSG_LWS_MIN_COUNT.format(path=path) if error == MSG_MIN_COUNT
                          else error.replace("spec.scheduling", path, 1))
    return errors


def resolve_lws(raw: Mapping[str, Any]) -> LwsScheduling:
    """The configuration the controller compiles (assumes ``validate_blocks`` found no errors)."""
    found = _blocks(raw)
    if isinstance(found, str):
        raise ConfigError(found)
    level, blocks = found
    return LwsScheduling(level, tuple((t, resolve(_with_default(b))) for t, _, b in blocks))


def priority_class(lws: kinds.LeaderWorkerSet | Mapping[str, Any]) -> str:
    """The effective priority class: the worker template's (the leader must use the same)."""
    return kinds.leaderworkerset(lws).worker_template.priority_class


def validate_lws(lws: kinds.LeaderWorkerSet | Mapping[str, Any],
                 old: kinds.LeaderWorkerSet | Mapping[str, Any] | None = None) -> list[str]:
    """The guide's admission rules for a LeaderWorkerSet create (``old`` None) or update."""
    # these rules' one home (docs/design.md: LWS/scheduling-immutable, LWS/no-leader-ready, LWS/one-priority-class)
    # these rules' one home too (docs/design.md: LWS/no-scheduling-group-in-templates, LWS/no-exclusive-topology)
    lws = kinds.leaderworkerset(lws)
    old = None if old is None else kinds.leaderworkerset(old)
    try:
        raw = raw_scheduling(lws)
        old_raw = raw_scheduling(old) if old is not None else None
    except ConfigError as err:
        return [str(err)]
    if old is not None and (raw is None) != (old_raw is None):
        return [MSG_ADDED]
    if old is not None and raw != old_raw:
        return [MSG_IMMUTABLE.format(value=json.dumps(raw, sort_keys=True))]
    if raw is None:
        return []
    errors = validate_blocks(raw)
    if errors:
        return errors
    sched = resolve_lws(raw)
    if sched.gang and lws.startup_policy == "LeaderReady":
        errors.append(MSG_LEADER_READY)
    if sched.gang and names.ANNOTATION_LWS_EXCLUSIVE_TOPOLOGY in lws.meta.annotations:
        errors.append(MSG_EXCLUSIVE)
    for which, template in (("leaderTemplate", lws.leader_template), ("workerTemplate", lws.worker_template)):
        if template.scheduling_group_set:
            errors.append(MSG_SCHEDULING_GROUP.format(template=which))
    leader = lws.leader_template.priority_class
    worker = priority_class(lws)
    if leader != worker:
        errors.append(MSG_PRIORITY.format(leader=json.dumps(leader), worker=json.dumps(worker)))
    if old is not None and priority_class(old) != worker:
        errors.append(MSG_PRIORITY_CHANGED.format(new=json.dumps(worker), old=json.dumps(priority_class(old))))
    return errors
