"""LeaderWorkerSets under the real LWS controller (sigs.k8s.io/lws at LWS_VERSION, built by
hack/build-lws.sh): LWS creates the leader StatefulSet, one worker StatefulSet per group and the
pods, its own webhooks label them; phalanx's controller and webhooks turn an annotated LWS into the
LWS gang-scheduling guide's Workload and PodGroups, and kube-scheduler + phalanx place them.
"""

from __future__ import annotations

import pytest
from harness import (
    GPU,
    RACK,
    assert_none_bound,
    bound,
    create,
    deletions_held,
    finish_pod,
    placement,
    pods,
    priority_class,
    scheduler_config,
    set_not_ready,
    wait_all_bound,
    wait_for,
)
from harness.lws import LWS_API, LwsManager, leaderworkerset
from phalanx_controller import PhalanxController

from cluster import names
from cluster.kube import KubeError
from controller.lws_config import MSG_ADDED, MSG_LEADER_READY
from controller.whatif import compile_objects

from .conftest import PHALANX_SCHEDULER_MODES, crd_flavor_phalanx, settle

PLAIN = "lws-e2e-plain"
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"


@pytest.fixture(scope="module")
def lws(control_plane):
    manager = LwsManager(control_plane).start()
    yield manager
    manager.stop()


def make_lws(rest, namespace, obj):
    return rest.create(f"{LWS_API}/namespaces/{namespace}/leaderworkersets", obj)


def test_lws_without_annotation_runs_as_lws_runs_it(rest, namespace, nodes, lws, start_scheduler):
    """The anchor: LWS alone, a plain kube-scheduler, no phalanx object anywhere."""
    start_scheduler(scheduler_config(PLAIN), name="lws-plain")
    nodes.add_many(4, prefix="plain", cpu="4")
    make_lws(rest, namespace, leaderworkerset("plain", size=3, replicas=2, scheduler_name=PLAIN))
    placed = wait_all_bound(rest, namespace, count=6, timeout=60, label_selector=f"{LWS_NAME}=plain")
    assert sorted(placed) == ["plain-0", "plain-0-1", "plain-0-2", "plain-1", "plain-1-1", "plain-1-2"]
    sets = {s["metadata"]["name"]: s for s in rest.list_items(f"/apis/apps/v1/namespaces/{namespace}/statefulsets")}
    assert sorted(sets) == ["plain", "plain-0", "plain-1"]  # leaders, then one worker set per group
    assert sets["plain-0"]["metadata"]["ownerReferences"][0]["kind"] == "Pod"  # owned by its leader
    for p in pods(rest, namespace):
        labels = p["metadata"]["labels"]
        name = p["metadata"]["name"]
        assert labels["leaderworkerset.sigs.k8s.io/group-index"] == name.split("-")[1]
        assert labels["leaderworkerset.sigs.k8s.io/worker-index"] == (name.split("-") + ["0"])[2]
        assert "schedulingGroup" not in p["spec"] and not p["spec"].get("schedulingGates")

# -- with phalanx: controller + webhooks, kube-scheduler with phalanx in each mode -------------------

SCHED_API = "/apis/scheduling.k8s.io/v1beta1"
RACKED = {"schedulingConstraints": {"topology": [{"key": RACK}]}}
GPU1 = {"cpu": "1", GPU: 1}
HIGH, LOW = "phalanx-e2e-lws-high", "phalanx-e2e-lws-low"


@pytest.fixture(scope="module")
def phalanx_lws(control_plane, lws, phalanx_scheduler):
    """phalanx's controller and webhooks beside LWS, and kube-scheduler with phalanx in each mode
    (``phalanx_scheduler``: extender, then plugin)."""
    running = PhalanxController(control_plane)  # after LWS: the controller watches LeaderWorkerSets
    running.start()
    running.register()
    yield running
    running.close()


def members(rest, namespace, name, index=None):
    selector = f"{LWS_NAME}={name}" + (f",{names.LABEL_LWS_GROUP_INDEX}={index}" if index is not None else "")
    return pods(rest, namespace, label_selector=selector)


def live(items):
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def group_of(pod):
    return (pod["spec"].get("schedulingGroup") or {}).get("podGroupName")


def podgroups(rest, namespace):
    return {g["metadata"]["name"]: g for g in rest.list_items(f"{SCHED_API}/namespaces/{namespace}/podgroups")}


