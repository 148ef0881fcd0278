"""A trace given by path (``phalanx bench trace --trace FILE [--cluster SPEC]``) and the rule by which a
default queue policy earns its place (``phalanx bench trace-defaults``)."""

from __future__ import annotations

import json

import pytest

from bench import trace_defaults
from bench.trace_bench import WAIT_TIE_S
from bench.traces import LoadRefused, cluster_spec, given, trace_file
from cluster.names import LABEL_RACK
from phalanx_cli.main import main

POLLUX = "name,time,application,num_replicas,batch_size\n" + "".join(
    f"job-{i},{i * 600},{app},{n},64\n" for i, (app, n) in enumerate(
        [("cifar10", 1), ("bert", 4), ("ncf", 2), ("yolov3", 8), ("cifar10", 1), ("deepspeech2", 2)]))
#: the same six jobs four times over, ten minutes apart: enough to fill two sized racks
POLLUX_24 = "name,time,application,num_replicas,batch_size\n" + "".join(
    f"job-{i},{i * 600},{app},{n},64\n" for i, (app, n) in enumerate(
        [("cifar10", 1), ("bert", 4), ("ncf", 2), ("yolov3", 8), ("cifar10", 1), ("deepspeech2", 2)] * 4))
TIRESIAS = "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n1,4,0,1,m,3600,0\n2,8,100,1,m,7200,0\n"


def test_a_trace_file_is_read_in_the_format_its_header_names(tmp_path):
    pollux, tiresias, other = tmp_path / "mine.csv", tmp_path / "t.csv", tmp_path / "x.csv"
    pollux.write_text(POLLUX)
    tiresias.write_text(TIRESIAS)
    other.write_text("a,b\n1,2\n")
    fmt, jobs = trace_file(pollux)
    assert fmt == "pollux" and [j.pods for j in jobs] == [1, 4, 2, 8, 1, 2]
    assert jobs[1].duration == pytest.approx(10 ** 0.5 * 3600 / 4)  # bert: the medium class's GPU-hours
    fmt, jobs = trace_file(tiresias)
    assert fmt == "tiresias" and [(j.pods, j.duration) for j in jobs] == [(4, 3600.0), (8, 7200.0)]
    with pytest.raises(ValueError, match="not a trace in a shipped format.*its header has a, b"):
        trace_file(other)
    with pytest.raises(ValueError, match="No such file"):
        trace_file(tmp_path / "missing.csv")
    trace = given(pollux, cluster_spec("1x1"), load=0.9)
    assert trace.name == "mine" and abs(trace.measured_load - 0.9) <= 0.01 and len(trace.cluster.nodes) == 1
    with pytest.raises(LoadRefused, match="on 32 GPUs the jobs feel at most 28%"):
        given(pollux, cluster_spec("1x4"), load=0.9)  # 18 GPUs of jobs cannot fill 32
    with pytest.raises(LoadRefused, match="no cluster of 2 racks.*given-2x1x8gpu.*at most 55%"):
        given(pollux, None, load=0.9)  # the two smallest racks are too many for 18 GPUs of jobs
    pollux.write_text(POLLUX_24)
    sized = given(pollux, None, load=0.9)  # two racks, sized
    assert sized.reached == "cluster sized" and len({n.labels[LABEL_RACK] for n in sized.cluster.nodes}) == 2


@pytest.mark.parametrize("spec", ["2", "0x8", "ax8", "2x", "rack"])
def test_a_cluster_spec_that_does_not_read_says_what_to_give(spec):
    with pytest.raises(ValueError, match="RACKSxNODES"):
        cluster_spec(spec)


