"""npspec.decode.sampling: warping (temperature, top-k, top-p), greedy, inverse-CDF sampling, the residual."""

import warnings

import numpy as np
import pytest
from hypothesis import example, given, strategies as st
from hypothesis.extra.numpy import arrays

from npspec import testing as kit
from npspec.decode.sampling import check_warp_args, greedy, residual, sample, top_p_tail, warp
from npspec.decode import accept

ATOL = 1e-12  # float64: every quantity is a handful of operations on numbers in [0, 1]
US = (0.0, 0.3, 0.5, kit.ONE_BELOW)  # uniforms, both ends included
NOTHING_TO_SAMPLE = "NaN or \\+inf, or a row is entirely -inf"


# ---- warp: temperature 0, greedy

def test_temperature_zero_is_argmax_lowest_id_on_ties():
    logits = np.array([[1.0, 3.0, 3.0, -2.0], [0.0, 0.0, 0.0, 0.0]], dtype=np.float32)
    assert np.array_equal(warp(logits, temperature=0), [[0, 1, 0, 0], [1, 0, 0, 0]])


def test_greedy_is_the_id_warp_puts_its_mass_on():
    logits = np.array([[1.0, 3.0, 3.0, -2.0],  # tie: the lower id, 1
                       [0.0, 0.0, 0.0, 0.0],  # all tied: 0
                       [-np.inf, -5.0, -np.inf, -6.0],  # -inf entries are never picked: 1
                       [np.float32(1.0), np.nextafter(np.float32(1.0), np.float32(2.0)), 0.0, 0.0]],  # 1 ulp apart: 1
                      dtype=np.float32)
    assert greedy(logits).tolist() == [1, 0, 1, 1]
    for row in logits:
        assert all(greedy(row) == sample(warp(row, temperature=0), u) for u in US)


@pytest.mark.parametrize("row", [[np.nan, 0.0], [0.0, np.nan], [np.inf, 0.0], [-np.inf, -np.inf]])
@pytest.mark.parametrize("pick", [warp, greedy], ids=["warp", "greedy"])
def test_rows_with_nothing_to_sample_are_refused(pick, row):
    with pytest.raises(ValueError, match=NOTHING_TO_SAMPLE):
        pick(np.array(row, dtype=np.float32))
    with pytest.raises(ValueError, match=NOTHING_TO_SAMPLE):
        pick(np.array([[0.0, 1.0], row], dtype=np.float32))  # one bad row among good ones


# ---- top-k and top-p

def test_top_k_and_top_p_follow_transformers_order():
    logits = np.log(np.array([0.5, 0.25, 0.15, 0.1]))
    np.testing.assert_allclose(warp(logits, top_k=2), [2 / 3, 1 / 3, 0, 0])
    # top-p 0.7: drop the tail whose cumulative mass (ascending) stays <= 0.3: 0.1 and 0.15
    np.testing.assert_allclose(warp(logits, top_p=0.7), [2 / 3, 1 / 3, 0, 0])
    np.testing.assert_allclose(warp(logits, top_p=0.8), [0.5 / 0.9, 0.25 / 0.9, 0.15 / 0.9, 0])
    # temperature first: T = 2 flattens before top-k keeps 3
    flat = np.sqrt([0.5, 0.25, 0.15])
    np.testing.assert_allclose(warp(logits, temperature=2, top_k=3), np.append(flat / flat.sum(), 0))


def stable_argsort_rule(probs, top_p):  # [..., n] -> [..., n] bool; the textbook form (transformers' TopPLogitsWarper)
    order = np.argsort(probs, axis=-1, kind="stable")  # ascending, ties by id
    sorted_probs = np.take_along_axis(probs, order, axis=-1)
    remove_sorted = np.cumsum(sorted_probs, axis=-1) <= 1 - top_p
    remove_sorted[..., -1] = False  # the most likely token always stays
    remove = np.zeros_like(remove_sorted)
    np.put_along_axis(remove, order, remove_sorted, axis=-1)
    return remove


