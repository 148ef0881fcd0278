// phalanx dashboard: plain JavaScript, no libraries. Polls the JSON API beside the page
// (/api/v1/...) every POLL_MS and redraws; the event feed is read incrementally (?since=SEQ).
"use strict";

const POLL_MS = 1500;
const state = { seq: 0, events: [], rack: null, filter: "", groups: [], topology: null, polls: 0, busy: false,
  whatif: null };  // whatif: {nodes: node -> [[group, pods], ...], domains: Set} of the last what-if answer

// -- helpers -------------------------------------------------------------------------------
const $ = (id) => document.getElementById(id);
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
const fmt = (x) => (Number.isInteger(x) ? String(x) : (Math.round(x * 10) / 10).toString());
const unit = (r) => (r === "cpu" ? "cores" : r.split("/").pop().toUpperCase() + "s");
const plural = (n, word) => `${fmt(n)} ${word}${n === 1 ? "" : "s"}`;
// node-2 before node-10: names compared number by number
const natural = (a, b) => String(a).localeCompare(String(b), undefined, { numeric: true });
// a request as an operator reads it: bytes in Ki/Mi/Gi/Ti, cores, devices
function quantity(resource, value) {
  if (resource === "memory" || resource === "ephemeral-storage" || resource.startsWith("hugepages-")) {
    const units = ["", "Ki", "Mi", "Gi", "Ti", "Pi"];
    let i = 0;
    while (value >= 1024 && i < units.length - 1 && value % 1024 === 0) { value /= 1024; i++; }
    while (value >= 1024 * 10 && i < units.length - 1) { value /= 1024; i++; }
    return `${fmt(value)}${units[i]}`;
  }
  return fmt(value);
}

function colour(group) {
  if (!group) return "var(--other)";
  let h = 2166136261;
  for (let i = 0; i < group.length; i++) { h ^= group.charCodeAt(i); h = Math.imul(h, 16777619); }
  return `hsl(${(h >>> 0) % 360}, 62%, ${45 + ((h >>> 9) % 3) * 7}%)`;
}

// A left-to-right (or bottom-to-top) fill of the groups using a node or rack, then reserved, then free.
function fill(item, direction) {
  const total = item.total || 1;
  let at = 0;
  const stops = [];
  for (const [g, amount] of item.groups) {
    const to = at + (amount / total) * 100;
    stops.push(`${colour(g)} ${at}% ${to}%`);
    at = to;
  }
  if (item.reserved) {
    const to = Math.min(100, at + (item.reserved / total) * 100);
    stops.push(`var(--reserved) ${at}% ${to}%`);
    at = to;
  }
  stops.push(`var(--free) ${at}% 100%`);
  return `linear-gradient(${direction}, ${stops.join(", ")})`;
}

async function get(path) {
  const res = await fetch(path, { cache: "no-store" });
  if (!res.ok) throw new Error(`${path}: HTTP ${res.status}`);
  return res.json();
}

const ago = (s) => (s == null ? "—" : s < 60 ? `${fmt(s)} s` : s < 3600 ? `${fmt(s / 60)} min` : `${fmt(s / 3600)} h`);
const clock = (t) => new Date(t * 1000).toLocaleTimeString();
const stateClass = (s) => "state state-" + s.replace(/ /g, "-");

