"""The dashboard's routes: the page at ``/``, its static assets, and the JSON API beside it.

- ``GET /`` — the single-page dashboard (topology, PodGroups, solver and extender, a group's page);
- ``GET /api/v1/topology`` — zones -> racks -> nodes (aggregated per rack above the detail limit);
- ``GET /api/v1/topology/<zone>/<rack>`` — one rack's nodes, always in detail (the drill-down);
- ``GET /api/v1/podgroups`` and ``/api/v1/podgroups/<ns>/<name>`` — the table and a group's page;
- ``GET /api/v1/plans?namespace=NS`` — the plans the cycle holds, pod by pod (``kubectl phalanx plans``);
- ``GET /api/v1/metrics`` — placement latency, solver paths and gaps, barrier, preemption, verbs;
- ``GET /api/v1/events?since=SEQ`` — the cycle's events after SEQ (the page polls it: live updates
  without a connection held open per browser tab);
- ``POST /api/v1/whatif`` (also ``/phalanx/api/whatif``, the path ``kubectl phalanx`` posts to) —
  where a manifest's PodGroups would go: body ``{"objects": [...], "namespace": "..."}``, reply
  ``{"groups": [...]}`` (:mod:`extender.dashboard.whatif`); it plans, but holds and writes nothing.

Read-only, and off the extender's hot path: see :mod:`extender.dashboard.views`.
"""

from __future__ import annotations

import pathlib

from flask import Blueprint, Response, jsonify, request, send_from_directory

from cluster.whatif import Compile
from cycle import WorkloadCycle

from . import views, whatif
from .history import GROUP_CAPACITY, GroupHistory

STATIC = pathlib.Path(__file__).parent / "static"


def dashboard_blueprint(cycle: WorkloadCycle, detail_limit: int = views.DETAIL_LIMIT,
                        compile_manifest: Compile | None = None, history_groups: int = GROUP_CAPACITY) -> Blueprint:
    """The dashboard for ``cycle``; subscribes its history (``history_groups`` groups at most) to
    the cycle's and the cache's events. ``compile_manifest`` serves what-if (the controller's
    compiler, handed in by the command that composes serve; None: what-if answers 501)."""
    cache = cycle.cache
    history = GroupHistory(plan_of=cycle.plans.get,
                           group_of_pod=lambda uid: getattr(getattr(cache.pods.get(uid), "pod", None), "group", ""),
                           capacity=history_groups)
    cycle.subscribe(history.on_cycle_event)
    cache.subscribe(history.on_cache_event)
    bp = Blueprint("dashboard", __name__, static_folder=str(STATIC), static_url_path="/dashboard/static")
    bp.history = history  # type: ignore[attr-defined]  # for the demo's summary and the tests

    def not_found(what: str) -> Response:
        response = jsonify({"error": f"{what} not found"})
        response.status_code = 404
        return response

    @bp.get("/")
    def index() -> Response:
        return send_from_directory(STATIC, "index.html")

    @bp.get("/api/v1/topology")
    def topology() -> Response:
        return jsonify(views.topology(cache, cycle, detail_limit))

    @bp.get("/api/v1/topology/<zone>/<rack>")
    def rack(zone: str, rack: str) -> Response:
        view = views.rack(cache, cycle, zone, rack)
        return jsonify(view) if view else not_found(f"rack {zone}/{rack}")

    @bp.get("/api/v1/podgroups")
    def podgroups() -> Response:
        return jsonify(views.podgroups(cache, cycle, history))

    @bp.get("/api/v1/podgroups/<namespace>/<name>")
    def podgroup(namespace: str, name: str) -> Response:
        view = views.podgroup(cache, cycle, history, f"{namespace}/{name}")
        return jsonify(view) if view else not_found(f"podgroup {namespace}/{name}")

    @bp.get("/api/v1/plans")
    def plans() -> Response:
        return jsonify(views.plans(cache, cycle, request.args.get("namespace", "")))

    @bp.get("/api/v1/metrics")
    def metrics() -> Response:
        return jsonify(views.metrics(cycle.metrics.registry, history))

    @bp.get("/api/v1/events")
    def events() -> Response:
        since = request.args.get("since", "0")
        if not since.lstrip("-").isdigit():
            return Response("phalanx: since must be an integer\n", status=400, mimetype="text/plain")
        return jsonify({"seq": history.seq, "events": history.since(int(since))})

    @bp.post("/api/v1/whatif")
    @bp.post("/phalanx/api/whatif")
    def what_if() -> Response:
        status, body = whatif.answer(cycle, compile_manifest, request.get_data(cache=False))
        response = jsonify(body)
        response.status_code = status
        return response

    return bp
