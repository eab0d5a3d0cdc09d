// The browser worker, run in a Web Worker so the page stays responsive: the same loop as
// minips/worker/worker.py (docs/model.md §4.4, docs/protocol.md §12). hello -> download my
// shard -> pull -> per batch {forward, backward, push (+ VSGD samples) with the pull in its
// reply} -> bye. The push carries `pull_since`, so the pull's parameters come back in the
// push's reply: one round trip per step, as the NumPy worker (docs/protocol.md §5.3).
// Gradients and parameters travel by the run's plan (transmit.js); a page that cannot follow
// the run says bye with its reason at once (follow.js). It posts {type: "status", status} to
// the page after every step and {type: "error", message, code, closeCode} (the server's
// error code, the WebSocket's close code: words.js explains them).

import { bestEngine, jsEngine } from "./engine.js";
import { cannotFollow } from "./follow.js";
import { argmaxRows, buildModel, softmaxCrossEntropy } from "./nn.js";
import { Sampler } from "./sampling.js";
import { StepSender, applyPull } from "./transmit.js";
import { decodeMessage, encodeMessage } from "./wire.js";
import { epochOrder, normalise, parseIdx } from "./data.js";
import { extraSeconds, speedSchedule } from "./speeds.js";
import { fetchShard } from "./partition.js";

// computeSeconds: forward + backward; commSeconds: push + pull (encoding, the round trips,
// decoding, copying the parameters in), both summed over the steps (as the NumPy worker's
// report's compute_s and comm_s).
const status = { state: "starting", steps: 0, samples: 0, staleness: [], accuracy: null,
  computeSeconds: 0, commSeconds: 0 };

// With ?stamps=1 each step's messaging is stamped, in ms on the wall clock (comparable with
// the gateway's time.time()): start, encode, sent, arrived, decoded, applied; the last
// status holds them all (tools/profile_messaging.py reads them beside the gateway's).
const mark = (stamp, key) => stamp && (stamp[key] = performance.timeOrigin + performance.now());

function report(fields) {
  Object.assign(status, fields);
  const recent = status.staleness.slice(-50);
  postMessage({
    type: "status",
    status: {
      ...status,
      staleness: undefined,
      stalenessMean: recent.length ? recent.reduce((a, b) => a + b, 0) / recent.length : null,
      stalenessMax: status.staleness.length ? Math.max(...status.staleness) : null,
    },
  });
}

/** This page cannot do what the run asks; said to the server in its bye (follow.js). */
class RefusedError extends Error {
  constructor(reason) {
    super(`this page cannot follow this run: ${reason}`);
    this.code = "cannot_follow";
  }
}

class ServerError extends Error {
  constructor(code, reason) {
    super(`server refused the request (${code}): ${reason}`);
    this.code = code;
  }
}

/** The WebSocket closed (by the gateway, or the teacher's computer went away). */
class ClosedError extends Error {
  constructor(code, reason) {
    super(`the connection closed (code ${code}${reason ? `: ${reason}` : ""})`);
    this.closeCode = code;
  }
}

/** One WebSocket to the gateway; request() sends and waits for the reply with its rid. */
class Connection {
  constructor(url, timeoutMs, retries, stamped = false) {
    Object.assign(this, { url, timeoutMs, retries, rid: 0, waiting: null, outgoing: null });
    this.stamp = stamped ? {} : null; // the last request's stamps (see `mark`)
  }

  open() {
    return new Promise((resolve, reject) => {
      this.ws = new WebSocket(this.url);
      this.ws.binaryType = "arraybuffer";
      this.ws.onopen = () => resolve();
      this.ws.onerror = () => reject(Object.assign(new Error(`cannot connect to ${this.url}`), { unreachable: true }));
      this.ws.onclose = (event) => {
        this.closed = new ClosedError(event.code, event.reason);
        if (this.waiting) this.waiting.reject(this.closed);
      };
      this.ws.onmessage = (event) => {
        mark(this.stamp, "arrived");
        const reply = decodeMessage(event.data);
        mark(this.stamp, "decoded");
        if (this.waiting && reply.header.rid === this.waiting.rid) this.waiting.resolve(reply);
        // else: a late reply to an attempt given up on (protocol.md §8): dropped
      };
    });
  }

