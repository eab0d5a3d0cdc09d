# ruff: noqa: E501  (HTML and JavaScript lines, not Python)
"""The dashboard's one page: HTML, CSS and small canvas charts in plain JavaScript.

Shipped as a Python string so it is inside the package whatever the packaging does, and
so the page needs nothing from the network (no CDN): it works offline, on a lab machine.
The page fetches `snapshot.json` once, then listens to `events` (Server-Sent Events). Each
number is also in a `data-value` attribute (raw, unformatted) for tests and scripts.

Made for a projector: the whole page fits the window (1280x720 with a class of 30: the
worker table scrolls inside its box), and the pictures a class looks at come first:
accuracy against time, each worker's contribution as bars, the staleness histogram. When
the run ends it says "finished" with the final accuracy, time and summary, and keeps them
after the server (and the dashboard itself) are gone.
"""

PAGE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>minips dashboard</title>
<style>
 html, body { height: 100%; margin: 0; }
 body { font: 13px/1.35 system-ui, sans-serif; color: #222; background: #fafafa; display: flex;
        flex-direction: column; padding: 10px 14px; box-sizing: border-box; gap: 8px; }
 h1 { font-size: 17px; margin: 0; } h1 small { color: #666; font-weight: normal; margin-left: 8px; }
 #status { font-weight: bold; } #status.live { color: #080; } #status.finished { color: #05a; }
 #status.lost, #status.connecting { color: #b00; }
 #final { background: #e8f1fb; border: 1px solid #9bc; border-radius: 6px; padding: 4px 10px; font-size: 15px; }
 .tiles { display: flex; flex-wrap: wrap; gap: 6px; }
 .tile { background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: 3px 8px; min-width: 84px; }
 .tile b { display: block; font-size: 16px; } .tile span { color: #666; font-size: 11px; }
 .charts { display: flex; gap: 8px; flex: 0 0 auto; }
 canvas { background: #fff; border: 1px solid #ddd; border-radius: 6px; width: 100%; height: 190px; }
 .charts > div { flex: 1 1 0; min-width: 0; }
 #table-box { flex: 1 1 auto; min-height: 90px; overflow: auto; background: #fff; border: 1px solid #ddd; border-radius: 6px; }
 table { border-collapse: collapse; width: 100%; font-size: 12px; }
 th, td { border-bottom: 1px solid #eee; padding: 1px 6px; text-align: right; white-space: nowrap; }
 th { background: #f0f0f0; position: sticky; top: 0; font-weight: 600; }
 td[data-key=agent], td[data-key=host], td[data-key=state] { text-align: left; }
 td.left { color: #b00; } td.finished, td.stopped { color: #05a; } td.training { color: #080; }
 td.waiting { color: #a60; } td.never { color: #888; }
 td.labels { font-family: monospace; text-align: left; letter-spacing: 1px; }
 #view-link { font-size: 12px; margin-left: 12px; color: #05a; }
 /* Projector view (?projector): a few numbers and the charts in type a class reads from the
    back of the room (48 px numbers, 22 px table at 1280x720); the charts take the height. */
 body.projector { font-size: 22px; padding: 12px 18px; gap: 12px; }
 body.projector h1 { font-size: 32px; } body.projector h1 small { font-size: 22px; }
 body.projector #final { font-size: 28px; padding: 6px 14px; }
 body.projector .tile { flex: 1 1 0; padding: 4px 14px; }
 body.projector .tile b { font-size: 48px; line-height: 1.15; }
 body.projector .tile span { font-size: 20px; color: #444; white-space: nowrap; }
 body.projector .charts { flex: 1 1 auto; min-height: 0; }
 body.projector .charts > div { height: 100%; }
 body.projector canvas { height: 100%; box-sizing: border-box; }
 body.projector #table-box { flex: 0 0 auto; max-height: 30vh; min-height: 0; }
 body.projector table { font-size: 22px; } body.projector th, body.projector td { padding: 2px 12px; }
 body.projector .minor, body.projector #shards, body.projector #view-link { display: none; }
</style></head><body>
<h1>minips <small id="connect"></small> <small id="status" class="connecting">connecting...</small><a id="view-link" href="?projector">projector view</a></h1>
<div id="final" hidden></div>
<div class="tiles">
 <div class="tile minor"><span>rule</span><b id="stat-rule">-</b></div>
 <div class="tile"><span>test accuracy</span><b id="stat-accuracy">-</b></div>
 <div class="tile minor"><span>version t</span><b id="stat-version">-</b></div>
 <div class="tile minor"><span>updates</span><b id="stat-updates">-</b></div>
 <div class="tile"><span>updates/s</span><b id="stat-updates-per-s">-</b></div>
 <div class="tile"><span>samples</span><b id="stat-samples">-</b></div>
 <div class="tile"><span>live workers</span><b id="stat-live-workers">-</b></div>
 <div class="tile"><span>staleness mean / max</span><b><i id="stat-staleness-mean">-</i> / <i id="stat-staleness-max">-</i></b></div>
 <div class="tile minor"><span>bytes up (to server)</span><b id="stat-bytes-in">-</b></div>
 <div class="tile minor"><span>bytes down</span><b id="stat-bytes-out">-</b></div>
 <div class="tile minor"><span>server uptime</span><b id="stat-uptime">-</b></div>
</div>
<div class="charts">
 <div><canvas id="chart-accuracy"></canvas></div>
 <div><canvas id="chart-contribution"></canvas></div>
 <div><canvas id="chart-staleness"></canvas></div>
</div>
<div id="table-box"><table id="workers"><thead><tr><th>rank</th><th>agent</th><th class="minor">host</th><th>state</th>
 <th>steps</th><th>samples</th><th>samples/s</th><th class="minor">steps/s</th><th class="minor">behind fastest</th>
 <th>staleness mean</th><th class="minor">max</th><th class="minor">scale mean</th><th class="minor">bytes up</th><th class="minor">bytes down</th><th id="labels-head" hidden>labels 0-9</th></tr></thead><tbody></tbody></table></div>
<table id="shards" hidden><thead><tr><th>shard</th><th>version</th><th>updates</th>
 <th>updates/s</th><th>bytes up</th><th>bytes down</th><th>bytes/s</th><th>load</th></tr></thead>
 <tbody></tbody></table>
<script>
"use strict";
const fmtBytes = b => b >= 1e9 ? (b / 1e9).toFixed(2) + " GB" : b >= 1e6 ? (b / 1e6).toFixed(1) + " MB"
  : b >= 1e3 ? (b / 1e3).toFixed(1) + " kB" : b + " B";
const fmt = (v, digits) => typeof v === "number" ? (Number.isInteger(v) && digits === undefined
  ? v.toLocaleString("en") : v.toFixed(digits === undefined ? 2 : digits)) : "-";
const pct = a => (100 * a).toFixed(1) + "%";
// A worker's examples per label (--partition) as ten bars, scaled to its largest count.
const BLOCKS = " ▁▂▃▄▅▆▇█";
const labelBars = counts => { const top = Math.max(...counts, 1);
  return counts.map(n => BLOCKS[n ? Math.max(1, Math.round(8 * n / top)) : 0]).join(""); };
const AGENT_COLOURS = { numpy: "#1f77b4" };  // browsers: orange
let last = null;
// The projector view: the class's view in large type; its chart text scales with it.
const PROJECTOR = new URLSearchParams(location.search).has("projector");
const SCALE = PROJECTOR ? 1.7 : 1;
const MINOR_COLUMNS = new Set(["host", "steps_per_s", "behind", "staleness_max", "scale_mean", "bytes_in", "bytes_out"]);
if (PROJECTOR) document.body.classList.add("projector");
const px = n => Math.round(n * SCALE) + "px system-ui";

function setValue(id, value, text) {
  const el = document.getElementById(id);
  el.dataset.value = value === undefined || value === null ? "" : String(value);
  el.textContent = text;
}

function canvas(id) {
  // The canvas at its displayed size (CSS pixels), cleared; [context, width, height].
  const c = document.getElementById(id), w = c.clientWidth, h = c.clientHeight;
  if (c.width !== w || c.height !== h) { c.width = w; c.height = h; }
  const g = c.getContext("2d");
  g.clearRect(0, 0, w, h);
  return [g, w, h];
}

function frame(g, w, h, title, xLabel) {
  const box = { left: 44 * SCALE, right: 10, top: 22 * SCALE, bottom: 28 * SCALE };
  box.w = w - box.left - box.right; box.h = h - box.top - box.bottom;
  g.fillStyle = "#222"; g.font = px(12); g.fillText(title, 8, 14 * SCALE);
  g.strokeStyle = "#999"; g.beginPath(); g.moveTo(box.left, box.top); g.lineTo(box.left, box.top + box.h);
  g.lineTo(box.left + box.w, box.top + box.h); g.stroke();
  g.font = px(11); g.fillStyle = "#666"; g.fillText(xLabel, box.left + box.w / 2 - 20 * SCALE, h - 4);
  return box;
}

function lineChart(id, points, title, xLabel, yMin, yMax, yText) {
  const [g, w, h] = canvas(id), b = frame(g, w, h, title, xLabel);
  if (points.length === 0) { g.fillText("no data yet", b.left + b.w / 2 - 30, b.top + b.h / 2); return; }
  const xs = points.map(p => p[0]), ys = points.map(p => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1e-9);
  const x = v => b.left + (v - x0) / (x1 - x0) * b.w, y = v => b.top + b.h - (v - yMin) / (yMax - yMin) * b.h;
  g.fillText(yText(yMax), 4, b.top + 4); g.fillText(yText(yMin), 4, b.top + b.h);
  g.fillText(fmt(x0, 0), b.left, b.top + b.h + 12 * SCALE); g.fillText(fmt(x1, 0), b.left + b.w - 24 * SCALE, b.top + b.h + 12 * SCALE);
  g.strokeStyle = "#1f77b4"; g.lineWidth = 2; g.beginPath();
  points.forEach((p, i) => i ? g.lineTo(x(p[0]), y(p[1])) : g.moveTo(x(p[0]), y(p[1])));
  g.stroke(); g.lineWidth = 1;
  const end = points[points.length - 1];
  g.fillStyle = "#1f77b4"; g.font = "bold " + px(13);
  g.fillText(yText(end[1]), Math.min(x(end[0]) - 40 * SCALE, b.left + b.w - 48 * SCALE), Math.max(y(end[1]) - 6, b.top + 12 * SCALE));
}

function barChart(id, bars, title, xLabel) {
  // bars: [{label, value, colour}]; labels are drawn when there is room for them.
  const [g, w, h] = canvas(id), b = frame(g, w, h, title, xLabel);
  if (bars.length === 0) { g.fillText("no data yet", b.left + b.w / 2 - 30, b.top + b.h / 2); return; }
  const top = Math.max(...bars.map(x => x.value), 1), step = b.w / bars.length, gap = Math.min(4, step / 4);
  g.fillText(fmt(top), 4, b.top + 4); g.fillText("0", 4, b.top + b.h);
  const every = Math.ceil(bars.length / Math.max(1, Math.floor(b.w / (22 * SCALE))));
  bars.forEach((bar, i) => {
    const bh = bar.value / top * b.h;
    g.fillStyle = bar.colour || "#1f77b4";
    g.fillRect(b.left + i * step + gap / 2, b.top + b.h - bh, step - gap, bh);
    if (i % every === 0) { g.fillStyle = "#444"; g.fillText(bar.label, b.left + i * step + step / 2 - 6 * SCALE, b.top + b.h + 12 * SCALE); }
  });
}

function showFinal(s) {
  const box = document.getElementById("final"), evals = s.evals || [];
  if (s.phase !== "finished") { box.hidden = true; return; }
  const sum = s.summary || {}, lastEval = evals.length ? evals[evals.length - 1] : {};
  const accuracy = sum.accuracy !== undefined ? sum.accuracy : lastEval.accuracy;
  const seconds = sum.wall_s !== undefined ? sum.wall_s : lastEval.time;
  const parts = ["finished"];
  if (accuracy !== undefined && accuracy !== null) parts.push("final accuracy " + pct(accuracy));
  if (seconds !== undefined && seconds !== null) parts.push(fmt(seconds, 1) + " s");
  const samples = sum.samples !== undefined ? sum.samples : (s.stats || {}).samples;
  if (samples !== undefined) parts.push(fmt(samples) + " samples");
  const updates = sum.updates !== undefined ? sum.updates : (s.stats || {}).updates;
  if (updates !== undefined) parts.push(fmt(updates) + " updates");
  if (sum.staleness_mean !== undefined && sum.staleness_mean !== null)
    parts.push("staleness mean " + fmt(sum.staleness_mean) + " max " + fmt(sum.staleness_max));
  box.hidden = false;
  box.textContent = parts.join(" · ");
  box.dataset.accuracy = accuracy === undefined || accuracy === null ? "" : String(accuracy);
}

function showStatus(s, gone) {
  const status = document.getElementById("status");
  const words = { connecting: s.notice || "connecting...", live: "live", stopping: "stopping",
    finished: "finished", lost: s.notice || "no answer from the server: " + (s.error || "") };
  status.textContent = s.phase === "finished" ? "finished" : gone ? "the dashboard has stopped (its run ended)" : words[s.phase] || s.phase;
  status.className = gone && s.phase !== "finished" ? "lost" : s.phase;
  document.body.dataset.phase = s.phase;
}

function render(s) {
  last = s;
  document.getElementById("connect").textContent = s.connect;
  showStatus(s, false);
  showFinal(s);
  document.body.dataset.seq = s.seq;
  const evals = s.evals || [];
  document.body.dataset.evals = evals.length;
  const lastEval = evals.length ? evals[evals.length - 1] : null;
  setValue("stat-accuracy", lastEval && lastEval.accuracy, lastEval ? (100 * lastEval.accuracy).toFixed(2) + " %" : "-");
  lineChart("chart-accuracy", evals.map(e => [e.time, e.accuracy]), "test accuracy vs time", "seconds", 0, 1, pct);
  const workers = s.workers || [];
  barChart("chart-contribution", workers.map(w => ({ label: String(w.rank), value: w.samples,
    colour: AGENT_COLOURS[w.agent] || "#ff7f0e" })),
    PROJECTOR ? "samples per worker (blue: NumPy)" : "samples per worker (blue: NumPy, orange: browser)", "rank");
  barChart("chart-staleness", (s.staleness_histogram || []).map((n, tau, all) => ({
    label: tau === all.length - 1 && tau >= 30 ? "30+" : String(tau), value: n, colour: "#2ca02c" })),
    "pushes by staleness", "staleness tau");
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
  const histograms = s.labels && s.labels.histograms;
  const head = document.getElementById("labels-head");
  head.hidden = !histograms;
  if (histograms) head.textContent = "labels 0-9 (" + s.labels.partition + ")";
  const body = document.querySelector("#workers tbody");
  body.replaceChildren(...workers.map(w => {
    const tr = document.createElement("tr"); tr.dataset.rank = w.rank;
    const cells = [["rank", w.rank, w.rank], ["agent", w.agent, w.agent], ["host", w.host, w.host || "-"],
      ["state", w.state, w.state], ["steps", w.steps, fmt(w.steps)], ["samples", w.samples, fmt(w.samples)],
      ["samples_per_s", w.samples_per_s, fmt(w.samples_per_s, 0)], ["steps_per_s", w.steps_per_s, fmt(w.steps_per_s, 1)],
      ["behind", w.behind, fmt(w.behind)], ["staleness_mean", w.staleness_mean, fmt(w.staleness_mean)],
      ["staleness_max", w.staleness_max, fmt(w.staleness_max)], ["scale_mean", w.scale_mean, fmt(w.scale_mean, 3)],
      ["bytes_in", w.bytes_in, fmtBytes(w.bytes_in)], ["bytes_out", w.bytes_out, fmtBytes(w.bytes_out)]];
    for (const [key, value, text] of cells) {
      const td = document.createElement("td"); td.dataset.key = key; td.dataset.value = value; td.textContent = text;
      if (key === "state") td.className = value;
      if (MINOR_COLUMNS.has(key)) td.classList.add("minor");
      tr.appendChild(td);
    }
    const counts = histograms && histograms[w.rank];
    if (counts) {
      const td = document.createElement("td"); td.dataset.key = "labels"; td.dataset.value = counts.join(" ");
      td.textContent = labelBars(counts); td.title = counts.map((n, c) => c + ": " + n).join(", ");
      td.className = "labels"; tr.appendChild(td);
    }
    tr.dataset.pushes = w.pushes;
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
events.onerror = () => { if (last && events.readyState !== EventSource.OPEN) showStatus(last, true); };
window.addEventListener("resize", () => last && render(last));
</script></body></html>
"""
