"""Node-loss shots for the fault driver (``faults.py``): a node goes away under a running gang.

``NodeLossRun`` is ``FaultRun`` plus two kinds; every other kind is ``FaultRun``'s own:

- ``node-deleted``: the Node object of one of the victim gang's nodes is deleted;
- ``node-notready``: KWOK takes that node NotReady; the node lifecycle controller taints it and
  the taint eviction controller evicts the member (the gang's pods tolerate the taints for 1 s).

The victim is a running ``disruptionMode: all`` gang (4 or 16 pods, some with a rack
constraint). Other units with a pod on the chosen node are deleted by the test first, so only
the victim is hit. After the loss the driver checks that the whole gang went within
``EVICT_BOUND`` s, then plays its owner controller: it creates the gang's pods again (new names,
same PodGroup) and checks that they all bind within ``REPLACE_BOUND`` s; then the node comes
back (re-created, or Ready again) so the next shots have the same room. The at-rest invariants
are ``FaultRun``'s; the first generation of the victim (lost by design) is not counted as
``lost_pod`` or ``disruption_target``. Two more violations:

- ``not_evicted_whole``: a first-generation member still live and bound ``EVICT_BOUND`` s after
  the loss;
- ``not_replaced``: the new generation not all bound ``REPLACE_BOUND`` s after it was created
  while it fit the free CPUs (in one rack for a rack gang) of the schedulable nodes then; when it
  did not fit (the lost node took room with it and the rest is spread over the racks), not all
  bound ``REPLACE_BOUND`` s after the node came back.
"""

from __future__ import annotations

import time

from cluster.quantity import parse_quantity

from .faults import RACK, UNIT_LABEL, FaultRun, Unit, retry
from .nodes import create_node, delete_node, set_not_ready
from .objects import SCHEDULING_API, pod, podgroup

NODE_KINDS = ("node-deleted", "node-notready")
EVICT_BOUND = 30.0
REPLACE_BOUND = 60.0
TOLERATE_1S = [{"key": f"node.kubernetes.io/{taint}", "operator": "Exists", "effect": "NoExecute",
                "tolerationSeconds": 1} for taint in ("not-ready", "unreachable")]


