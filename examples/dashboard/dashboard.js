// The demo's dashboard: one JSON event a second from /dashboard/events
// (shape in docs/dashboard.md), drawn without any library.
"use strict";
const POINTS = 300;
const COLORS = ["#2a7", "#d33", "#e90", "#66f"];
const history = new Map(); // "layer/policy" -> [[admitted, denied, shed, failed], ...]

function cell(row, text, id) {
  const td = row.insertCell();
  if (id) td.id = id;
  td.textContent = text;
  return td;
}

function rate(value, total, id) {
  const span = document.createElement("span");
  span.textContent = value;
  const all = document.createElement("span");
  all.className = "total";
  all.id = id;
  all.textContent = total;
  const td = document.createElement("td");
  td.append(span, " (", all, ")");
  return td;
}

function micros(us) {
  if (us === null || us === undefined) return "–";
  return us >= 1000 ? (us / 1000).toFixed(1) + " ms" : us + " µs";
}

function draw(canvas, points) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height;
  ctx.clearRect(0, 0, w, h);
  let max = 1;
  for (const p of points) for (const v of p) max = Math.max(max, v);
  for (let s = 0; s < 4; s++) {
    ctx.strokeStyle = COLORS[s];
    ctx.beginPath();
    points.forEach((p, i) => {
      const x = w - (points.length - i) * (w / POINTS);
      const y = h - 1 - (p[s] / max) * (h - 2);
      i === 0 ? ctx.moveTo(x, y) : ctx.lineTo(x, y);
    });
    ctx.stroke();
  }
  ctx.fillStyle = "#999";
  ctx.font = "10px sans-serif";
  ctx.fillText(max + "/s", 2, 10);
}

