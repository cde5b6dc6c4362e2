"""npspec.testing.vectors: the exact laws of speculative decoding as data, for engines in any language.

vectors() is the JSON-ready dict `python -m npspec.testing vectors OUT.json` writes; every output law is checked
against the speculative loop's enumeration (Leviathan et al. 2023, Theorem 3.5). npspec/testing/VECTORS.md documents
every field, vectors.schema.json is its JSON Schema. Imports npspec.decode and the kit's enumerations.
"""

import random
from collections import defaultdict
from fractions import Fraction as F

import numpy as np

from ..decode import accept, round_gamma
from ..decode.rules import accept_tree_traversal, draw_children, exact_match_accept
from ..decode.rules.trees import branching_tree, children, depths
from .blocks import (acceptance_rate, block_distribution, block_paths, exact_match_rule, expected_accepted, joint_bound,
                     token_block_rule)
from .multidraft import node_acceptance, ot_bound, tree_expected_accepted, without_replacement_expander
from .oracle import (constant_table, sequence_distribution, speculative_distribution, speculative_paths, table_drafter,
                     truncate)
from .probes import _REPLACEMENT_US, ACCEPT_PROBES, chi2_sf
from .traversal import (after_rejection, child_weight, traversal_expected_accepted, traversal_outcomes,
                        traversal_round_distribution)
from .trees import multi_candidate, sampled_expander, tree_round_outcomes

FORMAT = "npspec-speculative-vectors"
VERSION = 2

CONVENTIONS = {
    "letters": ("Leviathan et al. 2023: p is the target's row, q the draft's; in `cases` and `tree_cases` rows are the "
                "same at every position, in `position_cases` and `round_cases` row k is used at position k"),
    "round": ("g = min(gamma, max_new_tokens - emitted - 1) drafts, each x_i ~ q_warped; x_i is kept with probability "
              "min(1, p(x_i) / q(x_i)) (strict test u < p/q); at the first rejection the token is drawn from "
              "norm(max(0, p - q)); if every draft is kept, a bonus token is drawn from p; g = 0 is one step of p"),
    "eos": "an accepted or emitted eos_token_id ends the generation; after an accepted EOS the round emits no token",
    "warping": ("applied to both rows alike: temperature 0 is one-hot on the argmax (ties to the lowest id); "
                "top_k keeps entries >= the k-th largest (ties kept; 0 = off); top_p sorts ascending (ties by id), "
                "drops the prefix whose cumulative mass stays <= 1 - top_p, always keeps the most likely entry "
                "(1 = off); then renormalises"),
    "numbers": "probabilities are exact fractions written as strings 'n/d' (or 'n')",
    "accepted": "accepted counts drafts kept, never the corrected or bonus token",
}

# name, description, p, q, gamma, max_new_tokens, eos, warping
CASES = [
    ("basic", "q uniform, p not", [F(1, 2), F(1, 3), F(1, 6)], [F(1, 3)] * 3, 2, 3, None, {}),
    ("disjoint-supports", "every draft is rejected; the residual is p", [F(1, 2), F(1, 2), 0, 0],
     [0, 0, F(1, 4), F(3, 4)], 2, 2, None, {}),
    ("one-hot-q", "a deterministic draft (an n-gram proposer): q is one-hot", [F(1, 4), F(1, 2), F(1, 4)],
     [0, 1, 0], 3, 3, None, {}),
    ("one-hot-q-where-p-is-0", "the draft always proposes a token the target never emits",
     [F(1, 2), F(1, 2), 0], [0, 0, 1], 2, 2, None, {}),
    ("q-zero-where-p-positive", "the draft never proposes id 2, which the target emits half the time",
     [F(1, 4), F(1, 4), F(1, 2)], [F(1, 2), F(1, 2), 0], 2, 3, None, {}),
    ("p-equals-q", "every draft is accepted", [F(1, 5), F(3, 5), F(1, 5)], [F(1, 5), F(3, 5), F(1, 5)], 2, 3, None, {}),
    ("eos", "id 2 is EOS: an accepted EOS ends the round and the generation",
     [F(1, 3), F(1, 3), F(1, 3)], [F(1, 6), F(1, 3), F(1, 2)], 3, 4, 2, {}),
    ("budget-below-gamma", "gamma 4 with 2 tokens to go: g = 1", [F(2, 3), F(1, 3)], [F(1, 4), F(3, 4)], 4, 2, None, {}),
    ("top-k", "top_k 2 on both rows (ties at the k-th value kept)", [F(1, 10), F(3, 10), F(3, 10), F(2, 10), F(1, 10)],
     [F(2, 5), F(1, 5), F(1, 10), F(1, 5), F(1, 10)], 2, 2, None, {"top_k": 2}),
    ("top-p", "top_p 7/10 on both rows", [F(1, 10), F(3, 10), F(3, 10), F(2, 10), F(1, 10)],
     [F(2, 5), F(1, 5), F(1, 10), F(1, 5), F(1, 10)], 2, 2, None, {"top_p": F(7, 10)}),
    ("greedy", "temperature 0: one-hot argmax rows (ties to the lowest id); output is p's argmax every time",
     [F(1, 4), F(3, 8), F(3, 8)], [F(1, 2), F(1, 4), F(1, 4)], 3, 3, None, {"temperature": 0}),
]


