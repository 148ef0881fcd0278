"""The watch cache's side of the inter-pod and volume rules: claims resolved against PVCs, PVs and
StorageClasses (and re-resolved when they change), the volume inventory and CSI limits, namespace
labels, bound pods always in the snapshot (cached), assumed pods, and pods that fail to convert."""

import pytest

from cluster import names
from cluster.cache import ClusterCache
from cluster.sim import SimCluster
from solver import PersistentVolume

from .k8s_objects import node, pod

HOST = names.LABEL_HOSTNAME


def pvc(name, cls="fast", volume="", namespace="default", owner=""):
    meta = {"name": name, "namespace": namespace}
    if owner:
        meta["ownerReferences"] = [{"kind": "Pod", "name": "x", "uid": owner, "controller": True}]
    spec = {"storageClassName": cls, "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}}
    if volume:
        spec["volumeName"] = volume
    return {"metadata": meta, "spec": spec}


def pv(name, host="", claim="", phase="Available", cls="local", size="100Gi"):
    spec = {"storageClassName": cls, "capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"]}
    if host:
        spec["nodeAffinity"] = {"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": HOST, "operator": "In", "values": [host]}]}]}}
    if claim:
        ns, cname = claim.split("/")
        spec["claimRef"] = {"namespace": ns, "name": cname}
    return {"metadata": {"name": name}, "spec": spec, "status": {"phase": phase}}


def storage_class(name, mode="WaitForFirstConsumer", provisioner="ebs.csi.aws.com", zones=()):
    obj = {"metadata": {"name": name}, "provisioner": provisioner, "volumeBindingMode": mode}
    if zones:
        obj["allowedTopologies"] = [{"matchLabelExpressions": [{"key": names.LABEL_ZONE, "values": list(zones)}]}]
    return obj


def claimed_pod(name, *claims, uid=None, group="g", node_name=None, ephemeral=()):
    obj = pod(name, group=group, node=node_name)
    obj["metadata"]["uid"] = uid or f"u-{name}"
    obj["spec"]["volumes"] = ([{"name": c, "persistentVolumeClaim": {"claimName": c}} for c in claims]
                              + [{"name": e, "ephemeral": {"volumeClaimTemplate": {}}} for e in ephemeral])
    return obj


@pytest.fixture
def cache():
    c = ClusterCache()
    for n in ("n1", "n2"):
        c.apply("Node", "ADDED", node(n))
    c.apply("StorageClass", "ADDED", storage_class("fast", zones=("z0",)))
    c.apply("StorageClass", "ADDED", storage_class("now", mode="Immediate"))
    c.apply("StorageClass", "ADDED", storage_class("local", provisioner=names.PROVISIONER_NONE))
    return c


def volumes_of(cache, uid):
    return {v.name: v for v in cache.pods[uid].pod.volumes}


def test_bound_wffc_immediate_and_missing_claims(cache):
    cache.apply("PersistentVolume", "ADDED", pv("pv-1", host="n1", claim="default/bound"))
    for claim in (pvc("bound", volume="pv-1"), pvc("later"), pvc("imm", cls="now"), pvc("nocls", cls="")):
        cache.apply("PersistentVolumeClaim", "ADDED", claim)
    cache.apply("Pod", "ADDED", claimed_pod("p", "bound", "later", "imm", "nocls", "gone"))
    v = volumes_of(cache, "u-p")
    assert v["default/bound"].bound and v["default/bound"].node_affinity.matches({HOST: "n1"})
    assert not v["default/bound"].node_affinity.matches({HOST: "n2"})
    later = v["default/later"]
    assert not later.bound and later.delayed and later.dynamic and later.csi_driver == "ebs.csi.aws.com"
    assert later.allowed_topologies.matches({names.LABEL_ZONE: "z0"}) and later.request == 10 * 2**30
    assert not v["default/imm"].delayed and not v["default/imm"].bound and not v["default/imm"].missing
    assert not v["default/nocls"].delayed and not v["default/nocls"].dynamic  # no class: immediate binding
    assert v["default/gone"].missing
    # members read through the group carry the same resolved claims
    assert {c.name for c in cache.members("default/g")[0].pod.volumes} == set(v)


