// A speculative sampler for Node, checked against npspec's vectors with nothing but node's standard library.
//
// Written from npspec/testing/VECTORS.md alone (no npspec, no packages): what an engine in another language
// would write. The round is Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding",
// Algorithm 1, with its uniforms injected in the layout of VECTORS.md. Letters are Leviathan's: p the target's
// row, q the draft's. Checks (one FAIL line per failing case, then "N failures"; exit 1 if any, 2 on misuse):
//   * warp:  this file's warping, in exact BigInt fractions, gives every case's *_warped rows exactly;
//   * probe: one draft x, u_test and u_final given: the decision and the token are the vector's;
//   * round: whole rounds from the raw rows and the warping, uniforms given: drafts, accepted count, token;
//   * law:   first_round_law and output_law of `cases` and `position_cases`, exactly: the sampler is run once
//            per cell of its uniforms' decision edges and the outcomes weighed in fractions (see exactLaws);
//   * exact-match, traversal: the trials of two more verifiers (the engines' strict rule; Weng et al. 2025's
//            traversal of a tree from the leaves up), decided in exact fractions, and the traversal round law's
//            expected kept drafts against its listed value;
//   * --statistical adds the same laws by sampling, as `procedure` says (20,000 generations per case,
//            Pearson's chi-square, pooled cells): about two seconds; a consumer that cannot enumerate does this.
// Usage: node client.mjs VECTORS.json [--bug NAME] [--statistical]
// Planted bugs (--bug), each of which the exact sections catch:
//   non-strict        u <= p/q instead of u < p/q: keeps a token the target never emits when u = 0
//   bonus-from-draft  the bonus token drawn from the draft's row q_gamma instead of p_gamma
//   reused-uniform    the draft's own uniform u[i] reused for its test instead of u[g + i]
//   one-sided-warp    top-k / top-p applied to q only; p tested unwarped
//   traversal-top-down  a child's weight restarts at min(1, p/q) instead of carrying the path's weight
import { readFileSync } from "node:fs";
import process from "node:process";

const BUGS = ["non-strict", "bonus-from-draft", "reused-uniform", "one-sided-warp", "traversal-top-down"];

// ---- Exact fractions (BigInt): the vectors write probabilities as "n/d" or "n" ----

function gcd(a, b) {
  a = a < 0n ? -a : a;
  while (b) [a, b] = [b, a % b];
  return a;
}

function frac(n, d = 1n) { // BigInt n, d (d != 0) -> {n, d} in lowest terms, d > 0
  if (d < 0n) [n, d] = [-n, -d];
  const g = gcd(n, d) || 1n;
  return { n: n / g, d: d / g };
}

const parse = (s) => { const [n, d = "1"] = String(s).split("/"); return frac(BigInt(n), BigInt(d)); };
const add = (a, b) => frac(a.n * b.d + b.n * a.d, a.d * b.d);
const sub = (a, b) => frac(a.n * b.d - b.n * a.d, a.d * b.d);
const div = (a, b) => frac(a.n * b.d, a.d * b.n);
const cmp = (a, b) => { const x = a.n * b.d - b.n * a.d; return x < 0n ? -1 : x > 0n ? 1 : 0; };
const same = (a, b) => cmp(a, b) === 0;
const ZERO = frac(0n), ONE = frac(1n);
const sum = (row) => row.reduce(add, ZERO);
const normalise = (row) => { const t = sum(row); return row.map((v) => div(v, t)); };

function toDouble(f) { // the double nearest f (ties to even): exact division of BigInts, then one rounding
  if (f.n === 0n) return 0;
  const neg = f.n < 0n, n = neg ? -f.n : f.n;
  let shift = 80 - (n.toString(2).length - f.d.toString(2).length); // a quotient of at least 79 bits
  const num = shift >= 0 ? n << BigInt(shift) : n, den = shift >= 0 ? f.d : f.d << BigInt(-shift);
  let q = num / den;
  if (num % den !== 0n) q |= 1n; // sticky bit: far below the 53 kept, so Number() rounds as the exact value would
  const x = Number(q) * 2 ** -shift;
  return neg ? -x : x;
}

// ---- Warping (VECTORS.md, "Warping"): applied to both rows alike ----