// -- topology ------------------------------------------------------------------------------
function renderTopology(topo) {
  const parts = [];
  for (const zone of topo.zones) {
    parts.push(`<div class="zone"><div class="zone-title">zone ${esc(zone.name)}</div><div class="racks">`);
    for (const rack of zone.racks) {
      const id = `${zone.name}/${rack.name}`;
      const cells = rack.nodes
        ? `<div class="cells">${rack.nodes.map((n) => `<div class="cell${wouldTake(n.name) ? " whatif" : ""}" title="${esc(n.name)}: ${fmt(n.used)}/${fmt(n.total)} ${esc(unit(n.resource))}" style="background:${fill(n, "to top")}"></div>`).join("")}</div>`
        : `<div class="bar" style="background:${fill(rack, "to right")}"></div>`;
      const would = state.whatif && (state.whatif.domains.has(rack.name) || (rack.nodes || []).some((n) => wouldTake(n.name)));
      parts.push(`<div class="rack${state.rack === id ? " selected" : ""}${would ? " whatif" : ""}" data-rack="${esc(id)}">
        <div class="rack-name"><b>${esc(rack.name)}</b>${rack.held_by ? ` <span class="state state-holding" title="held for ${esc(rack.held_by)}: smaller groups stay out unless they finish first">held</span>` : ""}<span>${fmt(rack.used)}/${fmt(rack.total)} ${esc(unit(rack.resource))}</span></div>
        ${cells}</div>`);
    }
    parts.push("</div></div>");
  }
  const mode = topo.aggregated ? `${topo.nodes} nodes, aggregated per rack (over ${topo.detail_limit})` : `${topo.nodes} nodes`;
  parts.push(`<div class="legend"><span>${esc(mode)}</span>
    <span><i class="swatch" style="background:var(--reserved)"></i>reserved by a plan</span>
    <span><i class="swatch" style="background:var(--other)"></i>pods without a group</span>
    <span><i class="swatch" style="background:var(--free)"></i>free</span>
    <span>colours: one per PodGroup</span></div>`);
  $("topology").innerHTML = parts.join("");
}

async function renderRack() {
  const box = $("rack-detail");
  if (!state.rack || !state.topology) { box.hidden = true; return; }
  const [zone, name] = state.rack.split("/");
  let rack = state.topology.zones.flatMap((z) => z.racks).find((r) => r.zone === zone && r.name === name && r.nodes);
  if (!rack) {
    try { rack = await get(`/api/v1/topology/${encodeURIComponent(zone)}/${encodeURIComponent(name)}`); }
    catch (err) { box.hidden = false; box.textContent = String(err); return; }
  }
  box.hidden = false;
  box.innerHTML = `<h3>rack ${esc(rack.name)} <span class="hint">zone ${esc(rack.zone)} · ${rack.node_count} nodes ·
      ${fmt(rack.used)}/${fmt(rack.total)} ${esc(unit(rack.resource))} used · ${plural(rack.pods, "pod")}</span></h3>
    <div class="nodes">${rack.nodes.map((n) => `<div class="node${wouldTake(n.name) ? " whatif" : ""}" data-node="${esc(n.name)}">
      <div class="node-name" title="${esc(n.name)}">${esc(n.name)}</div>
      <div class="node-use">${fmt(n.used)}/${fmt(n.total)} ${esc(unit(n.resource))} · ${plural(n.pods, "pod")}${n.reserved ? ` · ${fmt(n.reserved)} reserved` : ""}</div>
      <div class="bar" style="background:${fill(n, "to right")}"></div>
      <div class="node-groups">${n.groups.map(([g, a]) => `<div><i class="swatch" style="background:${colour(g)}"></i>${g ? `<a href="#/group/${esc(g)}">${esc(g)}</a>` : "no group"} ${fmt(a)}</div>`).join("")}
        ${(wouldTake(n.name) || []).map(([g, pods]) => `<div class="would">what-if: ${esc(g)} × ${plural(pods, "pod")}</div>`).join("")}</div>
    </div>`).join("")}</div>`;
}

// -- what-if -------------------------------------------------------------------------------
const wouldTake = (node) => (state.whatif ? state.whatif.nodes.get(node) : undefined);