def warp_exact(row, temperature=1, top_k=0, top_p=1):
    """A row of Fractions warped with the conventions of CONVENTIONS["warping"] (temperature 0 or 1 only)."""
    row = [F(v) for v in row]
    if temperature == 0:
        best = row.index(max(row))
        return [F(int(i == best)) for i in range(len(row))]
    if temperature != 1:
        raise ValueError("exact warping takes temperature 0 or 1 (any other power is not rational)")
    return truncate(row, top_k, top_p)


def _s(v):
    return str(F(v))


def _order(k):  # a sort key for outcomes: ids tuples, counts, and (drafted, accepted, token or None)
    return tuple(_order(x) for x in k) if isinstance(k, tuple) else (-1 if k is None else k)


def _law(dist, key):
    return [{**key(k), "probability": _s(v)} for k, v in sorted(dist.items(), key=lambda kv: _order(kv[0])) if v]


def case(name, description, p, q, gamma, max_new_tokens, eos=None, warping=None, prompt=(0,)):
    """One case of `cases` as a JSON-ready dict (VECTORS.md). Raises AssertionError if the speculative loop's
    enumerated law is not exactly the target's (the theorem says it is)."""
    warping = dict(warping or {})
    pw, qw = warp_exact(p, **warping), warp_exact(q, **warping)
    return {"name": name, "description": description, "n_vocab": len(p), "prompt": list(prompt),
            "p": [_s(v) for v in p], "q": [_s(v) for v in q], **_warping(warping),
            "p_warped": [_s(v) for v in pw], "q_warped": [_s(v) for v in qw],
            **_laws(name, constant_table(pw), constant_table(qw), gamma, max_new_tokens, eos, prompt)}


def _warping(warping):
    return {"warping": {"temperature": warping.get("temperature", 1), "top_k": warping.get("top_k", 0),
                        "top_p": _s(warping.get("top_p", 1))}}


def _laws(name, pt, qt, gamma, max_new_tokens, eos, prompt):
    target = sequence_distribution(pt, prompt, max_new_tokens, eos)
    assert speculative_distribution(pt, qt, prompt, gamma, max_new_tokens, eos) == target, name
    first, first_len, total = defaultdict(int), defaultdict(int), defaultdict(int)
    for path in speculative_paths(pt, qt, prompt, gamma, max_new_tokens, eos):
        r = path.rounds[0]
        first[(r.drafted, r.accepted, r.token)] += path.prob
        first_len[r.accepted] += path.prob
        total[sum(x.accepted for x in path.rounds)] += path.prob
    return {
        "gamma": gamma, "first_round_gamma": round_gamma(gamma, max_new_tokens, None, len(prompt)),
        "max_new_tokens": max_new_tokens, "eos_token_id": eos,
        "output_law": _law(target, lambda k: {"ids": list(k)}),
        "first_round_law": _law(first, lambda k: {"drafted": list(k[0]), "accepted": k[1], "token": k[2]}),
        "accepted_length_law": _law(first_len, lambda k: {"accepted": k}),
        "accepted_total_law": _law(total, lambda k: {"accepted": k}),
    }


def positional_table(rows, n_prompt):
    """A table whose row is rows[k] at position k (k ids emitted so far), the last row from there on."""
    return lambda seq: rows[min(len(seq) - n_prompt, len(rows) - 1)]


# name, description, p rows, q rows (row k at position k), gamma, max_new_tokens, eos, warping
POSITION_CASES = [
    ("rows-by-position", "each position its own p and q: a draft tested against the next position's row, or a bonus "
     "drawn from the draft, changes the law", [[F(1, 2), F(1, 3), F(1, 6)], [F(1, 6), F(1, 6), F(2, 3)],
                                               [F(0), F(1, 4), F(3, 4)]],
     [[F(1, 3), F(1, 2), F(1, 6)], [F(1, 2), F(1, 4), F(1, 4)], [F(2, 3), F(1, 6), F(1, 6)]], 2, 3, None, {}),
    ("rows-by-position-top-k", "rows by position, top_k 2 on both", [[F(2, 5), F(1, 5), F(1, 5), F(1, 5)],
                                                                     [F(1, 10), F(1, 10), F(1, 2), F(3, 10)],
                                                                     [F(1, 2), F(1, 4), F(1, 8), F(1, 8)]],
     [[F(1, 10), F(1, 2), F(3, 10), F(1, 10)], [F(1, 4), F(1, 4), F(1, 4), F(1, 4)],
      [F(1, 8), F(1, 8), F(1, 4), F(1, 2)]], 2, 3, None, {"top_k": 2}),
]


