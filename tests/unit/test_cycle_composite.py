"""CompositePodGroups in the workload cycle, on the simulated cluster: the tree is planned as one
unit when a member of any child asks, every placed child's plan is made with the others, the
children cross the bind barrier together, and a child's plan let go takes its siblings' with it."""

import threading

from cluster import names
from cluster.sim import SimCluster
from cycle import WorkloadCycle
from cycle.binding import BindError
from extender import verbs

from .k8s_objects import node, pod, podgroup
from .test_cycle_service import all_nodes, bind_all, wait_until

RACK, ZONE = names.LABEL_RACK, names.LABEL_ZONE


def blocks():
    """Two blocks (zones) of two racks of two 4-GPU nodes: z0 holds r0 and r2, z1 r1 and r3."""
    sim = SimCluster()
    for r in range(4):
        for i in range(2):
            sim.create(node(f"n-{r}-{i}", rack=f"r{r}", zone=f"z{r % 2}", gpus=4))
    return sim


def composite(name, min_group_count=2, key=ZONE, parent=None):
    spec = {"workloadRef": {"workloadName": "w", "templateName": name},
            "schedulingPolicy": {"gang": {"minGroupCount": min_group_count}},
            "schedulingConstraints": {"topology": [{"key": key}]}}
    if parent:
        spec["parentCompositePodGroupName"] = parent
    return {"apiVersion": "scheduling.k8s.io/v1alpha3", "kind": "CompositePodGroup",
            "metadata": {"name": name, "namespace": "default"}, "spec": spec}


def child(sim, name, parent, size=2, gpu=4, key=RACK):
    """A rack gang of ``size`` pods that names ``parent`` as its CompositePodGroup."""
    group = podgroup(name, size, key)
    group["spec"]["parentCompositePodGroupName"] = parent
    sim.create(group)
    return [sim.create(pod(f"{name}-{i}", name, gpu=gpu)) for i in range(size)]


def busy(sim, rack):
    """Both nodes of ``rack`` taken by a bound pod."""
    return [sim.create(pod(f"busy-{rack}-{i}", gpu=4, node=f"n-{rack[1]}-{i}")) for i in range(2)]


def start_binds(cycle, planned, pods, errors):
    """kube-scheduler's bind call for each of ``pods``, each in its own thread (started); a refusal
    lands in ``errors``."""
    def bind(p):
        try:
            cycle.bind("default", p["metadata"]["name"], p["metadata"]["uid"], planned[p["metadata"]["uid"]])
        except BindError as err:
            errors.append(str(err))
    threads = [threading.Thread(target=bind, args=(p,)) for p in pods]
    for t in threads:
        t.start()
    return threads


def test_the_children_are_planned_together_in_one_block_or_not_at_all():
    sim = blocks()
    for rack in ("r2", "r3"):  # each block has one free rack: a child each, in different blocks
        busy(sim, rack)
    sim.create(composite("job"))
    first, second = child(sim, "rep-0", "job"), child(sim, "rep-1", "job")
    cycle = WorkloadCycle(sim.cache, sim, barrier_timeout=2.0).start()
    try:
        answer = verbs.filter(cycle, first[0], all_nodes(sim))
        assert answer.nodes == []  # no block holds both children: neither is planned
        assert cycle.plan_of("default/rep-0") is None and cycle.plan_of("default/rep-1") is None
        reason = next(iter(answer.failed.values()), "") or next(iter(answer.unresolvable.values()), "")
        assert "compositepodgroup default/job" in reason, answer
        assert cycle.flush()
        for i in range(2):  # rack r3 freed: block z1 now holds both
            sim.delete("Pod", f"default/busy-r3-{i}")
        planned, errors = bind_all(cycle, sim, [sim.get("Pod", f"default/{p['metadata']['name']}")
                                                 for p in second + first])
        assert errors == []
        racks = {sim.get("Node", n)["metadata"]["labels"][RACK] for n in planned.values()}
        assert {sim.get("Node", n)["metadata"]["labels"][ZONE] for n in planned.values()} == {"z1"}
        assert racks == {"r1", "r3"}  # each child whole in a rack of its own
        assert all(p["spec"].get("nodeName") for p in sim.list("Pod"))
    finally:
        cycle.close()