function topK(row, k) { // keep every entry >= the k-th largest (ties at the k-th kept); 0 = off
  if (!k || k >= row.length) return row;
  const kth = [...row].sort((a, b) => cmp(b, a))[k - 1];
  return normalise(row.map((v) => (cmp(v, kth) >= 0 ? v : ZERO)));
}

function topP(row, topp) { // drop the longest ascending prefix (ties by id) with mass <= 1 - top_p, never the top
  if (cmp(topp, ONE) >= 0) return row;
  const order = row.map((v, i) => i).sort((i, j) => cmp(row[i], row[j]) || i - j);
  const out = [...row];
  let mass = ZERO;
  for (const i of order.slice(0, -1)) {
    mass = add(mass, row[i]);
    if (cmp(mass, sub(ONE, topp)) > 0) break;
    out[i] = ZERO;
  }
  return normalise(out);
}

function warp(raw, w) { // raw row of fractions, {temperature, top_k, top_p} -> the warped row, summing to 1
  const row = normalise(raw);
  if (w.temperature === 0) { // one-hot on the argmax, ties to the lowest id
    const top = row.reduce((best, v, i) => (cmp(v, row[best]) > 0 ? i : best), 0);
    return row.map((v, i) => (i === top ? ONE : ZERO));
  }
  return topP(topK(row, w.top_k), parse(w.top_p));
}

// ---- The sampler: Leviathan et al. 2023, Algorithm 1, on double rows, uniforms injected ----

function draw(row, u) { // inverse CDF: the first id whose cumulative mass exceeds u * total
  const total = row.reduce((a, b) => a + b, 0);
  let cum = 0;
  for (let x = 0; x < row.length; x++) {
    cum += row[x];
    if (cum > u * total) return x;
  }
  return row.findLastIndex((v) => v > 0); // u * total rounded up to total: the last id with mass
}

function residual(p, q) { // norm(max(0, p - q)), or p when that has no mass (Algorithm 1's p'(x))
  const r = p.map((px, x) => Math.max(0, px - q[x]));
  const mass = r.reduce((a, b) => a + b, 0);
  return mass > 0 && Number.isFinite(mass) ? r.map((v) => v / mass) : p;
}

// Algorithm 1 rejects when r > p(x) / q(x), the same as keeping iff r < p(x) / q(x) for a continuous r; with
// u in [0, 1) only the strict test never keeps a token the target gives 0 (at u = 0), so VECTORS.md asks for it.
function keep(u, px, qx, bug) {
  return bug === "non-strict" ? u <= px / qx : u < px / qx;
}

// One round of g drafts. P, Q: g + 1 warped rows by position (Q[g] only a buggy bonus reads); u: 2g + 1
// uniforms, u[0:g] draw the drafts, u[g:2g] test them, u[2g] draws the correction or the bonus.
// Returns {drafts (all g), decided (the drafts that decided the round), accepted, token (null after an EOS)}.
function round(P, Q, u, g, eos, bug) {
  const drafts = Array.from({ length: g }, (_, i) => draw(Q[i], u[i])); // x_i ~ q_i
  for (let i = 0; i < g; i++) {
    const x = drafts[i], test = bug === "reused-uniform" ? u[i] : u[g + i];
    if (!keep(test, P[i][x], Q[i][x], bug)) // rejected at n = i: sample from the residual and stop
      return { drafts, decided: drafts.slice(0, i + 1), accepted: i, token: draw(residual(P[i], Q[i]), u[2 * g]) };
    if (x === eos) return { drafts, decided: drafts.slice(0, i + 1), accepted: i + 1, token: null };
  }
  const bonus = bug === "bonus-from-draft" ? Q[g] : P[g]; // every draft kept: one more token from p_g
  return { drafts, decided: drafts, accepted: g, token: draw(bonus, u[2 * g]) };
}

// The rows a sampler works with: raw fraction rows and the warping -> {P, Q} double rows by position.
function warpedRows(pRows, qRows, w, bug) {
  const pWarping = bug === "one-sided-warp" ? { ...w, top_k: 0, top_p: "1" } : w; // BUG: top-k/top-p on q only
  const P = pRows.map((r) => warp(r, pWarping).map(toDouble));
  const Q = qRows.map((r) => warp(r, w).map(toDouble));
  return { P, Q };
}