def position_case(name, description, p_rows, q_rows, gamma, max_new_tokens, eos=None, warping=None, prompt=(0,)):
    """A case whose rows depend on the position (p_rows[k], q_rows[k] after k emitted ids; the last repeats)."""
    warping = dict(warping or {})
    pw, qw = [warp_exact(r, **warping) for r in p_rows], [warp_exact(r, **warping) for r in q_rows]
    return {"name": name, "description": description, "n_vocab": len(p_rows[0]), "prompt": list(prompt),
            "p_rows": [[_s(v) for v in r] for r in p_rows], "q_rows": [[_s(v) for v in r] for r in q_rows],
            **_warping(warping), "p_warped_rows": [[_s(v) for v in r] for r in pw],
            "q_warped_rows": [[_s(v) for v in r] for r in qw],
            **_laws(name, positional_table(pw, len(prompt)), positional_table(qw, len(prompt)), gamma, max_new_tokens,
                    eos, prompt)}


def _exact_residual(p, q):
    r = [max(F(0), a - b) for a, b in zip(p, q)]
    mass = sum(r)
    return [v / mass for v in r] if mass > 0 else list(p)


def _inverse_cdf(row, u):  # exact: the first id whose cumulative mass exceeds u * total; and u's distance to its cell
    total, cum = sum(row), F(0)
    for x, v in enumerate(row):
        if cum + v > F(u) * total:  # (a lower edge at 0 is exact in any arithmetic: no tie there)
            return x, min(F(u) * total - cum if cum else 1, cum + v - F(u) * total) / total
        cum += v
    raise AssertionError("u must be in [0, 1)")


def probe_cases():
    """ACCEPT_PROBES as exact cases (rows, x, u_test, u_final, the strict rule's decision and token, checked against
    npspec's accept), leaving out a u_final within 1e-9 of a CDF cell edge (where a float cumsum's rounding decides)."""
    out = []
    for name, p, q, x, u, expect, allowed, why in ACCEPT_PROBES:
        pf, qf = [F(v) for v in p], [F(v) for v in q]
        kept = F(u) < pf[x] / qf[x]
        for ur in ((0.5,) if kept else _REPLACEMENT_US):
            token, margin = (x, 1) if kept else _inverse_cdf(_exact_residual(pf, qf), ur)
            if margin < F(1, 10 ** 9):  # u_final on a CDF cell's edge: float rounding of the cumsum decides, not the rule
                continue
            n, t = accept(np.array([x]), np.array([p, p], dtype=np.float64), np.array([q], dtype=np.float64),
                          np.array([u]), ur)
            assert (n == 1) == kept and (kept or t == token), name  # (kept: t is the bonus, not tested here)
            assert (expect != "accept" or kept) and (expect != "reject" or not kept) and (kept or token in allowed)
            out.append({"name": f"{name}/u_final={ur!r}", "checks": why, "p": [float(v) for v in p],
                        "q": [float(v) for v in q], "x": x, "u_test": u, "u_final": ur,
                        "decision": "accept" if kept else "reject", "token": token})
    return out


def _weights_rows(n_vocab, n_rows, seed):  # Zipf-like integer weights 1000 / sqrt(rank), a permutation per row
    rng = random.Random(seed)
    rows = []
    for _ in range(n_rows):
        ranks = list(range(1, n_vocab + 1))
        rng.shuffle(ranks)
        w = [round(1000 / k ** 0.5) for k in ranks]
        rows.append([F(v, sum(w)) for v in w])
    return rows


def _exact_round(P, Q, u, g):
    """(drafts, accepted, token, the smallest distance of a uniform to the boundary it was compared with)."""
    margins, drafts = [], []
    for i in range(g):
        x, m = _inverse_cdf(Q[i], u[i])
        drafts.append(x)
        margins.append(m)
    n = g
    for i, d in enumerate(drafts):
        ratio = P[i][d] / Q[i][d]
        if not (ratio == 0 and u[g + i] == 0):
            margins.append(abs(F(u[g + i]) - ratio))
        if not F(u[g + i]) < ratio:
            n = i
            break
    token, m = _inverse_cdf(P[g] if n == g else _exact_residual(P[n], Q[n]), u[2 * g])
    return drafts, n, token, min(margins + [m])


