"""notes/quantized.md's claims, checked on the committed study (bench/results/quantized-epyc/quantized_*.csv).

The note prints its tables from these files (tests/test_notes.py compares what it prints with what it quotes);
these tests hold what the prose concludes from them, each with its interval, so that a rerun that changes a
conclusion fails here and not only a digit:

* the 2^-b law: one bit fewer multiplies the lost mass 1 - beta by qmax(b) / qmax(b - 1), qmax = 2^(b-1) - 1
  (the two steps of the explanation are tests/test_bench_quantized.py's), for the observed steps 8 -> 6 .. 4 -> 3
  within TOLERANCE, and the 3 -> 2 step above it;
* every "within noise" (and every "differs") of the note: a paired difference over the validation windows
  (quantized_beta_windows.csv: the same windows for every draft), within NOISE standard errors of 0 or not;
* the 2-bit positional collapse of the shipped draft: its greedy proposals repeat one of the 4 ids before them
  (quantized_position.csv's `repeat`) and agreement falls to near 0; the 2-bit self-draft does not loop.
"""

import math

import numpy as np
import pytest

from bench.common import read_table
from bench.quantized import mean_and_se, ratio_and_se
from npspec.sources.quantize import parse_scheme

from conftest import ROOT

RESULTS = ROOT / "bench" / "results" / "quantized-epyc"
SELF, DISTILLED = "shipped target", "shipped draft"
TOLERANCE = 0.15  # the 2^-b law is first order in the rounding error: observed / predicted ratio within 15%
NOISE = 2.0  # "within noise": |paired mean difference| below 2 standard errors (a 95% interval holding 0)


def table(name):
    rows, _ = read_table(RESULTS / f"{name}.csv")
    return rows


def windows(scheme, warping="t1.0", draft=SELF, method="rtn"):
    """[48] beta of one draft in each validation window, in window order."""
    rows = sorted((r for r in table("quantized_beta_windows")
                   if (r["draft"], r["scheme"], r["method"]) == (draft, scheme, method)), key=lambda r: int(r["window"]))
    assert rows, (draft, scheme, method)
    return np.array([float(r[f"beta_{warping}"]) for r in rows])


def paired(a, b, warping="t1.0"):
    """beta_a - beta_b averaged over the windows, and its standard error; a, b: (scheme, draft, method)."""
    return mean_and_se(windows(a[0], warping, *a[1:]) - windows(b[0], warping, *b[1:]))


def lost_mass_ratio(low, high, warping):
    """(1 - beta at `low`) / (1 - beta at `high`), pooled over the windows, and its ratio-estimator standard error."""
    return ratio_and_se(1 - windows(low, warping), 1 - windows(high, warping))


def qmax(bits):
    return parse_scheme(f"int{bits}-ch").qmax


def test_the_windows_reproduce_the_table():
    beta = {(r["draft"], r["scheme"], r["method"]): r for r in table("quantized_beta")}
    for key in [(SELF, "int4-g64", "rtn"), (SELF, "int2-ch", "awq"), (DISTILLED, "fp32", "rtn")]:
        for w in ("greedy", "t1.0"):
            values = windows(key[1], w, key[0], key[2])
            assert len(values) == 48
            mean, se = mean_and_se(values)  # full windows: the position-weighted mean is the plain one
            assert math.isclose(mean, float(beta[key][f"beta_{w}"]), abs_tol=2e-4)
            assert math.isclose(se, float(beta[key][f"beta_{w}_se"]), rel_tol=1e-3, abs_tol=1e-7)


@pytest.mark.parametrize("warping", ["t1.0", "greedy"])
@pytest.mark.parametrize("granularity", ["ch", "g128", "g64", "g32"])
def test_one_bit_fewer_multiplies_the_lost_mass_by_the_ratio_of_the_grids_qmax(granularity, warping):
    """Each observed step within TOLERANCE of qmax(b) / qmax(b - 1), where its interval is narrow enough to test (se
    under a tenth of the ratio: every step at temperature 1; greedy from 6 bits down, since at 8 bits only 0.4% of
    the argmaxes flip and the 8 -> 6 ratio's interval, about +-0.7, is only required to hold the prediction)."""
    for high, low in [(8, 6), (6, 5), (5, 4), (4, 3)]:
        observed, se = lost_mass_ratio(f"int{low}-{granularity}", f"int{high}-{granularity}", warping)
        predicted = qmax(high) / qmax(low)  # 127/31, 31/15, 15/7, 7/3
        if warping == "greedy" and high == 8:
            assert abs(observed - predicted) < NOISE * se, (granularity, observed, se, predicted)
            continue
        assert se < 0.1 * observed, (high, low, se)
        assert abs(observed / predicted - 1) < TOLERANCE, (granularity, warping, high, low, observed, predicted)
    observed, se = lost_mass_ratio(f"int2-{granularity}", f"int3-{granularity}", warping)
    assert observed - NOISE * se > qmax(3) / qmax(2), (granularity, warping, observed)  # past the linear regime


