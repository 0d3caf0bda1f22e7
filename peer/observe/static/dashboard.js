// fedstream dashboard: one page, no build step. It follows /events (Server-Sent Events):
// each event is the federation as this peer sees it, every peer's status and newest
// samples; the first carries each peer's history (the last minutes), so the charts start
// full. Each query is drawn as boxes and arrows (SVG) from the event's "diagram", redrawn on
// every event, so a box that moved shows its new peer. Everything shown is written into the
// DOM with data-* attributes a test can read.
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

// -- queries as boxes and arrows (the federation view's "diagram", peer/observe/diagram.py) ---
const SVG = "http://www.w3.org/2000/svg";
const BOX_W = 170, BOX_H = 50, END_W = 130, END_H = 30, COL_W = 250, ROW_H = 74, PAD = 14;

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value !== undefined && value !== null) node.setAttribute(key, String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// one colour per peer, the same on every page and every refresh (from its node id)
function peerColor(nodeId) {
  const n = parseInt(String(nodeId || "").slice(0, 8), 16);
  return COLORS[(Number.isNaN(n) ? 0 : n) % COLORS.length];
}
function clip(text, chars) { text = String(text); return text.length > chars ? text.slice(0, chars - 1) + "…" : text; }
function peerName(box) { return `${box.participant || "?"} · ${box.peer}`; }

function queryGraph(graph) {
  const width = Math.max(1, graph.columns) * COL_W - (COL_W - BOX_W) + 2 * PAD;
  const height = Math.max(1, graph.rows) * ROW_H - (ROW_H - BOX_H) + 2 * PAD;
  const place = new Map(); // node id -> {x, y, w, h}: where the arrows start and end
  const marker = `arrowhead-${graph.query.replace(/[^A-Za-z0-9_-]/g, "_")}`;
  const drawing = svg("svg", {width, height, class: "graph", "data-query": graph.query},
    svg("defs", {}, svg("marker", {id: marker, viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse"},
      svg("path", {d: "M 0 0 L 10 5 L 0 10 z", class: "head"}))));
  const at = (node, w, h) => {
    const x = PAD + node.column * COL_W + (BOX_W - w) / 2, y = PAD + node.row * ROW_H + (BOX_H - h) / 2;
    place.set(node.id, {x, y, w, h});
    return {x, y};
  };
  const shapes = [];
  for (const end of graph.streams || []) {
    const {x, y} = at(end, END_W, END_H);
    shapes.push(svg("g", {class: `stream ${end.role}`, "data-stream": end.stream, "data-role": end.role},
      svg("title", {}, `${end.role} stream ${end.stream}`),
      svg("rect", {x, y, width: END_W, height: END_H, rx: END_H / 2}),
      svg("text", {x: x + END_W / 2, y: y + END_H / 2 + 4, "text-anchor": "middle"}, clip(end.stream, 18))));
  }
  for (const box of graph.boxes || []) {
    const {x, y} = at(box, BOX_W, BOX_H);
    const color = peerColor(box.node_id);
    shapes.push(svg("g", {class: "box", "data-box": box.box, "data-fragment": box.fragment, "data-operator": box.operator,
      "data-node": box.node_id, "data-participant": box.participant, "data-running": box.running},
      svg("title", {}, `${box.operator} box ${box.box} (fragment ${box.fragment}) runs on ${box.participant || "?"} ${box.node_id}${box.running ? "" : ", not running"}`),
      svg("rect", {x, y, width: BOX_W, height: BOX_H, rx: 4, stroke: color, fill: `${color}18`, class: box.running ? "running" : "idle"}),
      svg("rect", {x, y, width: 6, height: BOX_H, fill: color}),
      svg("text", {x: x + 14, y: y + 20, class: "operator"}, clip(`${box.operator} ${box.box}`, 22)),
      svg("text", {x: x + 14, y: y + 38, class: "peer-mark", style: `fill:${color}`}, clip(peerName(box), 24))));
  }
  const lines = [];
  for (const arrow of graph.arrows || []) {
    const a = place.get(arrow.source), b = place.get(arrow.target);
    if (!a || !b) continue;
    const x1 = a.x + a.w, y1 = a.y + a.h / 2;
    let d, lx, ly;
    if (arrow.source === arrow.target) { // a box feeding itself: a loop over its top
      d = `M ${x1} ${y1} C ${x1 + 40} ${a.y - 40}, ${a.x - 40} ${a.y - 40}, ${a.x} ${y1}`;
      lx = a.x + a.w / 2; ly = a.y - 24;
    } else {
      const x2 = b.x, y2 = b.y + b.h / 2, bend = Math.max(30, Math.abs(x2 - x1) / 2);
      d = `M ${x1} ${y1} C ${x1 + bend} ${y1}, ${x2 - bend} ${y2}, ${x2} ${y2}`;
      lx = (x1 + x2) / 2; ly = (y1 + y2) / 2 - 6;
    }
    const rate = arrow.rate === null || arrow.rate === undefined ? null : Number(arrow.rate);
    lines.push(svg("g", {class: "arrow", "data-stream": arrow.stream, "data-source": arrow.source, "data-target": arrow.target, "data-rate": rate === null ? "" : rate},
      svg("title", {}, `${arrow.stream}: ${rate === null ? "rate not measured" : num(rate) + " tuples/s"}`),
      svg("path", {d, "marker-end": `url(#${marker})`}),
      svg("text", {x: lx, y: ly, "text-anchor": "middle", class: "rate"}, rate === null ? "–" : `${num(rate)}/s`)));
  }
  drawing.append(...lines, ...shapes); // boxes over the arrows
  return el("div", {class: "query-graph", "data-query": graph.query}, el("h3", {}, graph.query), drawing);
}

function drawDiagram(diagram, peers) {
  const graphs = ((diagram && diagram.queries) || []).filter((g) => g && g.query);
  const legend = el("div", {class: "peer-legend"}, ...peers.filter((p) => p.status).map((p) =>
    el("span", {"data-node": p.node_id, style: `color:${peerColor(p.node_id)}`},
      `■ ${((p.status || {}).overlay || {}).participant || "?"} · ${short(p.node_id)}`)));
  document.getElementById("diagram").replaceChildren(
    legend, ...(graphs.length ? graphs.map(queryGraph) : [el("p", {}, "no queries")]));
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

  // queries: boxes marked with the peer running them, arrows with their stream's rate
  drawDiagram(view.diagram, peers);

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
