"""Warping, inverse-CDF sampling and the one-step law (issue 2, section 5)."""

import numpy as np
import pytest
from hypothesis import given, strategies as st
from hypothesis.extra.numpy import arrays

from npspec.sampling import check_warp_args, residual, sample, warp

# probability vectors over 2..12 tokens with exact zeros allowed, in float64
weights = st.integers(2, 12).flatmap(
    lambda n: arrays(np.float64, n, elements=st.one_of(st.just(0.0), st.floats(1e-12, 1.0))))


def normalise(w):
    w = w.copy()
    if w.sum() == 0:
        w[0] = 1.0
    return w / w.sum()


@given(weights, weights)
def test_one_step_law(wp, wq):
    """q * min(1, p/q) + (1 - beta) * residual == p, with beta = sum(min(p, q)) (Leviathan et al. 2023, Thm 3.5)."""
    n = min(len(wp), len(wq))
    p, q = normalise(wp[:n]), normalise(wq[:n])
    beta = np.minimum(p, q).sum()
    with np.errstate(divide="ignore", invalid="ignore"):
        accept = np.where(q > 0, np.minimum(1.0, p / np.where(q > 0, q, 1.0)), 0.0)
    law = q * accept + (1 - beta) * residual(p, q)
    np.testing.assert_allclose(law, p, rtol=0, atol=1e-12)  # float64: a few ulps of rounding per entry


def test_temperature_zero_is_argmax_lowest_id_on_ties():
    logits = np.array([[1.0, 3.0, 3.0, -2.0], [0.0, 0.0, 0.0, 0.0]], dtype=np.float32)
    assert np.array_equal(warp(logits, temperature=0), [[0, 1, 0, 0], [1, 0, 0, 0]])


def test_top_k_and_top_p_follow_transformers_order():
    logits = np.log(np.array([0.5, 0.25, 0.15, 0.1]))
    np.testing.assert_allclose(warp(logits, top_k=2), [2 / 3, 1 / 3, 0, 0])
    # top-p 0.7: drop the tail whose cumulative mass (ascending) stays <= 0.3: 0.1 and 0.15
    np.testing.assert_allclose(warp(logits, top_p=0.7), [2 / 3, 1 / 3, 0, 0])
    np.testing.assert_allclose(warp(logits, top_p=0.8), [0.5 / 0.9, 0.25 / 0.9, 0.15 / 0.9, 0])
    # temperature first: T = 2 flattens before top-k keeps 3
    flat = np.sqrt([0.5, 0.25, 0.15])
    np.testing.assert_allclose(warp(logits, temperature=2, top_k=3), np.append(flat / flat.sum(), 0))


def test_inverse_cdf_sampling():
    p = np.array([0.0, 0.25, 0.0, 0.75])
    assert [sample(p, u) for u in (0.0, 0.2499, 0.25, 0.9999)] == [1, 1, 3, 3]  # never a zero-probability id
    with pytest.raises(ValueError, match="no positive finite mass"):
        sample(np.zeros(3), 0.5)


def test_residual_falls_back_to_p_when_mass_vanishes():
    p = np.array([0.5, 0.5, 0.0])
    assert residual(p, p) is p
    np.testing.assert_array_equal(residual(p, np.array([1.0, 0.0, 0.0])), [0.0, 1.0, 0.0])


@pytest.mark.parametrize("args, msg", [((-1, 0, 1.0), "temperature"), ((1, -1, 1.0), "top_k"),
                                       ((1, 0, 0.0), "top_p"), ((1, 0, 1.5), "top_p")])
def test_bad_warp_args(args, msg):
    with pytest.raises(ValueError, match=msg):
        check_warp_args(*args)
