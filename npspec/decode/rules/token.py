"""Token-wise modified rejection sampling of a chain (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023).
NOTE: letters as in Leviathan et al.: `p` the target's rows, `q` the draft's. Imports numpy, npspec.decode.sampling."""

import numpy as np

from ..sampling import residual, sample


def accept(d, p, q, u_accept, u_final):
    """Keep d_i while u_i < p_i(d_i) / q_i(d_i) (Leviathan et al. 2023, Algorithm 1). d `[gamma]` ids, p
    `[gamma + 1, n_vocab]`, q `[gamma, n_vocab]` float64, u_accept `[gamma]`, u_final float. Returns (n kept, token):
    a sample of residual(p_n, q_n), or the bonus, a sample of p_gamma."""
    gamma = len(d)
    rows = np.arange(gamma)
    with np.errstate(over="ignore"):  # a denormal q(d) makes p/q inf: accepted, as min(1, p/q) = 1 says
        kept = u_accept < p[rows, d] / q[rows, d]  # strict: p(d) = 0 is never accepted, even with u = 0
    n = int(np.argmin(kept)) if not kept.all() else gamma
    last = p[gamma] if n == gamma else residual(p[n], q[n])
    return n, sample(last, u_final)