# rows of small integer weights: many ties, exact zeros, and cut points that land inside a run of ties
tie_rows = st.integers(1, 4).flatmap(lambda rows: st.integers(1, 12).flatmap(
    lambda n: arrays(np.int64, (rows, n), elements=st.integers(0, 4))))
top_ps = st.sampled_from([1e-30, 0.1, 0.25, 0.5, 0.6, 0.75, 0.8, 0.9, 0.95, 0.999])


@given(tie_rows, top_ps)
def test_top_p_tail_matches_the_stable_argsort_rule_with_ties(w, top_p):
    """top_p_tail (a sort of the values, no argsort) removes exactly what the stable-argsort rule removes."""
    w = w.astype(np.float64)
    w[:, 0] += 1  # every row has mass
    probs = w / w.sum(axis=-1, keepdims=True)
    np.testing.assert_array_equal(top_p_tail(probs, top_p), stable_argsort_rule(probs, top_p))


@given(arrays(np.float32, (3, 40), elements=st.floats(-20, 20, width=32)), top_ps,
       st.sampled_from([0.5, 1.0, 2.0]))
def test_top_p_tail_matches_on_softmax_rows(logits, top_p, temperature):
    probs = warp(logits, temperature=temperature)
    np.testing.assert_array_equal(top_p_tail(probs, top_p), stable_argsort_rule(probs, top_p))


def test_ties_at_the_cut_remove_the_lower_ids_first():
    probs = np.array([0.1, 0.4, 0.1, 0.4])
    # ascending, ties by id: 0 (0.1), 2 (0.1), 1, 3; cumsum 0.1, 0.2, 0.6, 1.0
    assert top_p_tail(probs, 0.85).tolist() == [True, False, False, False]  # 1 - top_p = 0.15: only id 0
    assert top_p_tail(probs, 0.75).tolist() == [True, False, True, False]  # 0.25: both 0.1s
    assert top_p_tail(probs, 1e-30).tolist() == [True, True, True, False]  # all but the last: id 3 stays


@pytest.mark.parametrize("args, msg", [((-1, 0, 1.0), "temperature"), ((1, -1, 1.0), "top_k"),
                                       ((1, 0, 0.0), "top_p"), ((1, 0, 1.5), "top_p")])
def test_bad_warp_args(args, msg):
    with pytest.raises(ValueError, match=msg):
        check_warp_args(*args)


@pytest.mark.parametrize("args, msg", [(("0.8", 0, 1.0), "temperature must be a number .* got '0.8' \\(a str\\)"),
                                       ((True, 0, 1.0), "temperature must be a number"),
                                       ((1.0, 2.0, 1.0), "top_k must be an integer >= 0 \\(0 = off\\), got 2.0 \\(a float\\)"),
                                       ((1.0, False, 1.0), "top_k must be an integer"),
                                       ((1.0, 0, None), "top_p must be a number in \\(0, 1\\], got None")])
def test_warp_args_of_the_wrong_type_are_named(args, msg):
    with pytest.raises(TypeError, match=msg):
        check_warp_args(*args)
    check_warp_args(np.float32(0.5), np.int64(3), np.float64(0.9))  # NumPy scalars are numbers


def test_a_denormal_temperature_warns_nothing():
    # (x - max) / 1e-320 overflows to -inf on purpose: one-hot on the argmax, and no RuntimeWarning leaks
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        probs = warp(np.array([1.0, 3.0, 2.0], dtype=np.float32), temperature=1e-320)
    assert probs.tolist() == [0.0, 1.0, 0.0]


@given(st.integers(2, 8).flatmap(lambda n: st.tuples(kit.logits_rows(size=n), kit.logits_rows(size=n))),
       st.sampled_from([0.0, 1e-300, 0.3, 1.0, 5.0, 1e300]), st.integers(0, 3), st.sampled_from([1.0, 0.9, 0.5, 1e-9]))