def test_the_cli_replays_a_given_trace_and_refuses_half_an_invocation(tmp_path, capsys):
    path = tmp_path / "mine.csv"
    path.write_text(POLLUX)
    out = tmp_path / "out.json"
    assert main(["bench", "trace", "--trace", str(path), "--cluster", "1x1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["traces"]
    assert {r["trace"] for r in rows} == {"mine"} and {r["load"] for r in rows} == {0.7, 0.9, 1.1}
    assert all(abs(r["load_measured"] - r["load"]) <= 0.01 for r in rows)
    assert "load felt" in out.with_suffix(".md").read_text()
    assert {r["load_reached"] for r in rows} == {"arrivals scaled"} and {r["cluster"] for r in rows} == {
        "given-1x1x8gpu"}
    sized = tmp_path / "sized.json"  # no --cluster: 2 racks sized to each load
    path.write_text(POLLUX_24)
    assert main(["bench", "trace", "--trace", str(path), "--json", str(sized)]) == 0
    rows = json.loads(sized.read_text())["traces"]
    assert {r["load_reached"] for r in rows} == {"cluster sized"}
    assert all(abs(r["load_measured"] - r["load"]) <= 0.01 for r in rows)
    for argv, why in ([["bench", "trace", "--cluster", "2x8"], "give the trace too"],
                      [["bench", "solver", "--trace", str(path)], "for trace only"],
                      [["bench", "trace", "--trace", str(tmp_path / "nope.csv"), "--cluster", "2x8"], "No such file"],
                      [["bench", "trace", "--trace", str(path), "--cluster", "big"], "RACKSxNODES"]):
        with pytest.raises(SystemExit, match=why):
            main(argv)


def _rows(case: str, load: float, variant: str, **metrics) -> list[dict]:
    base = dict(workload=case, load=load, policy=variant, completed=10, wait_p95_s=100.0, wait_p99_s=200.0,
                wait_p95_low_s=100.0, wait_p95_high_s=10.0, lost_gpu_hours=0.0)
    return [{**base, **metrics}]


def _busy(rows: list[dict], waited: int = 1) -> list[dict]:
    """``rows`` and, per case, a baseline under which ``waited`` gangs waited."""
    cases = sorted({(r["workload"], r["load"]) for r in rows})
    return rows + [dict(workload=w, load=load, policy="kueue-tas", waited_gangs=waited, seed=0) for w, load in cases]


def _verdict(judged, policy, case):
    return next(j for j in judged if j["policy"] == policy and j["workload"] == case)


def test_a_policy_earns_its_place_by_helping_what_it_is_for_or_doing_no_harm():
    rows = []
    # holds ("phalanx" against "no-holds"): cut the longest waits (helps), change nothing (no
    # harm), or cost p95 or completions with no help (fails)
    rows += _rows("helps", 0.9, "phalanx", wait_p99_s=500.0, wait_p95_s=900.0)
    rows += _rows("helps", 0.9, "no-holds", wait_p99_s=2000.0, wait_p95_s=400.0)
    rows += _rows("tie", 0.9, "phalanx", wait_p95_s=100.0 + WAIT_TIE_S / 2)
    rows += _rows("tie", 0.9, "no-holds")
    rows += _rows("harm", 0.9, "phalanx", wait_p95_s=1000.0, wait_p99_s=2000.0)
    rows += _rows("harm", 0.9, "no-holds", wait_p95_s=400.0, wait_p99_s=2000.0)
    rows += _rows("fewer", 0.9, "phalanx", completed=9)
    rows += _rows("fewer", 0.9, "no-holds")
    # weighing (on by default: "phalanx" against "no-weighing"): judged on lost work and low waits
    rows += _rows("w-helps", 0.9, "phalanx", lost_gpu_hours=1.0, wait_p95_s=900.0)
    rows += _rows("w-helps", 0.9, "no-weighing", lost_gpu_hours=50.0)
    rows += _rows("w-low", 0.9, "phalanx", wait_p95_s=900.0, wait_p95_low_s=100.0)
    rows += _rows("w-low", 0.9, "no-weighing", wait_p95_low_s=1000.0)
    rows += _rows("w-harm", 0.9, "phalanx", wait_p95_s=900.0)
    rows += _rows("w-harm", 0.9, "no-weighing")
    judged = trace_defaults.verdicts(_busy(rows))
    holds = {case: _verdict(judged, "starvation holds", case) for case in ("helps", "tie", "harm", "fewer")}
    assert holds["helps"]["helps"] and not holds["helps"]["harmless"] and holds["helps"]["earns"]
    assert not holds["tie"]["helps"] and holds["tie"]["harmless"] and holds["tie"]["earns"]
    assert not holds["harm"]["earns"] and not holds["fewer"]["earns"]
    weighing = {case: _verdict(judged, "preemption weighing", case) for case in ("w-helps", "w-low", "w-harm")}
    assert weighing["w-helps"]["helps"] and not weighing["w-helps"]["harmless"] and weighing["w-helps"]["earns"]
    assert weighing["w-low"]["helps"] and weighing["w-low"]["earns"]
    assert not weighing["w-harm"]["earns"]


def test_medians_over_draws_decide_not_one_draw():
    rows = []
    for seed, (on, off) in enumerate([(900.0, 100.0), (100.0, 100.0), (100.0, 100.0)]):
        rows += [{**r, "seed": seed} for r in _rows("w", 0.9, "phalanx", wait_p95_s=on)]
        rows += [{**r, "seed": seed} for r in _rows("w", 0.9, "no-holds", wait_p95_s=off)]
        rows += [{**r, "seed": seed} for r in _rows("w", 0.9, "no-weighing")]
    holds = _verdict(trace_defaults.verdicts(_busy(rows)), "starvation holds", "w")
    assert holds["draws"] == 3 and holds["on"]["wait_p95_s"] == 100.0 and holds["earns"]


def test_a_case_no_baseline_waited_on_is_left_out_of_the_defaults_check():
    """An idle case could only pass: it is not judged, and the check says it left it out."""
    rows = _rows("idle", 0.9, "phalanx", wait_p95_s=0.0) + _rows("idle", 0.9, "no-holds", wait_p95_s=0.0)
    rows += _rows("busy", 0.9, "phalanx", wait_p95_s=900.0) + _rows("busy", 0.9, "no-holds", wait_p95_s=100.0)
    rows += _rows("busy", 0.9, "no-preemption") + _rows("idle", 0.9, "no-preemption")
    rows = _busy([r for r in rows if r["workload"] == "busy"]) + _busy(
        [r for r in rows if r["workload"] == "idle"], waited=0)
    judged = trace_defaults.verdicts(rows)
    assert {j["workload"] for j in judged} == {"busy"}
    assert not _verdict(judged, "starvation holds", "busy")["earns"]  # a real case still fails when it harms
    assert trace_defaults.left_out(rows) == [("idle", 0.9)]
    assert [b["workload"] for b in trace_defaults.preemption(rows)] == ["busy"]
    assert "Cases kept: 1 of 2; 1 where no baseline's gangs waited (no contention) are left out: idle at 90%" in \
        trace_defaults.markdown(rows, judged, trace_defaults.preemption(rows), [], 1.0)


def test_a_trace_no_load_can_be_run_at_says_why_and_exits_1(tmp_path, capsys):
    """Every load refused (jobs that all arrive at once): the reasons, no traceback, exit 1."""
    path = tmp_path / "once.csv"
    path.write_text("name,time,application,num_replicas\nj1,0,cifar10,1\nj2,0,bert,2\n")
    assert main(["bench", "trace", "--trace", str(path), "--json", str(tmp_path / "out.json")]) == 1
    err = capsys.readouterr().err
    assert "nothing run, every load was refused" in err and "arriving at one instant" in err
    assert json.loads((tmp_path / "out.json").read_text())["refused"]