function renderWhatIf(groups) {
  const nodes = new Map();
  const domains = new Set();
  for (const g of groups) {
    const key = `${g.namespace}/${g.name}`;
    if (g.domain) domains.add(g.domain);
    const per = {};
    for (const node of Object.values(g.nodes)) per[node] = (per[node] || 0) + 1;
    for (const [node, pods] of Object.entries(per)) nodes.set(node, [...(nodes.get(node) || []), [key, pods]]);
  }
  state.whatif = { nodes, domains };
  $("whatif-result").innerHTML = `<table id="whatif-groups"><thead><tr><th>podgroup</th><th>from</th><th>answer</th>
      <th>domain</th><th>pods → nodes</th><th>solver</th><th>why / victims</th></tr></thead><tbody>${groups.map((g) => `<tr>
      <td>${esc(g.namespace)}/${esc(g.name)}</td><td>${esc(g.source)}</td>
      <td><span class="verdict-${esc(g.verdict)}">${esc(g.verdict)}</span></td><td>${esc(g.domain || "—")}</td>
      <td>${Object.keys(g.nodes).length ? esc(Object.entries(g.nodes).map(([p, n]) => `${p}→${n}`).join(", ")) : "—"}</td>
      <td>${g.path ? esc(g.path) + (g.optimal ? ", optimal" : g.gap == null ? "" : `, gap ${fmt(g.gap * 100)}%`) : "—"}</td>
      <td>${g.victims.length ? `evicts ${g.victims.map((v) => `${esc(v.pod)} (priority ${v.priority})`).join(", ")}<br>` : ""}${esc(g.explanation)}${g.advice ? `<br>advice: ${esc(g.advice)}` : ""}</td>
    </tr>`).join("")}</tbody></table>`;
}

async function runWhatIf() {
  const text = $("whatif-manifest").value;
  $("whatif-status").textContent = "planning…";
  try {
    const res = await fetch("/api/v1/whatif", { method: "POST", headers: { "Content-Type": "application/json" },
                                                body: JSON.stringify({ manifest: text }) });
    const body = await res.json();
    if (res.ok) {
      renderWhatIf(body.groups);
      $("whatif-status").textContent = `${body.groups.length} group(s) planned on the cluster as it is now`;
    } else {
      state.whatif = null;
      $("whatif-result").innerHTML = `<div class="explanation" id="whatif-errors"><div>${esc(body.error)}</div>
        <ul>${(body.errors || []).map((e) => `<li><b>${esc(e.object)}</b>: ${e.messages.map(esc).join("<br>")}</li>`).join("")}</ul></div>`;
      $("whatif-status").textContent = `HTTP ${res.status}`;
    }
  } catch (err) {
    $("whatif-status").textContent = String(err);
  }
  if (state.topology) { renderTopology(state.topology); renderRack(); }
}