# the target bans the draft's only token: with u = 0, a non-strict `u <= p/q` keeps a token of probability 0
@example(rows=(np.array([-np.inf, 0.0, 0.0]), np.array([0.0, -np.inf, -np.inf])), temperature=1.0, top_k=0, top_p=1.0)
def test_no_nan_reaches_a_sampler_from_logits(rows, temperature, top_k, top_p):
    """warp() of rows with -inf, +/-10 and wide values, at any temperature, gives finite rows summing to 1;
    sampling and accept then only return ids of positive probability, and accept's test is strict (kept iff
    u < p/q: at u = 0 a draft the target gives probability 0 is rejected)."""
    p, q = (warp(row, temperature, top_k, top_p) for row in rows)
    for row in (p, q):
        assert np.all(np.isfinite(row)) and np.all(row >= 0) and abs(row.sum() - 1) <= ATOL
    for u in (0.0, 0.5, kit.ONE_BELOW):
        x = sample(q, u)
        assert q[x] > 0
        n, token = accept(np.array([x]), np.stack([p, p]), q[None], np.array([u]), u)
        assert p[token] > 0
        with np.errstate(over="ignore"):  # a denormal q(x) makes p/q inf: kept
            assert (n == 1) == (u < p[x] / q[x])


# ---- sample: inverse CDF from one uniform

def test_inverse_cdf_sampling():
    p = np.array([0.0, 0.25, 0.0, 0.75])
    assert [sample(p, u) for u in (0.0, 0.2499, 0.25, 0.9999)] == [1, 1, 3, 3]  # never a zero-probability id
    with pytest.raises(ValueError, match="no positive finite mass"):
        sample(np.zeros(3), 0.5)
    with pytest.raises(ValueError, match="no positive finite mass"):
        sample(np.array([np.nan, 1.0]), 0.5)  # the sampler refuses NaN rather than return an id


# ---- residual: norm(max(0, p - q)), guarded

def test_residual_falls_back_to_p_when_mass_vanishes():
    p = np.array([0.5, 0.5, 0.0])
    assert residual(p, p) is p
    np.testing.assert_array_equal(residual(p, np.array([1.0, 0.0, 0.0])), [0.0, 1.0, 0.0])
    p = np.array([0.0, 0.5, 0.5 - 2.0 ** -54])
    q = np.array([0.0, 0.5, 0.5])  # p <= q everywhere: max(0, p - q) == 0
    assert residual(p, q) is p
    # and a rejection in that state samples p, no division by zero: u = 1 - 2**-53 is exactly p(2)/q(2)
    n, token = accept(np.array([2]), np.stack([p, p]), q[None], np.array([kit.ONE_BELOW]), 0.0)
    assert n == 0 and token == 1


@pytest.mark.parametrize("p, q", [([np.nan, 0.5, 0.5], [0.5, 0.5, 0.0]),  # NaN in p: its rows were NaN
                                  ([0.5, 0.5, 0.0], [np.nan, 0.5, 0.5]),  # NaN in q
                                  ([np.inf, 0.0, 0.0], [0.5, 0.5, 0.0]),  # inf mass: never inf / inf
                                  ([0.5, 0.5, 0.0], [np.inf, 0.0, 0.0])])
def test_residual_refuses_nan_and_inf_as_sample_does(p, q):
    with pytest.raises(ValueError, match="p or q holds NaN or an infinity"):
        residual(np.array(p), np.array(q))
    with pytest.raises(ValueError, match="no positive finite mass"):
        sample(np.array([np.nan, 1.0]), 0.5)


@given(kit.probability_pairs())
def test_residual_is_a_distribution(pq):
    """residual(p, q) is finite, >= 0 and sums to 1 (in particular whenever beta < 1): norm(max(0, p - q))
    when that has mass, else p. (In float64 beta can round to 1 while max(0, p - q) keeps a denormal mass.)"""
    p, q = pq
    r = residual(p, q)
    assert np.all(np.isfinite(r)) and np.all(r >= 0) and abs(r.sum() - 1) <= ATOL
    if np.maximum(p - q, 0).sum() > 0:
        np.testing.assert_allclose(r, np.maximum(p - q, 0) / np.maximum(p - q, 0).sum(), rtol=0, atol=ATOL)
    else:
        assert r is p
