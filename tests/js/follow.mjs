// follow.js's verdict on hello configs: node follow.mjs '[{"config": ..., "engine": ...,
// "asked": ...}, ...]' prints a JSON list of reasons (null where the page can follow).
import { cannotFollow } from "../../minips/classroom/web/static/follow.js";

const cases = JSON.parse(process.argv[2]);
console.log(JSON.stringify(cases.map((c) => cannotFollow(c.config, { name: c.engine }, c.asked || {}))));