# name, n_vocab, gamma, warping, trials
ROUND_VECTOR_CASES = [
    ("round-64-ids-top-k-50", 64, 3, {"top_k": 50}, 30),
    ("round-64-ids-top-p-0.8", 64, 3, {"top_p": F(4, 5)}, 30),
    ("round-64-ids-plain", 64, 3, {}, 30),
]


def round_cases(min_margin=F(1, 10 ** 6)):
    """Whole rounds with rows by position and injected uniforms (multiples of 2**-24, each at least min_margin from
    its boundary), with the exact drafts, accepted count and token of every trial."""
    out = []
    for c, (name, n_vocab, g, warping, trials) in enumerate(ROUND_VECTOR_CASES):
        p_rows, q_rows = _weights_rows(n_vocab, g + 1, 2 * c), _weights_rows(n_vocab, g + 1, 2 * c + 1)
        P, Q = [warp_exact(r, **warping) for r in p_rows], [warp_exact(r, **warping) for r in q_rows]
        rng = random.Random(f"round-cases:{c}")
        runs = []
        while len(runs) < trials:
            u = [rng.randrange(2 ** 24) / 2 ** 24 for _ in range(2 * g + 1)]
            if len(runs) % 3 == 1:
                u[g:2 * g] = [0.0] * g  # every draft with p > 0 kept: the bonus is reached
            elif len(runs) % 3 == 2:
                u[g:2 * g] = [1 - 2 ** -10] * g  # the first draft rejected unless p >= q: the residual
            drafts, n, token, margin = _exact_round(P, Q, u, g)
            if margin >= min_margin:
                runs.append({"uniforms": u, "drafts": drafts, "accepted": n, "token": token})
        out.append({"name": name, "n_vocab": n_vocab, "gamma": g, **_warping(warping),
                    "p_rows": [[_s(v) for v in r] for r in p_rows], "q_rows": [[_s(v) for v in r] for r in q_rows],
                    "p_warped_rows": [[_s(v) for v in r] for r in P], "q_warped_rows": [[_s(v) for v in r] for r in Q],
                    "trials": runs})
    return out


# name, p, q, branching
TREE_ROUND_CASES = [
    ("tree-2x1", [F(1, 2), F(1, 3), F(1, 6)], [F(1, 3), F(1, 3), F(1, 3)], (2, 1)),
    ("tree-3", [F(1, 4), F(1, 2), F(1, 4), F(0)], [F(1, 2), F(1, 4), F(0), F(1, 4)], (3,)),
]


def tree_case(name, p, q, branching, prompt=(0,)):
    """One tree round: branching[d] children drawn i.i.d. from q at depth d, verified by multi-candidate sampling;
    the law of the ids the round emits (kept path plus the corrected or bonus id), exact."""
    dist = defaultdict(int)
    for ids, prob in tree_round_outcomes(constant_table(p), sampled_expander(constant_table(q), branching),
                                         tuple(prompt), len(branching)):
        dist[ids] += prob
    return {"name": name, "n_vocab": len(p), "prompt": list(prompt), "p": [_s(v) for v in p],
            "q": [_s(v) for v in q], "branching": list(branching),
            "round_law": _law(dist, lambda k: {"ids": list(k)})}


N_SAMPLES = 20000
ALPHA = 1e-6
MIN_EXPECTED = 5


def procedure():
    """How to check a sampler against the laws by sampling: sizes, the total false-alarm rate, critical values."""
    tests = 2 * (len(CASES) + len(POSITION_CASES)) + len(TREE_ROUND_CASES)
    per_test = ALPHA / tests
    return {"n_samples": N_SAMPLES, "alpha": ALPHA, "tests": tests, "alpha_per_test": per_test,
            "min_expected": MIN_EXPECTED,
            "critical_values": {str(df): _critical(df, per_test) for df in range(1, 65)}}


def _critical(df, alpha):  # the chi-square statistic whose upper tail is alpha (bisection on chi2_sf), 6 digits
    lo, hi = 0.0, 1000.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if chi2_sf(mid, df) > alpha else (lo, mid)
    return float(f"{hi:.6g}")


def vectors():
    """Every case, with the format's name, version, conventions and sampling procedure: a JSON-ready dict."""
    return {"format": FORMAT, "version": VERSION, "conventions": CONVENTIONS, "procedure": procedure(),
            "cases": [case(*c) for c in CASES],
            "position_cases": [position_case(*c) for c in POSITION_CASES],
            "probe_cases": probe_cases(),
            "round_cases": round_cases(),
            "tree_cases": [tree_case(*c) for c in TREE_ROUND_CASES], **verification_cases()}


# ---- block verification (Sun et al. 2025) and multi-draft verification (RSD), the same exact format

