"""What-if over HTTP: a manifest in, where its PodGroups would go out (the JSON of the gRPC
``WhatIf`` reply, field for field, in the proto's JSON names).

Request ``{"objects": [<Kubernetes objects>], "namespace": "<for objects naming none>"}`` — or, as
the dashboard's form sends it, ``{"manifest": "<YAML or JSON text, several documents>"}`` instead
of ``objects`` (``kind: List`` unpacked); reply ``{"groups": [...]}``. A body that is not such an
object is 400 with ``error``; a manifest the admission webhooks would refuse is 422 with ``error``
and ``errors`` (per object, the webhooks' messages field by field), and nothing is planned; so is
one whose group the solver cannot take as drafted (``error`` names it). Never a 5xx for what a
client sent.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from cluster.whatif import MAX_MANIFEST_BYTES, Compile, manifest_objects, manifest_too_large
from cycle import WhatIfAnswer, WorkloadCycle
from solver import InvalidInput

UNPROCESSABLE = 422


def group_json(answer: WhatIfAnswer) -> dict[str, Any]:
    namespace, name = answer.group.split("/", 1)
    out: dict[str, Any] = {
        "namespace": namespace, "name": name, "source": answer.source, "verdict": answer.verdict,
        "members": answer.members, "minCount": answer.min_count, "policy": answer.policy,
        "topologyKey": answer.topology_key, "domain": answer.domain, "nodes": dict(answer.nodes),
        "path": answer.path, "optimal": answer.optimal,
        "victims": [{"pod": v.pod, "priority": v.priority, "unit": v.unit} for v in answer.victims],
        "pdbViolations": answer.pdb_violations, "explanation": answer.explanation, "order": answer.order,
        "advice": answer.advice,
        "waiting": list(answer.waiting), "waitingWhy": answer.waiting_why, "running": answer.running,
        "composite": answer.composite,
    }
    if answer.gap is not None:
        out["gap"] = answer.gap
    return out


def answer(cycle: WorkloadCycle, compile_manifest: Compile | None, body: bytes) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON reply) for a what-if request body."""
    if compile_manifest is None:
        return 501, {"error": "phalanx: this serve was started without what-if"}
    if len(body) > MAX_MANIFEST_BYTES:
        return 413, {"error": manifest_too_large(len(body))}
    try:
        data = json.loads(body or b"null")
    except ValueError as err:
        return 400, {"error": f"phalanx: the body is not JSON: {err}"}
    if isinstance(data, dict) and isinstance(data.get("manifest"), str) and "objects" not in data:
        try:
            data["objects"] = manifest_objects(data["manifest"])
        except yaml.YAMLError as err:
            return 400, {"error": f"phalanx: the manifest is not YAML: {err}"}
    if not isinstance(data, dict) or not isinstance(data.get("objects"), list) or not data["objects"]:
        return 400, {"error": 'phalanx: the body must be {"objects": [<Kubernetes objects>, ...]} (or {"manifest": '
                              '"<YAML>"}) with at least one'}
    namespace = data.get("namespace") or "default"
    if not isinstance(namespace, str):
        return 400, {"error": "phalanx: namespace must be a string"}
    drafts = compile_manifest(data["objects"], namespace)
    if drafts.errors:
        return UNPROCESSABLE, {"error": "phalanx: the manifest would be refused",
                               "errors": [{"object": e.source, "messages": list(e.messages)} for e in drafts.errors]}
    try:
        answers = cycle.what_if(drafts.groups, drafts.composites)
    except InvalidInput as err:  # a group the solver cannot take as drafted: the manifest's fault
        return UNPROCESSABLE, {"error": f"phalanx: the manifest would be refused: {err}"}
    return 200, {"groups": [group_json(a) for a in answers]}