def test_a_childs_members_wait_at_the_barrier_for_every_child_of_the_composite():
    sim = blocks()
    sim.create(composite("job"))
    first, second = child(sim, "rep-0", "job"), child(sim, "rep-1", "job")
    cycle = WorkloadCycle(sim.cache, sim, barrier_timeout=10.0).start()
    try:
        planned = {}
        for p in first + second:
            answer = verbs.filter(cycle, p, all_nodes(sim))
            assert len(answer.nodes) == 1, answer
            planned[p["metadata"]["uid"]] = answer.nodes[0]
        plan = cycle.plan_of("default/rep-0")
        assert plan.tree == ("default/rep-0", "default/rep-1") == cycle.plan_of("default/rep-1").tree
        errors = []
        threads = start_binds(cycle, planned, first, errors)
        wait_until(lambda: plan.arrived == {p["metadata"]["uid"] for p in first})
        assert not any(sim.get("Pod", f"default/{p['metadata']['name']}")["spec"].get("nodeName") for p in first)
        threads += start_binds(cycle, planned, second, errors)  # the last child arrives
        for t in threads:
            t.join(timeout=15)
        assert errors == []
        assert all(sim.get("Pod", f"default/{p['metadata']['name']}")["spec"].get("nodeName") for p in first + second)
        assert len({sim.get("Node", n)["metadata"]["labels"][ZONE] for n in planned.values()}) == 1
    finally:
        cycle.close()


def test_a_child_whose_members_never_come_releases_every_plan_of_its_tree():
    sim = blocks()
    sim.create(composite("job"))
    first, second = child(sim, "rep-0", "job"), child(sim, "rep-1", "job")
    cycle = WorkloadCycle(sim.cache, sim, barrier_timeout=1.0).start()
    try:
        planned = {}
        for p in first + second:
            planned[p["metadata"]["uid"]] = verbs.filter(cycle, p, all_nodes(sim)).nodes[0]
        errors = []
        threads = start_binds(cycle, planned, first, errors)  # rep-1's never reach bind
        for t in threads:
            t.join(timeout=10)
        assert len(errors) == 2 and all("barrier timed out" in e for e in errors), errors
        assert cycle.plan_of("default/rep-0") is None and cycle.plan_of("default/rep-1") is None
        assert not any(p["spec"].get("nodeName") for p in sim.list("Pod"))
    finally:
        cycle.close()


def test_a_composite_waits_for_its_children_and_says_so():
    sim = blocks()
    sim.create(composite("job", min_group_count=2))
    only = child(sim, "rep-0", "job")
    cycle = WorkloadCycle(sim.cache, sim, barrier_timeout=2.0).start()
    try:
        answer = verbs.filter(cycle, only[0], all_nodes(sim))
        assert answer.nodes == [] and cycle.plan_of("default/rep-0") is None
        reason = next(iter(answer.failed.values()), "") or next(iter(answer.unresolvable.values()), "")
        assert "waiting for children, 1 of 2 exist" in reason, answer
    finally:
        cycle.close()


def test_a_composite_of_composites_places_each_rack_group_in_one_rack_inside_one_block():
    sim = blocks()
    sim.create(composite("job", min_group_count=2, key=ZONE))
    pods_ = []
    for r in range(2):
        sim.create(composite(f"rack-{r}", min_group_count=2, key=RACK, parent="job"))
        for h in range(2):  # one pod per node: each host group is a single 4-GPU pod
            pods_ += child(sim, f"r{r}-h{h}", f"rack-{r}", size=1, gpu=4, key=names.LABEL_HOSTNAME)
    cycle = WorkloadCycle(sim.cache, sim, barrier_timeout=5.0).start()
    try:
        planned, errors = bind_all(cycle, sim, pods_)
        assert errors == []
        labels = {p: sim.get("Node", n)["metadata"]["labels"] for p, n in planned.items()}
        by_name = {sim.cache.pods[u].pod.name: lab for u, lab in labels.items()}
        assert len({lab[ZONE] for lab in labels.values()}) == 1
        for r in range(2):
            assert by_name[f"r{r}-h0-0"][RACK] == by_name[f"r{r}-h1-0"][RACK]
        assert by_name["r0-h0-0"][RACK] != by_name["r1-h0-0"][RACK]
    finally:
        cycle.close()


def test_a_composite_is_read_as_upstream_defines_it_and_a_malformed_one_is_refused_by_field():
    import pytest

    from cluster.convert import composite_record
    from solver import InvalidInput, Policy

    record = composite_record(composite("job", min_group_count=3, parent="top"))
    assert (record.key, record.parent, record.spec.policy, record.spec.min_count, record.spec.topology_key) == (
        "default/job", "top", Policy.GANG, 3, ZONE)
    basic = composite("b")
    basic["spec"]["schedulingPolicy"] = {"basic": {}}
    assert composite_record(basic).spec.policy is Policy.BASIC
    for mutate, message in (
            (lambda s: s["schedulingPolicy"]["gang"].update(minGroupCount=0), "minGroupCount must be between 1"),
            (lambda s: s["schedulingPolicy"].update(basic={}), "sets both basic and gang"),
            (lambda s: s["schedulingConstraints"]["topology"].append({"key": RACK}), "at most one topology"),
            (lambda s: s.update(parentCompositePodGroupName=7), "parentCompositePodGroupName")):
        bad = composite("bad")
        mutate(bad["spec"])
        with pytest.raises(InvalidInput, match=message):
            composite_record(bad)


