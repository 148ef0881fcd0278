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
  (NSDI '22), CC BY 4.0: the node inventory of a 1,897-machine GPU cluster (its job table is not
  in the data, so there is no PAI workload: Pollux's Philly-derived multi-replica jobs stand in).

What this module derives rather than reads (every result repeats it via :func:`assumptions`):

* **Topology is synthesized.** No trace carries rack labels. Every workload runs on 8-GPU nodes
  (96 cores) in racks. PAI nodes are grouped by GPU model (sorted by machine id) into racks of 32
  nodes, one GPU model per rack, racks into zones of 8; the other clusters are
  :func:`rack_cluster` shapes (racks of ``rack_nodes`` nodes, zones of 2 racks).
* **Acme** runs on PAI's 519 eight-GPU machines. Duration = ``num_iteration *
  (iteration_computing_time + iteration_networking_time)`` as the data README states. CPU per pod
  = ``cpu_per_gpu_worker * gpu_per_worker`` capped at the node's 12 cores per GPU.
* **Pollux** has no duration. Pollux (OSDI '21, section 5) sorts its applications into size
  classes by GPU-hours: small 0-1 (cifar10, ncf), medium 1-10 (bert, deepspeech2), large 10-100
  (yolov3), extra-large 100-1,000 (imagenet). Each application gets its class's geometric middle
  (0.5, 3.16, 31.6, 316 GPU-hours) and a job's duration is that work divided by its
  ``num_replicas`` (perfect scaling): an assumption, not data. ``num_replicas`` pods x 1 GPU on
  2 racks of 8-GPU nodes, sized to the load (below).
* **Tiresias** ``60_job.csv``: ``num_gpu`` pods x 1 GPU, ``duration`` as given, on 2 racks of
  8-GPU nodes sized to the load (its ``cluster_spec`` has 64 GPUs; at its own arrivals the 60 jobs
  keep about a fifth of them busy).
* **Synthetic mix** (:func:`synthetic`): (GPUs, duration) pairs drawn from the Acme and Tiresias
  jobs (both real), arrivals Poisson; a job of G GPUs is G/8 pods of 8 GPUs when G >= 8, else
  pods of 1, 2 or 4 GPUs (drawn) making G; on 4 racks of 16 nodes.
* **The load is the one the cluster feels** (:func:`demand_load`): the GPUs the arrived jobs would
  hold if each started on arrival and ran its duration, averaged over the arrival span (first to
  last arrival), over the cluster's GPUs. A job that outlasts the span counts only inside it, so a
  few jobs of many GPU-days cannot make an idle cluster look loaded. It is reached in one of two
  ways, stated in every table: where the cluster is ours to choose (Pollux, Tiresias, a trace given
  without ``--cluster``: :class:`Sizing`), the cluster is sized — the nodes per rack that leave
  the trace's own arrivals least changed and hold every job — and arrivals are then scaled only by
  what whole nodes leave; where the cluster is given (Acme on PAI's machines, the synthetic mix
  whose arrival clock is ours, ``--cluster``), arrivals are scaled. The factor is found by
  bisection (the load is monotone in it), so the load asked is the load felt; a load no factor
  reaches with a span of at least :data:`MIN_SPAN_S`, or one the rounded arrivals miss by more
  than :data:`LOAD_TOLERANCE`, is refused with the reason. The simulation runs past the last
  arrival until every job finished or :data:`RUN_SPANS` x the span, whichever is first: waits and
  JCTs count every job (censored at that end when it never started or finished); allocation,
  contention and the bound are measured over the arrival span. Runs at 70, 90 and 110%. (The rule
  before was the jobs' whole work over the span: in these traces most of the work sits in a few
  jobs that run far longer than the span, so a cluster "offered 110%" kept every gang starting on
  arrival and every policy tied on an idle cluster. That measure is still reported, as "the jobs'
  work over the span".)
* **Priorities.** The traces carry none. A stated rule: a seeded draw gives
  :data:`HIGH_PRIORITY` to a share of the jobs (:data:`HIGH_SHARE` by default, 10% and 40% in
  the sensitivity run), the rest 0.
* **Duration hints.** Every job declares its trace duration as its expected duration (the
  annotation phalanx reads for backfilling); the sensitivity run declares none.
"""

from __future__ import annotations

import csv
import os
import pathlib
import zlib
from dataclasses import dataclass, replace

import numpy as np

from cluster.names import LABEL_HOSTNAME, LABEL_RACK, LABEL_ZONE
from solver import DisruptionMode, Node, Pod, PodGroup, PodSpec, Policy

from .generate import GPU

DATA_ENV = "PHALANX_TRACE_DATA"
#: ``../shared/data`` beside the checkout.
DEFAULT_DATA = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"
LABEL_GPU_MODEL = "nvidia.com/gpu.product"
LOADS = (0.7, 0.9, 1.1)
#: the load the scaled trace makes its cluster feel may differ from the one asked by this much, no more
LOAD_TOLERANCE = 0.01
#: a scaled arrival span shorter than this is refused: the trace's arrival pattern would be gone
MIN_SPAN_S = 60.0
#: the simulation ends when every job finished, or at this many arrival spans after the first
RUN_SPANS = 3.0
HIGH_PRIORITY = 1000
HIGH_SHARE = 0.2
#: racks of a sized cluster (Pollux, Tiresias and a trace given without --cluster)
RACKS_SIZED = 2
PAI_RACK_NODES = 32
PAI_RACKS_PER_ZONE = 8
NODE_GPUS = 8
NODE_CORES = 96
#: GPU-hours per Pollux application: the geometric middle of its Pollux size class (assumption).
POLLUX_GPU_HOURS = {"cifar10": 0.5, "ncf": 0.5, "bert": 10 ** 0.5, "deepspeech2": 10 ** 0.5,
                    "yolov3": 10 ** 1.5, "imagenet": 10 ** 2.5}


def assumptions(load: float, high_share: float = HIGH_SHARE, hints: bool = True, checkpoint_s: float = 0.0) -> str:
    """The one line every table states."""
    ckpt = f"checkpoint every {checkpoint_s / 60:.0f} min" if checkpoint_s else "no checkpoints (restart from zero)"
    return (f"simulated; racks synthesized (8-GPU nodes); {load:.0%} load felt (the GPUs arrived jobs would hold "
            f"if each started on arrival, averaged over the arrival span), run until every job finished or "
            f"{RUN_SPANS:.0f} spans; "
            f"{high_share:.0%} of jobs high priority by seeded draw (traces have none); "
            f"{'declared duration = trace duration' if hints else 'no duration hints'}; {ckpt}; "
            "Pollux durations assumed per size class")


class LoadRefused(ValueError):
    """The trace cannot be run at the load asked (the message says why)."""


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
    """One gang of the trace: ``pods`` identical pods of ``gpus`` GPUs and ``cpu`` milli-CPU.
    ``hint`` is its declared duration (None: it declares none)."""

    id: str
    arrival: float
    duration: float
    pods: int
    gpus: int
    cpu: int
    priority: int = 0
    hint: float | None = None

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
    horizon: float = 0.0  # simulated seconds: the last arrival (allocation and the bound are measured to here)
    load: float = 0.0  # the load asked (felt, see demand_load)
    measured_load: float = 0.0  # the load the scaled arrivals make the cluster feel (demand_load)
    native_load: float = 0.0  # the same at the trace's own arrivals, on this cluster
    reached: str = ""  # how the load was reached: "cluster sized" or "arrivals scaled"
    work_load: float = 0.0  # the jobs' whole work over span x GPUs (the rule before demand_load)

    @property
    def end(self) -> float:
        """Where the simulation stops at the latest (every job finished earlier ends it)."""
        return self.horizon * RUN_SPANS


def _pods_per_node(node: Node, job: Job) -> int:
    gpu = node.allocatable.get(GPU, 0) // job.gpus
    cpu = node.allocatable.get("cpu", 0) // job.cpu if job.cpu else gpu
    return min(gpu, cpu)


def _node(name: str, gpus: int, cores: int, mem_gb: int, labels: dict[str, str]) -> Node:
    return Node(name, {GPU: gpus, "cpu": cores * 1000, "memory": mem_gb * 2**30, "pods": 110},
                {LABEL_HOSTNAME: name, **labels})


def pai_cluster(data: pathlib.Path, gpus_per_node: int = NODE_GPUS) -> Cluster:
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


def rack_cluster(name: str, racks: int, rack_nodes: int, racks_per_zone: int = 2) -> Cluster:
    """``racks`` x ``rack_nodes`` nodes of 8 GPUs and 96 cores, zones of ``racks_per_zone`` racks."""
    nodes = [_node(f"r{r}-n{i:02d}", NODE_GPUS, NODE_CORES, 768, {
        LABEL_RACK: f"rack-{r}", LABEL_ZONE: f"zone-{r // racks_per_zone}"})
        for r in range(racks) for i in range(rack_nodes)]
    return Cluster(f"{name}-{racks}x{rack_nodes}x{NODE_GPUS}gpu", tuple(nodes))


Window = tuple[int, int | None]
ALL: Window = (0, None)


def offered_load(jobs: list[Job], gpus: int, factor: float = 1.0) -> float:
    """The jobs' whole work over their arrival span x ``gpus`` when arrivals are multiplied by
    ``factor`` (0 when they all arrive at once). The rule before :func:`demand_load`: reported
    beside it, never scaled to."""
    span = (jobs[-1].arrival - jobs[0].arrival) * factor
    return sum(j.gpu_seconds for j in jobs) / (span * gpus) if span > 0 else 0.0


def _demand(jobs: list[Job]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Arrivals from the first (s), durations (s) and GPUs of ``jobs``."""
    arrivals = np.array([j.arrival for j in jobs], dtype=float)
    return (arrivals - arrivals.min(), np.array([j.duration for j in jobs], dtype=float),
            np.array([j.pods * j.gpus for j in jobs], dtype=float))


def demand_load(jobs: list[Job], gpus: int, factor: float = 1.0) -> float:
    """The load the cluster feels: the GPUs the arrived jobs would hold if each started on arrival
    and ran its duration, averaged over the arrival span (first to last arrival, arrivals
    multiplied by ``factor``), over ``gpus`` (0 when they all arrive at once). A job that outlasts
    the span counts only while inside it, so a few very long jobs cannot make an idle cluster
    look loaded. Non-increasing in ``factor``: spreading arrivals never raises it."""
    arrivals, durations, demand = _demand(jobs)
    return _demand_at(arrivals, durations, demand, gpus, factor)


def _demand_at(arrivals: np.ndarray, durations: np.ndarray, demand: np.ndarray, gpus: int, factor: float) -> float:
    span = float(arrivals.max()) * factor
    if span <= 0 or gpus <= 0:
        return 0.0
    inside = np.minimum(durations, span - arrivals * factor)
    return float((demand * inside).sum() / (span * gpus))


def arrival_factor(jobs: list[Job], gpus: int, load: float) -> float | None:
    """The factor on arrivals that makes :func:`demand_load` ``load`` on ``gpus``, with the arrival
    span no shorter than :data:`MIN_SPAN_S`; None when no factor does (the most the jobs make is
    with every arrival squeezed to that span). Bisection on the log of the factor (the load is
    monotone in it), so it cannot collapse to a floor the way a search for a count could."""
    arrivals, durations, demand = _demand(jobs)
    span = float(arrivals.max())
    if span <= 0 or load <= 0:
        return None
    lo = MIN_SPAN_S / span  # the most squeezed arrivals allowed: the highest load
    if _demand_at(arrivals, durations, demand, gpus, lo) < load:
        return None
    hi = max(lo, 1.0)
    while _demand_at(arrivals, durations, demand, gpus, hi) > load:
        hi *= 2.0
    for _ in range(80):
        mid = float(np.sqrt(lo * hi))
        if _demand_at(arrivals, durations, demand, gpus, mid) > load:
            lo = mid
        else:
            hi = mid
    return float(np.sqrt(lo * hi))


@dataclass(frozen=True)
class Sizing:
    """A synthesized cluster sized to the load: ``racks`` racks of between ``min_nodes`` and
    ``max_nodes`` 8-GPU nodes (zones of ``racks_per_zone`` racks). :func:`scaled` takes the
    nodes per rack that leaves the arrivals closest to the trace's own (the factor nearest 1) and
    every job fits."""

    name: str
    racks: int
    min_nodes: int = 1
    max_nodes: int = 64
    racks_per_zone: int = 2

    def cluster(self, rack_nodes: int) -> Cluster:
        return rack_cluster(self.name, self.racks, rack_nodes, self.racks_per_zone)


def holds_every_job(cluster: Cluster, jobs: list[Job]) -> bool:
    """Every job fits the empty cluster whole (in some domain of a level, or across the cluster)."""
    shapes = {(j.pods, j.gpus, j.cpu) for j in jobs}
    return all(sum(_pods_per_node(n, Job("", 0.0, 0.0, pods, gpus, cpu)) for n in cluster.nodes) >= pods
               for pods, gpus, cpu in shapes)


def _sized(name: str, sizing: Sizing, jobs: list[Job], load: float) -> tuple[Cluster, float]:
    """The sized cluster and the arrival factor for ``load`` (:class:`LoadRefused` when no size
    between the bounds holds every job and reaches it)."""
    best: tuple[float, Cluster, float] | None = None
    smallest: Cluster | None = None
    for nodes in range(sizing.min_nodes, sizing.max_nodes + 1):
        cluster = sizing.cluster(nodes)
        if not holds_every_job(cluster, jobs):
            continue
        smallest = smallest or cluster
        factor = arrival_factor(jobs, cluster.gpus, load)
        if factor is None:
            break  # a larger cluster reaches it even less
        distance = abs(float(np.log(factor)))
        if best is None or distance < best[0]:
            best = (distance, cluster, factor)
    if best is None:
        if smallest is None:
            why = f"none of up to {sizing.max_nodes} nodes per rack holds its largest job"
        else:
            most = _most_load(jobs, smallest.gpus)
            why = (f"the smallest that holds every job ({smallest.name}) feels at most {most:.0%} with every "
                   f"arrival squeezed into {MIN_SPAN_S:.0f} s")
        raise LoadRefused(f"{name}: no cluster of {sizing.racks} racks of {sizing.min_nodes}-{sizing.max_nodes} "
                          f"8-GPU nodes feels {load:.0%}: {why}; refused")
    return best[1], best[2]


def _span(jobs: list[Job]) -> float:
    return max(j.arrival for j in jobs) - min(j.arrival for j in jobs)


def _most_load(jobs: list[Job], gpus: int) -> float:
    """The most load the jobs make on ``gpus``: every arrival squeezed into :data:`MIN_SPAN_S`."""
    return demand_load(jobs, gpus, MIN_SPAN_S / _span(jobs))


def scaled(name: str, cluster: Cluster | Sizing, jobs: list[Job], notes: str, window: Window = ALL,
           load: float = 0.9, high_share: float = HIGH_SHARE, hints: bool = True, seed: int = 0) -> Trace:
    """Sort by arrival, keep jobs ``window[0]:window[1]``, draw priorities, declare hints, and make
    the load the cluster feels (:func:`demand_load`) ``load``: on a given cluster by scaling the
    arrivals; on a :class:`Sizing` by sizing the cluster first (arrivals then scaled only by what
    the cluster's whole nodes leave). :class:`LoadRefused` when it cannot be, with the reason."""
    jobs = sorted(jobs, key=lambda j: (j.arrival, j.id))[window[0]:window[1]]
    if window != ALL:
        notes += f"; jobs {window[0]}:{window[1] or len(jobs) + window[0]} in arrival order"
    jobs = [replace(j, priority=HIGH_PRIORITY if _draw(j.id, seed) < high_share else 0,
                    hint=j.duration if hints else None) for j in jobs]
    if load <= 0 or not jobs or _span(jobs) <= 0 or not any(j.gpu_seconds for j in jobs):
        raise LoadRefused(f"{name}: {len(jobs)} jobs arriving at one instant (or with no work) offer no load "
                          f"over an arrival span; no arrival scale makes {load:.0%}")
    if isinstance(cluster, Sizing):
        cluster, factor = _sized(name, cluster, jobs, load)
        how = "cluster sized"
    else:
        found = arrival_factor(jobs, cluster.gpus, load)
        if found is None:
            most = _most_load(jobs, cluster.gpus)
            raise LoadRefused(f"{name}: on {cluster.gpus} GPUs the jobs feel at most {most:.0%} (every arrival "
                              f"squeezed into {MIN_SPAN_S:.0f} s), not {load:.0%}: refused (a smaller cluster feels "
                              "more)")
        factor, how = found, "arrivals scaled"
    native = demand_load(jobs, cluster.gpus)
    first = jobs[0].arrival
    out = tuple(replace(j, arrival=round((j.arrival - first) * factor, 3)) for j in jobs)
    span = out[-1].arrival
    measured = demand_load(list(out), cluster.gpus)
    if span < MIN_SPAN_S - 1e-3:
        raise LoadRefused(f"{name}: {load:.0%} on {cluster.gpus} GPUs needs arrivals x{factor:.3g}, squeezing "
                          f"{len(jobs)} arrivals into {span:.1f} s (under {MIN_SPAN_S:.0f} s): refused")
    if abs(measured - load) > LOAD_TOLERANCE:
        raise LoadRefused(f"{name}: the scaled arrivals make {measured:.1%}, not {load:.0%}: refused")
    reached = (f"{how}: {cluster.name}, arrivals x{factor:.3g}" if how == "cluster sized"
               else f"{how}: x{factor:.3g} on {cluster.name}")
    return Trace(name, cluster, out, factor, f"{notes}; {reached}; at the trace's own arrivals "
                 f"{native:.1%}", horizon=span, load=load, measured_load=measured, native_load=native,
                 reached=how, work_load=offered_load(list(out), cluster.gpus))


def _draw(job_id: str, seed: int) -> float:
    """A stable uniform draw in [0, 1) per job id and seed."""
    return zlib.crc32(f"{seed}:{job_id}".encode()) / 2**32


def acme_jobs(data: pathlib.Path, cores_per_gpu: int = NODE_CORES // NODE_GPUS) -> list[Job]:
    """The Acme Kalos gangs as the trace has them (arrival, duration, shape), in file order."""
    return acme_file(data / "acme-kalos" / "converted_kalos_trace.csv", cores_per_gpu)


def acme_file(path: pathlib.Path, cores_per_gpu: int = NODE_CORES // NODE_GPUS) -> list[Job]:
    jobs = []
    with open(path) as f:
        for r in csv.DictReader(f):
            gpus = int(float(r["gpu_per_worker"]))
            cpu = min(float(r["cpu_per_gpu_worker"]) * gpus, cores_per_gpu * gpus)
            duration = float(r["num_iteration"]) * (float(r["iteration_computing_time"])
                                                    + float(r["iteration_networking_time"]))
            jobs.append(Job(f"acme-{int(r['job_id']):03d}", float(r["arrival_time"]), duration,
                            int(r["gpu_workers"]), gpus, int(cpu * 1000)))
    return jobs


def acme(data: pathlib.Path, window: Window = ALL, **kw) -> Trace:
    cluster = pai_cluster(data)
    return scaled("acme-kalos", cluster, acme_jobs(data), "Acme Kalos gangs on PAI-2020 8-GPU nodes", window, **kw)


def pollux(data: pathlib.Path, workload: int = 1, window: Window = ALL, **kw) -> Trace:
    cluster = Sizing("pollux", RACKS_SIZED)
    jobs = pollux_file(data / "pollux" / f"workload-{workload}.csv", f"pollux{workload}")
    return scaled(f"pollux-w{workload}", cluster, jobs, f"Pollux (Philly) workload-{workload}", window, **kw)


def pollux_file(path: pathlib.Path, prefix: str) -> list[Job]:
    """Pollux's workload columns (time, application, num_replicas, name); durations per application
    as :data:`POLLUX_GPU_HOURS` says."""
    jobs = []
    with open(path) as f:
        for r in csv.DictReader(f):
            replicas = int(r["num_replicas"])
            duration = POLLUX_GPU_HOURS[r["application"]] * 3600 / replicas
            jobs.append(Job(f"{prefix}-{r['name']}", float(r["time"]), duration, replicas, 1,
                            NODE_CORES * 1000 // NODE_GPUS))
    return jobs


def tiresias_jobs(data: pathlib.Path) -> list[Job]:
    return tiresias_file(data / "tiresias" / "60_job.csv")


def tiresias_file(path: pathlib.Path) -> list[Job]:
    jobs = []
    with open(path) as f:
        for r in csv.DictReader(f):
            jobs.append(Job(f"tiresias-{int(r['job_id']):02d}", float(r["submit_time"]), float(r["duration"]),
                            int(r["num_gpu"]), 1, NODE_CORES * 1000 // NODE_GPUS))
    return jobs


#: the shipped formats a trace given by path may be in: the columns that name each
FORMATS = {
    "pollux": {"time", "application", "num_replicas", "name"},
    "tiresias": {"job_id", "num_gpu", "submit_time", "duration"},
    "acme": {"job_id", "gpu_workers", "gpu_per_worker", "cpu_per_gpu_worker", "arrival_time", "num_iteration",
             "iteration_computing_time", "iteration_networking_time"},
}


def trace_file(path: pathlib.Path) -> tuple[str, list[Job]]:
    """A trace in one of the shipped formats (:data:`FORMATS`, told apart by its header): the
    format and the jobs. ValueError names the columns a format needs when none matches."""
    try:
        with open(path) as f:
            header = set(next(csv.reader(f), []))
    except OSError as err:
        raise ValueError(f"{path}: {err.strerror or err}") from None
    for name, columns in FORMATS.items():
        if columns <= header:
            stem = path.stem
            try:
                if name == "pollux":
                    return name, pollux_file(path, stem)
                return name, tiresias_file(path) if name == "tiresias" else acme_file(path)
            except (KeyError, ValueError) as err:
                raise ValueError(f"{path}: a {name}-format row does not read: {err}") from None
    wanted = "; ".join(f"{n}: {', '.join(sorted(c))}" for n, c in FORMATS.items())
    has = ", ".join(sorted(header)) or "nothing"
    raise ValueError(f"{path}: not a trace in a shipped format (its header has {has}); "
                     f"the columns each needs: {wanted}")


def cluster_spec(spec: str) -> Cluster:
    """``RACKSxNODES`` (racks of NODES 8-GPU nodes, zones of 2 racks) or ``pai`` (the PAI-2020
    8-GPU machines)."""
    if spec == "pai":
        return pai_cluster(data_dir())
    racks, sep, nodes = spec.partition("x")
    if sep and racks.isdigit() and nodes.isdigit() and int(racks) > 0 and int(nodes) > 0:
        return rack_cluster("given", int(racks), int(nodes))
    raise ValueError(f"--cluster {spec!r}: give RACKSxNODES (e.g. 2x8: 2 racks of 8 eight-GPU nodes) or pai")


def given(path: pathlib.Path, cluster: Cluster | None, window: Window = ALL, **kw) -> Trace:
    """A trace given by path (``phalanx bench trace --trace FILE [--cluster SPEC]``): on the cluster
    given (arrivals scaled), or on :data:`RACKS_SIZED` racks sized to each load."""
    fmt, jobs = trace_file(path)
    if not jobs:
        raise ValueError(f"{path}: no jobs")
    shape = cluster if cluster is not None else Sizing("given", RACKS_SIZED)
    return scaled(path.stem, shape, jobs, f"{path.name} ({fmt} format)", window, **kw)


def tiresias(data: pathlib.Path, window: Window = ALL, **kw) -> Trace:
    return scaled("tiresias-60", Sizing("tiresias", RACKS_SIZED), tiresias_jobs(data), "Tiresias 60_job", window,
                  **kw)


def synthetic(data: pathlib.Path, jobs: int = 400, seed: int = 0, **kw) -> Trace:
    """A gang-heavy mix: (GPUs, duration) pairs drawn from the Acme and Tiresias jobs, Poisson
    arrivals, 8-GPU pods for gangs of 8 GPUs and more, else pods of 1, 2 or 4 GPUs."""
    rng = np.random.default_rng(seed)
    pool = [(j.pods * j.gpus, j.duration) for j in acme_jobs(data) + tiresias_jobs(data) if j.duration > 0]
    cluster = rack_cluster("synthetic", 4, 16)
    cap = cluster.gpus // 2  # no gang larger than a zone
    out, t = [], 0.0
    for i in range(jobs):
        gpus, duration = pool[int(rng.integers(len(pool)))]
        gpus = min(gpus, cap)
        if gpus >= NODE_GPUS:
            pods, per = gpus // NODE_GPUS, NODE_GPUS
        else:
            per = int(rng.choice([p for p in (1, 2, 4) if p <= gpus and gpus % p == 0]))
            pods = gpus // per
        t += float(rng.exponential(1.0))
        out.append(Job(f"mix-{i:03d}", t, duration, pods, per, per * NODE_CORES * 1000 // NODE_GPUS))
    return scaled("synthetic-mix", cluster, out, f"synthetic mix of Acme and Tiresias (GPUs, duration), seed {seed}",
                  **kw)
