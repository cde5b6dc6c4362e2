"""A speculative sampler checked against npspec's vectors with nothing but json, random and VECTORS.md.

This file imports no npspec (tests/test_vectors.py runs it with `python -I`, in a subprocess, and checks its
imports): it is what an engine in another language would write from the spec. It holds a round written from
the paper, with the classic bugs as switches (--bug), and the three checks VECTORS.md describes:
  * probe_cases: one draft x, u_test and u_final given; the decision and the token must be the vector's;
  * round_cases: whole rounds, uniforms given in the layout u[0:g] drafts, u[g:2g] tests, u[2g] the last draw;
    the drafts, the accepted count and the token must be the vector's;
  * exact_match and traversal: trials of two more verifiers (the engines' strict rule; Weng et al. 2025's
    traversal of a tree, leaves up), uniforms given; the decisions must be the vector's;
  * --statistical: the laws of `cases` and `position_cases` (first_round_law, output_law) by sampling, as
    `procedure` says: n_samples generations, Pearson's chi-square with cells of expected count below
    min_expected pooled, failed when the statistic exceeds critical_values[df].
Usage: python client.py VECTORS.json [--bug NAME] [--statistical]. Prints one line per failure and a summary;
exit status 1 if anything failed.
"""

import json
import random
import sys

BUGS = ("non-strict", "unguarded-residual", "bonus-from-draft", "q-unwarped", "rows-off-by-one", "strict-on-draft",
        "traversal-weight-kept", "traversal-top-down")


def number(s):  # "n/d" or "n" -> float
    n, _, d = str(s).partition("/")
    return int(n) / int(d or 1)


def rows(strings):
    return [[number(v) for v in row] for row in strings]


def draw(row, u):  # inverse CDF: the first id whose cumulative mass exceeds u * total
    total, cum = sum(row), 0.0
    for x, v in enumerate(row):
        cum += v
        if cum > u * total:
            return x
    return max(x for x, v in enumerate(row) if v > 0)


class Sampler:
    def __init__(self, bug=None):
        self.bug = bug

    def keep(self, u, p_x, q_x):
        return u <= p_x / q_x if self.bug == "non-strict" else u < p_x / q_x

    def residual(self, p, q):
        r = [max(0.0, a - b) for a, b in zip(p, q)]
        mass = sum(r)
        if self.bug == "unguarded-residual" or mass > 0:
            return [v / mass for v in r]  # (unguarded: divides by 0)
        return list(p)

    def round(self, P, Q, Q_raw, u, g, eos=None):
        """One round over rows by position: (drafts decided, accepted, token or None after an accepted EOS)."""
        drafts = [draw(Q[i], u[i]) for i in range(g)]
        q_test = Q_raw if self.bug == "q-unwarped" else Q  # BUG: drafts from the warped q, the test given the raw one
        for i, d in enumerate(drafts):
            p_test = P[i + 1] if self.bug == "rows-off-by-one" and i + 1 < len(P) else P[i]
            if not self.keep(u[g + i], p_test[d], q_test[i][d]):
                return drafts[:i + 1], i, draw(self.residual(P[i], q_test[i]), u[2 * g])
            if d == eos:
                return drafts[:i + 1], i + 1, None
        bonus = Q[g] if self.bug == "bonus-from-draft" and g < len(Q) else P[g]  # BUG: the bonus from the draft
        return drafts, g, draw(bonus, u[2 * g])


def exact_match(d, P, u, g, bug=None):
    """The strict rule: keep d_i iff the target's own draw with u[g + i] equals it; (accepted, token)."""
    for i, x in enumerate(d):
        t = draw(P[i], u[g + i]) if bug != "strict-on-draft" else draw(P[i], u[i])  # BUG: the draft's uniform
        if t != x:
            return i, t
    return len(d), draw(P[len(d)], u[2 * g])


