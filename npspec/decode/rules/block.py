"""Block verification of a chain (Sun et al., "Block Verification Accelerates Speculative Decoding", ICLR 2025,
arXiv 2403.10444, Algorithm 2). NOTE: letters as in Leviathan et al.: `p` the target (their M_b), `q` the draft
(M_s); their block length gamma is our k, their eta_i our u_tests[i - 1]. With rows p_1..p_{k+1}, q_1..q_k:
  w_0 = 1, w_i = min(1, w_{i-1} p_i(d_i) / q_i(d_i));  h_k = w_k, h_i = Z_i / (Z_i + 1 - w_i) for i < k, with
  Z_i = sum_x max(0, w_i p_{i+1}(x) - q_{i+1}(x)); keep d_1..d_tau, tau the largest i with u_i < h_i (0 if none;
  strict, as the token rule: the paper's <= differs on a null set); then a bonus from p_{k+1} if tau = k, else a
  sample of norm(max(0, w_tau p_{tau+1} - q_{tau+1})).
Lossless and never worse than token-wise: notes/derivation.md, claim 10. Imports numpy and npspec.decode.sampling."""

import numpy as np

from ..sampling import residual, sample


def block_weights(d, p, q):  # [k] ids, [k + 1, n_vocab], [k, n_vocab] float64 -> [k + 1] float64
    """The weights w (Sun et al. 2025, Algorithm 2's p_i). A zero weight stays zero; p/q = +inf (q(d) = 0 < p(d))
    gives weight 1 and 0/0 a ratio 0 (never kept, as the strict token test)."""
    k = len(d)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        ratio = p[np.arange(k), d] / q[np.arange(k), d]
    w = np.ones(k + 1)
    for i in range(k):
        w[i + 1] = 0.0 if w[i] == 0 or not ratio[i] > 0 else min(1.0, w[i] * ratio[i])
    return w


def block_thresholds(w, p, q):  # [k + 1], [k + 1, n_vocab], [k, n_vocab] -> [k + 1] float64
    """The thresholds h (Sun et al. 2025, Algorithm 2); h_i = 1 where Z_i + 1 - w_i = 0 (nothing owed, nothing
    lost: probability 0 in exact arithmetic). h[0] is for the record only."""
    k = len(q)
    z = np.maximum(w[:k, None] * p[:k] - q, 0.0).sum(axis=1)  # [k]
    denominator = z + 1.0 - w[:k]
    with np.errstate(divide="ignore", invalid="ignore"):
        h = np.where(denominator > 0, z / denominator, 1.0)
    return np.append(h, w[k])


def block_accept(d, p, q, u_tests, u_final):
    """Block verification of a round, with npspec.decode.rules.accept's signature and uniforms: d `[k]` ids; p
    `[k + 1, n_vocab]`, q `[k, n_vocab]` float64; u_tests `[k]` (u_tests[i] for d_{i+1}); u_final. Returns (n kept,
    the corrected or bonus id). ValueError as sampling.residual and sample (NaN rows)."""
    d = np.asarray(d, dtype=np.int64)
    k = len(d)
    w = block_weights(d, p, q)
    h = block_thresholds(w, p, q)
    kept = np.asarray(u_tests[:k]) < h[1:]  # strict, as the token rule
    tau = int(np.flatnonzero(kept)[-1]) + 1 if kept.any() else 0  # the longest prefix whose test passes
    if tau == k:
        return k, sample(p[k], u_final)
    return tau, sample(residual(w[tau] * p[tau], q[tau]), u_final)