BLOCK_CASES = ["basic", "one-hot-q", "q-zero-where-p-positive", "eos", "budget-below-gamma", "top-k", "greedy"]
PAPER = ("paper-example", "Sun et al.'s example: token-wise keeps 10/9 drafts per round, block verification 11/9, "
         "the joint bound is 12/9", [F(1, 3), F(2, 3)], [F(2, 3), F(1, 3)], 2, 3, None, {})
VERIFICATION_CONVENTIONS = {
    "block_verification": (
        "Sun et al. 2025, Algorithm 2: drafts d_1..d_g ~ q, then w_0 = 1, w_i = min(1, w_(i-1) p(d_i) / q(d_i)); "
        "h_g = w_g and h_i = Z_i / (Z_i + 1 - w_i) for i < g, Z_i = sum_x max(0, w_i p(x) - q(x)) (h_i = 1 where "
        "the denominator is 0); tau = the largest i with u_i < h_i (0 if none); keep d_1..d_tau, then a bonus from p "
        "if tau = g, else a sample of norm(max(0, w_tau p - q)); an accepted EOS cuts the round after it (the later "
        "drafts still took part in the decision); 'drafted' lists the whole block"),
    "p_after_last_id": ("in a context-dependent case, the rows p and q after a sequence are those after its last id, "
                        "replacing p_warped and q_warped (no warping)"),
    "expected_accepted_first_round": "E[drafts kept] in the first round: block, token-wise, and the bound "
                                     "sum_i sum_(x_1..x_i) min(p(x_1..x_i), q(x_1..x_i)) no lossless verifier exceeds",
    "multi_draft": (
        "one node with k children: 'iid' draws them independently from q and tests child j with u_j < r(c_j) / "
        "q(c_j) against the running residual r (first p; after a rejection r <- norm(max(0, r - q))); "
        "'without_replacement' (RSD) draws child j from q without the earlier children, renormalised, and tests it "
        "against that conditional row q_j instead; no child kept: a sample of r. 'kept' is the kept child's id "
        "(empty if none), 'token' the bonus after it or the sample of r; acceptance is P(a child is kept), and ot_bound the "
        "largest value any lossless verifier of those drafts can reach"),
}
MARKOV = ({0: [F(1, 2), F(1, 2)], 1: [F(9, 10), F(1, 10)]}, {0: [F(1, 5), F(4, 5)], 1: [F(1, 2), F(1, 2)]})


def _markov_block_case():
    """A block case whose rows depend on the last id (p_after_last_id, q_after_last_id): a verifier that reads the
    row of the wrong position passes every constant-row case and fails this one."""
    (p_after, q_after), prompt, gamma, max_new_tokens = MARKOV, (0,), 2, 3
    pt, qt = (lambda seq: p_after[seq[-1]]), (lambda seq: q_after[seq[-1]])
    target = sequence_distribution(pt, prompt, max_new_tokens)
    assert block_distribution(pt, qt, prompt, gamma, max_new_tokens) == {k: v for k, v in target.items() if v}
    first = defaultdict(int)
    for path in block_paths(pt, table_drafter(qt), prompt, gamma, max_new_tokens):
        r = path.rounds[0]
        first[(r.drafted, r.accepted, r.token)] += path.prob
    return {
        "name": "context-dependent", "description": "rows depend on the last id; a verifier that takes Z_i from "
        "the tested position's rows instead of the next ones is caught here only", "verifier": "block",
        "n_vocab": 2, "prompt": list(prompt),
        "p_after_last_id": {str(x): [_s(v) for v in row] for x, row in p_after.items()},
        "q_after_last_id": {str(x): [_s(v) for v in row] for x, row in q_after.items()},
        "gamma": gamma, "first_round_gamma": gamma, "max_new_tokens": max_new_tokens, "eos_token_id": None,
        "output_law": _law(target, lambda k: {"ids": list(k)}),
        "first_round_law": _law(first, lambda k: {"drafted": list(k[0]), "accepted": k[1], "token": k[2]}),
        "expected_accepted_first_round": {
            "block": _s(expected_accepted(pt, qt, prompt, gamma)),
            "token": _s(expected_accepted(pt, qt, prompt, gamma, rule=token_block_rule)),
            "joint_bound": _s(joint_bound(pt, qt, prompt, gamma))},
    }


TREE_CASES = [  # name, description, p, q, children per node
    ("two-tokens-k2", "i.i.d. children keep one with 7/9, any verifier of i.i.d. children at most 8/9, RSD always",
     [F(1, 3), F(2, 3)], [F(2, 3), F(1, 3)], 2),
    ("three-tokens-k2", "RSD keeps 5/6, below its own bound 1", [F(2, 3), F(1, 3), 0], [F(1, 3)] * 3, 2),
    ("q-support-below-k", "q has 2 tokens: RSD draws both (fewer children than asked), i.i.d. children repeat",
     [F(1, 2), F(1, 4), F(1, 4)], [F(1, 2), F(1, 2), 0], 3),
]