def min_count(group):
    return group["spec"]["schedulingPolicy"]["gang"]["minCount"]


def racks_of(rest, where):
    return {rest.get(f"/api/v1/nodes/{n}")["metadata"]["labels"][RACK] for n in where.values()}


def lws_path(namespace, name):
    return f"{LWS_API}/namespaces/{namespace}/leaderworkersets/{name}"


def replica_bound(rest, namespace, name, index, size, timeout=60):
    """The pods of replica ``index``, all bound; returns pod -> node. On a timeout the error says
    what the PodGroups and pods of the namespace looked like."""
    try:
        return wait_all_bound(rest, namespace, count=size, timeout=timeout,
                              label_selector=f"{LWS_NAME}={name},{names.LABEL_LWS_GROUP_INDEX}={index}")
    except TimeoutError as err:
        groups = {n: (g.get("status") or {}).get("conditions") for n, g in podgroups(rest, namespace).items()}
        states = {p["metadata"]["name"]: (group_of(p), p["spec"].get("nodeName"), p["spec"].get("schedulingGates"),
                                          [(c["type"], c.get("reason"), c.get("message")) for c in
                                           (p.get("status") or {}).get("conditions") or []])
                  for p in pods(rest, namespace)}
        raise TimeoutError(f"{err}\nPodGroups: {groups}\npods: {states}") from None


def test_lws_without_annotation_runs_as_without_phalanx(rest, namespace, nodes, phalanx_lws):
    nodes.add_many(3, prefix="none", cpu="4")
    make_lws(rest, namespace, leaderworkerset("none", size=3, replicas=2))
    placed = wait_all_bound(rest, namespace, count=6, timeout=60, label_selector=f"{LWS_NAME}=none")
    assert sorted(placed) == ["none-0", "none-0-1", "none-0-2", "none-1", "none-1-1", "none-1-2"]
    for p in members(rest, namespace, "none"):
        assert group_of(p) is None and names.LABEL_LWS_INCARNATION not in p["metadata"]["labels"]
        assert not p["spec"].get("schedulingGates")
    assert rest.list_items(f"{SCHED_API}/namespaces/{namespace}/workloads") == [] and podgroups(rest, namespace) == {}


def asked(phalanx, namespace, obj):
    """phalanx serve's what-if for ``obj`` as a user would apply it (the drafts its door compiles),
    in-process: this module's serve has no manifest compiler of its own."""
    drafts = compile_objects([obj], namespace)
    assert not drafts.errors, drafts.errors
    return phalanx.cycle.what_if(drafts.groups)


