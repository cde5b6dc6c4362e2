"""bench.quantized: the quantized-draft study measures what npspec.decode.evaluate does, and states its uncertainty.

The study's figures are quoted in notes/quantized.md; tests/test_notes_quantized.py checks the quotes against
bench/results/. Here: the measuring functions themselves, on the shipped pair and on hand-made tables.
"""

import math
from fractions import Fraction

import numpy as np
import pytest

from bench import models, qdrafts, quantized
from npspec.decode.evaluate import expected_acceptance, validation_loss
from npspec.sources import load
from npspec.sources.quantize import parse_scheme, round_trip
from npspec.testing import TableModel


def test_the_quantized_study_measures_what_npspec_evaluate_does(shipped, val_ids):
    """bench.quantized's one-pass beta and loss equal npspec.decode.evaluate's expected_acceptance and validation_loss on the
    same window; along a draft identical to the target, beta is 1 at every position."""
    target, draft = shipped
    wins = quantized.windows(val_ids, target.config.n_ctx, 1)
    betas, per_window, loss = quantized.beta_and_loss(draft, wins, quantized.reference(target, wins))
    for name, temperature in (("greedy", 0.0), ("t1.0", 1.0)):
        assert betas[name] == expected_acceptance(target, draft, val_ids, temperature=temperature, max_windows=1)
        assert per_window[name] == [betas[name]]  # one window: its mean is the mean
    assert math.isclose(loss, validation_loss(draft, val_ids, max_windows=1)[0], rel_tol=1e-12)
    assert 0 < betas["greedy"] < 1 and betas["t0.8_p0.95"] != betas["t1.0"]
    for name in ("greedy", "t1.0"):
        per, per_se, _ = quantized.position_betas(target, target.with_kernel("gemv-rows"), val_ids, [100, 2000],
                                                  quantized.WARPS[name])
        assert len(per) == len(per_se) == quantized.DEPTH and min(per) > 1 - 1e-5  # only the kernels' rounding differs
    train = models.validation_ids(target.tokenizer, part=0)
    cal = quantized.calibration_windows(train, 256, 4)
    assert len(cal) == 4 and all(len(c) == 256 for c in cal) and list(cal[0]) == train[:256]


def test_beta_over_several_windows_is_the_position_weighted_mean_of_the_window_means(shipped, val_ids):
    target, draft = shipped
    wins = quantized.windows(val_ids, target.config.n_ctx, 3)
    wins[-1] = wins[-1][:100]  # a shorter last window weighs less
    betas, per_window, _ = quantized.beta_and_loss(draft, wins, quantized.reference(target, wins))
    weights = np.array([len(w) - 1 for w in wins], dtype=np.float64)
    for name in quantized.WARPS:
        assert len(per_window[name]) == 3
        assert math.isclose(betas[name], float(np.dot(per_window[name], weights) / weights.sum()), rel_tol=1e-12)


def test_mean_and_se_is_the_mean_and_the_sample_standard_deviation_over_root_n():
    assert quantized.mean_and_se([1.0, 2.0, 3.0, 6.0]) == (3.0, math.sqrt(14 / 3) / 2)  # var (4+1+0+9)/3
    assert quantized.mean_and_se([0.25]) == (0.25, 0.0)


def test_ratio_and_se_pools_the_units_and_takes_the_ratio_estimators_error():
    """Two units, 3/4 and 1/4 accepted: r = 4/8; residuals 3 - 2 = 1 and 1 - 2 = -1, se = sqrt(2 / 2) / 4."""
    assert quantized.ratio_and_se([3, 1], [4, 4]) == (0.5, 0.25)
    r, se = quantized.ratio_and_se([5, 10, 15], [10, 20, 30])  # every unit at the pooled ratio: no spread
    assert r == 0.5 and se == 0.0
    assert all(math.isnan(v) for v in quantized.ratio_and_se([0, 0], [0, 0]))
    assert quantized.ratio_and_se([2], [5]) == (0.4, 0.0)


def looping_draft(n_vocab, loop_id):
    """A draft whose argmax is always `loop_id` (the 2-bit draft's '\\n\\n\\n...'), from a table."""
    row = [Fraction(1, 2 * (n_vocab - 1))] * n_vocab
    row[loop_id] = Fraction(1, 2)
    return TableModel.from_table(lambda seq: row, n_vocab, n_ctx=128)