// -- podgroups -----------------------------------------------------------------------------
const WAITS = {
  room: ' <span class="muted" title="it fits the empty cluster: it waits for room to free up">waiting for room</span>',
  never: ' <span class="never" title="not even the empty cluster holds it: it never fits as asked">can never fit</span>',
};
function renderGroups(data) {
  state.groups = data.podgroups.slice().sort((a, b) => natural(a.key, b.key));
  const states = Object.entries(data.states).sort();
  $("group-states").textContent = `${data.podgroups.length} groups · ` + states.map(([s, n]) => `${n} ${s}`).join(" · ");
  $("state-filters").innerHTML = [["", data.podgroups.length], ...states]
    .map(([s, n]) => `<button data-state="${esc(s)}" class="${state.filter === s ? "on" : ""}">${esc(s || "all")} ${n}</button>`).join("");
  const rows = state.groups.filter((g) => !state.filter || g.state === state.filter);
  $("groups").querySelector("tbody").innerHTML = rows.map((g) => `<tr class="clickable" data-group="${esc(g.key)}">
      <td><a href="#/group/${esc(g.key)}">${esc(g.key)}</a></td>
      <td>${esc(g.owner.kind || "none")}${g.owner.name ? ` <span class="muted">${esc(g.owner.name)}</span>` : ""}${g.owner.level ? ` <span class="muted">· ${esc(g.owner.level)}</span>` : ""}</td>
      <td>${esc(g.policy)}${g.policy === "gang" ? ` ≥${g.min_count}` : ""}${g.disruption_mode === "all" ? " · all" : ""}</td>
      <td>${g.bound}/${g.members}</td>
      <td>${esc((g.topology_key || "").split("/").pop() || "—")}</td>
      <td>${esc(g.domain || "—")}</td>
      <td><span class="${stateClass(g.state)}">${esc(g.state)}</span>${WAITS[g.waits_for] || ""}${g.preempted_by ? ` <span class="muted" title="preempted by ${esc(g.preempted_by)}">⚠ preempted</span>` : ""}${g.held_domain ? ` <span class="state state-holding" title="starving: smaller groups stay out of this domain unless they finish first">holds ${esc(g.held_domain)}</span>` : ""}</td>
      <td>${ago(g.age_s)}</td><td>${g.time_to_place_s == null ? "—" : ago(g.time_to_place_s)}</td></tr>`).join("");
  const count = (s) => data.states[s] || 0;
  const waiting = (w) => data.podgroups.filter((g) => g.waits_for === w).length;
  const gpu = state.topology && state.topology.totals["nvidia.com/gpu"];
  $("summary").innerHTML = `<span><b>${state.topology ? state.topology.nodes : "…"}</b> nodes</span>` +
    (gpu ? `<span><b>${fmt(gpu.used)}</b>/${fmt(gpu.total)} GPUs used</span>` : "") +
    `<span><b>${count("scheduled")}</b> scheduled</span>` +
    `<span id="waiting-for-room" title="unschedulable now, but they fit the empty cluster: they wait for room to free up"><b>${waiting("room")}</b> waiting for room</span>` +
    `<span id="never-fit" title="unschedulable even on the empty cluster: more than any domain holds; they never fit as asked"><b>${waiting("never")}</b> can never fit</span>` +
    `<span><b>${count("preempting")}</b> preempting</span><span><b>${count("waiting for members")}</b> waiting</span>`;
}

// -- solver and extender -------------------------------------------------------------------
function histogram(h) {
  const buckets = h.buckets.filter((b) => Number.isFinite(b.le) || b.count);
  const max = Math.max(1, ...buckets.map((b) => b.count));
  const w = 100 / Math.max(1, buckets.length);
  const step = Math.max(1, Math.ceil(buckets.length / 6));
  const bars = buckets.map((b, i) => {
    const height = (b.count / max) * 80;
    const label = Number.isFinite(b.le) ? (b.le < 1 ? `${fmt(b.le * 1000)} ms` : `${fmt(b.le)} s`) : "+∞";
    // one label in every `step`, so they never run together (each bar keeps its tooltip)
    const shown = i % step === 0 || i === buckets.length - 1;
    return `<rect x="${i * w + 0.5}%" y="${88 - height}" width="${w - 1}%" height="${height}"><title>≤ ${label}: ${b.count}</title></rect>
      ${shown ? `<text x="${i * w + w / 2}%" y="104" text-anchor="middle">${label}</text>` : ""}
      ${b.count ? `<text x="${i * w + w / 2}%" y="${86 - height}" text-anchor="middle">${b.count}</text>` : ""}`;
  });
  return `<svg class="hist" role="img" aria-label="placement latency histogram">${bars.join("")}</svg>`;
}

const kv = (pairs) => `<dl class="kv">${pairs.map(([k, v]) => `<dt>${esc(k)}</dt><dd>${v}</dd>`).join("")}</dl>`;
const counts = (o) => Object.entries(o).map(([k, v]) => `${esc(k || "—")} ${fmt(v)}`).join(" · ") || "0";

function renderMetrics(m) {
  const s = m.solver;
  const lat = m.attempt_latency;
  $("metrics").innerHTML = `
    <h3>Placement latency <span class="hint">${fmt(lat.count)} cycles, mean ${lat.count ? fmt((lat.sum / lat.count) * 1000) : 0} ms</span></h3>
    ${histogram(lat)}
    ${kv([
      ["attempts", counts(m.attempts)],
      ["solver path", counts(s.paths)],
      ["exact plans", `${s.exact_plans} (${s.proven_optimal} proven optimal)`],
      ["certified gaps", s.open_gaps.length ? s.open_gaps.slice(0, 4).map((g) => `${esc(g.group)} ${fmt(g.gap * 100)}%`).join(", ") : "none open"],
      ["barrier", counts(m.barrier) + ` · waiting now ${fmt(m.barrier_waiting)}`],
      ["plans held", fmt(m.plans_held)],
      ["plans released", counts(m.plans_released)],
      ["preemptions", counts(m.preemption_attempts) + ` · ${fmt(m.preemption_victims)} victims`],
      ["extender requests", counts(m.requests)],
      ["request errors", fmt(m.request_errors)],
    ])}`;
}