class NodeLossRun(FaultRun):
    """``FaultRun`` with the node-loss kinds (see the module docstring)."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.lost_generation: set[str] = set()  # pod names of victims' first generations

    def shot(self, index: int, kind: str) -> dict:
        if kind not in NODE_KINDS:
            return super().shot(index, kind)
        rng = self.rng
        size = rng.choice((4, 16))
        rack = rng.random() < 0.5
        self.make_room(2 * size + self.cfg.cpu_per_node, exact=True)
        name = self._name(f"n{size}{'r' if rack else ''}")
        unit = Unit(name, "gang", size, size, size, rack, time.monotonic())
        self.units[name] = unit
        retry(lambda: self.rest.create(f"/apis/{SCHEDULING_API}/namespaces/{self.ns}/podgroups", podgroup(
            name, min_count=size, topology_key=RACK if rack else None, disruption_mode="all")))
        first = [f"{name}-{i}" for i in range(size)]
        self.post_pods([(name, self._tolerant_pod(p, name)) for p in first])
        reached = self.wait_phase(unit, "bound", size)
        with self.changed:
            where = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in self.members(name)}
        bound_at_loss = sum(1 for n in where.values() if n)
        row = {"i": index, "kind": kind, "victim": name, "size": size, "min_count": size, "rack": rack,
               "companions": 0, "plain": 0, "wanted": "bound", "k": None, "reached": reached,
               "phase": "bound" if bound_at_loss == size else "binding", "bound_at_kill": bound_at_loss,
               "downtime_s": 0.0, "evicted_s": None, "replaced_s": None}
        self.lost_generation.update(first)
        if not bound_at_loss:  # never placed (no room): nothing to lose; the invariants still hold
            return {**row, "recovery_s": 0.0}
        node = rng.choice(sorted(n for n in where.values() if n))
        self._clear_others_on(node, name)
        node_rack = (retry(lambda: self.rest.get(f"/api/v1/nodes/{node}"))["metadata"].get("labels") or {}).get(RACK)
        lost_at = time.monotonic()
        if kind == "node-deleted":
            retry(lambda: delete_node(self.rest, node))
        else:
            retry(lambda: set_not_ready(self.rest, node))
        row["evicted_s"] = self._wait(lambda: not self._live_bound(first), EVICT_BOUND, lost_at)
        again = [f"{name}-g2-{i}" for i in range(size)]
        created = time.monotonic()
        self.post_pods([(name, self._tolerant_pod(p, name)) for p in again])
        row["replaced_s"] = self._wait(lambda: len(self._live_bound(again)) == size, REPLACE_BOUND, created)
        row["loss"] = {"node": node, "first_left_bound": sorted(self._live_bound(first)),
                       "second_bound": len(self._live_bound(again))}
        if row["replaced_s"] is None:  # did it fit? (and what phalanx said on the PodGroup)
            room = self.free_cpu_by_rack()
            row["loss"].update(free_cpu_by_rack=room, fit=max(room.values(), default=0) >= size if rack
                               else sum(room.values()) >= size, condition=self.scheduled_condition(name))
        if kind == "node-deleted":  # the node comes back (its stuck pods then finish terminating)
            retry(lambda: create_node(self.rest, node, cpu=self.cfg.cpu_per_node, rack=node_rack))
        else:
            retry(lambda: set_not_ready(self.rest, node, False))
        if row["replaced_s"] is None and not row["loss"]["fit"]:  # room comes back with the node
            row["replaced_after_node_back_s"] = self._wait(lambda: len(self._live_bound(again)) == size,
                                                           REPLACE_BOUND, time.monotonic())
        return {**row, "recovery_s": round(time.monotonic() - lost_at, 2)}

    def free_cpu_by_rack(self) -> dict[str, int]:
        """Free CPUs per rack on the nodes a pod may be scheduled to (not cordoned, no NoSchedule or
        NoExecute taint), requests of the pods bound there subtracted (terminating ones included:
        they hold their room until they are gone)."""
        nodes = retry(lambda: self.rest.list_items("/api/v1/nodes"))
        pods = retry(lambda: self.rest.list_items("/api/v1/pods"))
        used: dict[str, int] = {}  # milli-CPUs
        for p in pods:
            where = p["spec"].get("nodeName")
            if where and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                used[where] = used.get(where, 0) + sum(
                    parse_quantity(((c.get("resources") or {}).get("requests") or {}).get("cpu", "0"), "cpu")
                    for c in p["spec"].get("containers") or [])
        room: dict[str, int] = {}
        for n in nodes:
            if n["spec"].get("unschedulable") or any(t.get("effect") in ("NoSchedule", "NoExecute")
                                                     for t in n["spec"].get("taints") or []):
                continue
            name, rack_of = n["metadata"]["name"], (n["metadata"].get("labels") or {}).get(RACK, "")
            free = parse_quantity((n.get("status") or {}).get("allocatable", {}).get("cpu", "0"), "cpu") - used.get(name, 0)
            room[rack_of] = room.get(rack_of, 0) + max(0, free) // 1000
        return room

    def scheduled_condition(self, group: str) -> str:
        """The PodGroup's scheduling condition as phalanx wrote it (reason: message), or ""."""
        try:
            obj = self.rest.get(f"/apis/{SCHEDULING_API}/namespaces/{self.ns}/podgroups/{group}")
        except Exception:  # noqa: BLE001 - evidence only
            return ""
        return "; ".join(f"{c.get('type')}={c.get('status')} {c.get('reason', '')}: {c.get('message', '')}"
                         for c in (obj.get("status") or {}).get("conditions") or [])[:600]

    def check(self, pods: list[dict], groups: list[dict], shot: dict) -> list[dict]:
        violations = [v for v in super().check(pods, groups, shot)
                      if not (v["type"] in ("lost_pod", "disruption_target") and v.get("pod") in self.lost_generation)]
        if shot["kind"] in NODE_KINDS and shot.get("bound_at_kill"):
            if shot["evicted_s"] is None:
                violations.append({"type": "not_evicted_whole", "group": shot["victim"], **shot["loss"]})
            if shot["replaced_s"] is None and (shot["loss"].get("fit", True)
                                               or shot.get("replaced_after_node_back_s") is None):
                violations.append({"type": "not_replaced", "group": shot["victim"], **shot["loss"]})
        return violations

    # -- helpers ------------------------------------------------------------------------------
    def _tolerant_pod(self, name: str, unit: str) -> dict:
        return pod(name, podgroup_name=unit, labels={UNIT_LABEL: unit}, scheduler_name=self.scheduler_name,
                   tolerations=TOLERATE_1S)

    def _live_bound(self, names: list[str]) -> list[str]:
        with self.changed:
            objects = dict(self.pods.objects)
        return [n for n in names if n in objects and objects[n]["spec"].get("nodeName")
                and not objects[n]["metadata"].get("deletionTimestamp")]

    def _clear_others_on(self, node: str, victim: str) -> None:
        """Delete the units (other than ``victim``) with a pod on ``node``: only the victim is hit."""
        with self.changed:
            others = {(p["metadata"].get("labels") or {}).get(UNIT_LABEL) for p in self.pods.objects.values()
                      if p["spec"].get("nodeName") == node}
        for unit in [u for u in self.units.values() if u.name in others and u.name != victim and not u.deleted]:
            self.delete_unit(unit)

    @staticmethod
    def _wait(done, bound: float, since: float) -> float | None:  # type: ignore[no-untyped-def]
        """Seconds from ``since`` until ``done()``; None when ``bound`` s passed first."""
        while time.monotonic() - since < bound:
            if done():
                return round(time.monotonic() - since, 2)
            time.sleep(0.2)
        return None
