"""The kube-scheduler extender wire format (``k8s.io/kube-scheduler/extender/v1``), both ways.

The Go structs carry no json tags: keys are PascalCase field names, decoded case-insensitively,
and every key is present in a reply with ``null`` where unset. Scores are integers 0-10. Requests
are parsed here into plain values, and any deviation from the wire types is a :class:`WireError`
(the HTTP layer answers it with 400 and the message).
"""

from __future__ import annotations

from typing import Any, Mapping

MIN_SCORE, MAX_SCORE = 0, 10


class WireError(ValueError):
    """The request does not match the extender wire types."""


def fold(obj: Any, what: str) -> dict[str, Any]:
    """Top-level keys of a request, matched the way Go's encoding/json matches them."""
    if not isinstance(obj, Mapping):
        raise WireError(f"{what}: expected a JSON object")
    out: dict[str, Any] = {}
    for key, value in obj.items():
        out.setdefault(str(key).lower(), value)
    return out


def _pod(args: Mapping[str, Any], what: str) -> dict:
    pod = args.get("pod")
    if not isinstance(pod, Mapping) or not isinstance(pod.get("metadata"), Mapping):
        raise WireError(f"{what}: Pod must be a Pod object with metadata")
    if not pod["metadata"].get("name"):
        raise WireError(f"{what}: Pod.metadata.name is missing")
    if pod.get("spec") is not None and not isinstance(pod["spec"], Mapping):
        raise WireError(f"{what}: Pod.spec must be an object")
    return dict(pod)


class ExtenderArgs:
    """Filter and prioritize requests: the pod and its candidate nodes in either mode."""

    def __init__(self, body: Any, what: str):
        args = fold(body, what)
        self.pod = _pod(args, what)
        names, nodes = args.get("nodenames"), args.get("nodes")
        self.node_objects: list[dict] | None = None
        if names is not None:
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise WireError(f"{what}: NodeNames must be a list of strings")
            self.cache_mode = True
            self.node_names = list(names)
        elif nodes is not None:
            if not isinstance(nodes, Mapping) or not isinstance(nodes.get("items", []), list):
                raise WireError(f"{what}: Nodes must be a NodeList with items")
            items = nodes.get("items") or []
            if not all(isinstance(n, Mapping) and isinstance(n.get("metadata"), Mapping)
                       and isinstance(n["metadata"].get("name"), str) for n in items):
                raise WireError(f"{what}: every Nodes item needs metadata.name")
            self.cache_mode = False
            self.node_objects = [dict(n) for n in items]
            self.node_names = [n["metadata"]["name"] for n in items]
        else:
            raise WireError(f"{what}: one of Nodes or NodeNames is required")


def filter_result(args: ExtenderArgs, keep: list[str], failed: Mapping[str, str],
                  unresolvable: Mapping[str, str], error: str = "") -> dict:
    """ExtenderFilterResult in the request's mode: kept node objects echoed unchanged, or names."""
    kept = set(keep)
    if args.cache_mode:
        nodes, names = None, [n for n in args.node_names if n in kept]
    else:
        nodes = {"metadata": {}, "items": [n for n in args.node_objects or [] if n["metadata"]["name"] in kept]}
        names = None
    return {
        "Nodes": nodes,
        "NodeNames": names,
        "FailedNodes": dict(failed),
        "FailedAndUnresolvableNodes": dict(unresolvable),
        "Error": error,
    }


def host_priorities(scores: Mapping[str, int]) -> list[dict]:
    out = []
    for host, score in scores.items():
        if isinstance(score, bool) or not isinstance(score, int):
            raise TypeError(f"score for {host} must be an int")
        out.append({"Host": host, "Score": max(MIN_SCORE, min(MAX_SCORE, score))})
    return out


class BindingArgs:
    def __init__(self, body: Any):
        args = fold(body, "bind")
        fields = {}
        for key in ("podname", "podnamespace", "poduid", "node"):
            value = args.get(key)
            if not isinstance(value, str) or not value:
                raise WireError(f"bind: {key_name(key)} must be a non-empty string")
            fields[key] = value
        self.pod_name, self.pod_namespace = fields["podname"], fields["podnamespace"]
        self.pod_uid, self.node = fields["poduid"], fields["node"]


def key_name(folded: str) -> str:
    return {"podname": "PodName", "podnamespace": "PodNamespace", "poduid": "PodUID", "node": "Node"}[folded]


def binding_result(error: str = "") -> dict:
    return {"Error": error}


class PreemptionArgs:
    """The preempt verb: candidate nodes with their victims, as full pods or as UIDs."""

    def __init__(self, body: Any):
        args = fold(body, "preempt")
        self.pod = _pod(args, "preempt")
        self.meta_victims: dict[str, dict] = {}
        full = args.get("nodenametovictims")
        meta = args.get("nodenametometavictims")
        if full is not None:
            if not isinstance(full, Mapping):
                raise WireError("preempt: NodeNameToVictims must be a map")
            for node, victims in full.items():
                v = fold(victims or {}, f"preempt: victims of {node}")
                pods = v.get("pods") or []
                if not isinstance(pods, list) or not all(
                        isinstance(p, Mapping) and isinstance(p.get("metadata") or {}, Mapping) for p in pods):
                    raise WireError(f"preempt: victims of {node}: Pods must be a list of pods with metadata")
                self.meta_victims[node] = {
                    "Pods": [{"UID": str((p.get("metadata") or {}).get("uid", ""))} for p in pods],
                    "NumPDBViolations": _int(v.get("numpdbviolations", 0), f"preempt: {node} NumPDBViolations"),
                }
        if meta is not None:
            if not isinstance(meta, Mapping):
                raise WireError("preempt: NodeNameToMetaVictims must be a map")
            for node, victims in meta.items():
                v = fold(victims or {}, f"preempt: meta victims of {node}")
                pods = v.get("pods") or []
                if not isinstance(pods, list):
                    raise WireError(f"preempt: meta victims of {node}: Pods must be a list")
                uids = []
                for p in pods:
                    uid = fold(p, f"preempt: meta victim on {node}").get("uid")
                    if not isinstance(uid, str):
                        raise WireError(f"preempt: meta victim on {node}: UID must be a string")
                    uids.append({"UID": uid})
                self.meta_victims.setdefault(node, {
                    "Pods": uids,
                    "NumPDBViolations": _int(v.get("numpdbviolations", 0), f"preempt: {node} NumPDBViolations"),
                })


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise WireError(f"{what} must be an integer")
    return value


def preemption_result(meta_victims: Mapping[str, Mapping[str, Any]]) -> dict:
    return {"NodeNameToMetaVictims": {n: dict(v) for n, v in meta_victims.items()}}


def victim_uids(meta_victims: Mapping[str, Mapping[str, Any]]) -> dict[str, list[str]] | None:
    """Candidate node -> the uids of its victims, from :attr:`PreemptionArgs.meta_victims`; None when
    they cannot be read (kube-scheduler's own choice then stands)."""
    try:
        return {node: [str(p.get("UID", "")) for p in v.get("Pods") or ()] for node, v in meta_victims.items()}
    except (AttributeError, TypeError):
        return None