// -- events --------------------------------------------------------------------------------
const eventLine = (e, withGroup) => `<li><span class="t">${clock(e.time)}</span><span class="k k-${esc(e.kind)}">${esc(e.kind)}</span>
  ${withGroup ? `<a href="#/group/${esc(e.group)}">${esc(e.group)}</a> ` : ""}${esc(e.text)}${e.repeats > 1 ? ` <span class="muted repeats">(×${e.repeats}, last ${clock(e.time)})</span>` : ""}</li>`;

function renderEvents(batch) {
  state.seq = batch.seq;
  $("event-seq").textContent = String(batch.seq);
  state.events = batch.events.reverse().concat(state.events).slice(0, 200);
  $("events").innerHTML = state.events.map((e) => eventLine(e, true)).join("");
}

// -- a group's page ------------------------------------------------------------------------
async function renderGroupPage(key) {
  let g;
  try { g = await get(`/api/v1/podgroups/${key}`); }
  catch (err) { $("group-title").textContent = `podgroup ${key} not found`; $("group-facts").innerHTML = ""; return; }
  $("group-title").innerHTML = `podgroup ${esc(g.key)} <span class="${stateClass(g.state)}">${esc(g.state)}</span>${WAITS[g.waits_for] || ""}`;
  $("group-facts").innerHTML = [
    ["owner", `${g.owner.kind || "none"} ${g.owner.name}${g.owner.level ? ` (${g.owner.level})` : ""}`], ["policy", g.policy === "gang" ? `gang, minCount ${g.min_count}` : "basic"],
    ["priority", g.priority], ["disruption", g.disruption_mode], ["members", `${g.bound} bound of ${g.members}`],
    ["topology", g.topology_key || "none"], ["domain", g.domain || "—"], ["age", ago(g.age_s)],
    ["time to place", g.time_to_place_s == null ? "—" : ago(g.time_to_place_s)],
    ["holds", g.held_domain || "—"],
    ["expected duration", g.expected_duration_s == null ? "not declared" : ago(g.expected_duration_s)],
  ].map(([k, v]) => `<div><span>${esc(k)}</span>${esc(v)}</div>`).join("");
  const c = g.composite || {};
  const siblings = (c.groups || []).filter((other) => other !== g.key)
    .map((other) => `<a href="#/group/${esc(other)}">${esc(other)}</a>`).join(", ");
  $("group-composite").innerHTML = !c.key ? ""
    : c.why ? `<p>child of compositepodgroup <b>${esc(c.key)}</b>, not ready: ${esc(c.why)}</p>`
    : `<p>child of compositepodgroup <b>${esc(c.key)}</b>${siblings ? `, planned as one with ${siblings}` : ""}${c.how ? ` (${esc(c.how)})` : ""}</p>`;
  $("group-explanation").innerHTML = g.explanation
    ? `<div class="explanation" id="explanation-text"><div>${esc(g.explanation)}</div>
        <ol>${g.shortfalls.map((s, i) => `<li class="${i === 0 ? "near" : ""}">${esc(s)}${i === 0 ? " <span class='muted'>(nearest miss)</span>" : ""}</li>`).join("")}</ol>
        ${g.smallest_change.length ? `<div id="smallest-change"><b>smallest change that makes it fit</b>
        <ul>${g.smallest_change.map((c) => `<li>${esc(c)}</li>`).join("")}</ul></div>` : ""}</div>`
    : `<div class="ok">${g.state === "scheduled" ? "placed whole" : "no reason recorded: " + esc(g.state)}</div>`;
  const p = g.placement;
  $("group-placement").innerHTML = p
    ? kv([["domain", esc(p.domain || "the whole cluster")], ["solver", `${esc(p.path)} in ${fmt(p.ms)} ms`],
          ["optimality", p.optimal ? "proven optimal (CP-SAT)" : p.gap == null ? "greedy (no bound)" : `certified gap ${fmt(p.gap * 100)}%`],
          ["pods → nodes", `${p.pods} pods on ${p.nodes.length} nodes: ${esc(p.nodes.slice(0, 12).join(", "))}${p.nodes.length > 12 ? " …" : ""}`]])
    : `<span class="muted">no plan yet</span>`;
  const victims = g.victims.length
    ? `preempted to make room: ${g.victims.map((v) => `<a href="#/group/${esc(v.group)}">${esc(v.group)}</a> (${v.pods} pods)`).join(", ")}` : "";
  const by = g.preempted_by ? `preempted by <a href="#/group/${esc(g.preempted_by)}">${esc(g.preempted_by)}</a>` : "";
  $("group-preemption").innerHTML = [victims, by].filter(Boolean).join("<br>") || `<span class="muted">none</span>`;
  $("group-pods").querySelector("tbody").innerHTML = g.pods.slice().sort((a, b) => natural(a.name, b.name)).map((m) => `<tr><td>${esc(m.name)}</td><td>${esc(m.node || "—")}</td>
    <td>${esc(m.gated ? "gated" : m.phase)}</td><td>${esc(Object.entries(m.requests).map(([r, v]) => `${r}=${quantity(r, v)}`).join(" "))}</td></tr>`).join("");
  $("group-timeline").innerHTML = g.timeline.slice().reverse().map((e) => eventLine(e, false)).join("");
}