// ---- The checks ----

const fracs = (rows) => rows.map((r) => r.map(parse));

function checkWarps(vectors) {
  const failures = [];
  const one = (c) => [[c.p], [c.q], [c.p_warped], [c.q_warped]];
  const many = (c) => [c.p_rows, c.q_rows, c.p_warped_rows, c.q_warped_rows];
  const all = [...vectors.cases.map((c) => [c, one(c)]), ...[...vectors.position_cases, ...vectors.round_cases]
    .map((c) => [c, many(c)])];
  for (const [c, [p, q, pw, qw]] of all) {
    const got = [...fracs(p), ...fracs(q)].map((r) => warp(r, c.warping));
    const want = [...fracs(pw), ...fracs(qw)];
    const bad = got.findIndex((r, k) => !r.every((v, x) => same(v, want[k][x])));
    if (bad >= 0) failures.push(`warp ${c.name}: row ${bad} differs from the *_warped rows`);
  }
  return failures;
}

function checkProbes(vectors, bug) {
  const failures = [];
  for (const c of vectors.probe_cases) {
    const { p, q, x } = c; // binary64 rows, already warped
    const kept = keep(c.u_test, p[x], q[x], bug);
    const got = kept ? ["accept", x] : ["reject", draw(residual(p, q), c.u_final)];
    if (got[0] !== c.decision || got[1] !== c.token)
      failures.push(`probe ${c.name}: expected ${c.decision} ${c.token}, got ${got[0]} ${got[1]} (${c.checks})`);
  }
  return failures;
}

function checkRounds(vectors, bug) {
  const failures = [];
  for (const c of vectors.round_cases) {
    const { P, Q } = warpedRows(fracs(c.p_rows), fracs(c.q_rows), c.warping, bug);
    const show = (r) => `drafts [${r.drafts}] accepted ${r.accepted} token ${r.token}`;
    const bad = c.trials.map((t, i) => [i, t, round(P, Q, t.uniforms, c.gamma, null, bug)])
      .filter(([, t, r]) => show(r) !== show(t));
    if (bad.length) {
      const [i, t, r] = bad[0];
      failures.push(`round ${c.name}: ${bad.length} of ${c.trials.length} trials differ, e.g. trial ${i}: ` +
        `expected ${show(t)}, got ${show(r)}`);
    }
  }
  return failures;
}

// ---- Exact laws: the sampler's law as a function of its uniforms, in fractions ----
// Inverse-CDF draws and the test u < p/q are constant between consecutive edges of their CDFs and ratios, so
// running the round once per cell of those edges (at the cell's midpoint) and weighting each outcome by the
// cell's volume gives its law exactly. The edges are those of the rows a correct round reads (the vectors'
// *_warped rows): a bug that reads other rows or uniforms gets only an approximation of its own law from the
// same midpoints, but one that differs from the vector's, which is all a check needs.

function edges(row) { // the cumulative sums of a fraction row, normalised (the last is 1)
  const out = [];
  let cum = ZERO;
  for (const v of normalise(row)) { cum = add(cum, v); out.push(cum); }
  return out;
}

function cells(points) { // fractions -> [{width, mid}] between the distinct ones in (0, 1), and 0 and 1
  const inside = points.filter((v) => cmp(v, ZERO) > 0 && cmp(v, ONE) < 0).sort(cmp);
  const cuts = [ZERO, ...inside.filter((v, i) => i === 0 || !same(v, inside[i - 1])), ONE];
  return cuts.slice(1).map((b, i) => ({ width: sub(b, cuts[i]), mid: toDouble(div(add(b, cuts[i]), frac(2n))) }));
}

function exactResidual(p, q) { // norm(max(0, p - q)) in fractions, or p when it has no mass
  const r = p.map((v, x) => (cmp(v, q[x]) > 0 ? sub(v, q[x]) : ZERO));
  return cmp(sum(r), ZERO) > 0 ? r : p;
}