def verification_cases():
    """Block-verification cases (BLOCK_CASES and the paper's, Sun et al. 2025, Algorithm 2) and multi-draft cases
    (one node, k children i.i.d. or without replacement: RSD) in the format of `case`, every law exact."""
    chain = {c[0]: c for c in CASES}
    blocks = []
    for name, description, p, q, gamma, max_new_tokens, eos, warping in [PAPER, *(chain[n] for n in BLOCK_CASES)]:
        pw, qw = warp_exact(p, **warping), warp_exact(q, **warping)
        pt, qt = constant_table(pw), constant_table(qw)
        target = sequence_distribution(pt, (0,), max_new_tokens, eos)
        assert block_distribution(pt, qt, (0,), gamma, max_new_tokens, eos) == {k: v for k, v in target.items() if v}
        first = defaultdict(int)
        for path in block_paths(pt, table_drafter(qt), (0,), gamma, max_new_tokens, eos):
            r = path.rounds[0]
            first[(r.drafted, r.accepted, r.token)] += path.prob
        g = round_gamma(gamma, max_new_tokens, None, 1)
        blocks.append({
            "name": name, "description": description, "verifier": "block", "n_vocab": len(p), "prompt": [0],
            "p_warped": [_s(v) for v in pw], "q_warped": [_s(v) for v in qw], "warping": {
                "temperature": warping.get("temperature", 1), "top_k": warping.get("top_k", 0),
                "top_p": _s(warping.get("top_p", 1))},
            "gamma": gamma, "first_round_gamma": g, "max_new_tokens": max_new_tokens, "eos_token_id": eos,
            "output_law": _law(target, lambda k: {"ids": list(k)}),
            "first_round_law": _law(first, lambda k: {"drafted": list(k[0]), "accepted": k[1], "token": k[2]}),
            "expected_accepted_first_round": {
                "block": _s(expected_accepted(pt, qt, (0,), g)),
                "token": _s(expected_accepted(pt, qt, (0,), g, rule=token_block_rule)),
                "joint_bound": _s(joint_bound(pt, qt, (0,), g))},
        })
    blocks.append(_markov_block_case())
    trees = []
    for name, description, p, q, k in TREE_CASES:
        pt, qt = constant_table(p), constant_table(q)
        laws = {}
        for children, expand in (("iid", sampled_expander(qt, (k,))), ("without-replacement",
                                                                       without_replacement_expander(qt, (k,)))):
            law = defaultdict(int)
            for emitted, prob in tree_round_outcomes(pt, expand, (0,), 1, None, multi_candidate):
                law[emitted] += prob
            laws[children] = _law(law, lambda e: {"kept": list(e[:-1]), "token": e[-1]})
        trees.append({
            "name": name, "description": description, "n_vocab": len(p), "p": [_s(v) for v in p],
            "q": [_s(v) for v in q], "children": k,
            "round_law_iid": laws["iid"], "round_law_without_replacement": laws["without-replacement"],
            "acceptance": {"iid": _s(node_acceptance(p, q, k)), "rsd": _s(node_acceptance(p, q, k, False)),
                           "ot_bound_iid": _s(ot_bound(p, q, k)), "ot_bound_without_replacement": _s(
                               ot_bound(p, q, k, False))},
        })
    return {"block_verification": blocks, "multi_draft": trees, "exact_match": exact_match_cases(),
            "traversal": traversal_cases(),
            "verification_conventions": {**VERIFICATION_CONVENTIONS, **RULE_CONVENTIONS}}


# ---- exact-match ("strict") and traversal verification (Weng et al. 2025), the same exact format

