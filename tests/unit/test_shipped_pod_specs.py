"""Every pod spec under scheduler-config/ follows tests/pod_specs.py's rules (the Helm chart's
renderings are checked the same way in tests/e2e/test_install.py, where helm is built)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from tests.pod_specs import pod_spec_problems, pod_templates, shipped_problems

MANIFESTS = Path(__file__).resolve().parents[2] / "scheduler-config"


def shipped_objects() -> list[dict]:
    return [doc for path in sorted(MANIFESTS.rglob("*.yaml")) for doc in yaml.safe_load_all(path.read_text())
            if isinstance(doc, dict) and "kind" in doc]


def test_every_shipped_pod_spec_follows_the_rules():
    found = dict(pod_templates(shipped_objects()))
    assert {"Deployment/phalanx-scheduler", "Deployment/phalanx-controller"} <= set(found)
    assert shipped_problems(shipped_objects()) == {}


def good_spec() -> dict:
    return dict(pod_templates(shipped_objects()))["Deployment/phalanx-scheduler"]


@pytest.mark.parametrize(("break_it", "problem"), [
    (lambda c, s: c["livenessProbe"]["httpGet"].update(host="127.0.0.1"),
     "phalanx: livenessProbe.httpGet.host without hostNetwork"),
    (lambda c, s: c["resources"]["requests"].pop("memory"), "phalanx: no memory request"),
    (lambda c, s: c["resources"].pop("limits"), "phalanx: no memory limit"),
    (lambda c, s: c["securityContext"].update(runAsUser=0), "phalanx: may run as root"),
    (lambda c, s: s["securityContext"].pop("runAsNonRoot"), "phalanx: may run as root"),
    (lambda c, s: c["securityContext"].update(readOnlyRootFilesystem=False), "phalanx: writable root filesystem"),
    (lambda c, s: c["securityContext"].pop("capabilities"), "phalanx: capabilities not dropped"),
    (lambda c, s: s["volumes"].append({"name": "h", "hostPath": {"path": "/"}}), "pod: hostPath volume h"),
])
def test_the_rules_catch_what_they_name(break_it, problem):
    spec = copy.deepcopy(good_spec())
    container = next(c for c in spec["containers"] if c["name"] == "phalanx")
    break_it(container, spec)
    assert problem in pod_spec_problems(spec)


def test_a_probe_host_is_allowed_on_the_host_network():
    spec = copy.deepcopy(good_spec())
    next(c for c in spec["containers"] if c["name"] == "phalanx")["livenessProbe"]["httpGet"]["host"] = "127.0.0.1"
    spec["hostNetwork"] = True
    assert pod_spec_problems(spec) == []



def test_the_chart_reads_the_shipped_manifests():
    # a link, so the chart's CRDs and ClusterRole rules never drift from scheduler-config/ (what
    # hack/gen-crds.py writes, what kubectl apply -k grants); helm package copies its contents
    chart = MANIFESTS.parent / "charts" / "phalanx" / "files" / "scheduler-config"
    assert chart.is_symlink() and chart.resolve() == MANIFESTS.resolve()