function roundLaw(Pf, Qf, P, Q, g, eos, bug) { // rows at the round's positions -> Map(JSON outcome -> fraction)
  const axes = [
    ...Qf.slice(0, g).map((q) => cells(edges(q))), // u[0:g]: the drafts
    ...Qf.slice(0, g).map((q, i) => cells(q.flatMap((v, x) => (cmp(v, ZERO) > 0 ? [div(Pf[i][x], v)] : [])))),
    cells([...Pf.slice(0, g).flatMap((p, i) => edges(exactResidual(p, Qf[i]))), ...edges(Pf[g])]), // u[2g]
  ];
  const law = new Map(), u = [];
  const walk = (axis, weight) => {
    if (axis === axes.length) {
      const r = round(P, Q, u, g, eos, bug), key = JSON.stringify([r.decided, r.accepted, r.token]);
      law.set(key, add(law.get(key) ?? ZERO, weight));
      return;
    }
    for (const cell of axes[axis]) {
      u[axis] = cell.mid;
      walk(axis + 1, frac(weight.n * cell.width.n, weight.d * cell.width.d));
    }
  };
  walk(0, ONE);
  return law;
}

function exactLaws(c, P, Q, bug) { // -> {first_round_law, output_law}: Maps from JSON keys to fractions
  const Pf = fracs(c.p_warped_rows ?? [c.p_warped]), Qf = fracs(c.q_warped_rows ?? [c.q_warped]);
  const memo = new Map();
  const rows = (k, g, R) => Array.from({ length: g + 1 }, (_, i) => R[Math.min(k + i, R.length - 1)]);
  const roundAt = (k) => {
    const g = Math.min(c.gamma, c.max_new_tokens - k - 1);
    return roundLaw(rows(k, g, Pf), rows(k, g, Qf), rows(k, g, P), rows(k, g, Q), g, c.eos_token_id, bug);
  };
  const rest = (k) => { // Map(JSON ids emitted from k on -> fraction)
    if (k >= c.max_new_tokens) return new Map([["[]", ONE]]);
    if (memo.has(k)) return memo.get(k);
    const law = new Map();
    for (const [key, w] of roundAt(k)) {
      const [decided, accepted, token] = JSON.parse(key);
      const ids = [...decided.slice(0, accepted), ...(token === null ? [] : [token])];
      const ended = c.eos_token_id !== null && ids.includes(c.eos_token_id);
      for (const [tail, v] of ended ? [["[]", ONE]] : rest(k + ids.length)) {
        const all = JSON.stringify([...ids, ...JSON.parse(tail)]);
        law.set(all, add(law.get(all) ?? ZERO, frac(w.n * v.n, w.d * v.d)));
      }
    }
    memo.set(k, law);
    return law;
  };
  return { first_round_law: roundAt(0), output_law: rest(0) };
}

function checkExactLaws(vectors, bug) {
  const failures = [];
  const keys = { first_round_law: (e) => [e.drafted, e.accepted, e.token], output_law: (e) => e.ids };
  for (const c of [...vectors.cases, ...vectors.position_cases]) {
    const { P, Q } = warpedRows(fracs(c.p_rows ?? [c.p]), fracs(c.q_rows ?? [c.q]), c.warping, bug);
    const got = exactLaws(c, P, Q, bug);
    for (const [name, key] of Object.entries(keys)) {
      const want = new Map(c[name].map((e) => [JSON.stringify(key(e)), parse(e.probability)]));
      const seen = [...got[name]].filter(([, v]) => cmp(v, ZERO) > 0);
      const bad = [...want.keys(), ...seen.map(([k]) => k).filter((k) => !want.has(k))]
        .filter((k) => !same(got[name].get(k) ?? ZERO, want.get(k) ?? ZERO));
      if (bad.length) {
        const f = (v) => (v ? `${v.n}/${v.d}` : "0");
        failures.push(`law ${c.name} ${name}: ${bad.length} outcomes differ, e.g. ${bad[0]} has ` +
          `${f(got[name].get(bad[0]))}, the law ${f(want.get(bad[0]))}`);
      }
    }
  }
  return failures;
}

// ---- The statistical procedure (VECTORS.md, "The procedure") ----

function mulberry32(seed) { // a small seeded generator; two draws make one uniform double in [0, 1)
  const next = () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return (t ^ (t >>> 14)) >>> 0;
  };
  return () => ((next() >>> 5) * 67108864 + (next() >>> 6)) / 9007199254740992;
}