# the note's "within noise" statements: paired differences whose interval holds 0
WITHIN_NOISE = [
    # AWQ against round-to-nearest at 3 bits and above, greedy, per channel and in groups of 64
    *[((f"int{b}-{g}", SELF, "awq"), (f"int{b}-{g}", SELF, "rtn"), "greedy") for b in (8, 6, 5, 4, 3) for g in ("ch", "g64")],
    # the distilled draft quantized down to 4 bits in groups (8 bits per channel), greedy, against its float32 self
    *[((s, DISTILLED, "rtn"), ("fp32", DISTILLED, "rtn"), "greedy") for s in ("int8-ch", "int6-g64", "int5-g64", "int4-g64")],
]
# and the differences it calls real: the interval excludes 0
DIFFERS = [
    *[((f"int{b}-g32", SELF, "rtn"), (f"int{b}-ch", SELF, "rtn"), "t1.0") for b in (8, 4, 2)],  # groups help, most at 2
    (("int4-g64+emb", SELF, "rtn"), ("int4-g64", SELF, "rtn"), "t1.0"),  # the embeddings and head cost
    (("int2-g64", SELF, "awq"), ("int2-g64", SELF, "rtn"), "greedy"),  # AWQ helps at 2 bits in groups
    (("int2-ch", SELF, "awq"), ("int2-ch", SELF, "rtn"), "greedy"),  # and hurts per channel
    (("int4-ch", DISTILLED, "rtn"), ("fp32", DISTILLED, "rtn"), "greedy"),  # the distilled draft, 4 bits per channel
    (("int3-g64", DISTILLED, "rtn"), ("fp32", DISTILLED, "rtn"), "greedy"),  # and at 3 bits
    (("int4-g64", DISTILLED, "rtn"), ("fp32", DISTILLED, "rtn"), "t1.0"),  # at temperature 1 every loss is resolved
]


@pytest.mark.parametrize("a, b, warping", WITHIN_NOISE, ids=lambda x: "-".join(x) if isinstance(x, tuple) else x)
def test_what_the_note_calls_within_noise_is_a_paired_difference_whose_interval_holds_zero(a, b, warping):
    mean, se = paired(a, b, warping)
    assert se > 0 and abs(mean) < NOISE * se, (a, b, warping, mean, se)


@pytest.mark.parametrize("a, b, warping", DIFFERS, ids=lambda x: "-".join(x) if isinstance(x, tuple) else x)
def test_what_the_note_calls_a_difference_is_a_paired_difference_whose_interval_excludes_zero(a, b, warping):
    mean, se = paired(a, b, warping)
    assert abs(mean) > NOISE * se, (a, b, warping, mean, se)


def test_awq_moves_beta_at_temperature_1_by_less_than_0_003_at_3_bits_and_above():
    """Resolved (paired over the windows, differences of 0.0001 are), but small: the interval's far end below 0.003."""
    for b in (8, 6, 5, 4, 3):
        for g in ("ch", "g64"):
            mean, se = paired((f"int{b}-{g}", SELF, "awq"), (f"int{b}-{g}", SELF, "rtn"), "t1.0")
            assert abs(mean) + NOISE * se < 0.003, (b, g, mean, se)


def position(draft, scheme, warping, method="rtn"):
    rows = sorted((r for r in table("quantized_position") if (r["draft"], r["scheme"], r["method"], r["warping"])
                   == (draft, scheme, method, warping)), key=lambda r: int(r["position"]))
    assert len(rows) == 8, (draft, scheme, warping)
    return {k: np.array([float(r[k]) for r in rows]) for k in ("beta", "beta_se", "repeat")}


def test_the_2_bit_distilled_draft_falls_into_a_loop_and_the_target_never_follows_it():
    collapsed = position(DISTILLED, "int2-g64", "greedy")
    assert collapsed["repeat"][3:].min() >= 0.9  # from position 4 on, 9 proposals in 10 repeat a recent id
    assert collapsed["beta"][4:].max() < 0.1  # and from position 5 the argmaxes agree in fewer than 1 start in 10
    assert position(DISTILLED, "fp32", "greedy")["repeat"].max() < 0.35  # unquantized, it repeats as the text does


def test_the_2_bit_self_draft_does_not_loop():
    for warping in ("greedy", "t1.0"):
        assert position(SELF, "int2-g64", warping)["repeat"].max() < 0.4


def test_the_self_drafts_at_3_bits_and_above_are_flat_along_positions_within_noise():
    """No position's beta differs from the mean of the 8 by more than 3 of its standard errors (8 looks, so 3)."""
    for scheme in ("int4-ch", "int4-g64", "int3-g64"):
        for warping in ("greedy", "t1.0"):
            p = position(SELF, scheme, warping)
            assert np.all(np.abs(p["beta"] - p["beta"].mean()) < 3 * np.maximum(p["beta_se"], 1e-9)), (scheme, warping)
