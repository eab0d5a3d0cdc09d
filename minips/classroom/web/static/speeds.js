// How slow a browser worker is at each step (docs/model.md §4.5): the same schedules and
// draws as minips/run/speeds.py, so a tab and a NumPy worker of one rank sleep alike.
const MASK64 = (1n << 64n) - 1n;
const SPEED_SALT = 0x5350454544n; // "SPEED": never the batch order's stream
const PARETO_CAP = 100; // the longest heavy-tailed step, in compute times
const FIELDS = { fixed: 0, fluctuate: 2, pareto: 2, away: 3 };

/** u_index of `stream` (a BigInt): (SplitMix64 output index >> 11) / 2^53, in [0, 1). */
export function uniform(stream, index) {
  let z = (stream + BigInt(index + 1) * 0x9e3779b97f4a7c15n) & MASK64;
  z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & MASK64;
  z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & MASK64;
  return Number((z ^ (z >> 31n)) >> 11n) / 2 ** 53;
}

/** One worker's schedule: `text` as hello's config.hetero_schedule gives it. */
export function speedSchedule(text, factor, seed, rank) {
  const [kind, ...fields] = (text || "fixed").split(":");
  if (!(kind in FIELDS) || fields.length !== FIELDS[kind]) throw new Error(`bad hetero_schedule ${text}`);
  const stream = ((BigInt(seed) * 1000n + BigInt(rank)) & MASK64) ^ SPEED_SALT;
  return { kind, args: fields.map(Number), factor, stream, rank };
}

/** Seconds to sleep after step `step` (from 0), whose compute took `compute` seconds. */
export function extraSeconds(schedule, step, compute) {
  const { kind, args, stream } = schedule;
  let slowdown = schedule.factor;
  if (kind === "fluctuate") {
    slowdown *= 1 + (args[1] - 1) * uniform(stream, Math.floor(step / args[0]));
  } else if (kind === "pareto" && uniform(stream, 2 * step) < args[1]) {
    const size = 1 - uniform(stream, 2 * step + 1); // in (0, 1]
    slowdown *= Math.min(size ** (-1 / args[0]), PARETO_CAP);
  }
  const away = kind === "away" && args[0] === schedule.rank && step === args[1];
  return Math.max(0, (slowdown - 1) * compute) + (away ? args[2] : 0);
}
