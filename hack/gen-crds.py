#!/usr/bin/env python3
"""Generate phalanx's fallback CRDs (scheduling.phalanx.dev/v1beta1 Workload and PodGroup, and
scheduling.phalanx.dev/v1alpha3 CompositePodGroup) from the OpenAPI v3 documents a Kubernetes 1.37
API server serves for scheduling.k8s.io/v1beta1 and v1alpha3, so the CRDs carry exactly the
upstream schema (spec and status).

    kubectl get --raw /openapi/v3/apis/scheduling.k8s.io/v1beta1 > scheduling-v1beta1.json
    kubectl get --raw /openapi/v3/apis/scheduling.k8s.io/v1alpha3 > scheduling-v1alpha3.json
    python3 hack/gen-crds.py scheduling-v1beta1.json scheduler-config/crds scheduling-v1alpha3.json

(k8s.io/kubernetes v1.37.2 carries the same documents in api/openapi-spec/v3/, without the
enums a server adds.)

``$ref``s are inlined (CRD schemas must be structural), ``metav1.Time`` becomes a date-time
string, and descriptions are kept to their first sentence to keep the manifests readable. One rule
is added: a PodGroup's name is at most 63 characters (pods reference it by a label value).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

GROUP = "scheduling.phalanx.dev"
KEEP = ("type", "format", "enum", "default", "maxItems", "minItems", "maximum", "minimum", "maxLength",
        "x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-map-type")


# Beyond the upstream schema: in this flavor a pod names its PodGroup in the label
# scheduling.phalanx.dev/pod-group, and a label value holds at most 63 characters.
PODGROUP_NAME_RULE = {
    "rule": "size(self.metadata.name) <= 63",
    "message": "a PodGroup's name must be at most 63 characters in the scheduling.phalanx.dev flavor: pods "
               "name their PodGroup in the label scheduling.phalanx.dev/pod-group",
}


def first_sentence(text: str) -> str:
    text = " ".join(text.split())
    cut = text.find(". ")
    return text if cut < 0 else text[: cut + 1]


def inline(schema: dict, schemas: dict, path: tuple[str, ...] = ()) -> dict:
    """``schema`` with every ``$ref`` inlined. A recursive type (a composite group holding
    composite groups) cannot be structural: below its first level it keeps unknown fields."""
    if "allOf" in schema and len(schema["allOf"]) == 1:
        merged = {k: v for k, v in schema.items() if k != "allOf"}
        return {**inline(schema["allOf"][0], schemas, path),
                **{k: v for k, v in inline(merged, schemas, path).items() if k == "description"}}
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        if name.endswith("meta.v1.Time"):
            return {"type": "string", "format": "date-time"}
        if name.endswith("meta.v1.ObjectMeta"):
            return {"type": "object"}
        if name in path:
            return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        return inline(schemas[name], schemas, path + (name,))
    out = {k: schema[k] for k in KEEP if k in schema}
    if schema.get("description"):
        out["description"] = first_sentence(schema["description"])
    if "properties" in schema:
        out["type"] = "object"
        out["properties"] = {k: inline(v, schemas, path) for k, v in schema["properties"].items()}
    if "required" in schema:
        out["required"] = list(schema["required"])
    if "items" in schema:
        out["items"] = inline(schema["items"], schemas, path)
        keys = out.get("x-kubernetes-list-map-keys") or ()
        if any(k not in out["items"].get("properties", {}) for k in keys):  # a recursion stub
            out.pop("x-kubernetes-list-map-keys")
            out["x-kubernetes-list-type"] = "atomic"
    if "additionalProperties" in schema and isinstance(schema["additionalProperties"], dict):
        out["additionalProperties"] = inline(schema["additionalProperties"], schemas, path)
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["properties"] = {}  # an empty marker struct such as gang's sibling `basic: {}`
    return out


def crd(kind: str, plural: str, schemas: dict, version_name: str = "v1beta1") -> dict:
    top = schemas[f"io.k8s.api.scheduling.{version_name}.{kind}"]
    props = {"apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"}}
    for part in ("spec", "status"):
        if part in top.get("properties", {}):
            props[part] = inline(top["properties"][part], schemas)
    root = {"type": "object", "description": first_sentence(top.get("description", "")),
            "properties": props, "required": ["spec"]}
    if kind == "PodGroup":
        root["x-kubernetes-validations"] = [PODGROUP_NAME_RULE]
    version = {"name": version_name, "served": True, "storage": True, "schema": {"openAPIV3Schema": root}}
    if "status" in props:
        version["subresources"] = {"status": {}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}", "annotations": {
            "phalanx.dev/generated-from": f"scheduling.k8s.io/{version_name} (Kubernetes 1.37)"}},
        "spec": {"group": GROUP, "scope": "Namespaced",
                 "names": {"plural": plural, "singular": kind.lower(), "kind": kind, "listKind": f"{kind}List"},
                 "versions": [version]},
    }


def main(source: str, out_dir: str, composite_source: str = "") -> int:
    schemas = json.loads(Path(source).read_text())["components"]["schemas"]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    made = [("Workload", "workloads", schemas, "v1beta1"), ("PodGroup", "podgroups", schemas, "v1beta1")]
    if composite_source:
        made.append(("CompositePodGroup", "compositepodgroups",
                     json.loads(Path(composite_source).read_text())["components"]["schemas"], "v1alpha3"))
    for kind, plural, doc, version_name in made:
        text = yaml.safe_dump(crd(kind, plural, doc, version_name), sort_keys=False, width=110)
        (out / f"{plural}.{GROUP}.yaml").write_text("# Generated by hack/gen-crds.py: do not edit.\n" + text)
    (out / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n"
        + "".join(f"- {plural}.{GROUP}.yaml\n" for _, plural, _, _ in made))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
