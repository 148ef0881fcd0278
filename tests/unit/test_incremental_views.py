"""What the watch cache and the plugin's stream keep incrementally (the bound pods, whether one
carries required anti-affinity, the gang groups waiting for members) equals what a full pass over
every record gives, after any sequence of watch events."""

from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.sim import SimCluster
from cycle.plugin_mode import PluginEnforcement
from cycle.service import WorkloadCycle
from solver import Policy

from .k8s_objects import node, pod, podgroup

NODES = ["n0", "n1", "n2"]
PODS = [f"p{i}" for i in range(6)]
GROUPS = ["g0", "g1"]

ANTI = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
    {"labelSelector": {"matchLabels": {"app": "a"}}, "topologyKey": "kubernetes.io/hostname"}]}}

ops = st.lists(st.one_of(
    st.tuples(st.just("node"), st.sampled_from(NODES)),
    st.tuples(st.just("drop-node"), st.sampled_from(NODES)),
    st.tuples(st.just("group"), st.sampled_from(GROUPS), st.integers(1, 4)),
    st.tuples(st.just("drop-group"), st.sampled_from(GROUPS)),
    st.tuples(st.just("pod"), st.sampled_from(PODS), st.sampled_from(GROUPS + [""]), st.booleans(),
              st.sampled_from(NODES + [""])),
    st.tuples(st.just("bind"), st.sampled_from(PODS), st.sampled_from(NODES)),
    st.tuples(st.just("finish"), st.sampled_from(PODS)),
    st.tuples(st.just("terminate"), st.sampled_from(PODS)),
    st.tuples(st.just("drop-pod"), st.sampled_from(PODS)),
), min_size=4, max_size=40)


def _apply(sim, op):
    kind, name, *rest = op
    existing = {"node": ("Node", name), "drop-node": ("Node", name), "group": ("PodGroup", f"default/{name}"),
                "drop-group": ("PodGroup", f"default/{name}")}.get(kind, ("Pod", f"default/{name}"))
    present = sim.get(*existing) is not None
    if kind == "node" and not present:
        sim.create(node(name, gpus=8))
    elif kind == "group" and not present:
        sim.create(podgroup(name, rest[0]))
    elif kind == "pod" and not present:
        group, anti, on = rest
        obj = pod(name, group=group or None, gpu=0, node=on or None, labels={"app": "a"})
        if anti:
            obj["spec"]["affinity"] = ANTI
        sim.create(obj)
    elif kind == "bind" and present:
        sim.update("Pod", f"default/{name}", lambda o: o["spec"].__setitem__("nodeName", rest[0]))
    elif kind == "finish" and present:
        sim.update("Pod", f"default/{name}", lambda o: o["status"].__setitem__("phase", "Succeeded"))
    elif kind == "terminate" and present:
        sim.update("Pod", f"default/{name}",
                   lambda o: o["metadata"].__setitem__("deletionTimestamp", "2026-01-01T00:00:00Z"))
    elif kind.startswith("drop-") and present:
        sim.delete(*existing)


def _bound_by_full_pass(cache):
    return tuple(r.pod for r in cache.pods.values() if r.pod.node in cache.nodes and r.active)


def _waiting_by_full_pass(cache):
    waiting = set()
    for key, record in cache.podgroups.items():
        if record.spec.policy is not Policy.GANG or record.spec.min_count <= 1:
            continue
        uids = cache.pods_by_group.get(key, ())
        live = sum(1 for u in uids if cache.pods[u].active and not cache.pods[u].terminating)
        if uids and live < record.spec.min_count:
            waiting.add(key)
    return waiting


@settings(max_examples=400, deadline=None)
@given(ops, st.integers(0, 6))
def test_the_bound_pods_and_their_anti_affinity_kept_per_event_equal_a_full_pass(steps, read_from):
    sim = SimCluster()
    for i, op in enumerate(steps):
        _apply(sim, op)
        if i >= read_from:  # the kept view exists from its first read on
            snap = sim.cache.snapshot()
            expected = _bound_by_full_pass(sim.cache)
            assert snap.bound == expected
            assert snap.bound_anti == any(p.spec.pod_anti_affinity for p in expected)


@settings(max_examples=400, deadline=None)
@given(ops, st.integers(0, 6))
def test_the_waiting_groups_recounted_per_event_equal_a_full_pass(steps, read_from):
    sim = SimCluster()
    service = WorkloadCycle(sim.cache, sim, barrier_timeout=2.0)
    try:
        enforcement = PluginEnforcement(service)
        for i, op in enumerate(steps):
            _apply(sim, op)
            if i >= read_from:
                assert set(enforcement.snapshot().waiting_groups) == _waiting_by_full_pass(sim.cache)
    finally:
        service.close()


def test_a_mutation_of_the_kept_bound_pods_is_caught():
    """The check above bites: a bound pod left in the kept view after it finished is seen."""
    sim = SimCluster()
    sim.create(node("n0"))
    sim.create(pod("p0", gpu=0, node="n0"))
    assert len(sim.cache.snapshot().bound) == 1
    kept = dict(sim.cache._on_nodes)
    sim.update("Pod", "default/p0", lambda o: o["status"].__setitem__("phase", "Succeeded"))
    assert sim.cache.snapshot().bound == () == _bound_by_full_pass(sim.cache)
    sim.cache._on_nodes, sim.cache._bound = kept, None  # what a missed removal would leave
    assert sim.cache.snapshot().bound != _bound_by_full_pass(sim.cache)


def test_a_group_whose_last_member_is_deleted_stops_waiting():
    sim = SimCluster()
    service = WorkloadCycle(sim.cache, sim, barrier_timeout=2.0)
    try:
        enforcement = PluginEnforcement(service)
        for op in [("group", "g0", 3), ("pod", "p0", "g0", False, ""), ("pod", "p1", "g0", False, "")]:
            _apply(sim, op)
        assert enforcement.snapshot().waiting_groups == ("default/g0",)
        _apply(sim, ("drop-pod", "p0"))
        _apply(sim, ("drop-pod", "p1"))  # a deletion names only the uid: its group is remembered
        assert enforcement.snapshot().waiting_groups == ()
    finally:
        service.close()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.booleans()), max_size=30))
def test_pods_grouped_by_shape_through_shared_specs_equal_a_plain_grouping(choices):
    """solver.model.by_shape groups by spec identity first: keys and members come out in the order
    a plain grouping by shape key gives, whether equal specs are one object or several."""
    from solver.model import Pod, PodSpec, Toleration, by_shape

    shared = {}
    pods = []
    for k, (cpu, tol, fresh) in enumerate(choices):
        def make(cpu=cpu, tol=tol):
            return PodSpec(requests={"cpu": 1000 * (cpu + 1)}, tolerations=(Toleration(f"k{tol}", "Exists"),),
                           priority=tol)  # priority is not part of the shape
        spec = make() if fresh else shared.setdefault((cpu, tol), make())
        pods.append(Pod(f"u{k}", f"p{k}", spec))
    plain = {}
    for made in pods:
        plain.setdefault(made.spec.shape_key, []).append(made)
    grouped = by_shape(pods)
    assert list(grouped) == list(plain)
    assert all([p.uid for p in grouped[key]] == [p.uid for p in plain[key]] for key in plain)
