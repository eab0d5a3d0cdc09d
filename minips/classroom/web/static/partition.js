// Which training examples each worker gets (docs/model.md §4.2, "Partitions"): the twin of
// minips/data/sharding.py, integer arithmetic on SplitMix64 outputs, so a browser computes
// the very partition the Python worker does. `labels` is the training set in training order.
import { parseIdx, shuffle, splitmix64 } from "./data.js";

const MASK64 = (1n << 64n) - 1n;
const ALPHA_SCALE = 1000000;
const MAX_ALPHA = 10000;
const N_CLASSES = 10;

/** "iid" | "dirichlet:ALPHA" | "shards:K" -> {kind, alpha (millionths), k}; throws otherwise. */
export function parsePartition(text) {
  if (text === "iid") return { kind: "iid" };
  let match = /^dirichlet:(\d+)(?:\.(\d{1,6}))?$/.exec(text);
  if (match) {
    const alpha = Number(match[1]) * ALPHA_SCALE + Number((match[2] || "").padEnd(6, "0"));
    if (!(alpha > 0 && alpha <= MAX_ALPHA * ALPHA_SCALE)) {
      throw new Error(`--partition ${text}: ALPHA must be in (0, ${MAX_ALPHA}]`);
    }
    return { kind: "dirichlet", alpha };
  }
  match = /^shards:(\d{1,6})$/.exec(text);
  if (match && Number(match[1]) >= 1) return { kind: "shards", k: Number(match[1]) };
  throw new Error(`bad --partition ${JSON.stringify(text)}: iid, dirichlet:ALPHA or shards:K`);
}

/** The partition's SplitMix64 seed P = seed*1000 - 1 (mod 2^64). */
export function partitionStream(seed) {
  return (BigInt(seed) * 1000n - 1n) & MASK64;
}

/** The worker of every training position (Int32Array of labels.length). */
export function owners(labels, worldSize, text, seed) {
  const part = parsePartition(text);
  const n = labels.length;
  if (worldSize < 1 || worldSize > n) throw new Error(`cannot split ${n} examples among ${worldSize} workers`);
  if (part.kind === "iid") {
    const out = new Int32Array(n);
    for (let r = 0; r < worldSize; r++) {
      out.fill(r, Math.floor((r * n) / worldSize), Math.floor(((r + 1) * n) / worldSize));
    }
    return out;
  }
  if (part.kind === "dirichlet") return urnOwners(labels, worldSize, part.alpha, partitionStream(seed));
  return shardOwners(labels, worldSize, part.k, partitionStream(seed));
}

/** Polya urn per class: example j of class c goes to the first w with u < the running sum of
 *  (A + 10^6 k_cw), u = (key_P(j) * (W*A + 10^6 m_c)) >> 64 (all below 2^53: exact). */
function urnOwners(labels, worldSize, alpha, stream) {
  const keys = splitmix64(stream, labels.length);
  const counts = Array.from({ length: N_CLASSES }, () => new Array(worldSize).fill(0));
  const drawn = new Array(N_CLASSES).fill(0);
  const out = new Int32Array(labels.length);
  for (let j = 0; j < labels.length; j++) {
    const label = labels[j];
    const total = worldSize * alpha + ALPHA_SCALE * drawn[label];
    const u = Number((keys[j] * BigInt(total)) >> 64n);
    const row = counts[label];
    let [acc, w] = [0, -1];
    while (acc <= u) {
      w += 1;
      acc += alpha + ALPHA_SCALE * row[w];
    }
    row[w] += 1;
    drawn[label] += 1;
    out[j] = w;
  }
  return out;
}

/** Shards per label: 1 per present label, each further one to the largest n_c / s_c. */
export function shardSizes(classCounts, nShards) {
  const shards = classCounts.map((n) => (n ? 1 : 0));
  const extra = nShards - shards.reduce((a, b) => a + b, 0);
  for (let t = 0; t < extra; t++) {
    let best = -1;
    for (let c = 0; c < shards.length; c++) {
      if (shards[c] && (best < 0 || classCounts[c] * shards[best] > classCounts[best] * shards[c])) best = c;
    }
    shards[best] += 1;
  }
  return shards;
}

/** W*K one-label shards (label ascending, then training order) dealt by shuffle(P, W*K). */
function shardOwners(labels, worldSize, k, stream) {
  const nShards = worldSize * k;
  const counts = new Array(N_CLASSES).fill(0);
  for (const label of labels) counts[label] += 1;
  const present = counts.filter((c) => c).length;
  if (nShards < present || nShards > labels.length) {
    throw new Error(`shards:${k} with ${worldSize} workers: need labels <= workers * K <= examples`);
  }
  const deal = shuffle(stream, nShards);
  const shardOwner = new Int32Array(nShards);
  for (let i = 0; i < nShards; i++) shardOwner[deal[i]] = Math.floor(i / k);
  const out = new Int32Array(labels.length);
  const sizes = shardSizes(counts, nShards);
  let first = 0;
  for (let label = 0; label < N_CLASSES; label++) {
    const positions = [];
    for (let j = 0; j < labels.length; j++) if (labels[j] === label) positions.push(j);
    const [n, pieces] = [positions.length, sizes[label]];
    for (let i = 0; i < pieces; i++) {
      const [from, to] = [Math.floor((i * n) / pieces), Math.floor(((i + 1) * n) / pieces)];
      for (let p = from; p < to; p++) out[positions[p]] = shardOwner[first + i];
    }
    first += pieces;
  }
  return out;
}

/** The training positions of worker `rank`, ascending (Int32Array). */
export function shardPositions(labels, rank, worldSize, text, seed) {
  const who = owners(labels, worldSize, text, seed);
  const out = [];
  for (let j = 0; j < who.length; j++) if (who[j] === rank) out.push(j);
  return Int32Array.from(out);
}

/**
 * This worker's shard from the gateway (protocol.md §14.1): {images, labels}, IDX parsed.
 * Under a label-skewing partition the page computes its own examples from the whole
 * training set's labels and checks that the gateway's shard is exactly them.
 */
export async function fetchShard(fetchBytes, dataUrl, config, rank, worldSize) {
  const partition = config.partition || "iid";
  let url = `${dataUrl}/train/${rank}/${worldSize}`;
  if (partition === "iid") {
    const images = parseIdx(await fetchBytes(`${url}/images`));
    return { images, labels: parseIdx(await fetchBytes(`${url}/labels`)).data };
  }
  const seed = config.seed || 0;
  const all = parseIdx(await fetchBytes(`${dataUrl}/train/0/1/labels`)).data;
  const mine = shardPositions(all, rank, worldSize, partition, seed);
  url += `/${partition}/${seed}`;
  const images = parseIdx(await fetchBytes(`${url}/images`));
  const labels = parseIdx(await fetchBytes(`${url}/labels`)).data;
  if (labels.length !== mine.length || labels.some((y, i) => y !== all[mine[i]])) {
    throw new Error(`the gateway's shard of --partition ${partition} is not the one this page computes`);
  }
  return { images, labels };
}
