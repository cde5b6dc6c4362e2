"""top_p_tail (sort of the values, no argsort) removes exactly what the stable-argsort rule removes."""

import numpy as np
from hypothesis import given, strategies as st
from hypothesis.extra.numpy import arrays

from npspec.sampling import top_p_tail, warp


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
