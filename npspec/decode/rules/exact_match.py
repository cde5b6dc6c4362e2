"""Exact-match ("strict") verification of a chain, llama.cpp's server path and vLLM Model Runner V2's default: lossless,
a draft kept with probability sum_x p(x) q(x) <= sum_x min(p, q) (p target, q draft). Imports npspec.decode.sampling."""

from ..sampling import sample


def exact_match_accept(d, p, q, u_tests, u_final):  # [k] ids, [k + 1, n_vocab], [k, n_vocab] (unread), [k], float
    """Keep d_i while it equals t_i = sample(p_i, u_tests[i]), the target's own draw; the first mismatch emits t_i, else
    the bonus sample(p_k, u_final). Returns (n kept, token). Proven: tests/test_exact_match.py."""
    for i, x in enumerate(d):
        t = sample(p[i], u_tests[i])
        if t != x:
            return i, t
    return len(d), sample(p[len(d)], u_final)
