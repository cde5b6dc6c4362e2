"""npspec.testing.strategies: hypothesis strategies for probability rows, (p, q) pairs and logits rows.

Each imports hypothesis (a test dependency) only when it builds a strategy. Imports numpy, nothing of npspec.
"""

import numpy as np


def _normalise(w):
    w = np.array(w, dtype=np.float64)
    if not w.sum() > 0:
        w[0] = 1.0
    return w / w.sum()


def probability_vectors(min_size=2, max_size=8, size=None):
    """float64 probability rows `[n]` (n = size, or min_size..max_size): random rows with zeros and
    near-denormal entries, one-hot rows, uniform rows."""
    from hypothesis import strategies as st
    from hypothesis.extra.numpy import arrays

    entries = st.one_of(st.just(0.0), st.sampled_from([5e-324, 1e-310, 2.2250738585072014e-308]),
                        st.floats(1e-6, 1.0), st.floats(1e-300, 1e-6))

    def rows(n):
        return st.one_of(arrays(np.float64, n, elements=entries).map(_normalise),
                         st.integers(0, n - 1).map(lambda i: np.eye(n)[i]),
                         st.just(np.full(n, 1.0 / n)))

    sizes = st.just(size) if size else st.integers(min_size, max_size)
    return sizes.flatmap(rows)


def probability_pairs(min_size=2, max_size=8):
    """(p, q) float64 rows of one size: independent, p == q, disjoint supports, one-hot, and q = p with one
    entry one ulp higher (max(0, p - q) all zero: the residual's zero-mass case)."""
    from hypothesis import strategies as st

    def pairs(n):
        vec = probability_vectors(size=n)

        def disjoint(args):
            a, b, split = args
            a, b = a.copy(), b.copy()
            a[split:], b[:split] = 0, 0
            return _normalise(a), _normalise(b)

        def nudge(args):
            p, i = args
            i = int(np.flatnonzero(p)[i % np.count_nonzero(p)])
            q = p.copy()
            q[i] = np.nextafter(p[i], np.inf)
            return p, q

        floats = st.floats(0.01, 1.0)
        return st.one_of(
            st.tuples(vec, vec),
            vec.map(lambda p: (p, p.copy())),
            st.tuples(st.lists(floats, min_size=n, max_size=n), st.lists(floats, min_size=n, max_size=n),
                      st.integers(1, n - 1)).map(lambda a: disjoint((np.array(a[0]), np.array(a[1]), a[2]))),
            st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)).map(lambda ij: tuple(np.eye(n)[list(ij)])),
            st.tuples(vec, st.integers(0, n - 1)).map(nudge),
        )

    return st.integers(min_size, max_size).flatmap(pairs)


def logits_rows(min_size=2, max_size=8, size=None):
    """Hypothesis strategy: float32 logits rows `[n]` (n = size, or min_size..max_size) with -inf,
    +/-10 and wide finite values; at least one entry finite."""
    from hypothesis import strategies as st
    from hypothesis.extra.numpy import arrays

    entries = st.one_of(st.just(-np.inf), st.sampled_from([10.0, -10.0, 0.0]),
                        st.floats(-80.0, 80.0, width=32))

    def fix(x):
        x = x.copy()
        if not np.isfinite(x).any():
            x[0] = 0.0
        return x

    sizes = st.just(size) if size else st.integers(min_size, max_size)
    return sizes.flatmap(lambda n: arrays(np.float32, n, elements=entries).map(fix))