function generate(c, P, Q, random, bug) { // one generation: {first: the first round's outcome, out: the ids}
  const out = [];
  let first = null;
  while (out.length < c.max_new_tokens) {
    const k = out.length, g = Math.min(c.gamma, c.max_new_tokens - k - 1);
    const at = Array.from({ length: g + 1 }, (_, i) => Math.min(k + i, P.length - 1)); // the row after k + i ids
    const u = Array.from({ length: 2 * g + 1 }, random);
    const r = round(at.map((i) => P[i]), at.map((i) => Q[i]), u, g, c.eos_token_id, bug);
    first ??= JSON.stringify([r.decided, r.accepted, r.token]);
    out.push(...r.decided.slice(0, r.accepted), ...(r.token === null ? [] : [r.token]));
    const end = out.indexOf(c.eos_token_id);
    if (end >= 0) { out.length = end + 1; break; }
  }
  return { first, out: JSON.stringify(out) };
}

function chiSquare(counts, probs, n, minExpected) { // -> {stat, df, impossible}, cells below minExpected pooled
  const cells = [];
  let poolE = 0, poolO = 0;
  for (const [key, prob] of probs) {
    const e = n * prob, o = counts.get(key) ?? 0;
    if (e >= minExpected) cells.push([e, o]);
    else { poolE += e; poolO += o; }
  }
  if (poolE >= minExpected) cells.push([poolE, poolO]);
  else if (poolE > 0 && cells.length) { // merge the pool into the smallest cell
    const s = cells.reduce((m, cell, i) => (cell[0] < cells[m][0] ? i : m), 0);
    cells[s] = [cells[s][0] + poolE, cells[s][1] + poolO];
  }
  const impossible = [...counts].filter(([key]) => !probs.has(key)).reduce((a, [, v]) => a + v, 0);
  return { stat: cells.reduce((a, [e, o]) => a + (o - e) ** 2 / e, 0), df: cells.length - 1, impossible };
}

function checkSampledLaws(vectors, bug, seed = 1) {
  const proc = vectors.procedure, failures = [], random = mulberry32(seed);
  for (const c of [...vectors.cases, ...vectors.position_cases]) {
    const { P, Q } = warpedRows(fracs(c.p_rows ?? [c.p]), fracs(c.q_rows ?? [c.q]), c.warping, bug);
    const first = new Map(), output = new Map();
    for (let s = 0; s < proc.n_samples; s++) {
      const r = generate(c, P, Q, random, bug);
      first.set(r.first, (first.get(r.first) ?? 0) + 1);
      output.set(r.out, (output.get(r.out) ?? 0) + 1);
    }
    const laws = {
      first_round_law: [new Map(c.first_round_law.map((e) => [JSON.stringify([e.drafted, e.accepted, e.token]),
        toDouble(parse(e.probability))])), first],
      output_law: [new Map(c.output_law.map((e) => [JSON.stringify(e.ids), toDouble(parse(e.probability))])), output],
    };
    for (const [name, [probs, counts]] of Object.entries(laws)) {
      const { stat, df, impossible } = chiSquare(counts, probs, proc.n_samples, proc.min_expected);
      const critical = proc.critical_values[String(df)];
      if (impossible || (df >= 1 && stat > critical))
        failures.push(`sampled ${c.name} ${name}: chi-square ${stat.toFixed(1)} on ${df} df above ${critical}` +
          (impossible ? `, ${impossible} impossible outcomes` : ""));
    }
  }
  return failures;
}

// ---- Two more verifiers, in exact fractions (verification_conventions "exact_match" and "traversal") ----

const mul = (a, b) => frac(a.n * b.n, a.d * b.d);
const max0 = (a) => (a.n < 0n ? ZERO : a);
const min1 = (a) => (cmp(a, ONE) > 0 ? ONE : a);
const exactU = (u) => frac(BigInt(u * 2 ** 24), 2n ** 24n); // the trials' uniforms are multiples of 2^-24

function exactDraw(row, u) { // inverse CDF in fractions: the first id whose cumulative mass exceeds u * total
  const t = mul(exactU(u), sum(row));
  let cum = ZERO;
  for (let x = 0; x < row.length; x++) {
    cum = add(cum, row[x]);
    if (cmp(cum, t) > 0) return x;
  }
  throw new Error("u must be below 1");
}