EXACT_MATCH_CASES = ["basic", "one-hot-q", "eos", "top-k", "greedy"]
RULE_CONVENTIONS = {
    "exact_match": (
        "the engines' strict rule: at draft i the target draws its own token t_i from p with the test uniform "
        "u_(g+i) (inverse CDF); d_i is kept iff t_i = d_i; the first mismatch emits t_i; all kept: a bonus from p "
        "with u_(2g); a draft is kept with probability sum_x p(x) q(x)"),
    "traversal": (
        "Weng et al. 2025, Algorithm 1: node i's row q_i is q_rows[depth] without its earlier siblings' ids, "
        "renormalised (children without replacement); the root has weight 1 and row p_rows[0]; children are "
        "visited in node order, each subtree before the next sibling; child c starts with weight min(1, w r(c) / "
        "q_c(c)), (w, r) its parent's current state; a node is tested once its children are all rejected, kept iff "
        "u_i < its weight; a rejected child c sets its parent's S = sum_x max(0, w r(x) - q_c(x)), w <- S / (S + 1 "
        "- w) (1 if 0/0), r <- norm(max(0, w r - q_c)) (r if S = 0); the first node kept ends the round: the path "
        "to it is kept and its current r sampled with u_final; the root is always kept"),
}
# name, description, p rows by depth, q rows by depth, branching
TRAVERSAL_CASES = [
    ("paper-example", "Weng et al.'s introduction: the first draft alone has ratio 1/2, the pair 1/2 * 4/3; "
     "traversal keeps the pair with 2/3, token-wise with 1/2", [[F(1, 4), F(3, 4)], [F(2, 3), F(1, 3)], [F(1, 2)] * 2],
     [[F(1, 2), F(1, 2)], [F(1, 2), F(1, 2)]], (1, 1)),
    ("sun-rows-tree-2x1", "Sun et al.'s rows, 2 children without replacement and one child each: 16/9 kept "
     "against RSD's 5/3", [[F(1, 3), F(2, 3)]], [[F(2, 3), F(1, 3)]], (2, 1)),
    ("three-tokens-2x2", "3 tokens, 2 children of 2 children", [[F(1, 2), F(1, 3), F(1, 6)]], [[F(1, 3)] * 3],
     (2, 2)),
    ("three-tokens-chain-3", "a chain of 3: block verification's law", [[F(1, 2), F(1, 3), F(1, 6)]],
     [[F(1, 6), F(1, 3), F(1, 2)]], (1, 1, 1)),
]


def _exact_match_trials(P, Q, g, seed, n=8, min_margin=F(1, 10 ** 6)):
    """Chains of g drafts with uniforms (u[0:g] drafts, u[g:2g] the target's own draws, u[2g] the bonus) and the
    exact (drafts, accepted, token), each uniform at least min_margin from its CDF edge."""
    rng, out = random.Random(f"exact-match:{seed}"), []
    while len(out) < n:
        u = [rng.randrange(2 ** 24) / 2 ** 24 for _ in range(2 * g + 1)]
        drafts, margins = [], []
        for i in range(g):
            x, m = _inverse_cdf(Q[i], u[i])
            drafts.append(x)
            margins.append(m)
        accepted, token = g, None
        for i, d in enumerate(drafts):
            t, m = _inverse_cdf(P[i], u[g + i])
            margins.append(m)
            if t != d:
                accepted, token = i, t
                break
        if token is None:
            token, m = _inverse_cdf(P[g], u[2 * g])
            margins.append(m)
        if min(margins) >= min_margin:
            got = exact_match_accept(np.array(drafts), np.array(P, dtype=np.float64),
                                     np.array(Q[:g], dtype=np.float64), np.array(u[g:2 * g]), u[2 * g])
            assert got == (accepted, token), (drafts, u)
            out.append({"uniforms": u, "drafts": drafts, "accepted": accepted, "token": token})
    return out


def exact_match_cases():
    """EXACT_MATCH_CASES in the format of block_verification (laws by the kit's exact_match_rule), each with the
    acceptance sum_x p q against sum_x min(p, q), and trials of uniforms with npspec's exact decisions."""
    chain, out = {c[0]: c for c in CASES}, []
    for name, description, p, q, gamma, max_new_tokens, eos, warping in (chain[n] for n in EXACT_MATCH_CASES):
        pw, qw = warp_exact(p, **warping), warp_exact(q, **warping)
        pt, qt = constant_table(pw), constant_table(qw)
        target = sequence_distribution(pt, (0,), max_new_tokens, eos)
        assert block_distribution(pt, qt, (0,), gamma, max_new_tokens, eos, rule=exact_match_rule) == \
            {k: v for k, v in target.items() if v}, name
        first = defaultdict(int)
        for path in block_paths(pt, table_drafter(qt), (0,), gamma, max_new_tokens, eos, rule=exact_match_rule):
            r = path.rounds[0]
            first[(r.drafted, r.accepted, r.token)] += path.prob
        g = round_gamma(gamma, max_new_tokens, None, 1)
        out.append({
            "name": name, "description": description, "verifier": "exact-match", "n_vocab": len(p), "prompt": [0],
            "p_warped": [_s(v) for v in pw], "q_warped": [_s(v) for v in qw], **_warping(warping),
            "gamma": gamma, "first_round_gamma": g, "max_new_tokens": max_new_tokens, "eos_token_id": eos,
            "output_law": _law(target, lambda k: {"ids": list(k)}),
            "first_round_law": _law(first, lambda k: {"drafted": list(k[0]), "accepted": k[1], "token": k[2]}),
            "acceptance": {"exact_match": _s(acceptance_rate(pw, qw, exact_match_rule)),
                           "token": _s(acceptance_rate(pw, qw, token_block_rule))},
            "trials": _exact_match_trials([pw] * (g + 1), [qw] * g, g, name) if g else [],
        })
    return out