function render(event) {
  if (event.history) {
    history.clear();
    for (const [name, points] of Object.entries(event.history)) history.set(name, points.slice(-POINTS));
  }
  document.getElementById("updated").textContent =
    event.at_ms ? "at " + new Date(event.at_ms).toLocaleTimeString() : "";
  document.getElementById("instances").textContent = event.instances ?? "–";
  document.getElementById("instance-list").textContent =
    (event.instance_list || []).map((i) => i.address || i.id).join(", ");
  const store = event.store || {};
  document.getElementById("store-p50").textContent = micros(store.p50_us);
  document.getElementById("store-p99").textContent = micros(store.p99_us);
  const perS = event.store_per_second || {};
  document.getElementById("store-calls").textContent = perS.calls ?? 0;
  document.getElementById("store-errors").textContent = perS.errors ?? 0;
  document.getElementById("store-errors-total").textContent = store.errors ?? 0;

  const decisions = document.querySelector("#decisions tbody");
  const leases = document.querySelector("#leases tbody");
  const tiers = document.querySelector("#tiers tbody");
  const denied = document.querySelector("#denied tbody");
  for (const body of [decisions, leases, tiers, denied]) body.replaceChildren();
  for (const p of event.policies || []) {
    const name = p.layer + "/" + p.policy;
    const id = p.layer + "-" + p.policy;
    const points = history.get(name) || [];
    if (!event.history && p.point) {
      points.push(p.point);
      if (points.length > POINTS) points.shift();
    }
    history.set(name, points);
    const d = p.decisions, r = p.per_second || {};
    const row = decisions.insertRow();
    cell(row, p.layer);
    cell(row, p.policy);
    row.append(
      rate(r.allowed ?? 0, d.allowed, "total-" + id + "-allowed"),
      rate(r.denied ?? 0, d.denied, "total-" + id + "-denied"),
      rate(r.shed ?? 0, d.shed, "total-" + id + "-shed"),
      // Shadow mode (any layer): what it would have refused, let through.
      rate(r.shadow_denied ?? 0, d.shadow_denied, "total-" + id + "-shadow_denied"),
      rate(r.fail_open ?? 0, d.fail_open, "total-" + id + "-fail_open"),
      rate(r.fail_closed ?? 0, d.fail_closed, "total-" + id + "-fail_closed"),
      rate(((r.fallback_allowed ?? 0) + (r.fallback_denied ?? 0)).toFixed(2) * 1,
        d.fallback_allowed + d.fallback_denied, "total-" + id + "-local"),
      // Deny and allow list entries: refused or let through undecided.
      rate(r.deny_listed ?? 0, d.deny_listed ?? 0, "total-" + id + "-deny_listed"),
      rate(r.allow_listed ?? 0, d.allow_listed ?? 0, "total-" + id + "-allow_listed"));
    const canvas = document.createElement("canvas");
    canvas.width = POINTS;
    canvas.height = 36;
    row.insertCell().append(canvas);
    draw(canvas, points);
    if (p.leases_in_use !== null && p.leases_in_use !== undefined) {
      const l = leases.insertRow();
      cell(l, p.policy);
      cell(l, p.leases_in_use, "leases-" + p.policy);
      // An adaptive limit's capacity is where it is now.
      const a = p.adaptive;
      const rtt = a && a.min_rtt_us !== null ? ", min RTT " + (a.min_rtt_us / 1000).toFixed(1) + " ms" : "";
      cell(l, a ? p.capacity + " (" + a.algorithm + rtt + ")" : p.capacity ?? "–", "limit-" + p.policy);
      const q = p.queue;
      cell(l, q ? q.waiting + " waiting, " + q.timed_out + " timed out" : "–", "queue-" + p.policy);
      cell(l, (p.top_denied || []).length);
    }
    for (const t of p.tiers || []) {
      const row = tiers.insertRow();
      cell(row, p.policy);
      cell(row, t.tier);
      cell(row, t.in_flight);
      // The worker-utilization shedder is local: it has no fleet limit.
      // The fleet's in flight is estimated as this instance's times the
      // instances counted, when they are.
      const fleet = event.instances ? " (fleet ≈ " + t.in_flight * event.instances + ")" : "";
      const share = p.layer === "utilization_shed" ? "– (local)"
        : t.limit === null ? "never shed" : t.limit + " of " + (p.capacity ?? "?") + fleet;
      cell(row, share);
      cell(row, Math.round(t.shed_fraction * 100) + "%");
    }
    for (const who of p.top_denied || []) {
      const row = denied.insertRow();
      cell(row, p.policy);
      const code = document.createElement("code");
      code.textContent = who.identity;
      row.insertCell().append(code);
      cell(row, who.denials);
    }
  }
  const outbound = document.querySelector("#outbound tbody");
  outbound.replaceChildren();
  for (const t of event.throttles || []) {
    const row = outbound.insertRow();
    cell(row, "throttle");
    cell(row, t.name);
    cell(row, t.sent);
    cell(row, t.accepted);
    cell(row, t.refused, "throttle-" + t.name + "-refused");
    const ratio = t.accept_ratio === null ? "–" : Math.round(t.accept_ratio * 100) + "%";
    cell(row, "refusing " + Math.round(t.rejection_probability * 100) + "%, accepted " + ratio);
  }
  for (const b of event.retry_budgets || []) {
    const row = outbound.insertRow();
    cell(row, "retry budget");
    cell(row, b.name);
    cell(row, b.first_attempts);
    cell(row, b.retries, "budget-" + b.name + "-retries");
    cell(row, b.refused);
    cell(row, b.store_errors ? b.store_errors + " store errors" : "–");
  }
  document.body.dataset.events = String(Number(document.body.dataset.events || 0) + 1);
}

const status = document.getElementById("status");
const source = new EventSource("/dashboard/events");
// `?events=N`: stop after N events, leaving a still page (for screenshots
// and for scripts/dashboard-check.sh, whose headless browser waits for the
// network to go quiet).
const stopAfter = Number(new URLSearchParams(location.search).get("events")) || 0;
source.onopen = () => { status.textContent = "live"; status.dataset.state = "live"; };
source.onerror = () => { status.textContent = "reconnecting…"; status.dataset.state = "lost"; };
source.onmessage = (message) => {
  try {
    render(JSON.parse(message.data));
    if (stopAfter && Number(document.body.dataset.events) >= stopAfter) {
      source.close();
      status.textContent = "stopped after " + stopAfter + " events";
      status.dataset.state = "stopped";
    }
  } catch (err) {
    status.textContent = "bad event: " + err;
  }
};