function exactMatch(d, p, u) { // keep d_i while the target's own draw with u[g + i] equals it
  const g = d.length;
  for (let i = 0; i < g; i++) {
    const t = exactDraw(p, u[g + i]);
    if (t !== d[i]) return [i, t];
  }
  return [g, exactDraw(p, u[2 * g])];
}

function traversal(ids, parents, P, Q, u, bug) { // -> [kept node indices, token]
  const kids = new Map([[-1, []]]), depth = [];
  parents.forEach((parent, i) => {
    kids.get(parent).push(i);
    kids.set(i, []);
    depth.push(parent < 0 ? 0 : depth[parent] + 1);
  });
  const at = (rows, k) => rows[Math.min(k, rows.length - 1)];
  const visit = (node, w) => {
    let r = at(P, node < 0 ? 0 : depth[node] + 1);
    const removed = new Set();
    for (const c of kids.get(node)) {
      const q = normalise(at(Q, depth[c]).map((v, x) => (removed.has(x) ? ZERO : v)));
      const ratio = div(r[ids[c]], q[ids[c]]);
      const got = visit(c, min1(bug === "traversal-top-down" ? ratio : mul(w, ratio))); // BUG: ratio restarts
      if (got) return [[c, ...got[0]], got[1]];
      const z = r.map((v, x) => max0(sub(mul(w, v), q[x]))), mass = sum(z), den = add(sub(mass, w), ONE);
      w = den.n > 0n ? div(mass, den) : ONE;
      if (mass.n > 0n) r = z.map((v) => div(v, mass));
      removed.add(ids[c]);
    }
    return node < 0 || cmp(exactU(u[node]), w) < 0 ? [[], r] : null;
  };
  const [path, r] = visit(-1, ONE);
  return [path, exactDraw(r, u[ids.length])];
}

function checkVerifiers(vectors, bug) {
  const failures = [], key = (x) => JSON.stringify(x);
  for (const c of vectors.exact_match ?? []) {
    const p = c.p_warped.map(parse);
    const bad = c.trials.filter((t) => key(exactMatch(t.drafts, p, t.uniforms)) !== key([t.accepted, t.token]));
    if (bad.length) failures.push(`exact-match ${c.name}: ${bad.length} of ${c.trials.length} trials differ`);
  }
  for (const c of vectors.traversal ?? []) {
    const P = fracs(c.p_rows), Q = fracs(c.q_rows);
    const bad = c.trials.filter((t) => key(traversal(t.ids, t.parents, P, Q, t.uniforms, bug)) !==
      key([t.kept, t.token]));
    if (bad.length) failures.push(`traversal ${c.name}: ${bad.length} of ${c.trials.length} trials differ`);
    const kept = c.round_law.reduce((a, e) => add(a, mul(parse(e.probability), frac(BigInt(e.kept.length)))), ZERO);
    const total = sum(c.round_law.map((e) => parse(e.probability)));
    if (!same(total, ONE) || !same(kept, parse(c.expected_accepted.traversal)))
      failures.push(`traversal ${c.name}: round_law is not a law with the listed expected kept drafts`);
  }
  return failures;
}

function main(argv) {
  const [path] = argv, at = argv.indexOf("--bug"), bug = at >= 0 ? argv[at + 1] : null;
  if (!path || path.startsWith("--") || (bug !== null && !BUGS.includes(bug))) {
    console.error(`client.mjs: usage: node client.mjs VECTORS.json [--bug ${BUGS.join("|")}] [--statistical]`);
    return 2;
  }
  const vectors = JSON.parse(readFileSync(path, "utf8"));
  if (vectors.format !== "npspec-speculative-vectors" || vectors.version !== 2) {
    console.error("client.mjs: not npspec-speculative-vectors version 2");
    return 2;
  }
  const failures = [...checkWarps(vectors), ...checkProbes(vectors, bug), ...checkRounds(vectors, bug),
    ...checkExactLaws(vectors, bug), ...checkVerifiers(vectors, bug)];
  if (argv.includes("--statistical")) failures.push(...checkSampledLaws(vectors, bug));
  for (const line of failures) console.log(`FAIL ${line}`);
  console.log(`${failures.length} failures`);
  return failures.length ? 1 : 0;
}

process.exitCode = main(process.argv.slice(2));