def test_a_claim_bound_later_is_seen_next_time_members_are_read(cache):
    cache.apply("PersistentVolumeClaim", "ADDED", pvc("data", cls="now"))
    cache.apply("Pod", "ADDED", claimed_pod("p", "data"))
    assert not volumes_of(cache, "u-p")["default/data"].bound
    before = cache.capacity_version
    cache.apply("PersistentVolume", "ADDED", pv("pv-9", host="n2", claim="default/data", phase="Bound"))
    cache.apply("PersistentVolumeClaim", "MODIFIED", pvc("data", cls="now", volume="pv-9"))
    claim = cache.members("default/g")[0].pod.volumes[0]
    assert claim.bound and claim.node_affinity.matches({HOST: "n2"})
    assert cache.capacity_version > before  # room may have appeared for a waiting group
    cache.apply("PersistentVolumeClaim", "DELETED", pvc("data"))
    assert cache.members("default/g")[0].pod.volumes[0].missing


def test_a_storage_class_change_re_resolves_its_claims(cache):
    cache.apply("PersistentVolumeClaim", "ADDED", pvc("data", cls="late"))
    cache.apply("Pod", "ADDED", claimed_pod("p", "data"))
    assert not volumes_of(cache, "u-p")["default/data"].delayed  # unknown class: immediate binding
    cache.apply("StorageClass", "ADDED", storage_class("late"))
    assert volumes_of(cache, "u-p")["default/data"].delayed


def test_an_ephemeral_claim_must_be_owned_by_its_pod(cache):
    cache.apply("PersistentVolumeClaim", "ADDED", pvc("p-scratch", owner="u-p"))
    cache.apply("PersistentVolumeClaim", "ADDED", pvc("q-scratch", owner="someone-else"))
    cache.apply("Pod", "ADDED", claimed_pod("p", ephemeral=("scratch",)))
    cache.apply("Pod", "ADDED", claimed_pod("q", ephemeral=("scratch",)))
    assert volumes_of(cache, "u-p")["default/p-scratch"].delayed
    assert volumes_of(cache, "u-q")["default/q-scratch"].missing


def test_volume_inventory_and_csi_limits(cache):
    cache.apply("PersistentVolumeClaim", "ADDED", pvc("waiting"))
    cache.apply("PersistentVolumeClaim", "ADDED", pvc("done", volume="pv-bound"))
    for volume in (pv("free", host="n1"), pv("prebound", claim="default/waiting"), pv("taken", claim="default/done"),
                   pv("pv-bound", claim="default/done", phase="Bound"), pv("released", phase="Released")):
        cache.apply("PersistentVolume", "ADDED", volume)
    cache.apply("CSINode", "ADDED", {"metadata": {"name": "n1"}, "spec": {"drivers": [
        {"name": "ebs.csi.aws.com", "nodeID": "i-1", "allocatable": {"count": 25}}]}})
    inventory = cache.snapshot().volumes
    assert [v.name for v in inventory.available] == ["free", "prebound"]
    assert isinstance(inventory.available[0], PersistentVolume) and inventory.available[0].capacity == 100 * 2**30
    assert inventory.attach_limits == {"n1": {"ebs.csi.aws.com": 25}}
    cache.apply("PersistentVolumeClaim", "MODIFIED", pvc("waiting", volume="prebound"))
    assert [v.name for v in cache.snapshot().volumes.available] == ["free"]
    cache.replace("CSINode", [])
    assert cache.snapshot().volumes.attach_limits == {}


def test_snapshot_always_lists_bound_pods_and_namespaces(cache):
    cache.apply("Namespace", "ADDED", {"metadata": {"name": "default", "labels": {"team": "a"}}})
    bound = pod("b", node="n1", labels={"app": "zk"})
    bound["metadata"]["uid"] = "u-b"
    cache.apply("Pod", "ADDED", bound)
    snapshot = cache.snapshot()
    assert [p.labels for p in snapshot.bound] == [{"app": "zk"}]
    assert snapshot.namespaces == {"default": {"team": "a", names.LABEL_NAMESPACE_NAME: "default"}}


