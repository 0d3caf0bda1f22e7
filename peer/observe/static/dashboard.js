// fedstream dashboard: one page, no build step. It follows /events (Server-Sent Events):
// each event is the federation as this peer sees it, every peer's status and newest
// samples; the first carries each peer's history (the last minutes), so the charts start
// full. Everything shown is written into the DOM with data-* attributes a test can read.
"use strict";

const HISTORY = 150;
const COLORS = ["#2f6fde", "#d9480f", "#2b8a3e", "#9c36b5", "#e67700", "#0b7285", "#c2255c", "#5c940d"];
const series = new Map(); // node id -> [samples]
let latest = null;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null) continue;
    if (key === "class") node.className = value;
    else node.setAttribute(key, String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function short(id) { return id ? String(id).slice(0, 12) : "?"; }
function num(value, digits) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  return Number(value).toFixed(digits === undefined ? 1 : digits);
}
function td(value, attrs) { return el("td", attrs, value); }
function fill(tbody, rows) { tbody.replaceChildren(...rows); }
function when(t) { return new Date(t * 1000).toLocaleTimeString(); }

function remember(view) {
  if (!view.node_id || !Array.isArray(view.samples)) return;
  const kept = series.get(view.node_id) || [];
  for (const sample of view.samples) {
    if (!kept.length || sample.t > kept[kept.length - 1].t) kept.push(sample);
  }
  while (kept.length > HISTORY) kept.shift();
  series.set(view.node_id, kept);
}

function last(node) {
  const kept = series.get(node) || [];
  return kept.length ? kept[kept.length - 1] : null;
}

// -- charts: inline SVG polylines -----------------------------------------------------------
function chart(title, samples, key, unit) {
  const width = 300, height = 90, pad = 4;
  const names = new Set();
  for (const s of samples) for (const name of Object.keys(s[key] || {})) names.add(name);
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("width", width); svg.setAttribute("height", height);
  let top = 0;
  for (const s of samples) for (const v of Object.values(s[key] || {})) top = Math.max(top, v);
  top = top > 0 ? top * 1.1 : 1;
  const t0 = samples.length ? samples[0].t : 0;
  const t1 = samples.length ? samples[samples.length - 1].t : 1;
  const span = Math.max(1, t1 - t0);
  const legend = el("div", {class: "legend"});
  [...names].sort().forEach((name, i) => {
    const color = COLORS[i % COLORS.length];
    const points = samples
      .filter((s) => s[key] && s[key][name] !== undefined)
      .map((s) => `${(pad + (s.t - t0) / span * (width - 2 * pad)).toFixed(1)},${(height - pad - s[key][name] / top * (height - 2 * pad)).toFixed(1)}`);
    const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
    line.setAttribute("points", points.join(" "));
    line.setAttribute("fill", "none"); line.setAttribute("stroke", color); line.setAttribute("stroke-width", "1.5");
    svg.append(line);
    legend.append(el("span", {style: `color:${color}`}, `${name}`));
  });
  return el("div", {class: "chart", "data-chart": key},
    el("div", {class: "title"}, `${title} (max ${num(top / 1.1, 2)} ${unit})`), svg, legend);
}

// -- sections ---------------------------------------------------------------------------------
function peersOf(view) { return (view.peers || []).filter((p) => p && p.node_id); }