def test_a_parent_chain_that_loops_or_a_missing_parent_is_a_tree_that_is_not_ready():
    sim = blocks()
    sim.create(composite("a", parent="b"))
    sim.create(composite("b", parent="a"))  # a loop upstream's validation would not let through
    child(sim, "rep-0", "a")
    root = sim.cache.composite_root("default/rep-0")
    assert root in ("default/a", "default/b")
    assert isinstance(sim.cache.composite(root), str)  # deeper than upstream allows: not planned
    child(sim, "rep-1", "nowhere")
    assert sim.cache.composite_root("default/rep-1") == "default/nowhere"
    assert sim.cache.composite("default/nowhere") == "compositepodgroup default/nowhere does not exist (yet)"


def all_composite(sim, cycle, priority=None):
    """A running job of two rack replicas (2 x 4 GPUs each) whose composite has disruptionMode all."""
    job = composite("job")
    job["spec"]["disruptionMode"] = {"all": {}}
    if priority is not None:
        job["spec"]["priority"] = priority
    sim.create(job)
    members = []
    for r in range(2):
        group = podgroup(f"rep-{r}", 2, RACK, priority=priority)
        group["spec"]["parentCompositePodGroupName"] = "job"
        sim.create(group)
        members += [sim.create(pod(f"rep-{r}-{i}", f"rep-{r}", gpu=4)) for i in range(2)]
    planned, errors = bind_all(cycle, sim, members)
    assert errors == []
    return planned


def test_a_member_lost_from_an_all_composite_evicts_every_child_of_it():
    from .test_cycle_preemption import RecordingWriter

    sim = blocks()
    writer = RecordingWriter(sim)
    cycle = WorkloadCycle(sim.cache, writer, barrier_timeout=5.0).start()
    try:
        planned = all_composite(sim, cycle)
        uid = next(u for u in planned if sim.cache.pods[u].pod.name == "rep-0-0")
        sim.delete("Node", planned[uid])  # one member of one child lost with its node
        wait_until(lambda: not [p for p in sim.list("Pod") if p["metadata"]["name"].startswith("rep-")])
        assert sorted(name for name, _, _ in writer.evictions) == ["rep-0-0", "rep-0-1", "rep-1-0", "rep-1-1"]
        cycle.flush()
        [broken] = [e for e in sim.events if e["reason"] == names.EVENT_UNIT_BROKEN]
        assert "compositepodgroup default/job has disruptionMode all" in broken["note"]
    finally:
        cycle.close()


def test_a_preemptor_evicts_an_all_composite_whole_or_not_at_all():
    from solver import DisruptionMode

    sim = blocks()
    cycle = WorkloadCycle(sim.cache, sim, barrier_timeout=5.0).start()
    try:
        all_composite(sim, cycle, priority=10)
        context = sim.cache.preemption_context()
        units = {info.group for info in context.victims.values()}
        assert units == {"default/job"}  # one unit over both children
        assert {info.mode for info in context.victims.values()} == {DisruptionMode.ALL}
        assert {info.priority for info in context.victims.values()} == {10}
    finally:
        cycle.close()


def test_a_composite_that_does_not_fit_preempts_lower_pods_of_one_block_and_then_binds_there():
    sim = blocks()
    for r in range(4):  # every node full of one low-priority pod; z1's cheaper (priority 5)
        for i in range(2):
            sim.create(pod(f"low-{r}-{i}", gpu=4, node=f"n-{r}-{i}", priority=5 if r % 2 else 50))
    job = composite("job")
    job["spec"]["priority"] = 1000
    sim.create(job)
    members = []
    for r in range(2):
        group = podgroup(f"rep-{r}", 2, RACK, priority=1000)
        group["spec"]["parentCompositePodGroupName"] = "job"
        sim.create(group)
        members += [sim.create(pod(f"rep-{r}-{i}", f"rep-{r}", gpu=4, priority=1000)) for i in range(2)]
    cycle = WorkloadCycle(sim.cache, sim, barrier_timeout=5.0).start()
    try:
        answer = verbs.filter(cycle, members[0], all_nodes(sim))
        assert answer.nodes == []
        reason = next(iter(answer.failed.values()), "") or next(iter(answer.unresolvable.values()), "")
        assert "preempting 4 pods" in reason and "compositepodgroup default/job whole in z1" in reason, reason
        wait_until(lambda: sorted(p["metadata"]["name"] for p in sim.list("Pod") if p["metadata"]["name"].startswith(
            "low-")) == ["low-0-0", "low-0-1", "low-2-0", "low-2-1"])  # z1's four went, z0's stay
        assert set(cycle.preemption.nominations) == {"default/rep-0", "default/rep-1"}
        planned, errors = bind_all(cycle, sim, [sim.get("Pod", f"default/{p['metadata']['name']}") for p in members])
        assert errors == []
        assert {sim.get("Node", n)["metadata"]["labels"][ZONE] for n in planned.values()} == {"z1"}
    finally:
        cycle.close()


