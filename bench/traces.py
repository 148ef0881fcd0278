"""Real traces for ``phalanx bench trace``: jobs, clusters and the derivations between them.

The data lives beside the checkout in ``../shared/data`` (override with ``PHALANX_TRACE_DATA``),
copied unchanged from its authors' repositories:

* ``acme-kalos`` — InternLM/AcmeTrace ``trace_kalos``, "Characterization of Large Language Model
  Development in the Datacenter" (NSDI '24), CC BY 4.0: 319 LLM training gangs;
* ``pollux`` — petuum/adaptdl ``benchmark/workloads`` (Pollux, OSDI '21, derived from the
  Microsoft Philly trace), Apache-2.0: 8 workloads x 160 jobs;
* ``tiresias`` — SymbioticLab/Tiresias (NSDI '19), Apache-2.0: ``60_job.csv`` and switch -> node ->
  GPU cluster shapes;
* ``alibaba-pai-2020`` — alibaba/clusterdata ``cluster-trace-gpu-v2020``, "MLaaS in the Wild"
  (NSDI '22), CC BY 4.0: the node inventory of a 1,897-machine GPU cluster.

What this module derives rather than reads (every result repeats it via :data:`SYNTHESIZED`):

* **Topology is synthesized.** No trace carries rack labels. PAI nodes are grouped by GPU model
  (sorted by machine id) into racks of 32 nodes, one GPU model per rack, and racks into zones of 8.
  Tiresias' switch is the zone; racks are its switch when a switch has at most 16 nodes, else
  slices of 16 nodes.
* **Acme** runs on PAI's 1,897 machines restricted to the 519 eight-GPU ones (every multi-pod Acme
  gang is 8 GPUs per pod). Duration = ``num_iteration * (iteration_computing_time +
  iteration_networking_time)`` as the data README states. CPU per pod = ``cpu_per_gpu_worker *
  gpu_per_worker`` capped at the node's 12 cores per GPU (PAI nodes have 96 cores for 8 GPUs; the
  trace's 120-core pods would fit nowhere). No memory request.
* **Pollux** has no duration. Pollux (OSDI '21, section 5) sorts its applications into size
  classes by GPU-hours: small 0-1 (cifar10, ncf), medium 1-10 (bert, deepspeech2), large 10-100
  (yolov3), extra-large 100-1,000 (imagenet). Each application gets its class's geometric middle
  (0.5, 3.16, 31.6, 316 GPU-hours; 0.5 for the open-ended small class) and a job's duration is
  that work divided by its ``num_replicas`` (perfect scaling). This is an assumption of the
  benchmark, not data. Pods are 1 GPU with the node's CPU share per GPU. It runs on Tiresias'
  ``n32g4`` shape (32 nodes x 4 GPUs, one switch).
* **Tiresias** ``60_job.csv``: ``num_gpu`` pods x 1 GPU, ``duration`` as given, on its
  ``cluster_spec.csv`` shape (16 nodes x 4 GPUs, one switch).
* **Offered load.** Arrivals are multiplied by one factor per trace so that total GPU-seconds /
  (arrival span x cluster GPUs) = :data:`OFFERED_LOAD` (90%); the factor is reported.
* **Priorities.** The traces carry none. Every :data:`HIGH_PRIORITY_EVERY`-th job in arrival order
  gets priority :data:`HIGH_PRIORITY`, the rest 0; every policy queues by priority, only
  phalanx exact preempts.
"""

from __future__ import annotations

import csv
import os
import pathlib
from dataclasses import dataclass, replace

import numpy as np

from cluster.names import LABEL_HOSTNAME, LABEL_RACK, LABEL_ZONE
from solver import DisruptionMode, Node, Pod, PodGroup, PodSpec, Policy

from .generate import GPU

DATA_ENV = "PHALANX_TRACE_DATA"
#: ``../shared/data`` beside the checkout.
DEFAULT_DATA = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"
LABEL_GPU_MODEL = "nvidia.com/gpu.product"
OFFERED_LOAD = 0.9
HIGH_PRIORITY = 1000
HIGH_PRIORITY_EVERY = 5
PAI_RACK_NODES = 32
PAI_RACKS_PER_ZONE = 8
TIRESIAS_RACK_NODES = 16
#: GPU-hours per Pollux application: the geometric middle of its Pollux size class (assumption).
POLLUX_GPU_HOURS = {"cifar10": 0.5, "ncf": 0.5, "bert": 10 ** 0.5, "deepspeech2": 10 ** 0.5,
                    "yolov3": 10 ** 1.5, "imagenet": 10 ** 2.5}
