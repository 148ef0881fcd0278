"""Several gangs at once through the served extender: what the HTTP pool must hold is the sum of
the waiting members of every planned gang. Three gangs interleaved as kube-scheduler's queue
interleaves them, with room for all three in the cluster but not for all their bind calls in the
pool at once: barrier capacity is planned, so they bind whole one after another (without it,
every barrier times out with nothing bound), and /healthz and filter keep answering meanwhile."""

import http.client
import threading

import orjson

from bench.scheduler_sim import SimulatedScheduler
from cluster.sim import SimCluster
from extender.server import ServeOptions, build

from .k8s_objects import podgroup


def interleaved_gangs(sim, gangs, size):
    """Members named so that kube-scheduler's order (priority, age, name) interleaves the gangs."""
    for g in gangs:
        sim.create(podgroup(g, size))
    for i in range(size):
        for g in gangs:
            sim.create({"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": f"p{i:04d}-{g}", "namespace": "default"},
                        "spec": {"schedulingGroup": {"podGroupName": g},
                                 "containers": [{"name": "c", "resources": {"requests": {
                                     "cpu": "1", "nvidia.com/gpu": "1"}}}]}})


def run_gangs(gangs, size, nodes, threads, barrier_timeout):
    sim = SimCluster()
    sim.add_nodes(zones=1, racks_per_zone=1, nodes_per_rack=nodes, gpus=8)
    interleaved_gangs(sim, gangs, size)
    phalanx = build(ServeOptions(insecure_loopback_no_auth=True, http_addr="127.0.0.1:0", grpc_addr="", http_threads=threads,
                                 barrier_timeout=barrier_timeout, plan_ttl=300.0), sim=sim).start()
    driver = SimulatedScheduler(sim, phalanx.port, bind_threads=len(gangs) * size + 50)
    probes: list[str] = []  # what each probe got: "ok", or what went wrong
    stop = threading.Event()

    def probe():  # /healthz and a filter for a pod without a group, answered while gangs wait
        solo = {"metadata": {"name": "solo", "namespace": "default", "uid": "solo"},
                "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}}
        body = orjson.dumps({"Pod": solo, "NodeNames": ["node-z0-r0-0"]})
        while not stop.is_set():
            try:
                conn = http.client.HTTPConnection("127.0.0.1", phalanx.port, timeout=60)
                conn.request("GET", "/healthz")
                health = conn.getresponse().read()
                conn.request("POST", "/scheduler/filter", body, {"Content-Type": "application/json"})
                nodes = orjson.loads(conn.getresponse().read())["NodeNames"]
                conn.close()
                ok = health == b"ok\n" and nodes == ["node-z0-r0-0"]
                probes.append("ok" if ok else f"healthz {health!r}, filter {nodes!r}")
            except Exception as err:  # noqa: BLE001 - recorded, asserted by the test
                probes.append(f"{type(err).__name__}: {err}")
            stop.wait(0.1)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    try:
        stats = driver.run_until_settled(max_rounds=10)
    finally:
        stop.set()
        prober.join(60)
        driver.close()
        phalanx.stop()
    bound = sum(1 for p in sim.list("Pod") if p["spec"].get("nodeName"))
    return stats, bound, probes


def test_three_interleaved_gangs_bind_whole_within_the_pools_barrier_capacity():
    # 3 x 40 bind calls against a pool of 110 threads (barrier capacity 102): the same shape as
    # 3 x 400 against the default 1,100, which deadlocked every barrier before capacity was planned
    stats, bound, probes = run_gangs(("a", "b", "c"), 40, nodes=20, threads=110, barrier_timeout=20.0)
    assert stats.bind_errors == [] and bound == 120
    # answered throughout (each probe waits for its answer: a probe stuck behind the barrier would
    # time out and be recorded as an error)
    assert probes and set(probes) == {"ok"}, probes