def test_replica_level_each_replica_whole_in_one_rack_independent_and_scaled(rest, namespace, nodes, phalanx,
                                                                             phalanx_lws):
    for rack in ("ra", "rb"):
        for i in range(2):
            nodes.add(f"rep-{rack}-{i}", gpu=2, rack=rack)  # 4 GPUs per rack, a replica needs 4
    obj = make_lws(rest, namespace, leaderworkerset("rep", size=4, replicas=3, resources=GPU1,
                                                    scheduling={"replica": RACKED}))
    wait_for(lambda: len(podgroups(rest, namespace)) == 3, 60, "one PodGroup per replica")
    [workload] = rest.list_items(f"{SCHED_API}/namespaces/{namespace}/workloads")
    assert workload["spec"]["controllerRef"] == {"apiGroup": "leaderworkerset.x-k8s.io", "kind": "LeaderWorkerSet",
                                                 "name": "rep"}
    assert workload["metadata"]["ownerReferences"][0]["uid"] == obj["metadata"]["uid"]
    for group in podgroups(rest, namespace).values():
        assert min_count(group) == 4 and group["spec"]["schedulingConstraints"] == RACKED["schedulingConstraints"]
        assert group["metadata"]["ownerReferences"][0]["kind"] == "LeaderWorkerSet"
    # two replicas fit, each whole inside one rack; the third waits whole and the others do not wait
    wait_for(lambda: len(bound(members(rest, namespace, "rep"))) == 8, 90, "two replicas bound")
    whole = [i for i in range(3) if len(bound(members(rest, namespace, "rep", i))) == 4]
    assert len(whole) == 2
    for i in whole:
        assert len(racks_of(rest, placement(members(rest, namespace, "rep", i)))) == 1
    [waiting] = [i for i in range(3) if i not in whole]
    assert_none_bound(rest, namespace, seconds=5,
                      label_selector=f"{LWS_NAME}=rep,{names.LABEL_LWS_GROUP_INDEX}={waiting}")
    for p in members(rest, namespace, "rep"):
        labels = p["metadata"]["labels"]
        suffix = f"-{labels[names.LABEL_LWS_GROUP_INDEX]}-{labels[names.LABEL_LWS_REVISION]}"
        assert group_of(p) in podgroups(rest, namespace) and group_of(p).endswith(suffix)
    nodes.add("rep-rc-0", gpu=4, rack="rc")  # room appears in one event (one node of 4 GPUs)
    assert racks_of(rest, replica_bound(rest, namespace, "rep", waiting, 4)) == {"rc"}
    # scale up: a fourth independent PodGroup, placed whole when room appears. What-if asked first
    # for the LWS at 4 replicas: the three it runs are answered as they run (their live PodGroups,
    # nothing to place), only the fourth is planned — and has no rack with room
    scaled = leaderworkerset("rep", size=4, replicas=4, resources=GPU1, scheduling={"replica": RACKED})
    live_groups = {f"{namespace}/{n}" for n in podgroups(rest, namespace)}
    *kept, added = asked(phalanx, namespace, scaled)
    assert {a.group for a in kept} == live_groups and all((a.verdict, a.running) == ("fits", 4) for a in kept)
    assert added.verdict == "does-not-fit" and added.running == 0, added
    rest.patch(lws_path(namespace, "rep"), {"spec": {"replicas": 4}})
    wait_for(lambda: len(podgroups(rest, namespace)) == 4, 60, "a PodGroup for the new replica")
    assert_none_bound(rest, namespace, seconds=3, label_selector=f"{LWS_NAME}=rep,{names.LABEL_LWS_GROUP_INDEX}=3")
    nodes.add("rep-rd-0", gpu=4, rack="rd")
    settle(rest, phalanx.cycle.cache, ["rep-rd-0"])  # created with the not-ready taint, lifted just after
    *kept, added = asked(phalanx, namespace, scaled)
    assert added.group not in live_groups and (added.verdict, added.domain) == ("fits", "rd"), added
    assert racks_of(rest, replica_bound(rest, namespace, "rep", 3, 4)) == {"rd"}
    # scale down: the removed replica's PodGroup goes
    rest.patch(lws_path(namespace, "rep"), {"spec": {"replicas": 3}})
    wait_for(lambda: len([g for g in podgroups(rest, namespace).values()
                          if not g["metadata"].get("deletionTimestamp")]) == 3, 60, "3 PodGroups after scale-down")


def test_a_recreated_leader_gets_new_podgroups_and_binds_whole_and_all_goes_with_the_lws(rest, namespace, nodes, phalanx_lws):
    nodes.add_many(3, prefix="rec", gpu=1, cpu="4")
    make_lws(rest, namespace, leaderworkerset("rec", size=3, resources=GPU1, scheduling={}))
    replica_bound(rest, namespace, "rec", 0, 3)
    [first] = podgroups(rest, namespace)
    leader = rest.get(f"/api/v1/namespaces/{namespace}/pods/rec-0")
    rest.delete(f"/api/v1/namespaces/{namespace}/pods/rec-0", missing_ok=True)

    def recreated():
        found = rest.get_or_none(f"/api/v1/namespaces/{namespace}/pods/rec-0")
        return found if found and found["metadata"]["uid"] != leader["metadata"]["uid"] else None
    new_leader = wait_for(recreated, 60, "LWS recreated the leader")
    assert group_of(new_leader) != first
    assert (new_leader["metadata"]["labels"][names.LABEL_LWS_INCARNATION]
            != leader["metadata"]["labels"][names.LABEL_LWS_INCARNATION])
    replica_bound(rest, namespace, "rec", 0, 3)
    assert {group_of(p) for p in members(rest, namespace, "rec")} == {group_of(new_leader)}
    wait_for(lambda: first not in podgroups(rest, namespace), 60, "the predecessor's PodGroup deleted")
    # deleting the LWS takes its Workload, PodGroups and pods with it (owner references)
    rest.delete(lws_path(namespace, "rec"), missing_ok=True)
    wait_for(lambda: not podgroups(rest, namespace) and not members(rest, namespace, "rec")
             and not rest.list_items(f"{SCHED_API}/namespaces/{namespace}/workloads"), 60,
             "Workload, PodGroups and pods collected with the LWS")