SYNTHESIZED = ("topology synthesized: no trace has rack labels; racks of 32 (PAI, one GPU model per "
               "rack, zones of 8 racks) or 16 nodes (Tiresias shapes, zone = switch); simulated time; "
               f"arrivals scaled to {OFFERED_LOAD:.0%} offered load; priorities assigned to every "
               f"{HIGH_PRIORITY_EVERY}th job (the traces have none); Pollux durations assumed per "
               "application size class")


class DataMissing(RuntimeError):
    pass


def data_dir() -> pathlib.Path:
    path = pathlib.Path(os.environ.get(DATA_ENV, DEFAULT_DATA))
    if not (path / "acme-kalos").is_dir():
        raise DataMissing(f"trace data not found in {path}: expected acme-kalos/, pollux/, tiresias/ and "
                          f"alibaba-pai-2020/ there (set {DATA_ENV}=DIR to point elsewhere)")
    return path


@dataclass(frozen=True)
class Job:
    """One gang of the trace: ``pods`` identical pods of ``gpus`` GPUs and ``cpu`` milli-CPU."""

    id: str
    arrival: float
    duration: float
    pods: int
    gpus: int
    cpu: int
    priority: int = 0

    @property
    def gpu_seconds(self) -> float:
        return self.pods * self.gpus * self.duration

    def group(self, topology_key: str) -> PodGroup:
        spec = PodSpec({GPU: self.gpus, "cpu": self.cpu}, priority=self.priority)
        members = tuple(Pod(uid=f"{self.id}-{i}", name=f"{self.id}-{i}", spec=spec, namespace="trace",
                            group=f"trace/{self.id}") for i in range(self.pods))
        return PodGroup("trace", self.id, members, Policy.GANG, self.pods, topology_key,
                        disruption_mode=DisruptionMode.ALL, priority=self.priority, created=self.arrival)


@dataclass(frozen=True)
class Cluster:
    name: str
    nodes: tuple[Node, ...]
    #: Required-key candidates, lowest level first; the whole cluster comes after the last.
    levels: tuple[str, ...] = (LABEL_RACK, LABEL_ZONE)

    @property
    def gpus(self) -> int:
        return sum(n.allocatable.get(GPU, 0) for n in self.nodes)

    def required_key(self, job: Job) -> str:
        """The lowest level one of whose domains holds the gang on an empty cluster; '' (no key)
        when none does. The same rule for every policy."""
        fits = np.array([_pods_per_node(n, job) for n in self.nodes])
        for key in self.levels:
            values = np.array([n.labels[key] for n in self.nodes])
            if max(int(fits[values == v].sum()) for v in set(values)) >= job.pods:
                return key
        return ""


@dataclass(frozen=True)
class Trace:
    name: str
    cluster: Cluster
    jobs: tuple[Job, ...]
    arrival_scale: float
    notes: str


def _pods_per_node(node: Node, job: Job) -> int:
    gpu = node.allocatable.get(GPU, 0) // job.gpus
    cpu = node.allocatable.get("cpu", 0) // job.cpu if job.cpu else gpu
    return min(gpu, cpu)


def _node(name: str, gpus: int, cores: int, mem_gb: int, labels: dict[str, str]) -> Node:
    return Node(name, {GPU: gpus, "cpu": cores * 1000, "memory": mem_gb * 2**30, "pods": 110},
                {LABEL_HOSTNAME: name, **labels})


def pai_cluster(data: pathlib.Path, gpus_per_node: int = 8) -> Cluster:
    """PAI 2020 machines with ``gpus_per_node`` GPUs, racked by GPU model (synthesized)."""
    with open(data / "alibaba-pai-2020" / "pai_machine_spec.csv") as f:
        rows = [r for r in csv.reader(f) if int(r[4]) == gpus_per_node]
    rows.sort(key=lambda r: (r[1], r[0]))
    nodes, rack, previous, in_rack = [], -1, None, PAI_RACK_NODES
    for machine, model, cores, mem, gpus in rows:
        if model != previous or in_rack == PAI_RACK_NODES:
            rack, in_rack, previous = rack + 1, 0, model
        in_rack += 1
        nodes.append(_node(f"pai-{machine[:12]}", int(gpus), int(cores), int(mem), {
            LABEL_RACK: f"rack-{rack:03d}", LABEL_ZONE: f"zone-{rack // PAI_RACKS_PER_ZONE:02d}",
            LABEL_GPU_MODEL: model}))
    return Cluster(f"pai-2020-{gpus_per_node}gpu", tuple(nodes))


