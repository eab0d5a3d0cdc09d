# ruff: noqa: E501  (HTML and JavaScript lines, not Python)
"""The dashboard's one page: HTML, CSS and a small canvas chart in plain JavaScript.

Shipped as a Python string so it is inside the package whatever the packaging does, and
so the page needs nothing from the network (no CDN): it works offline, on a lab machine.
The page fetches `snapshot.json` once, then listens to `events` (Server-Sent Events). Each
number is also in a `data-value` attribute (raw, unformatted) for tests and scripts.
"""

PAGE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>minips dashboard</title>
<style>
 body { font: 14px/1.4 system-ui, sans-serif; margin: 16px; color: #222; background: #fafafa; }
 h1 { font-size: 18px; margin: 0 0 8px; } h1 small { color: #666; font-weight: normal; }
 .tiles { display: flex; flex-wrap: wrap; gap: 8px; margin-bottom: 12px; }
 .tile { background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: 6px 10px; min-width: 96px; }
 .tile b { display: block; font-size: 18px; } .tile span { color: #666; font-size: 12px; }
 .charts { display: flex; flex-wrap: wrap; gap: 8px; }
 canvas { background: #fff; border: 1px solid #ddd; border-radius: 6px; }
 table { border-collapse: collapse; margin-top: 12px; background: #fff; }
 th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
 th { background: #f0f0f0; } td.dead { color: #b00; }
 #status.ok { color: #080; } #status.down { color: #b00; }
</style></head><body>
<h1>minips <small id="connect"></small> <small id="status">connecting...</small></h1>
<div class="tiles">
 <div class="tile"><span>rule</span><b id="stat-rule">-</b></div>
 <div class="tile"><span>test accuracy</span><b id="stat-accuracy">-</b></div>
 <div class="tile"><span>version t</span><b id="stat-version">-</b></div>
 <div class="tile"><span>updates</span><b id="stat-updates">-</b></div>
 <div class="tile"><span>updates/s</span><b id="stat-updates-per-s">-</b></div>
 <div class="tile"><span>samples</span><b id="stat-samples">-</b></div>
 <div class="tile"><span>live workers</span><b id="stat-live-workers">-</b></div>
 <div class="tile"><span>staleness mean / max</span><b><i id="stat-staleness-mean">-</i> / <i id="stat-staleness-max">-</i></b></div>
 <div class="tile"><span>bytes up (to server)</span><b id="stat-bytes-in">-</b></div>
 <div class="tile"><span>bytes down</span><b id="stat-bytes-out">-</b></div>
 <div class="tile"><span>server uptime</span><b id="stat-uptime">-</b></div>
</div>
<div class="charts">
 <canvas id="chart-acc-time" width="420" height="240"></canvas>
 <canvas id="chart-acc-samples" width="420" height="240"></canvas>
 <canvas id="chart-updates" width="420" height="240"></canvas>
</div>
<table id="workers"><thead><tr><th>rank</th><th>host</th><th>alive</th><th>steps (clock)</th>
 <th>pushes</th><th>samples</th><th>samples/s</th><th>steps/s</th><th>clocks behind fastest</th>
 <th>bytes up</th><th>bytes down</th></tr></thead><tbody></tbody></table>
<table id="shards" hidden><thead><tr><th>shard</th><th>version</th><th>updates</th>
 <th>updates/s</th><th>bytes up</th><th>bytes down</th><th>bytes/s</th><th>load</th></tr></thead>
 <tbody></tbody></table>
<script>
"use strict";
const fmtBytes = b => b >= 1e9 ? (b / 1e9).toFixed(2) + " GB" : b >= 1e6 ? (b / 1e6).toFixed(1) + " MB"
  : b >= 1e3 ? (b / 1e3).toFixed(1) + " kB" : b + " B";
const fmt = (v, digits) => typeof v === "number" ? (Number.isInteger(v) && digits === undefined
  ? v.toLocaleString("en") : v.toFixed(digits === undefined ? 2 : digits)) : "-";

function setValue(id, value, text) {
  const el = document.getElementById(id);
  el.dataset.value = value === undefined || value === null ? "" : String(value);
  el.textContent = text;
}

function chart(id, points, title, xLabel, yMin, yMax) {
  // A line chart of [x, y] points on a canvas: axes, min/max ticks, the line, the last value.
  const c = document.getElementById(id), g = c.getContext("2d");
  const left = 48, right = 12, top = 24, bottom = 32, w = c.width - left - right, h = c.height - top - bottom;
  g.clearRect(0, 0, c.width, c.height);
  g.fillStyle = "#222"; g.font = "13px system-ui"; g.fillText(title, left, 16);
  g.strokeStyle = "#999"; g.beginPath(); g.moveTo(left, top); g.lineTo(left, top + h); g.lineTo(left + w, top + h); g.stroke();
  g.font = "11px system-ui"; g.fillStyle = "#666"; g.fillText(xLabel, left + w / 2 - 30, c.height - 6);
  if (points.length === 0) { g.fillText("no data yet", left + w / 2 - 30, top + h / 2); return; }
  const xs = points.map(p => p[0]), ys = points.map(p => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1e-9);
  const y0 = yMin !== undefined ? yMin : Math.min(...ys), y1 = yMax !== undefined ? yMax : Math.max(...ys, y0 + 1e-9);
  const px = x => left + (x - x0) / (x1 - x0) * w, py = y => top + h - (y - y0) / (y1 - y0) * h;
  g.fillText(fmt(y1), 4, top + 4); g.fillText(fmt(y0), 4, top + h);
  g.fillText(fmt(x0, 0), left, top + h + 14); g.fillText(fmt(x1, 0), left + w - 30, top + h + 14);
  g.strokeStyle = "#1f77b4"; g.lineWidth = 2; g.beginPath();
  points.forEach((p, i) => i ? g.lineTo(px(p[0]), py(p[1])) : g.moveTo(px(p[0]), py(p[1])));
  g.stroke(); g.fillStyle = "#1f77b4";
  points.forEach(p => { g.beginPath(); g.arc(px(p[0]), py(p[1]), 2.5, 0, 7); g.fill(); });
}

function render(s) {
  document.getElementById("connect").textContent = s.connect;
  const status = document.getElementById("status");
  status.textContent = s.connected ? (s.stats.stopping ? "stopping" : "live") : "no server: " + (s.error || "");
  status.className = s.connected ? "ok" : "down";
  document.body.dataset.seq = s.seq;
  const evals = s.evals || [];
  document.body.dataset.evals = evals.length;
  const last = evals.length ? evals[evals.length - 1] : null;
  setValue("stat-accuracy", last && last.accuracy, last ? (100 * last.accuracy).toFixed(2) + " %" : "-");
  chart("chart-acc-time", evals.map(e => [e.time, e.accuracy]), "test accuracy vs time", "seconds", 0, 1);
  chart("chart-acc-samples", evals.map(e => [e.samples, e.accuracy]), "test accuracy vs samples", "samples", 0, 1);
  chart("chart-updates", (s.history || []).map(p => [p.uptime, p.updates_per_s]), "updates/s", "server uptime (s)", 0);
  if (!s.stats) return;
  const t = s.stats, rule = t.rule || {};
  setValue("stat-rule", rule.name, Object.entries(rule).map(([k, v]) => k === "name" ? v : k + "=" + v).join(" "));
  for (const key of ["version", "updates", "samples", "live_workers", "staleness_max"])
    setValue("stat-" + key.replace("_", "-"), t[key], fmt(t[key]));
  setValue("stat-staleness-mean", t.staleness_mean, fmt(t.staleness_mean));
  setValue("stat-updates-per-s", s.updates_per_s, fmt(s.updates_per_s, 1));
  setValue("stat-bytes-in", t.bytes_in, fmtBytes(t.bytes_in));
  setValue("stat-bytes-out", t.bytes_out, fmtBytes(t.bytes_out));
  setValue("stat-uptime", t.uptime, fmt(t.uptime, 0) + " s");
  const body = document.querySelector("#workers tbody");
  body.replaceChildren(...s.workers.map(w => {
    const tr = document.createElement("tr"); tr.dataset.rank = w.rank;
    const cells = [["rank", w.rank, w.rank], ["host", w.host, w.host], ["alive", w.alive, w.alive ? "yes" : "no"],
      ["clock", w.clock, fmt(w.clock)], ["pushes", w.pushes, fmt(w.pushes)], ["samples", w.samples, fmt(w.samples)],
      ["samples_per_s", w.samples_per_s, fmt(w.samples_per_s, 0)], ["steps_per_s", w.steps_per_s, fmt(w.steps_per_s, 1)],
      ["behind", w.behind, fmt(w.behind)], ["bytes_in", w.bytes_in, fmtBytes(w.bytes_in)],
      ["bytes_out", w.bytes_out, fmtBytes(w.bytes_out)]];
    for (const [key, value, text] of cells) {
      const td = document.createElement("td"); td.dataset.key = key; td.dataset.value = value; td.textContent = text;
      if (key === "alive" && !value) td.className = "dead";
      tr.appendChild(td);
    }
    return tr;
  }));
  const shards = s.shards || [];  // a server group's shards, one row each
  document.getElementById("shards").hidden = shards.length === 0;
  document.querySelector("#shards tbody").replaceChildren(...shards.map(r => {
    const tr = document.createElement("tr"); tr.dataset.shard = r.shard;
    const cells = [["shard", r.shard, r.shard], ["version", r.version, r.joined ? fmt(r.version) : "not joined"],
      ["updates", r.updates, fmt(r.updates)], ["updates_per_s", r.updates_per_s, fmt(r.updates_per_s, 1)],
      ["bytes_in", r.bytes_in, r.joined ? fmtBytes(r.bytes_in) : "-"],
      ["bytes_out", r.bytes_out, r.joined ? fmtBytes(r.bytes_out) : "-"],
      ["bytes_per_s", r.bytes_per_s, fmtBytes(Math.round(r.bytes_per_s)) + "/s"],
      ["load", r.load, (100 * r.load).toFixed(0) + " %"]];
    for (const [key, value, text] of cells) {
      const td = document.createElement("td"); td.dataset.key = key; td.dataset.value = value; td.textContent = text;
      tr.appendChild(td);
    }
    return tr;
  }));
}

fetch("snapshot.json").then(r => r.json()).then(render);
const events = new EventSource("events");
events.onmessage = e => render(JSON.parse(e.data));
</script></body></html>
"""