def _row(rows, k):  # rows by depth: row k, the last one repeating
    return rows[min(k, len(rows) - 1)]


def _traversal_decide(ids, parents, P, Q, u):
    """Exact traversal of one tree (RULE_CONVENTIONS["traversal"]): (kept node indices, token, the smallest
    distance of a uniform to what it was compared with)."""
    kids, depth, margins = children(parents), [0] + depths(parents), []  # depth[node + 1]: ids above node's children

    def visit(node, w):
        r, removed = list(_row(P, depth[node + 1])), []
        for c in kids[node]:
            row = [F(0) if x in removed else v for x, v in enumerate(_row(Q, depth[node + 1]))]
            row = [v / sum(row) for v in row]
            got = visit(c, child_weight(w, r[ids[c]], row[ids[c]]))
            if got is not None:
                return [c] + got[0], got[1]
            w, r = after_rejection(w, r, row)
            removed.append(ids[c])
        if node < 0:
            return [], r
        margins.append(abs(F(u[node]) - w))
        return ([], r) if F(u[node]) < w else None

    path, row = visit(-1, F(1))
    token, m = _inverse_cdf(row, u[len(ids)])
    return path, token, min(margins + [m])


def _traversal_trials(P, Q, branching, seed, n=8, min_margin=F(1, 10 ** 6)):
    """Trees of the case's shape drawn without replacement, N + 1 uniforms (node i's test, then the last sample)
    and the exact kept path and token, each uniform at least min_margin from its boundary; npspec's float
    accept_tree_traversal (given each node's row before excluding siblings) decides the same."""
    parents, rng, out = branching_tree(branching), random.Random(f"traversal:{seed}"), []
    kids, depth = children(parents), [0] + depths(parents)
    while len(out) < n:
        ids = [0] * len(parents)
        for node in range(-1, len(parents)):
            drawn = draw_children(np.array(_row(Q, depth[node + 1]), dtype=np.float64), len(kids[node]),
                                  [rng.random() for _ in kids[node]])
            for c, x in zip(kids[node], drawn):
                ids[c] = int(x)
        u = [rng.randrange(2 ** 24) / 2 ** 24 for _ in range(len(parents) + 1)]
        if len(out) % 3 == 1:
            u[:len(parents)] = [1 - 2 ** -10] * len(parents)  # the tests mostly reject: the walk goes up the tree
        path, token, margin = _traversal_decide(ids, parents, P, Q, u)
        if margin < min_margin:
            continue
        base = np.array([_row(Q, depth[parents[i] + 1]) for i in range(len(parents))], dtype=np.float64)
        prows = np.array([_row(P, depth[i + 1]) for i in range(-1, len(parents))], dtype=np.float64)
        assert accept_tree_traversal(ids, parents, base, prows, np.array(u[:-1]), u[-1]) == (path, token)
        out.append({"ids": ids, "parents": parents, "uniforms": u, "kept": path, "token": token})
    return out


def traversal_cases():
    """TRAVERSAL_CASES: one round of a tree (children without replacement) decided by traversal verification, with
    rows by depth; its law of (kept ids, token), E[kept] against the token-wise rule (RSD), and trials."""
    out = []
    for name, description, p_rows, q_rows, branching in TRAVERSAL_CASES:
        pt, qt = positional_table(p_rows, 1), positional_table(q_rows, 1)
        expand, depth = without_replacement_expander(qt, branching), len(branching)
        assert traversal_round_distribution(pt, expand, (0,), depth) == \
            {k: v for k, v in sequence_distribution(pt, (0,), depth + 1).items() if v}, name
        law = defaultdict(int)
        for kept, emitted, prob in traversal_outcomes(pt, expand, (0,), depth):
            law[kept, emitted[-1]] += prob
        out.append({
            "name": name, "description": description, "verifier": "traversal", "n_vocab": len(p_rows[0]),
            "prompt": [0], "p_rows": [[_s(v) for v in r] for r in p_rows],
            "q_rows": [[_s(v) for v in r] for r in q_rows],
            "branching": list(branching), "children": "without-replacement",
            "round_law": _law(law, lambda k: {"kept": list(k[0]), "token": k[1]}),
            "expected_accepted": {"traversal": _s(traversal_expected_accepted(pt, expand, (0,), depth)),
                                  "token_wise": _s(tree_expected_accepted(pt, expand, (0,), depth))},
            "trials": _traversal_trials(p_rows, q_rows, branching, name),
        })
    return out