def test_repeat_counts_the_proposals_that_repeat_one_of_the_ids_before_them():
    """A draft stuck on one id repeats from its 2nd proposal on (the 1st repeats only if the context ended on it);
    a target that never continues it gives greedy beta 0 there."""
    n_vocab, loop_id = 5, 3
    draft = looping_draft(n_vocab, loop_id)
    target = TableModel.from_table(lambda seq: [Fraction(1, 4)] * 3 + [Fraction(0)] + [Fraction(1, 4)], n_vocab,
                                   n_ctx=128)
    val_ids = [0, 1, 2, 4] * 40  # no loop_id in the text
    per, per_se, repeat = quantized.position_betas(target, draft, val_ids, [64, 70, 90], quantized.WARPS["greedy"])
    assert repeat == [0.0] + [1.0] * (quantized.DEPTH - 1)
    assert per == [0.0] * quantized.DEPTH and per_se == [0.0] * quantized.DEPTH


@pytest.mark.parametrize("bits", [4, 5, 6, 8])
def test_the_rounding_error_shrinks_by_the_ratio_of_the_grids_qmax_per_bit(bits):
    """The first step of notes/quantized.md's explanation of 1 - beta's doubling: round-to-nearest on a grid of step
    max|w| / qmax, qmax = 2^(b-1) - 1, leaves an error of RMS step / sqrt(12) (uniform within half a step), so one
    bit fewer multiplies it by qmax(b) / qmax(b - 1). Checked on 2^20 Gaussian weights per output channel; the
    2-bit grid (qmax 1: most weights round to 0) is where the uniform-error picture ends, and is left out."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((1024, 1024)).astype(np.float32)
    rms = {b: float(np.sqrt(np.mean((round_trip(w, parse_scheme(f"int{b}-ch")) - w).astype(np.float64) ** 2)))
           for b in (bits - 1, bits)}
    predicted = parse_scheme(f"int{bits}-ch").qmax / parse_scheme(f"int{bits - 1}-ch").qmax
    assert math.isclose(rms[bits - 1] / rms[bits], predicted, rel_tol=0.03)


def test_total_variation_is_linear_in_a_small_logit_perturbation():
    """The second step: for logits z + eps * delta, TV(softmax(z), softmax(z + eps delta)) = 1 - beta equals
    eps * (1/2) sum_i p_i |delta_i - E_p[delta]| + O(eps^2): halving the perturbation halves 1 - beta."""
    rng = np.random.default_rng(1)
    z, delta = rng.standard_normal(50) * 3, rng.standard_normal(50)
    p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    slope = 0.5 * float(np.sum(p * np.abs(delta - p @ delta)))
    for eps in (1e-2, 1e-3, 1e-4):
        q = np.exp(z + eps * delta - (z + eps * delta).max())
        q /= q.sum()
        tv = 1 - float(np.minimum(p, q).sum())
        assert abs(tv / eps - slope) <= 2 * eps * 50 * float(np.abs(delta).max()) ** 2  # the O(eps) term, bounded loosely


def test_qdrafts_counts_a_float32_draft_as_every_matrix_at_4_bytes_and_a_code_at_its_bits():
    """bench.qdrafts' bytes column: fp32 is bench.models.matrix_bytes of a built model; int8-ch reads a byte a
    weight plus a float32 scale a column, so it sits just above a quarter of fp32."""
    model = load("random:tiny")
    fp32 = qdrafts.matrix_bytes(model.config, "fp32")
    assert fp32 == models.matrix_bytes(model)
    assert fp32 / 4 < qdrafts.matrix_bytes(model.config, "int8-ch+emb") < fp32 / 3.5


def test_qdrafts_rows_name_the_drafts_the_cli_takes_and_the_studys_betas():
    assert qdrafts.draft_spec("fp32", "distilgpt2") == "random:distilgpt2"
    assert qdrafts.draft_spec("int4-g64", "self") == "int4-g64:self"
    betas = qdrafts.study_betas()
    assert all(0 < betas[(d, s)] <= 1 for d in ("shipped target", "shipped draft") for s in qdrafts.SCHEMES)
    assert betas[("shipped target", "fp32")] == 1  # the target drafting for itself keeps everything