def tiresias_cluster(data: pathlib.Path, shape: str) -> Cluster:
    """A Tiresias shape file: switches of nodes; racks are 16-node slices of a switch."""
    with open(data / "tiresias" / f"{shape}.csv") as f:
        spec = {k: int(v) for k, v in next(csv.DictReader(f)).items()}
    nodes = []
    for s in range(spec["num_switch"]):
        for i in range(spec["num_node_p_switch"]):
            nodes.append(_node(f"sw{s}-n{i:03d}", spec["num_gpu_p_node"], spec["num_cpu_p_node"],
                               spec["mem_p_node"], {LABEL_ZONE: f"switch-{s}",
                                                    LABEL_RACK: f"switch-{s}-rack-{i // TIRESIAS_RACK_NODES}"}))
    return Cluster(f"tiresias-{shape}", tuple(nodes))


Window = tuple[int, int | None]
ALL: Window = (0, None)


def _scaled(name: str, cluster: Cluster, jobs: list[Job], notes: str, window: Window) -> Trace:
    """Sort by arrival, keep jobs ``window[0]:window[1]``, assign priorities, scale to the offered load."""
    jobs = sorted(jobs, key=lambda j: (j.arrival, j.id))[window[0]:window[1]]
    if window != ALL:
        notes += f"; jobs {window[0]}:{window[1] or len(jobs) + window[0]} in arrival order"
    jobs = [replace(j, priority=HIGH_PRIORITY if i % HIGH_PRIORITY_EVERY == HIGH_PRIORITY_EVERY - 1 else 0)
            for i, j in enumerate(jobs)]
    first = jobs[0].arrival
    span = max(jobs[-1].arrival - first, 1.0)
    load = sum(j.gpu_seconds for j in jobs) / (span * cluster.gpus)
    factor = load / OFFERED_LOAD
    jobs = [replace(j, arrival=round((j.arrival - first) * factor, 3)) for j in jobs]
    return Trace(name, cluster, tuple(jobs), factor, f"{notes}; native offered load {load:.1%}, "
                 f"arrivals x{factor:.3g} for {OFFERED_LOAD:.0%}")


def acme_jobs(data: pathlib.Path, cores_per_gpu: int = 96 // 8) -> list[Job]:
    """The Acme Kalos gangs as the trace has them (arrival, duration, shape), in file order."""
    jobs = []
    with open(data / "acme-kalos" / "converted_kalos_trace.csv") as f:
        for r in csv.DictReader(f):
            gpus = int(float(r["gpu_per_worker"]))
            cpu = min(float(r["cpu_per_gpu_worker"]) * gpus, cores_per_gpu * gpus)
            duration = float(r["num_iteration"]) * (float(r["iteration_computing_time"])
                                                    + float(r["iteration_networking_time"]))
            jobs.append(Job(f"acme-{int(r['job_id']):03d}", float(r["arrival_time"]), duration,
                            int(r["gpu_workers"]), gpus, int(cpu * 1000)))
    return jobs


def acme(data: pathlib.Path, window: Window = ALL) -> Trace:
    cluster = pai_cluster(data)
    return _scaled("acme-kalos", cluster, acme_jobs(data), "Acme Kalos gangs on PAI-2020 8-GPU nodes", window)


def pollux(data: pathlib.Path, workload: int = 1, window: Window = ALL) -> Trace:
    cluster = tiresias_cluster(data, "n32g4")
    node = cluster.nodes[0].allocatable
    cpu = node["cpu"] // node[GPU]
    jobs = []
    with open(data / "pollux" / f"workload-{workload}.csv") as f:
        for r in csv.DictReader(f):
            replicas = int(r["num_replicas"])
            duration = POLLUX_GPU_HOURS[r["application"]] * 3600 / replicas
            jobs.append(Job(f"pollux{workload}-{r['name']}", float(r["time"]), duration, replicas, 1, cpu))
    return _scaled(f"pollux-w{workload}", cluster, jobs,
                   f"Pollux workload-{workload} on the Tiresias n32g4 shape", window)


def tiresias(data: pathlib.Path, window: Window = ALL) -> Trace:
    cluster = tiresias_cluster(data, "cluster_spec")
    node = cluster.nodes[0].allocatable
    cpu = node["cpu"] // node[GPU]
    jobs = []
    with open(data / "tiresias" / "60_job.csv") as f:
        for r in csv.DictReader(f):
            jobs.append(Job(f"tiresias-{int(r['job_id']):02d}", float(r["submit_time"]), float(r["duration"]),
                            int(r["num_gpu"]), 1, cpu))
    return _scaled("tiresias-60", cluster, jobs, "Tiresias 60_job on its cluster_spec shape", window)