  /** Send header + arrays, wait for the reply; resend with a new rid after a timeout. */
  async request(header, arrays = []) {
    for (let attempt = 0; attempt <= this.retries; attempt++) {
      const rid = ++this.rid;
      if (this.closed) throw this.closed;
      const reply = await new Promise((resolve, reject) => {
        const timer = setTimeout(() => resolve(null), this.timeoutMs);
        const done = (fn) => (value) => {
          clearTimeout(timer);
          this.waiting = null;
          fn(value);
        };
        this.waiting = { rid, resolve: done(resolve), reject: done(reject) };
        // send() copies the bytes, so the next request may reuse the same buffer
        mark(this.stamp, "encode");
        const message = encodeMessage({ ...header, rid }, arrays, this.outgoing);
        this.outgoing = message.buffer;
        this.ws.send(message);
        mark(this.stamp, "sent");
      });
      if (reply === null) continue; // timed out: try again (a push keeps its seq)
      if (reply.header.op === "error") throw new ServerError(reply.header.code, reply.header.reason);
      return reply;
    }
    throw new Error(`no reply to ${header.op} after ${this.retries + 1} attempts`);
  }

  close() {
    this.ws.close();
  }
}

async function fetchBytes(url) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: ${(await response.text()).trim()}`);
  return response.arrayBuffer();
}

/** Examples `indices` of (images, labels) as a batch tensor (B, 1, 28, 28) and labels. */
function gather(x, labels, indices) {
  const per = 784;
  const data = new Float32Array(indices.length * per);
  const y = new Int32Array(indices.length);
  indices.forEach((idx, i) => {
    data.set(x.subarray(idx * per, (idx + 1) * per), i * per);
    y[i] = labels[idx];
  });
  return { x: { data, shape: [indices.length, 1, 28, 28] }, y };
}

function accuracy(model, test) {
  let correct = 0;
  for (let start = 0; start < test.n; start += 100) {
    const idx = Array.from({ length: Math.min(100, test.n - start) }, (_, i) => start + i);
    const { x, y } = gather(test.x, test.labels, idx);
    const predicted = argmaxRows(model.forward(x, false));
    predicted.forEach((p, i) => (correct += p === y[i] ? 1 : 0));
  }
  return correct / test.n;
}

/**
 * Two passes on a batch of zeros before training: the WebAssembly engine sizes its memory
 * on the first, and the browser compiles the hot loops to optimised code, so the first
 * steps are not several times slower than the rest (their gradients would be late, and
 * staler). The gradients are overwritten by the first real step.
 */
function warmUp(model, batchSize) {
  const zeros = { data: new Float32Array(batchSize * 784), shape: [batchSize, 1, 28, 28] };
  for (let pass = 0; pass < 2; pass++) {
    const { dlogits } = softmaxCrossEntropy(model.forward(zeros, true), new Int32Array(batchSize));
    model.backward(dlogits);
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function train(options) {
  const { base, workerId } = options;
  const wsUrl = base.replace(/^http/, "ws") + "ws";
  const conn = new Connection(wsUrl, options.timeoutMs || 60000, 3, options.stamps);
  const stamps = [];
  await conn.open();
  const info = { role: "worker", agent: "browser", ua: navigator.userAgent.slice(0, 200) };
  if (options.host) info.host = options.host;
  const helloHeader = { op: "hello", worker: workerId, info };
  let hello;
  try {
    hello = await join(conn, helloHeader);
  } catch (err) {
    if (err.code !== "stopping") throw err;
    report({ state: "ended", outcome: "ended before joining" });
    return conn.close();
  }
  // Requests that need registration say hello again once if the server declared us dead.
  const workerRequest = async (header, arrays) => {
    try {
      return await conn.request(header, arrays);
    } catch (err) {
      if (err.code !== "unknown_worker") throw err;
      await conn.request(helloHeader);
      return conn.request(header, arrays);
    }
  };

  const config = hello.config;
  const [rank, worldSize] = [hello.rank, hello.world_size];
  // The kernels on WebAssembly SIMD where this browser has it, unless ?engine=js asks for
  // the plain loops.
  const fetchStatic = (name) => fetchBytes(new URL(name, import.meta.url));
  const engine = options.engine === "js" ? jsEngine : await bestEngine(fetchStatic);
  const refusal = cannotFollow(config, engine, options);
  if (refusal) {
    // `finished: false`: the rank is free for a browser that can (protocol.md §5.6)
    await conn.request({ op: "bye", worker: helloHeader.worker, finished: false, refused: refusal.slice(0, 256) });
    conn.close();
    throw new RefusedError(refusal);
  }
  const resumed = resumeFrom(options.resume, hello);
  report({ workerId: helloHeader.worker, steps: resumed.steps, samples: resumed.samples });
  const rule = config.rule || { name: "asgd" };
  const slowdown = (config.hetero || [])[rank] || 1;
  const speeds = speedSchedule(config.hetero_schedule, slowdown, config.seed || 0, rank); // §4.5
  report({ state: "loading data", rank, worldSize, rule: rule.name, model: config.model.name,
    dataset: config.dataset, slowdown, version: hello.version });

  const dataUrl = `${base}data/${config.dataset}`;
  const meta = JSON.parse(new TextDecoder().decode(await fetchBytes(`${dataUrl}/info`)));
  const { images, labels } = await fetchShard(fetchBytes, dataUrl, config, rank, worldSize);
  const x = normalise(images.data, meta.mean, meta.std);
  const testImages = parseIdx(await fetchBytes(`${dataUrl}/test/images`));
  const testLabels = parseIdx(await fetchBytes(`${dataUrl}/test/labels`)).data;
  const nTest = Math.min(options.evalExamples || 500, testLabels.length);
  const test = {
    n: nTest,
    x: normalise(testImages.data.subarray(0, nTest * 784), meta.mean, meta.std),
    labels: testLabels,
  };

  const model = buildModel(config.model, engine);
  warmUp(model, config.batch_size);
  const sampler = rule.name === "vsgd" ? new Sampler(rule.rho, rule.min_samples) : null;
  const sender = new StepSender(model, config.plan);
  const applyParams = (reply) => applyPull(model, reply);
  let reply = await workerRequest({ op: "pull", worker: workerId, since: null });
  applyParams(reply);
  let version = reply.header.version;
  let stop = reply.header.stop;
  report({ state: "training", shard: labels.length, version, engine: engine.name });

  const batchSize = config.batch_size;
  const started = performance.now();
  let [seq, lastEval, skip] = [0, -Infinity, resumed.steps];
  outer: for (let epoch = 0; epoch < config.epochs && !stop; epoch++) {
    const order = epochOrder(config.seed || 0, rank, epoch, labels.length); // model.md §4.3
    for (let start = 0; start < order.length; start += batchSize) {
      if (skip > 0 && skip--) continue; // trained before a reload: the same order goes on
      const batch = gather(x, labels, order.subarray(start, start + batchSize));
      const tick = performance.now();
      const { loss, dlogits } = softmaxCrossEntropy(model.forward(batch.x, true), batch.y);
      model.backward(dlogits);
      const compute = performance.now() - tick;
      status.computeSeconds += compute / 1000;
      const extra = extraSeconds(speeds, status.steps, compute / 1000); // a slower machine
      if (extra > 0) await sleep(extra * 1000);

      const sending = performance.now();
      mark(conn.stamp, "start");
      const params = model.params;
      const { parts: arrays, base } = sender.step(version); // the gradients due, encoded
      if (sampler) {
        // The parameters are still those of the last pull: the values the gradient was
        // computed at (protocol.md §6.4).
        for (const [name] of model.grads) {
          const values = sampler.values(name, params.get(name).data);
          arrays.push({ name: `extra/sample/${name}`, shape: [values.length], data: values });
        }
      }
      const pushHeader = { op: "push", worker: workerId, seq: seq++, base, last: true,
        samples: batch.y.length, pull_since: version };
      reply = await workerRequest(pushHeader, arrays);
      const pushed = reply.header; // the push's answer and the pull's fields (§5.3)
      if (pushed.stop && !pushed.applied) { // arrived after the run stopped: not counted
        stop = true;
        break outer;
      }
      status.staleness.push(pushed.staleness);
      applyParams(reply);
      if (mark(conn.stamp, "applied")) stamps.push({ ...conn.stamp });
      version = pushed.version;
      status.commSeconds += (performance.now() - sending) / 1000;
      const steps = status.steps + 1;
      const seconds = (performance.now() - started) / 1000;
      report({ steps, samples: status.samples + batch.y.length, epoch, loss, version,
        stepsPerSecond: (steps - resumed.steps) / seconds, computeMs: compute,
        lastStaleness: pushed.staleness });
      if (pushed.stop) {
        stop = true;
        break outer;
      }
      if (options.maxSteps && steps >= options.maxSteps) break outer;
      if (performance.now() - lastEval > (options.evalSeconds || 5) * 1000) {
        report({ accuracy: accuracy(model, test) });
        lastEval = performance.now();
      }
    }
  }
  report({ accuracy: accuracy(model, test), state: "finishing" });
  // Stopped before its shard's epochs were done (maxSteps, a stop): `finished: false`
  // frees its rank for a replacement (docs/protocol.md 5.6).
  const finished = status.samples >= config.epochs * labels.length;
  try {
    await conn.request({ op: "bye", worker: workerId, ...(finished ? {} : { finished: false }) });
  } catch (err) {
    if (err.code !== "unknown_worker") throw err; // already gone: nothing to leave
  }
  conn.close();
  report({ state: "done", ...(options.stamps ? { stamps } : {}), outcome: finished ? "finished" : stop ? "ended" : "stopped" });
}

/** hello, patient with `not_owner` and `full` for 4 s: right after a reload, or a tab
 * reopened after a crash, the gateway may still be saying the old page's bye, which frees
 * its seat (protocol.md §14.3). Still `not_owner` after that, this is a copy of a tab (the
 * same sessionStorage): it joins as a new worker; still `full`, the class is. */
async function join(conn, helloHeader) {
  for (let attempt = 0; ; attempt++) {
    try {
      return (await conn.request(helloHeader)).header;
    } catch (err) {
      if (!["not_owner", "full"].includes(err.code) || attempt >= 8) throw err;
      if (attempt === 5) helloHeader.worker = `${helloHeader.worker}-${attempt}${Date.now() % 1000}`;
      await sleep(500);
    }
  }
}

/** Where a reloaded page goes on: the steps it had trained, if it got its rank back in the
 * same run (the server's version has not gone back), else from the start. */
function resumeFrom(saved, hello) {
  const same = saved && saved.rank === hello.rank && saved.worldSize === hello.world_size
    && saved.version <= hello.version && saved.steps > 0;
  return same ? { steps: saved.steps, samples: saved.samples } : { steps: 0, samples: 0 };
}

onmessage = (event) => {
  if (event.data.type !== "start") return;
  train(event.data.options).catch((err) => {
    // No status report here: the page marks itself failed when the error comes, with its
    // reason, so a script reading window.minipsStatus never sees "failed" without "error".
    status.state = "failed";
    const { code, closeCode, unreachable } = err || {};
    postMessage({ type: "error", message: String(err && err.message ? err.message : err), code, closeCode, unreachable });
  });
};