def test_replica_level_size_change_rollout_gives_each_replaced_replica_podgroups_of_its_new_size(
        rest, namespace, nodes, phalanx_lws):
    nodes.add_many(6, prefix="roll", gpu=1, cpu="4")
    make_lws(rest, namespace, leaderworkerset("roll", size=2, replicas=2, resources=GPU1, scheduling={}))
    wait_all_bound(rest, namespace, count=4, timeout=60, label_selector=f"{LWS_NAME}=roll")
    before = set(podgroups(rest, namespace))
    rest.patch(lws_path(namespace, "roll"), {"spec": {"leaderWorkerTemplate": {"size": 3}}})

    def rolled():
        items = live(members(rest, namespace, "roll"))
        done = len(items) == 6 and len(bound(items)) == 6 and len({group_of(p) for p in items}) == 2
        return items if done else None
    items = wait_for(rolled, 120, "both replicas rolled to size 3 and bound")
    groups = podgroups(rest, namespace)
    for p in items:
        name = group_of(p)
        assert name not in before and min_count(groups[name]) == 3
        assert name.endswith(p["metadata"]["labels"][names.LABEL_LWS_REVISION])
    wait_for(lambda: not before & set(podgroups(rest, namespace)), 60, "the previous revision's PodGroups deleted")


def test_whole_lws_level_all_or_nothing_then_a_size_change_rollout(rest, namespace, nodes, phalanx_lws):
    nodes.add_many(3, prefix="whole", gpu=1, cpu="4")
    make_lws(rest, namespace, leaderworkerset("whole", size=2, replicas=2, resources=GPU1,
                                              scheduling={"schedulingPolicy": {"gang": {}}}))
    wait_for(lambda: len(members(rest, namespace, "whole")) == 4, 60, "LWS created 4 pods")
    [name] = podgroups(rest, namespace)
    assert min_count(podgroups(rest, namespace)[name]) == 4
    assert {group_of(p) for p in members(rest, namespace, "whole")} == {name}
    assert_none_bound(rest, namespace, seconds=6, label_selector=f"{LWS_NAME}=whole")  # 3 GPUs for 4 pods
    nodes.add("whole-3", gpu=1, cpu="4")
    wait_all_bound(rest, namespace, count=4, timeout=60, label_selector=f"{LWS_NAME}=whole")
    # size 2 -> 3: a replaced replica counts with its new size, the others with their previous one
    old_revision = members(rest, namespace, "whole")[0]["metadata"]["labels"][names.LABEL_LWS_REVISION]
    rest.patch(lws_path(namespace, "whole"), {"spec": {"leaderWorkerTemplate": {"size": 3}}})
    wait_for(lambda: min_count(podgroups(rest, namespace)[name]) == 5, 60, "minCount 2 + 3 while replica 1 rolls")
    nodes.add("whole-4", gpu=1, cpu="4")
    nodes.add("whole-5", gpu=1, cpu="4")
    placed = wait_all_bound(rest, namespace, count=6, timeout=120, label_selector=f"{LWS_NAME}=whole")
    assert len(placed) == 6 and min_count(podgroups(rest, namespace)[name]) == 6
    revisions = {p["metadata"]["labels"][names.LABEL_LWS_REVISION] for p in members(rest, namespace, "whole")}
    assert old_revision not in revisions and len(revisions) == 1
    assert list(podgroups(rest, namespace)) == [name]  # one PodGroup through the rollout


def test_role_level_leader_and_worker_podgroups_placed_separately(rest, namespace, nodes, phalanx_lws):
    nodes.add("role-0", gpu=2, cpu="8")
    make_lws(rest, namespace, leaderworkerset(
        "role", size=4, resources=GPU1,
        scheduling={"replica": {"leader": {"schedulingPolicy": {"basic": {}}}, "worker": {}}}))
    wait_for(lambda: len(podgroups(rest, namespace)) == 2, 60, "a leader and a worker PodGroup")
    groups = podgroups(rest, namespace)
    leader_group = next(n for n in groups if "-0-leader-" in n)
    worker_group = next(n for n in groups if "-0-worker-" in n)
    assert groups[leader_group]["spec"]["schedulingPolicy"] == {"basic": {}}
    assert min_count(groups[worker_group]) == 3
    # the leader's basic group fits alone; the 3-worker gang (3 GPUs) does not fit in the 1 GPU left
    assert len(wait_all_bound(rest, namespace, count=1, timeout=60, podgroup=leader_group)) == 1
    assert_none_bound(rest, namespace, seconds=6, podgroup=worker_group)
    nodes.add("role-1", gpu=2, cpu="8")
    assert len(wait_all_bound(rest, namespace, count=3, timeout=60, podgroup=worker_group)) == 3


