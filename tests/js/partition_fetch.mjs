// fetchShard (static/partition.js) against a fake gateway: prints "ok N" when the served
// shard is the page's own, the error's message when the gateway serves another.
// node partition_fetch.mjs good|bad
import { fetchShard, shardPositions } from "../../minips/classroom/web/static/partition.js";

const idx = (data, shape) => {
  const head = new Uint8Array(4 + 4 * shape.length);
  const view = new DataView(head.buffer);
  view.setUint8(2, 0x08);
  view.setUint8(3, shape.length);
  shape.forEach((n, i) => view.setUint32(4 + 4 * i, n));
  const out = new Uint8Array(head.length + data.length);
  out.set(head);
  out.set(data, head.length);
  return out.buffer;
};
const labels = Uint8Array.from({ length: 300 }, (_, j) => (j * 7) % 10);
const config = { partition: "dirichlet:0.2", seed: 4 };
const mine = shardPositions(labels, 1, 3, config.partition, config.seed);
const served = Uint8Array.from(mine, (j) => labels[j]);
if (process.argv[2] === "bad") served[0] = (served[0] + 1) % 10;
const gateway = {
  "/d/train/0/1/labels": idx(labels, [labels.length]),
  "/d/train/1/3/dirichlet:0.2/4/labels": idx(served, [served.length]),
  "/d/train/1/3/dirichlet:0.2/4/images": idx(new Uint8Array(served.length * 784), [served.length, 28, 28]),
};
const fetchBytes = async (url) => {
  if (!(url in gateway)) throw new Error(`no ${url}`);
  return gateway[url];
};
try {
  const shard = await fetchShard(fetchBytes, "/d", config, 1, 3);
  console.log(`ok ${shard.labels.length} ${shard.images.shape[0]}`);
} catch (err) {
  console.log(err.message);
}