def _no_block_holds_the_job(sim, provisioning=""):
    """rack r0 (z0) and r1 (z1) full: each block holds one replica of job, none both."""
    for rack in ("r0", "r1"):
        busy(sim, rack)
    sim.create(composite("job"))
    members = child(sim, "rep-0", "job") + child(sim, "rep-1", "job")
    if provisioning:
        sim.update("PodGroup", "default/rep-1", lambda o: o["metadata"].setdefault("annotations", {}).update(
            {names.ANNOTATION_PROVISIONING: provisioning}))
    return members


def test_a_composite_that_does_not_fit_gets_the_smallest_change_for_its_whole_tree_on_every_child():
    from .test_cycle_service import condition

    sim = blocks()
    members = _no_block_holds_the_job(sim)
    cycle = WorkloadCycle(sim.cache, sim, barrier_timeout=2.0).start()
    try:
        assert verbs.filter(cycle, members[0], all_nodes(sim)).nodes == []
        assert cycle.smallest.settle(30) and cycle.flush()
        for name in ("rep-0", "rep-1"):
            said = condition(sim, name)
            assert said["status"] == "False" and "compositepodgroup default/job" in said["message"]
            # the change is the tree's: two 4-GPU nodes in the nearest block's open rack, the
            # replica that does not fit there named; and the job would fit across both blocks
            assert "smallest change: capacity: zone z0 lacks 2 nodes like n-2-1" in said["message"], said
            assert "podgroup default/rep-1 does not fit there now" in cycle.smallest.texts[f"default/{name}"]
            assert "fits across zones z0+z1" in cycle.smallest.texts[f"default/{name}"]
    finally:
        cycle.close()


def test_a_composite_short_of_capacity_asks_once_for_the_child_left_out_in_one_rack_of_its_block():
    from cluster.provisioning import request_name

    from .test_cycle_provisioning import requests, template
    from .test_cycle_service import condition

    sim = blocks()
    members = _no_block_holds_the_job(sim, names.PROVISIONING_ATOMIC)  # one child opted in: the tree is
    cycle = WorkloadCycle(sim.cache, sim, barrier_timeout=2.0).start()
    try:
        assert verbs.filter(cycle, members[0], all_nodes(sim)).nodes == []
        for p in members[1:]:  # every member asks again: still one request
            verbs.filter(cycle, p, all_nodes(sim))
        assert cycle.smallest.settle(30) and cycle.flush()
        [request] = requests(sim)
        uid = sim.get("PodGroup", "default/rep-0")["metadata"]["uid"]
        assert request["metadata"]["name"] == request_name(uid)  # made for (and owned by) the first child
        assert [s["count"] for s in request["spec"]["podSets"]] == [2]  # rep-1's two pods, whole
        spec = template(sim, request)["template"]["spec"]
        # one rack (one node group) of the block: the nearest to fitting rep-1 once rep-0 took r2
        assert spec["nodeSelector"] == {ZONE: "z0", RACK: "r0"}
        for name in ("rep-0", "rep-1"):
            assert condition(sim, name)["reason"] == names.REASON_PROVISIONING
            assert "asks for 2 pods in topology.kubernetes.io/zone=z0, topology.kubernetes.io/rack=r0 for " \
                   "compositepodgroup default/job" in condition(sim, name)["message"]
        for i in range(2):  # what the atomic class would bring: two 4-GPU nodes in rack r0 of z0
            sim.create(node(f"n-0-new-{i}", rack="r0", zone="z0", gpus=4))
        current = [sim.get("Pod", f"default/{p['metadata']['name']}") for p in members]
        planned, errors = bind_all(cycle, sim, current)
        assert errors == []
        assert {sim.get("Node", n)["metadata"]["labels"][ZONE] for n in planned.values()} == {"z0"}
        wait_until(lambda: cycle.flush() and not requests(sim))  # deleted once the whole tree is bound
    finally:
        cycle.close()


def test_a_composite_without_opt_in_asks_for_nothing():
    from .test_cycle_provisioning import requests

    sim = blocks()
    members = _no_block_holds_the_job(sim)
    cycle = WorkloadCycle(sim.cache, sim, barrier_timeout=2.0).start()
    try:
        verbs.filter(cycle, members[0], all_nodes(sim))
        assert cycle.smallest.settle(30) and cycle.flush()
        assert requests(sim) == []
    finally:
        cycle.close()