def traversal(ids, parents, P, Q, u, bug=None):
    """Traversal verification (verification_conventions["traversal"]): (kept node indices, token)."""
    kids, depth = {-1: []}, []
    for i, parent in enumerate(parents):
        kids.setdefault(parent, []).append(i)
        kids[i] = []
        depth.append(0 if parent < 0 else depth[parent] + 1)

    def row_at(rows, k):
        return rows[min(k, len(rows) - 1)]

    def visit(node, w):
        r, removed = list(row_at(P, 0 if node < 0 else depth[node] + 1)), []
        for c in kids[node]:
            q = [0.0 if x in removed else v for x, v in enumerate(row_at(Q, depth[c]))]
            q = [v / sum(q) for v in q]
            ratio = r[ids[c]] / q[ids[c]]
            got = visit(c, min(1.0, ratio if bug == "traversal-top-down" else w * ratio))  # BUG: ratio restarts at 1
            if got is not None:
                return [c] + got[0], got[1]
            z = [max(0.0, w * a - b) for a, b in zip(r, q)]
            mass = sum(z)
            if bug != "traversal-weight-kept":  # BUG: the weight not updated after a rejected child
                w = mass / (mass + 1 - w) if mass + 1 - w > 0 else 1.0
            r = [v / mass for v in z] if mass > 0 else r
            removed.append(ids[c])
        return ([], r) if node < 0 or u[node] < w else None

    path, r = visit(-1, 1.0)
    return path, draw(r, u[len(ids)])


def check_verifiers(sampler, vectors):
    """The exact_match and traversal trials: every decision must be the vector's."""
    failures = []
    for c in vectors.get("exact_match", []):
        P, Q = [[number(v) for v in c["p_warped"]]], [[number(v) for v in c["q_warped"]]]
        bad = sum(exact_match(t["drafts"], P * (len(t["drafts"]) + 1), t["uniforms"], len(t["drafts"]), sampler.bug)
                  != (t["accepted"], t["token"]) for t in c["trials"])
        if bad:
            failures.append(f"exact-match {c['name']}: {bad} of {len(c['trials'])} trials differ")
    for c in vectors.get("traversal", []):
        P, Q = rows(c["p_rows"]), rows(c["q_rows"])
        bad = sum(traversal(t["ids"], t["parents"], P, Q, t["uniforms"], sampler.bug) != (t["kept"], t["token"])
                  for t in c["trials"])
        if bad:
            failures.append(f"traversal {c['name']}: {bad} of {len(c['trials'])} trials differ")
    return failures


def check_probes(sampler, vectors):
    failures = []
    for c in vectors["probe_cases"]:
        p, q, x = c["p"], c["q"], c["x"]
        try:
            kept = sampler.keep(c["u_test"], p[x], q[x])
            got = ("accept", x) if kept else ("reject", draw(sampler.residual(p, q), c["u_final"]))
        except (ZeroDivisionError, ValueError) as e:
            got = ("raised", repr(e))
        if got != (c["decision"], c["token"]):
            failures.append(f"probe {c['name']}: expected {c['decision']} {c['token']}, got {got[0]} {got[1]} "
                            f"({c['checks']})")
    return failures


def check_rounds(sampler, vectors):
    failures = []
    for c in vectors["round_cases"]:
        P, Q, Q_raw, g = rows(c["p_warped_rows"]), rows(c["q_warped_rows"]), rows(c["q_rows"]), c["gamma"]
        Q_raw = [[v / sum(r) for v in r] for r in Q_raw]
        bad = 0
        for t in c["trials"]:
            try:
                drafts, n, token = sampler.round(P, Q, Q_raw, t["uniforms"], g)
                got = (drafts if n == g else drafts + [draw(Q[i], t["uniforms"][i]) for i in range(len(drafts), g)],
                       n, token)
            except (ZeroDivisionError, ValueError) as e:
                got = ("raised", repr(e))
            bad += got != (t["drafts"], t["accepted"], t["token"])
        if bad:
            failures.append(f"round {c['name']}: {bad} of {len(c['trials'])} trials differ")
    return failures