def test_a_gang_replica_is_preempted_as_one_unit_with_disruption_mode_all(rest, namespace, nodes, phalanx_lws):
    for klass, value in ((HIGH, 100000), (LOW, 10)):
        if rest.get_or_none(f"/apis/scheduling.k8s.io/v1/priorityclasses/{klass}") is None:
            create(rest, priority_class(klass, value))
    nodes.add_many(4, prefix="pre", gpu=1, cpu="4")
    # restartPolicy None: LWS itself does not recreate a group when one of its pods goes, so only
    # phalanx's group preemption can take all four
    make_lws(rest, namespace, leaderworkerset("low", size=4, resources=GPU1, priority_class_name=LOW,
                                              restart_policy="None",
                                              scheduling={"replica": {"disruptionMode": {"all": {}}}}))
    assert len(replica_bound(rest, namespace, "low", 0, 4)) == 4
    victims = {p["metadata"]["uid"] for p in members(rest, namespace, "low")}
    make_lws(rest, namespace, leaderworkerset("high", size=2, resources=GPU1, priority_class_name=HIGH,
                                              scheduling={}))
    replica_bound(rest, namespace, "high", 0, 2, timeout=90)
    # two GPUs were needed; the whole low replica went, not two of its pods: every victim evicted
    # and gone (a victim still terminating is still bound), and no pod recreated for the replica
    # bound (four do not fit in the two GPUs left)
    wait_for(lambda: not victims & {p["metadata"]["uid"] for p in members(rest, namespace, "low")}, 60,
             "every pod of the low replica evicted and gone")
    left = members(rest, namespace, "low")
    assert not bound(left), [(p["metadata"]["name"], group_of(p), p["spec"].get("nodeName"),
                              p["spec"].get("schedulingGates")) for p in left]


def test_a_worker_that_fails_under_restart_policy_none_is_recreated_and_binds_back_into_its_replicas_rack(
        rest, namespace, nodes, phalanx_lws):
    """A worker's containers exit 1 (KWOK reports the pod Failed). Under ``restartPolicy: None`` LWS
    keeps the group; the worker StatefulSet deletes the Failed pod and recreates it under its name
    (a gang's history: docs/design.md): the PodGroup stays, the new pod is a repair and binds into
    the replica's rack, though the other rack is empty."""
    for rack in ("fa", "fb"):
        for i in range(3):
            nodes.add(f"wf-{rack}-{i}", cpu="1", rack=rack)
    make_lws(rest, namespace, leaderworkerset("wf", size=3, resources={"cpu": "1"}, restart_policy="None",
                                              scheduling={"replica": RACKED}))
    first = replica_bound(rest, namespace, "wf", 0, 3, timeout=90)
    [home] = racks_of(rest, first)
    [group] = {group_of(p) for p in members(rest, namespace, "wf")}
    [worker] = [p for p in members(rest, namespace, "wf") if p["metadata"]["name"] == "wf-0-1"]
    finish_pod(rest, namespace, "wf-0-1", exit_code=1)
    again = wait_for(lambda: (b := placement(bound(live(members(rest, namespace, "wf"))))) and len(b) == 3
                     and worker["metadata"]["uid"] not in {p["metadata"]["uid"] for p in members(rest, namespace, "wf")}
                     and b, 90, "the failed worker recreated and bound")
    assert racks_of(rest, again) == {home}
    assert {group_of(p) for p in members(rest, namespace, "wf")} == {group}  # the same gang, repaired