function render(view) {
  latest = view;
  for (const peer of peersOf(view)) remember(peer);
  const peers = peersOf(view);
  const byNode = new Map(peers.map((p) => [p.node_id, p]));
  document.getElementById("updated").textContent = `updated ${when(view.t)}`;
  document.body.dataset.peers = String(peers.length);

  // overlay: members as this peer's gossip has them, joined with each one's own view
  const self = byNode.get(view.self);
  const members = (self && self.status && self.status.overlay && self.status.overlay.members) || [];
  fill(document.querySelector("#overlay tbody"), members.map((m) => {
    const own = byNode.get(m.node_id);
    const status = own && own.status;
    const brain = status && status.brain;
    const util = brain && brain.utilisation !== undefined ? brain.utilisation : (m.load || {}).util;
    const queries = status ? (status.queries || []).length : "–";
    const hosted = status ? (status.hosted || []).join(", ") : "";
    const link = own && own.dashboard ? el("a", {href: own.dashboard}, own.dashboard) : (own && own.error ? own.error : "");
    return el("tr", {"data-node": m.node_id, "data-state": m.state},
      td(el("code", {}, short(m.node_id)), {title: m.node_id}), td(m.participant),
      td(m.state, {class: `state-${m.state}`}), td(util === undefined ? "–" : num(util * 100, 0) + " %", {class: "num"}),
      td(num((m.load || {}).cpu, 2), {class: "num"}), td(queries, {class: "num"}), td(hosted), td(link));
  }));

  // streams: who hosts each one, its replicas, its rate and backlog
  const streams = new Map();
  for (const peer of peers) {
    const status = peer.status || {};
    const sample = last(peer.node_id) || {};
    for (const name of status.hosted || []) {
      const s = streams.get(name) || {replicas: new Set()};
      s.host = peer; s.sample = sample; s.peerStatus = status;
      if (!s.copies) s.copies = (status.replication || {}).note; // no control plane: one copy
      streams.set(name, s);
    }
    const replicated = ((status.replication || {}).streams) || {};
    for (const [name, info] of Object.entries(replicated)) {
      const s = streams.get(name) || {replicas: new Set()};
      if (info.role === "primary") { s.host = peer; s.sample = sample; s.peerStatus = status; s.copies = info.copies; }
      else s.replicas.add(peer.node_id);
      streams.set(name, s);
    }
    for (const name of Object.keys(status.replicas || {})) {
      const s = streams.get(name) || {replicas: new Set()};
      s.replicas.add(peer.node_id);
      streams.set(name, s);
    }
  }
  const streamRows = [];
  for (const [name, s] of [...streams.entries()].sort()) {
    if (!s.host) continue;
    const sample = s.sample || {};
    let entered = 0, rate = 0;
    for (const peer of peers) { // a stream is pushed through any peer: add them up
      const p = last(peer.node_id) || {};
      entered += (p.records_in || {})[name] || 0;
      rate += (p.in_rate || {})[name] || 0;
    }
    const info = ((s.peerStatus.streams || []).find((x) => x.name === name)) || {};
    const backlog = (sample.backlog || {})[name];
    streamRows.push(el("tr", {"data-stream": name},
      td(name), td(el("code", {}, short(s.host.node_id)), {"data-host": s.host.node_id}),
      td([...s.replicas].map(short).join(", ")),
      td(s.copies || "–", {class: "copies"}),
      td(entered, {class: "num records-in", "data-value": entered}),
      td(num(rate) + "/s", {class: "num rate", "data-value": rate}),
      td(backlog === undefined ? "–" : backlog, {class: "num backlog", "data-value": backlog}),
      td(info.latest_offset === undefined ? "–" : info.latest_offset, {class: "num"})));
  }
  fill(document.querySelector("#streams tbody"), streamRows);

  // each peer: its fragments with rates, latency and batch time, and their charts
  const cards = peers.map((peer) => {
    const status = peer.status || {};
    const sample = last(peer.node_id) || {};
    const overlay = status.overlay || {};
    const head = el("h3", {}, el("code", {class: "node-id"}, peer.node_id), " ", overlay.participant || "",
      peer.error ? el("span", {class: "error"}, ` ${peer.error}`) : null);
    const rows = (status.queries || []).map((q) => {
      const running = q.status === "RUNNING" && q.active === true;
      // results while an input is missing beyond the query's availability bound (issue 16)
      const dpc = q.availability || null;
      const tentative = dpc !== null && dpc.tentative === true;
      const results = dpc === null ? "exact"
        : (tentative ? `TENTATIVE since ${when(dpc.tentative_since)} (missing ${(dpc.missing_inputs || []).join(", ")})` : "exact")
          + (dpc.corrections ? `; ${dpc.corrections} corrections, ${dpc.corrected_tuples} taken back` : "");
      return el("tr", {"data-fragment": q.name, "data-running": running, "data-tentative": tentative},
        td(q.name), td(q.status, {class: `running-${running}`}),
        td(results, {class: `tentative-${tentative}`}),
        td(num((sample.out_rate || {})[q.name]) + "/s", {class: "num rate-out", "data-value": (sample.out_rate || {})[q.name]}),
        td(q.rows_out === undefined ? "–" : q.rows_out, {class: "num"}),
        td(num((sample.latency_s || {})[q.name], 2) + " s", {class: "num"}),
        td(num((sample.batch_s || {})[q.name], 3) + " s", {class: "num"}),
        td(q.batches === undefined ? "–" : q.batches, {class: "num"}),
        td(q.error || "", {class: "error"}));
    });
    const table = el("table", {class: "fragments"},
      el("thead", {}, el("tr", {}, ...["fragment", "status", "results", "out rate", "tuples out", "latency", "batch time", "batches", ""].map((h) => el("th", {}, h)))),
      el("tbody", {}, ...rows));
    // warm standbys this peer runs for fragments led elsewhere (issue 26), and its promotions
    const replication = status.replication || {};
    const standbys = Object.entries(replication.standbys || {}).map(([name, sb]) =>
      el("tr", {"data-standby": name, "data-promoted": sb.promoted === true},
        td(name), td(sb.promoted ? "promoted" : "standby"), td(el("code", {}, sb.anchor || "")),
        td(sb.behind_batches === null || sb.behind_batches === undefined ? "–" : sb.behind_batches, {class: "num"}),
        td(sb.since_batch_s === null || sb.since_batch_s === undefined ? "–" : num(sb.since_batch_s, 1) + " s", {class: "num"}),
        td(sb.held, {class: "num"}), td(sb.batches, {class: "num"})));
    const standbyTable = standbys.length ? el("table", {class: "standbys"},
      el("thead", {}, el("tr", {}, ...["standby of", "role", "input", "behind (batches)", "since batch", "held results", "batches"].map((h) => el("th", {}, h)))),
      el("tbody", {}, ...standbys)) : null;
    const promotions = replication.promotions ? el("p", {class: "promotions"}, `${replication.promotions} standby promotions here`) : null;
    const kept = series.get(peer.node_id) || [];
    const charts = el("div", {class: "charts"},
      chart("input rate", kept, "in_rate", "tuples/s"),
      chart("output rate", kept, "out_rate", "tuples/s"),
      chart("push to result", kept, "latency_s", "s"),
      chart("batch time", kept, "batch_s", "s"));
    return el("div", {class: "peer", "data-node": peer.node_id}, head, rows.length ? table : el("p", {}, "no fragments"), standbyTable, promotions, charts);
  });
  document.getElementById("peers").replaceChildren(...cards);

  // contracts and moves (each peer's brain)
  const contractRows = [], moveRows = [];
  for (const peer of peers) {
    const brain = (peer.status || {}).brain;
    if (!brain) continue;
    for (const c of brain.contracts || []) {
      contractRows.push(el("tr", {"data-contract": c.id},
        td(el("code", {}, short(peer.node_id))), td(c.partner), td(num(c.price, 2), {class: "num"}),
        td(num(c.min_price, 2), {class: "num"}), td(c.valid ? "yes" : "no"), td(c.not_after)));
    }
    for (const m of brain.ledger || []) {
      moveRows.push([m.t, el("tr", {class: "move", "data-fragment": m.fragment, "data-direction": m.direction, "data-ok": m.ok, title: m.reason || ""},
        td(when(m.t)), td(el("code", {}, short(peer.node_id))), td(m.direction), td(m.fragment), td(m.contract === "" ? `${m.partner} (own peer)` : (m.partner || "")),
        td(num(m.load, 3), {class: "num"}), td(num(m.price, 2), {class: "num"}),
        td(m.pause_s === undefined || m.pause_s === null ? "–" : num(m.pause_s, 2) + " s", {class: "num"}),
        td(m.ok ? "yes" : (m.error || "no"), {class: `ok-${m.ok}`}))]);
    }
  }
  fill(document.querySelector("#contracts tbody"), contractRows);
  moveRows.sort((a, b) => b[0] - a[0]);
  fill(document.querySelector("#moves tbody"), moveRows.map((r) => r[1]));
}

function connect() {
  const state = document.getElementById("connection");
  const events = new EventSource("/events");
  events.addEventListener("federation", (event) => {
    state.textContent = "live"; state.dataset.state = "live";
    try { render(JSON.parse(event.data)); } catch (err) { console.error(err); }
  });
  events.onerror = () => { state.textContent = "reconnecting…"; state.dataset.state = "lost"; };
}

connect();
