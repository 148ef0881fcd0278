"""The served extender under a gang's real concurrency: N-1 bind calls wait at the barrier while
filter calls for the remaining members keep being answered. A fixed pool of 8 threads would
deadlock a gang of 9; phalanx's server must place a 1,000-pod gang whole."""

from bench.scheduler_sim import SimulatedScheduler
from cluster.sim import SimCluster
from extender.server import ServeOptions, build

from .k8s_objects import podgroup


def test_a_1000_pod_gang_goes_through_filter_and_the_barrier_over_http():
    sim = SimCluster()
    sim.add_nodes(zones=1, racks_per_zone=4, nodes_per_rack=32, gpus=8)  # 1,024 GPUs
    sim.create(podgroup("big", 1000))
    for i in range(1000):
        sim.create({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": f"big-{i}", "namespace": "default"},
                    "spec": {"schedulingGroup": {"podGroupName": "big"},
                             "containers": [{"name": "c", "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "1"}}}]}})
    phalanx = build(ServeOptions(insecure_loopback_no_auth=True, http_addr="127.0.0.1:0", grpc_addr="", http_threads=1100, barrier_timeout=120.0,
                                 plan_ttl=300.0), sim=sim).start()
    driver = SimulatedScheduler(sim, phalanx.port, bind_threads=1100)
    try:
        stats = driver.run_round()
    finally:
        driver.close()
        phalanx.stop()
    assert stats.bind_errors == []
    assert stats.bound == 1000
    assert all(p["spec"].get("nodeName") for p in sim.list("Pod"))