def test_a_replica_that_loses_a_node_is_recreated_by_lws_and_bound_whole_in_a_rack_with_room(
        rest, namespace, nodes, phalanx_lws):
    """A node under a running replica goes NotReady; the taint eviction controller evicts the pod
    on it (tolerated for one second, not the default 300 s); LWS's default restartPolicy
    (RecreateGroupOnPodRestart) then deletes the leader, so the whole group is re-created as a new
    incarnation with a new PodGroup, which phalanx places whole in the one rack that still has room
    for all three pods."""
    for rack in ("ra", "rb"):
        for i in range(3):
            nodes.add(f"nl-{rack}-{i}", cpu="1", rack=rack)  # a replica of 3 one-CPU pods fills a rack
    obj = leaderworkerset("nl", size=3, resources={"cpu": "1"}, scheduling={"replica": RACKED})
    worker_spec = obj["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
    worker_spec["tolerations"] = [
        {"key": f"node.kubernetes.io/{taint}", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 1}
        for taint in ("not-ready", "unreachable")]
    worker_spec["terminationGracePeriodSeconds"] = 30  # Kubernetes' default: an eviction is graceful
    make_lws(rest, namespace, obj)
    first = replica_bound(rest, namespace, "nl", 0, 3, timeout=90)
    [home] = racks_of(rest, first)
    old = {p["metadata"]["uid"]: group_of(p) for p in members(rest, namespace, "nl")}
    [first_group] = set(old.values())
    # the evicted worker stays terminating while its node is NotReady, as on a cluster whose kubelet
    # there cannot confirm the deletion (KWOK would finish it at once; with the harness's grace
    # period of 0 the API server removes it at once). LWS v0.9.0 recreates the group only when its
    # pod reconciler reads the worker with a deletionTimestamp (handleRestartPolicy): a pod gone
    # before that read is missed, and the group is not recreated
    [worker] = [p for p in members(rest, namespace, "nl") if p["metadata"]["name"] == "nl-0-1"]
    with deletions_held(rest, [worker]):
        set_not_ready(rest, first["nl-0-1"])  # a worker's node
        wait_for(lambda: not set(old) & {p["metadata"]["uid"] for p in live(members(rest, namespace, "nl"))}, 60,
                 "the whole first incarnation gone (LWS deleted the leader once its worker was evicted)")
    again = wait_for(lambda: (b := placement(bound(members(rest, namespace, "nl")))) and len(b) == 3
                     and not set(old) & {p["metadata"]["uid"] for p in members(rest, namespace, "nl")} and b,
                     120, "the re-created replica bound")
    assert racks_of(rest, again) == {"ra", "rb"} - {home}
    new_groups = {group_of(p) for p in members(rest, namespace, "nl")}
    assert len(new_groups) == 1 and first_group not in new_groups


def test_admission_rejects_what_the_guide_forbids(rest, namespace, phalanx_lws, scheduler_mode):
    if scheduler_mode == "plugin":
        pytest.skip("admission only (the webhooks and the API server; no pod is scheduled): the same in both modes")
    path = f"{LWS_API}/namespaces/{namespace}/leaderworkersets"
    with pytest.raises(KubeError) as err:
        rest.create(path, leaderworkerset("ready", size=2, scheduling={}, startupPolicy="LeaderReady"), dryRun="All")
    assert MSG_LEADER_READY in str(err.value)
    make_lws(rest, namespace, leaderworkerset("fixed", size=2, scheduling={}, scheduler_name="none"))
    with pytest.raises(KubeError) as err:
        rest.patch(lws_path(namespace, "fixed"), {"metadata": {"annotations": {
            names.ANNOTATION_SCHEDULING: '{"schedulingPolicy": {"gang": {}}}'}}})
    assert "field is immutable" in str(err.value)
    with pytest.raises(KubeError) as err:
        rest.patch(lws_path(namespace, "fixed"), {"metadata": {"annotations": {names.ANNOTATION_SCHEDULING: None}}})
    assert MSG_ADDED in str(err.value)
    rest.patch(lws_path(namespace, "fixed"), {"spec": {"replicas": 2}})  # replicas and size stay free


@pytest.mark.parametrize("scheduler_mode", PHALANX_SCHEDULER_MODES)
def test_crd_flavor_pods_name_their_podgroup_in_the_label_and_bind_whole(crd_control_plane, scheduler_mode):
    """The CRD flavor (a cluster without scheduling.k8s.io Workloads): LWS, phalanx serve, its
    kube-scheduler (in each mode) and controller on the CRD-flavor control plane; a replica's pods
    carry ``scheduling.phalanx.dev/pod-group`` and bind whole."""
    plane = crd_control_plane
    rest = plane.rest
    manager = LwsManager(plane).start()
    try:
        with crd_flavor_phalanx(plane, scheduler_mode, "lws-crd") as (_, pool, namespace):
            controller = PhalanxController(plane)
            try:
                assert not controller.flavor.builtin
                controller.start()
                controller.register()
                for i in range(2):
                    pool.add(f"lws-crd-{i}", gpu=2, cpu="4")
                make_lws(rest, namespace, leaderworkerset("crd", size=4, replicas=2, resources=GPU1, scheduling={}))
                wait_for(lambda: len(bound(members(rest, namespace, "crd"))) == 4, 60, "one replica bound whole")
                crd_groups = {g["metadata"]["name"]: g for g in rest.list_items(
                    f"/apis/{names.CRD_GROUP}/{names.SCHEDULING_VERSION}/namespaces/{namespace}/podgroups")}
                assert len(crd_groups) == 2
                by_replica: dict[str, set] = {}
                for p in members(rest, namespace, "crd"):
                    labels = p["metadata"]["labels"]
                    assert labels[names.LABEL_POD_GROUP] in crd_groups and "schedulingGroup" not in p["spec"]
                    by_replica.setdefault(labels[names.LABEL_LWS_GROUP_INDEX], set()).add(
                        bool(p["spec"].get("nodeName")))
                assert sorted(map(sorted, by_replica.values())) == [[False], [True]]  # one whole, one waiting
            finally:
                controller.close()
    finally:
        manager.stop()


@pytest.fixture
def kueue_lws(control_plane, lws):
    """The real Kueue manager (harness/kueue.py) beside LWS, for one test: started after LWS, so its
    ``leaderworkerset`` integration finds the CRDs."""
    from harness.kueue import KueueManager

    manager = KueueManager(control_plane).start()
    yield manager
    manager.stop()


def test_lws_behind_kueue_waits_gated_over_quota_then_each_replica_lands_whole(rest, namespace, nodes,
                                                                                phalanx_lws, kueue_lws):
    """A LeaderWorkerSet submitted to a Kueue LocalQueue (docs/kueue.md): Kueue admits it (its
    pods gated meanwhile, so phalanx plans none of them) and phalanx places each replica whole in
    one rack; a second one over quota stays gated until the first is deleted."""
    from harness.kueue import KUEUE_API, QUEUE_LABEL, cluster_queue, local_queue, resource_flavor

    prefix = namespace[-40:]
    flavor, cq = f"{prefix}-flavor", f"{prefix}-cq"
    rest.create(f"{KUEUE_API}/resourceflavors", resource_flavor(flavor))
    rest.create(f"{KUEUE_API}/clusterqueues", cluster_queue(cq, flavor, 4))
    rest.create(f"{KUEUE_API}/namespaces/{namespace}/localqueues", local_queue("lq", cq))
    try:
        for rack in ("ra", "rb"):
            for i in range(2):
                nodes.add(f"kq-{rack}-{i}", cpu="1", rack=rack)  # 2 CPUs per rack: one replica each

        def submit(name: str) -> None:
            obj = leaderworkerset(name, size=2, replicas=2, resources={"cpu": "1"}, scheduling={"replica": RACKED})
            obj["metadata"]["labels"] = {QUEUE_LABEL: "lq"}
            make_lws(rest, namespace, obj)

        submit("first")  # 4 pods of 1 CPU: the ClusterQueue's 4
        for index in (0, 1):
            placed = replica_bound(rest, namespace, "first", index, 2)
            assert len(racks_of(rest, placed)) == 1, placed
        submit("second")
        wait_for(lambda: len(live(members(rest, namespace, "second"))) == 4 or None, 60, "the second LWS's pods")
        held = live(members(rest, namespace, "second"))
        assert all(p["spec"].get("schedulingGates") for p in held), "Kueue gates the pods over quota"
        assert placement(held) == {}
        rest.delete(lws_path(namespace, "first"))
        for index in (0, 1):
            placed = replica_bound(rest, namespace, "second", index, 2, timeout=90)
            assert len(racks_of(rest, placed)) == 1, placed
    finally:
        rest.delete(f"{KUEUE_API}/namespaces/{namespace}/localqueues/lq", missing_ok=True)
        rest.delete(f"{KUEUE_API}/clusterqueues/{cq}", missing_ok=True)
        rest.delete(f"{KUEUE_API}/resourceflavors/{flavor}", missing_ok=True)
