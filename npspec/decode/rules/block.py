"""Block verification of a chain (Sun et al. 2025). Imports numpy and npspec.decode.sampling; no I/O, no RNG.

NOTE: letters as in npspec.decode (Leviathan's): `p` is the target, `q` the draft. Sun et al. write M_b for p
and M_s for q; their block length gamma is our k (the drafts of the round), their eta_i our u_tests[i - 1].

Block verification (Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami, Suresh, "Block Verification Accelerates
Speculative Decoding", ICLR 2025, arXiv 2403.10444, Algorithm 2). For drafts d_1..d_k, with the target's rows
p_1..p_{k+1} and the draft's rows q_1..q_k of the round (row i is the law after d_1..d_{i-1}):
  * weights: w_0 = 1, w_i = min(1, w_{i-1} p_i(d_i) / q_i(d_i)): how much of the prefix d_1..d_i survives;
  * thresholds: h_k = w_k, and for 0 < i < k, h_i = Z_i / (Z_i + 1 - w_i) with Z_i = sum_x max(0, w_i p_{i+1}(x) -
    q_{i+1}(x)), the mass the next position still owes the target;
  * decision, from the END of the block: tau = the largest i in k..1 with u_i < h_i, 0 if none; keep d_1..d_tau;
  * token: a bonus from p_{k+1} if tau = k, else a sample of norm(max(0, w_tau p_{tau+1} - q_{tau+1})).
A prefix can be kept although one of its tokens alone would be rejected (w rises again after a dip), which is how it
keeps more than token-wise verification; notes/derivation.md, claim 10, proves it lossless and never worse.
The paper writes its test `eta_i <= h_i`; npspec's is strict (`u < h`), as in npspec.decode.rules.accept, so a
threshold of 0 never keeps a prefix even with u = 0 (the two tests differ on a set of probability 0). The
uniform layout is the token rule's: u_tests[i] belongs to d_{i+1}, u_final to the last sample.
"""

import numpy as np

from ..sampling import residual, sample


def block_weights(d, p, q):  # [k] ids, [k + 1, n_vocab], [k, n_vocab] float64 -> [k + 1] float64
    """w_0 = 1, w_i = min(1, w_{i-1} p_i(d_i) / q_i(d_i)) (Sun et al. 2025, Algorithm 2: the weights p_i).

    A zero weight stays zero (never 0 * inf); q_i(d_i) = 0 with p_i(d_i) > 0 is a ratio of +inf (weight 1, as
    min(1, p/q) says), and 0 / 0 a ratio of 0 (never kept, as the strict token test does).
    """
    k = len(d)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        ratio = p[np.arange(k), d] / q[np.arange(k), d]
    w = np.ones(k + 1)
    for i in range(k):
        w[i + 1] = 0.0 if w[i] == 0 or not ratio[i] > 0 else min(1.0, w[i] * ratio[i])
    return w


def block_thresholds(w, p, q):  # [k + 1], [k + 1, n_vocab], [k, n_vocab] -> [k + 1] float64
    """h_i: keep the prefix d_1..d_i when u_i < h_i, scanning i = k down to 1 (Sun et al. 2025, Algorithm 2).

    h_k = w_k; h_i = Z_i / (Z_i + 1 - w_i) for 0 <= i < k, Z_i = sum(max(0, w_i p_{i+1} - q_{i+1})). Where the
    denominator is 0 (w_i = 1 and p_{i+1} == q_{i+1}: nothing is owed and nothing was lost) h_i = 1; that case
    has probability 0 of being reached in exact arithmetic, and 1 keeps every surviving prefix under rounding.
    h[0] is for the record only (tau = 0 needs no test).
    """
    k = len(q)
    z = np.maximum(w[:k, None] * p[:k] - q, 0.0).sum(axis=1)  # [k]
    denominator = z + 1.0 - w[:k]
    with np.errstate(divide="ignore", invalid="ignore"):
        h = np.where(denominator > 0, z / denominator, 1.0)
    return np.append(h, w[k])


def block_accept(d, p, q, u_tests, u_final):
    """Block verification of one round (Sun et al. 2025, Algorithm 2; see the module docstring).

    d `[k]` ids; p `[k + 1, n_vocab]` float64, the target's warped rows (p[i] after d_1..d_i); q `[k, n_vocab]`
    float64, the rows the drafts were drawn from (one-hot for a deterministic drafter); u_tests `[k]` uniforms in
    [0, 1), u_tests[i] for d_{i+1}; u_final a uniform for the last sample. The same signature and uniforms as
    npspec.decode.rules.accept. Returns (n accepted, the corrected or bonus id). At temperature 0 (one-hot p and q)
    it makes the token rule's decision for every uniform; with one-hot q alone its law is the token rule's
    (notes/derivation.md, claim 10). Raises ValueError as npspec.decode.sampling.residual and sample do (NaN rows).
    """
    d = np.asarray(d, dtype=np.int64)
    k = len(d)
    w = block_weights(d, p, q)
    h = block_thresholds(w, p, q)
    kept = np.asarray(u_tests[:k]) < h[1:]  # strict, as the token rule
    tau = int(np.flatnonzero(kept)[-1]) + 1 if kept.any() else 0  # the longest prefix whose test passes
    if tau == k:
        return k, sample(p[k], u_final)
    return tau, sample(residual(w[tau] * p[tau], q[tau]), u_final)
