"""A gang that already ran is never stranded by its own history (docs/design.md: phalanx/gang-history).

kubernetes/kubernetes#142330: a gang Job whose index finished and that then loses another index's
pod never completes under in-tree gang scheduling — the Succeeded member no longer counts, so the
replacement waits for minCount members that will never exist. Here the finished members count,
a lost member's replacement is a repair in the gang's domain, and the PodGroup says what a repair
waits for. The pods are shaped as the Job controller makes them (the completion index as a label,
the Job as controller owner); the e2e suite drives the real Job controller (tests/e2e/test_gang_jobs.py).
"""

import pytest

from cluster import names
from extender import verbs
from solver import InvalidInput, PodGroup

from .k8s_objects import pod, podgroup
from .test_cycle_service import all_nodes, bind_all
from .test_plugin_contract import first_snapshot, plan_for, stub  # noqa: F401 - the fixture

INDEX = names.LABEL_JOB_COMPLETION_INDEX


def job_pod(job, index, suffix="a", gpu=1):
    """A pod as the Job controller makes an Indexed Job's: ``<job>-<index>-<suffix>``, its index
    as a label, the Job its controller."""
    obj = pod(f"{job}-{index}-{suffix}", job, gpu=gpu, labels={INDEX: str(index)})
    obj["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": job,
                                           "uid": f"uid-{job}", "controller": True}]
    return obj


def gang_job(sim, name, size, key=names.LABEL_RACK, gpu=1):
    sim.create(podgroup(name, size, key))
    return [sim.create(job_pod(name, i, gpu=gpu)) for i in range(size)]


def finish(sim, obj, phase="Succeeded"):
    sim.update("Pod", f"default/{obj['metadata']['name']}", lambda o: o["status"].update(phase=phase))


def lose(sim, obj):
    sim.delete("Pod", f"default/{obj['metadata']['name']}")


def conditions(sim, name):
    pg = sim.get("PodGroup", f"default/{name}")
    return {c["type"]: c for c in (pg.get("status") or {}).get("conditions") or []}


def racks(sim, nodes):
    return {sim.get("Node", n)["metadata"]["labels"][names.LABEL_RACK] for n in nodes}


def test_a_finished_member_counts_and_the_lost_members_replacement_binds_in_the_gangs_rack(sim, cycle):
    """The issue's case: index 0 finishes, index 1's pod is lost, its replacement binds (in-tree
    answers "waiting for minCount pods" for ever)."""
    members = gang_job(sim, "train", 4)
    placed, errors = bind_all(cycle, sim, members)
    assert not errors
    rack = racks(sim, placed.values())
    finish(sim, members[0])
    lose(sim, members[1])
    replacement = sim.create(job_pod("train", 1, "b"))
    group = sim.cache.podgroup("default/train")
    assert group.finished == 1 and group.needed == 1 and not group.missing_members
    placed, errors = bind_all(cycle, sim, [replacement])
    assert not errors and racks(sim, placed.values()) == rack
    assert cycle.group_state("default/train") == "scheduled"


def test_replacements_pending_at_once_are_placed_together_and_the_podgroup_says_what_they_wait_for(sim, cycle):
    members = gang_job(sim, "train", 4)
    bind_all(cycle, sim, members)
    finish(sim, members[0])
    lose(sim, members[1])
    lose(sim, members[2])
    first = sim.create(job_pod("train", 1, "b"))
    answer = verbs.filter(cycle, first, all_nodes(sim))
    assert answer.nodes == []
    assert set(answer.unresolvable.values()) == {
        "podgroup default/train: waiting for members, 3 of 4 exist (1 of them finished)"}
    assert cycle.flush()
    waiting = conditions(sim, "train")[names.CONDITION_MEMBERS_SCHEDULED]
    assert (waiting["status"], waiting["reason"]) == ("False", names.REASON_WAITING_FOR_MEMBERS)
    assert waiting["message"] == ("podgroup default/train was scheduled; members 1 pending (train-1-b), "
                                  "1 running (train-3-a), 1 finished (train-0-a): podgroup default/train: "
                                  "waiting for members, 3 of 4 exist (1 of them finished)")
    assert conditions(sim, "train")[names.CONDITION_INITIALLY_SCHEDULED]["status"] == "True"
    second = sim.create(job_pod("train", 2, "b"))
    placed, errors = bind_all(cycle, sim, [first, second])
    assert not errors and len(placed) == 2
    assert cycle.flush()
    assert conditions(sim, "train")[names.CONDITION_MEMBERS_SCHEDULED]["status"] == "True"
    assert conditions(sim, "train")[names.CONDITION_INITIALLY_SCHEDULED]["status"] == "True"


def test_a_repair_that_does_not_fit_says_which_members_and_what_room_is_short(sim, cycle):
    members = gang_job(sim, "train", 4)
    placed, _ = bind_all(cycle, sim, members)
    rack = racks(sim, placed.values()).pop()
    finish(sim, members[0])
    lose(sim, members[1])
    other = "r1" if rack == "r0" else "r0"  # the other rack is empty: the repair may not go there
    filler = [sim.create(pod(f"fill-{i}", gpu=1)) for i in range(2)]
    free = [n for n in all_nodes(sim) if racks(sim, [n]) == {rack}]
    for i, obj in enumerate(filler):  # the finished member's GPU and one more taken in the gang's rack
        sim.bind("default", obj["metadata"]["name"], obj["metadata"]["uid"], free[i % len(free)])
    replacement = sim.create(job_pod("train", 1, "b", gpu=4))
    answer = verbs.filter(cycle, replacement, all_nodes(sim))
    assert answer.nodes == []
    assert cycle.flush()
    message = conditions(sim, "train")[names.CONDITION_MEMBERS_SCHEDULED]["message"]
    assert message.startswith("podgroup default/train was scheduled; members 1 pending (train-1-b), "
                              "2 running (train-2-a, train-3-a), 1 finished (train-0-a): ")
    assert f"rack {other}" not in message and "nvidia.com/gpu" in message
    assert conditions(sim, "train")[names.CONDITION_INITIALLY_SCHEDULED]["status"] == "True"