// -- the loop ------------------------------------------------------------------------------
function route() {
  const m = location.hash.match(/^#\/group\/([^/]+\/[^/]+)$/);
  $("home").hidden = !!m;
  $("group-page").hidden = !m;
  return m ? decodeURIComponent(m[1]) : null;
}

async function poll() {
  if (state.busy) return;  // a slow answer must not stack polls
  state.busy = true;
  const group = route();
  try {
    if (group) {
      await renderGroupPage(group);
    } else {
      const [topo, groups, metrics] = await Promise.all([get("/api/v1/topology"), get("/api/v1/podgroups"), get("/api/v1/metrics")]);
      state.topology = topo;
      renderTopology(topo);
      await renderRack();
      renderGroups(groups);
      renderMetrics(metrics);
    }
    renderEvents(await get(`/api/v1/events?since=${state.seq}`));
    state.polls += 1;
    $("live-dot").className = "dot on";
    $("live-text").textContent = `live · updated ${new Date().toLocaleTimeString()}`;
  } catch (err) {
    $("live-dot").className = "dot off";
    $("live-text").textContent = `disconnected (${err.message})`;
  } finally {
    state.busy = false;
  }
}

document.addEventListener("click", (ev) => {
  if (ev.target.id === "whatif-run") { runWhatIf(); return; }
  if (ev.target.id === "whatif-clear") {
    state.whatif = null; $("whatif-result").innerHTML = ""; $("whatif-status").textContent = "";
    if (state.topology) { renderTopology(state.topology); renderRack(); }
    return;
  }
  const rack = ev.target.closest(".rack");
  if (rack) { state.rack = state.rack === rack.dataset.rack ? null : rack.dataset.rack; renderTopology(state.topology); renderRack(); return; }
  const filter = ev.target.closest("#state-filters button");
  if (filter) { state.filter = filter.dataset.state; poll(); return; }
  const row = ev.target.closest("tr[data-group]");
  if (row && !ev.target.closest("a")) location.hash = `#/group/${row.dataset.group}`;
});
window.addEventListener("hashchange", poll);
poll();
setInterval(poll, POLL_MS);