def test_the_bound_pod_tuple_is_rebuilt_only_when_a_bound_pod_changes(cache):
    bound = pod("b", node="n1", labels={"app": "zk"})
    bound["metadata"]["uid"] = "u-b"
    cache.apply("Pod", "ADDED", bound)
    first = cache.snapshot().bound
    bound["status"] = {"phase": "Running"}  # a status update changes nothing the solver reads
    cache.apply("Pod", "MODIFIED", bound)
    pending = pod("p", group="g")
    pending["metadata"]["uid"] = "u-p"
    cache.apply("Pod", "ADDED", pending)
    assert cache.snapshot().bound is first
    bound["metadata"]["labels"] = {"app": "etcd"}
    cache.apply("Pod", "MODIFIED", bound)
    assert cache.snapshot().bound is not first and cache.snapshot().bound[0].labels == {"app": "etcd"}
    cache.apply("Pod", "DELETED", bound)
    assert cache.snapshot().bound == ()


def test_assumed_pods_are_placed_for_the_inter_pod_rules_only(cache):
    pending = pod("p", group="g", labels={"app": "zk"})
    pending["metadata"]["uid"] = "u-p"
    cache.apply("Pod", "ADDED", pending)
    snapshot = cache.snapshot(assumed={"u-p": "n2", "unknown": "n1"})
    assert [(p.uid, p.node, p.labels) for p in snapshot.assumed] == [("u-p", "n2", {"app": "zk"})]
    assert snapshot.bound == () and int(snapshot.used.sum()) == 0
    assert [p.uid for p in snapshot.placed_pods] == ["u-p"]


def test_pods_that_fail_to_convert_are_remembered_for_their_group(cache):
    bad = pod("db-1", group="db")
    bad["metadata"]["uid"] = "u-bad"
    bad["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{}]}}
    assert not cache.apply("Pod", "ADDED", bad)
    (invalid,) = cache.invalid_members("default/db")
    assert (invalid.uid, invalid.pod) == ("u-bad", "default/db-1") and "topologyKey" in invalid.error
    del bad["spec"]["affinity"]
    assert cache.apply("Pod", "MODIFIED", bad) and cache.invalid_pods == {}
    bad["spec"]["containers"] = "oops"
    cache.apply("Pod", "MODIFIED", bad)
    assert "u-bad" in cache.invalid_pods
    cache.apply("Pod", "DELETED", bad)
    assert cache.invalid_pods == {}
    cache.apply("Pod", "ADDED", bad)
    cache.replace("Pod", [])
    assert cache.invalid_pods == {}


def test_malformed_storage_objects_are_skipped(cache):
    before = cache.skipped
    assert not cache.apply("PersistentVolumeClaim", "ADDED", {"metadata": {"name": "c"}, "spec": {"accessModes": 1}})
    assert not cache.apply("CSINode", "ADDED", {"metadata": {"name": "n"}, "spec": {"drivers": "x"}})
    assert cache.skipped == before + 2 and cache.claims == {} and cache.csinodes == {}


def test_the_simulated_cluster_serves_the_storage_kinds():
    sim = SimCluster()
    sim.create({"kind": "StorageClass", "apiVersion": "storage.k8s.io/v1", **storage_class("fast")})
    sim.create({"kind": "PersistentVolume", "apiVersion": "v1", **pv("pv-1")})
    sim.create({"kind": "PersistentVolumeClaim", "apiVersion": "v1", **pvc("data")})
    sim.create({"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": "ml"}})
    assert "pv-1" in sim.cache.persistent_volumes and "default/data" in sim.cache.claims
    assert "fast" in sim.cache.storage_classes and "ml" in sim.cache.namespaces
    assert sim.get("PersistentVolume", "pv-1")["metadata"].get("namespace") is None