def chi_square(counts, probs, n, min_expected):
    cells, pool_e, pool_o = [], 0.0, 0
    for key, prob in probs.items():
        e = n * prob
        if e >= min_expected:
            cells.append((e, counts.get(key, 0)))
        else:
            pool_e, pool_o = pool_e + e, pool_o + counts.get(key, 0)
    if pool_e >= min_expected:
        cells.append((pool_e, pool_o))
    elif pool_e > 0 and cells:
        e, o = min(cells)
        cells.remove((e, o))
        cells.append((e + pool_e, o + pool_o))
    impossible = sum(v for k, v in counts.items() if k not in probs)
    return sum((o - e) ** 2 / e for e, o in cells), len(cells) - 1, impossible


def generate(sampler, case, P, Q, Q_raw, rng):
    """One generation: (first round's outcome, emitted ids)."""
    out, first = [], None
    while len(out) < case["max_new_tokens"]:
        k = len(out)
        g = min(case["gamma"], case["max_new_tokens"] - k - 1)
        at = [min(k + i, len(P) - 1) for i in range(g + 1)]  # row k + i at draft i of a round starting after k ids
        u = [rng.random() for _ in range(2 * g + 1)]
        drafted, n, token = sampler.round([P[i] for i in at], [Q[i] for i in at], [Q_raw[i] for i in at], u, g,
                                          case["eos_token_id"])
        first = first or (tuple(drafted), n, token)
        out += drafted[:n] + ([] if token is None else [token])
        if case["eos_token_id"] in out:
            out = out[:out.index(case["eos_token_id"]) + 1]
            break
    return first, tuple(out)


def check_laws(sampler, vectors, seed=0):
    proc, failures = vectors["procedure"], []
    rng = random.Random(seed)
    for c in vectors["cases"] + vectors["position_cases"]:
        P = rows(c["p_warped_rows"]) if "p_warped_rows" in c else [[number(v) for v in c["p_warped"]]]
        Q = rows(c["q_warped_rows"]) if "q_warped_rows" in c else [[number(v) for v in c["q_warped"]]]
        raw = rows(c["q_rows"]) if "q_rows" in c else [[number(v) for v in c["q"]]]
        Q_raw = [[v / sum(r) for v in r] for r in raw]
        first, output = {}, {}
        try:
            for _ in range(proc["n_samples"]):
                f, o = generate(sampler, c, P, Q, Q_raw, rng)
                first[f] = first.get(f, 0) + 1
                output[o] = output.get(o, 0) + 1
        except (ZeroDivisionError, ValueError) as e:
            failures.append(f"law {c['name']}: raised {e!r}")
            continue
        laws = {"first_round_law": ({(tuple(e["drafted"]), e["accepted"], e["token"]): number(e["probability"])
                                     for e in c["first_round_law"]}, first),
                "output_law": ({tuple(e["ids"]): number(e["probability"]) for e in c["output_law"]}, output)}
        for name, (probs, counts) in laws.items():
            stat, df, impossible = chi_square(counts, probs, proc["n_samples"], proc["min_expected"])
            if impossible or (df >= 1 and stat > proc["critical_values"][str(df)]):
                failures.append(f"law {c['name']} {name}: chi-square {stat:.1f} on {df} df above "
                                f"{proc['critical_values'].get(str(df))}" + (f", {impossible} impossible outcomes"
                                                                            if impossible else ""))
    return failures


def main(argv):
    path, bug, statistical = argv[0], None, "--statistical" in argv
    if "--bug" in argv:
        bug = argv[argv.index("--bug") + 1]
        if bug not in BUGS:
            print(f"client: no bug {bug}; choose from {', '.join(BUGS)}", file=sys.stderr)
            return 2
    with open(path, encoding="utf-8") as f:
        vectors = json.load(f)
    if vectors.get("format") != "npspec-speculative-vectors" or vectors.get("version") != 2:
        print("client: not npspec-speculative-vectors version 2", file=sys.stderr)
        return 2
    sampler = Sampler(bug)
    failures = check_probes(sampler, vectors) + check_rounds(sampler, vectors) + check_verifiers(sampler, vectors)
    if statistical:
        failures += check_laws(sampler, vectors)
    for line in failures:
        print("FAIL", line)
    print(f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
