// The partition of docs/model.md §4.2 in JavaScript (static/partition.js), for
// tests/test_data_partition.py: reads labels.bin (uint8, training order) and cases.json
// ([{seed, world_size, partition}]), prints one JSON line per case: the owner of each example.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { owners } from "../../minips/classroom/web/static/partition.js";

const dir = process.argv[2];
const labels = new Uint8Array(readFileSync(join(dir, "labels.bin")));
const cases = JSON.parse(readFileSync(join(dir, "cases.json"), "utf8"));
for (const c of cases) {
  console.log(JSON.stringify(Array.from(owners(labels, c.world_size, c.partition, c.seed))));
}