def test_a_failed_index_the_job_will_not_replace_does_not_hold_the_gang_back(sim, cycle):
    """backoffLimitPerIndex reached: index 0 stays Failed, no pod takes its index; index 1 is then
    lost and replaced: the replacement binds."""
    members = gang_job(sim, "train", 4)
    bind_all(cycle, sim, members)
    finish(sim, members[0], "Failed")
    lose(sim, members[1])
    replacement = sim.create(job_pod("train", 1, "b"))
    placed, errors = bind_all(cycle, sim, [replacement])
    assert not errors and len(placed) == 1


def test_finished_members_count_once_per_slot(sim):
    """A slot is an Indexed Job's completion index (else the pod's name): a Failed member whose
    index a live pod holds was replaced; two finished pods of one index count once; a Failed pod of
    a Job without indexes never counts (the Job replaces it under a new name); terminating ones
    never do."""
    sim.create(podgroup("j", 6))
    done = [sim.create(job_pod("j", i)) for i in range(5)]
    for obj in done:
        sim.bind("default", obj["metadata"]["name"], obj["metadata"]["uid"], "n-0-0")
    finish(sim, done[0])  # index 0 succeeded
    finish(sim, done[1], "Failed")  # index 1 failed ...
    sim.create(job_pod("j", 1, "b"))  # ... and was replaced
    finish(sim, done[2], "Failed")  # index 2 failed, then succeeded on a retry: one slot
    retry = sim.create(job_pod("j", 2, "b"))
    sim.bind("default", "j-2-b", retry["metadata"]["uid"], "n-0-0")
    finish(sim, retry)
    unindexed = sim.create(job_pod("j", 9, "x"))
    sim.update("Pod", "default/j-9-x", lambda o: o["metadata"]["labels"].pop(INDEX))
    sim.bind("default", "j-9-x", unindexed["metadata"]["uid"], "n-0-0")
    finish(sim, unindexed, "Failed")
    sim.update("Pod", "default/j-3-a", lambda o: o["metadata"].update(deletionTimestamp="2026-01-01T00:00:00Z"))
    finish(sim, done[3])  # finished while being deleted: not counted
    finished = sim.cache.finished_members("default/j")
    assert [r.pod.name for r in finished] == ["j-0-a", "j-2-b"]  # a Succeeded pod stands for its slot
    group = sim.cache.podgroup("default/j")
    assert group.finished == 2 and len(group.members) == 2  # j-1-b pending, j-4-a running


def test_a_gang_that_never_ran_still_waits_for_min_count_members(sim, cycle):
    """No member finished: nothing counts but the members (the KEP's rule, unchanged)."""
    sim.create(podgroup("fresh", 4, names.LABEL_RACK))
    first = [sim.create(job_pod("fresh", i)) for i in range(3)]
    answer = verbs.filter(cycle, first[0], all_nodes(sim))
    assert set(answer.unresolvable.values()) == {"podgroup default/fresh: waiting for members, 3 of 4 exist"}
    assert cycle.flush()
    assert names.CONDITION_MEMBERS_SCHEDULED not in conditions(sim, "fresh")


def test_a_job_whose_members_all_finished_reads_finished(sim, cycle):
    members = gang_job(sim, "done", 2)
    bind_all(cycle, sim, members)
    for obj in members:
        finish(sim, obj)
    assert cycle.group_state("default/done") == "finished"


def test_plugin_mode_does_not_list_a_gang_with_finished_members_as_waiting(sim, stub):  # noqa: F811
    sim.create(podgroup("p", 3))
    members = [sim.create(job_pod("p", i)) for i in range(3)]
    for obj in members:
        sim.bind("default", obj["metadata"]["name"], obj["metadata"]["uid"], "n-0-0")
    finish(sim, members[0])
    lose(sim, members[1])
    replacement = sim.create(job_pod("p", 1, "b"))
    reply = plan_for(stub, replacement)
    assert not reply.members_missing, reply.reason
    assert "default/p" not in first_snapshot(stub).waiting_groups


def test_the_solver_counts_finished_members_toward_min_count():
    group = PodGroup("default", "g", (), min_count=4, finished=1)
    assert group.missing_members == "podgroup default/g: waiting for members, 1 of 4 exist (1 of them finished)"
    assert group.needed == 3
    with pytest.raises(InvalidInput, match="finished members must be an integer >= 0"):
        PodGroup("default", "g", (), min_count=4, finished=-1)


def test_explain_says_which_members_finished_and_what_the_repair_waits_for(sim, cycle, capsys):
    from phalanx_cli.main import main
    from rpc import start_grpc_server

    members = gang_job(sim, "train", 4)
    bind_all(cycle, sim, members)
    finish(sim, members[0])
    lose(sim, members[1])
    lose(sim, members[2])
    verbs.filter(cycle, sim.create(job_pod("train", 1, "b")), all_nodes(sim))
    running = start_grpc_server(cycle, "127.0.0.1:0")
    try:
        assert main(["explain", "default/train", "--grpc-addr", f"127.0.0.1:{running.port}"]) == 0
    finally:
        running.stop(grace=0)
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == ["podgroup default/train: waiting",
                       "  members: 2 exist, 1 bound, 1 finished (minCount 4)",
                       "  why: podgroup default/train: waiting for members, 3 of 4 exist (1 of them finished)"]
