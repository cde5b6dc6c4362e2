"""npspec.sources.quantize: the scheme names, round-to-nearest per channel and per group, the 16-bit round trips,
which tensors a scheme quantizes, and the bytes a forward reads."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from npspec.model.tensors import tensor_shapes
from npspec.model.gpt2 import GPT2Config
from npspec.sources.quantize import (Scheme, awq_objective, awq_round_trip, awq_search, check_scheme, dequantize_tensor, from_bfloat16_bits, parse_scheme,
                             quantize_tensor, quantize_tensors, quantized_names, round_trip, to_bfloat16_bits,
                             weight_bytes)

BITS = [2, 3, 4, 5, 6, 8]
CONFIG = GPT2Config(n_vocab=50, n_ctx=16, n_embd=64, n_head=2, n_layer=2, eos_token_id=None)


# ---- names

@pytest.mark.parametrize("name, scheme", [
    ("int4-g64", Scheme("int", 4, 64)), ("int8-ch", Scheme("int", 8)), ("int2-g32+emb", Scheme("int", 2, 32, True)),
    ("fp16", Scheme("fp16", 16)), ("bf16+emb", Scheme("bf16", 16, None, True)), (" int3-g128 ", Scheme("int", 3, 128))])
def test_scheme_names_parse_and_print_back(name, scheme):
    assert parse_scheme(name) == scheme
    assert parse_scheme(scheme.name) == scheme and scheme.name == name.strip()


@pytest.mark.parametrize("name, says", [
    ("int0-ch", "bits must be 2..8, got 0"), ("int1-g64", "bits must be 2..8, got 1 (symmetric 1 bit"),
    ("int9-g64", "bits must be 2..8, got 9"), ("int17-ch", "bits must be 2..8, got 17"),
    ("int4", "needs a granularity: int4-ch"), ("int4-g1", "group must be >= 2"), ("int4-g0", "group must be >= 2"),
    ("int4-g64+wte", "the only suffix is +emb"), ("fp8", "unknown quantization scheme 'fp8'"),
    ("fp16-g64", "unknown quantization scheme"), ("", "unknown quantization scheme ''"),
    ("INT4-g64", "unknown quantization scheme")])
def test_bad_scheme_names_get_one_line_errors(name, says):
    with pytest.raises(ValueError, match=r"^[^\n]*$") as e:
        parse_scheme(name)
    assert says in str(e.value)


def test_a_group_that_does_not_divide_a_width_is_refused_naming_the_tensor():
    shapes = tensor_shapes(CONFIG)  # widths 64 and 256
    check_scheme(parse_scheme("int4-g32"), shapes)
    check_scheme(parse_scheme("int4-g64+emb"), shapes)
    with pytest.raises(ValueError, match=r"group 128 does not divide the input width 64 of h\.0\.attn\.c_attn\.weight"):
        check_scheme(parse_scheme("int4-g128"), shapes)
    with pytest.raises(ValueError, match="group 48 does not divide"):
        quantize_tensors({n: np.zeros(s, np.float32) for n, s in shapes.items()}, parse_scheme("int4-g48"))
    with pytest.raises(ValueError, match="group 3 does not divide the input width 4"):
        quantize_tensor(np.zeros((4, 2), np.float32), parse_scheme("int4-g3"))


def test_which_tensors_a_scheme_quantizes():
    names = list(tensor_shapes(CONFIG))
    linears = [f"h.{i}.{m}.weight" for i in range(2) for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")]
    assert quantized_names(names, parse_scheme("int4-g64")) == linears
    assert quantized_names(names, parse_scheme("bf16+emb")) == ["wte.weight", "wpe.weight"] + linears
    assert not any(".ln_" in n or n.endswith(".bias") for n in quantized_names(names, parse_scheme("int8-ch+emb")))


# ---- round to nearest

def test_hand_made_codes():
    w = np.array([[0.5], [-1.0], [0.26], [0.0]], np.float32)  # one output channel, input axis 0
    q = quantize_tensor(w, parse_scheme("int2-ch"))  # qmax 1, s = 1
    assert q.scales.tolist() == [[1.0]] and q.codes[:, 0].tolist() == [0, -1, 0, 0]  # 0.5 ties to even: 0
    q = quantize_tensor(w, parse_scheme("int3-ch"))  # qmax 3, s = float32(1/3) = 0.33333334: 0.5 / s = 1.4999999 -> 1
    assert q.codes[:, 0].tolist() == [1, -3, 1, 0] and q.scales.dtype == np.float32 and q.codes.dtype == np.int8
    q = quantize_tensor(w, parse_scheme("int2-g2"))  # groups [0.5, -1] (s = 1) and [0.26, 0] (s = 0.26)
    assert q.scales[:, 0].tolist() == [1.0, np.float32(0.26)] and q.codes[:, 0].tolist() == [0, -1, 1, 0]


def test_an_all_zero_group_stays_zero():
    w = np.zeros((64, 3), np.float32)
    w[32:, 1] = np.linspace(-1, 1, 32)
    q = quantize_tensor(w, parse_scheme("int4-g32"))
    assert q.scales[0].tolist() == [0, 0, 0] and np.all(dequantize_tensor(q, parse_scheme("int4-g32"))[:32] == 0)


@st.composite
def matrices(draw):
    d_in = draw(st.sampled_from([32, 64, 128, 256]))
    d_out = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((d_in, d_out)) * np.exp(rng.uniform(-8, 4, (1, d_out)))  # a scale per channel
    w[rng.random(w.shape) < 0.02] *= 30  # outliers, as trained weights have
    return w.astype(np.float32)


@given(matrices(), st.sampled_from(BITS), st.sampled_from([None, 32]), st.booleans())
def test_every_weight_is_within_half_a_step(w, bits, group, transposed):
    scheme, axis = Scheme("int", bits, group), int(transposed)
    w = w.T.copy() if transposed else w  # wte's layout: the input axis is 1
    q = quantize_tensor(w, scheme, axis)
    back = dequantize_tensor(q, scheme, axis)
    assert back.dtype == np.float32 and back.shape == w.shape == q.codes.shape
    n_groups = w.shape[axis] // (group or w.shape[axis])
    assert q.scales.shape == ((n_groups, w.shape[1]) if axis == 0 else (w.shape[0], n_groups))
    assert np.abs(q.codes).max() <= scheme.qmax
    step = np.repeat(q.scales, w.shape[axis] // n_groups, axis=axis)  # each weight's scale
    assert np.all(np.abs(w - back) <= step / 2 + np.spacing(np.abs(back)))  # half a step, plus the product's rounding
    assert np.all(np.abs(q.codes).max(axis=axis) == scheme.qmax)  # each channel's largest weight is on the outer level


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("group", [None, 32])
def test_a_tensor_on_the_grid_is_reproduced_exactly(bits, group):
    """Codes times scales with at most 16 significant bits (so every product is exact in float32), each group
    using its outer level: quantizing gives back the very codes and scales, and dequantizing the very tensor."""
    rng = np.random.default_rng(bits)
    scheme = Scheme("int", bits, group)
    d_in, d_out = 128, 5
    n_groups = d_in // (group or d_in)
    scales = (rng.integers(1, 2**16, (n_groups, d_out)) * 2.0 ** rng.integers(-30, -10, (n_groups, d_out)))
    codes = rng.integers(-scheme.qmax, scheme.qmax + 1, (n_groups, d_in // n_groups, d_out))
    codes[:, 0, :] = scheme.qmax * rng.choice([-1, 1], (n_groups, d_out))  # every group reaches its outer level
    w = (codes * scales[:, None, :]).reshape(d_in, d_out).astype(np.float32)
    q = quantize_tensor(w, scheme)
    assert np.array_equal(q.codes, codes.reshape(d_in, d_out)) and np.array_equal(q.scales, scales.astype(np.float32))
    assert np.array_equal(dequantize_tensor(q, scheme), w)


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 7])
def test_fewer_bits_never_reconstruct_better_on_average(bits):
    w = np.random.default_rng(0).standard_normal((256, 64)).astype(np.float32)
    err = {b: float(np.mean((w - round_trip(w, Scheme("int", b, 64))) ** 2)) for b in (bits, bits + 1)}
    assert err[bits] > err[bits + 1] > 0


# ---- the 16-bit levels

@given(matrices())
def test_the_16_bit_levels_are_within_float_rounding(w):
    half = round_trip(w, parse_scheme("fp16"))
    assert np.array_equal(half, w.astype(np.float16).astype(np.float32))
    assert np.all(np.abs(w - half) <= np.maximum(np.abs(w) * 2.0**-11, 2.0**-25))  # half an ulp; subnormals
    brain = round_trip(w, parse_scheme("bf16"))
    assert np.all(np.abs(w - brain) <= np.abs(w) * 2.0**-8)
    assert np.all(brain.view(np.uint32) & 0xFFFF == 0)  # a bfloat16 value: the low half of the bits is zero
    assert np.array_equal(round_trip(brain, parse_scheme("bf16")), brain)  # on the grid: reproduced exactly


def test_bfloat16_rounds_ties_to_even():
    w = np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8 + 2**-20), 2**-130, 3.0e38], np.float32)
    expected = [1.0, 1 + 2**-6, -(1 + 2**-7), None, None]  # tie down to even; tie up to even; above the tie: up
    got = from_bfloat16_bits(to_bfloat16_bits(w))
    assert got[:3].tolist() == expected[:3]
    assert got[3] == np.float32(2**-130) and abs(got[4] - 3.0e38) <= 3.0e38 * 2**-8  # subnormal exact, large near


def test_bfloat16_matches_torch():
    torch = pytest.importorskip("torch")
    w = np.random.default_rng(1).standard_normal(10000).astype(np.float32) * 10.0 ** np.arange(-5, 5).repeat(1000)
    ours = round_trip(w.reshape(100, 100), parse_scheme("bf16")).ravel()
    theirs = torch.from_numpy(w).to(torch.bfloat16).to(torch.float32).numpy()
    assert np.array_equal(ours, theirs)


def test_values_outside_a_format_are_refused():
    with pytest.raises(ValueError, match=r"does not fit float16 \(\|w\| > 65504\); use bf16"):
        quantize_tensor(np.array([[7e4]], np.float32), parse_scheme("fp16"))
    with pytest.raises(ValueError, match="rounds to inf in bfloat16"):
        quantize_tensor(np.array([[3.4e38]], np.float32), parse_scheme("bf16"))
    with pytest.raises(ValueError, match="NaN or inf"):
        quantize_tensor(np.array([[np.nan]], np.float32), parse_scheme("int8-ch"))


# ---- activation-aware scaling (AWQ)

@st.composite
def layers(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((96, 64)) * np.exp(rng.uniform(-2, 3, 64))  # channels of very different magnitude
    x[:, rng.integers(0, 64, 2)] *= 20  # a few salient channels
    return x.astype(np.float32), rng.standard_normal((64, 24)).astype(np.float32)


@given(layers(), st.sampled_from([2, 3, 4, 8]), st.sampled_from([None, 32]))
def test_awq_is_never_worse_than_round_to_nearest_on_its_calibration_objective(layer, bits, group):
    x, w = layer
    scheme = Scheme("int", bits, group)
    s, alpha, losses = awq_search(x, w, scheme)
    rtn = awq_objective(x, w, round_trip(w, scheme))
    assert losses[0] == rtn  # alpha = 0: s = 1, plain round-to-nearest
    assert awq_objective(x, w, awq_round_trip(w, s, scheme)) == losses.min() <= rtn
    assert s.shape == (64,) and s.dtype == np.float32 and alpha == int(np.argmin(losses)) / 20


def test_awq_buys_back_accuracy_when_a_few_channels_carry_large_activations():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 64)).astype(np.float32)
    x[:, [3, 10]] *= [30, 10]  # the salient channels of Lin et al.'s Figure 2
    w = rng.standard_normal((64, 32)).astype(np.float32)
    s, alpha, losses = awq_search(x, w, parse_scheme("int3-g32"))
    assert alpha > 0 and losses.min() < 0.5 * losses[0]
    assert s[3] == s.max() and s[10] > np.median(s)  # the salient channels get the largest scales
    with pytest.raises(ValueError, match="AWQ scales integer schemes only, not bf16"):
        awq_search(x, w, parse_scheme("bf16"))


# ---- bytes

def test_weight_bytes_count_the_matrices_a_token_reads():
    shapes = tensor_shapes(CONFIG)  # per layer: 64x192 + 64x64 + 64x256 + 256x64 = 49152 weights; wte 50x64
    linears, head = 2 * 49152, 50 * 64
    assert weight_bytes(shapes, parse_scheme("fp16")) == 2 * linears + 4 * head
    assert weight_bytes(shapes, parse_scheme("bf16+emb")) == 2 * linears + 2 * head
    assert weight_bytes(shapes, parse_scheme("int4-g32")) == linears / 2 + 4 * linears / 32 + 4 * head
    # per channel: one scale per output column of each linear, per row of wte
    columns = 2 * (192 + 64 + 256 + 64)
    assert weight_bytes(shapes, parse_scheme("int8-ch+emb")) == linears + 4 * columns + head + 4 * 50
