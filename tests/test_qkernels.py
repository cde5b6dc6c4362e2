"""npspec.kernels.quantized: the "dequant-panels" product equals, bit for bit, the same panel GEMVs on the dequantized float32
matrix (npspec.sources.quantize's values); it is batch invariant; a model holding int8 codes runs only with it, and as a draft
it keeps greedy output identical to plain greedy decoding."""

import json

import numpy as np
import pytest

from npspec.sources.errors import CheckpointError
from npspec.model.model import Model
from npspec.kernels.quantized import QuantizedMatrix, dequant_gemm, dequant_panels, holds_codes, qpanel_width
from npspec.kernels.registry import kernel
from npspec.sources.quantize import dequantize_tensor, parse_scheme, quantize_tensor
from npspec.sources.quantized import load_quantized, quantize_model, save_quantized
from npspec.sources import load
from npspec.decode import speculative_generate

from conftest import run_python, tiny_model

D_IN, D_OUT, WIDTH = 64, 203, 40  # 203 = 5 * 40 + 3: one overlapping last panel


def panel_reference(x, w, width):  # [n, d_in], float32 [d_in, d_out] -> [n, d_out]
    """The GEMVs dequant_panels should run, on float32 weights: panels of `width` columns at 0, width, ...,
    and one more at d_out - width if width does not divide d_out (written last); every row its own GEMV."""
    d_out = w.shape[1]
    starts = list(range(0, d_out - width + 1, width))
    starts += [d_out - width] if d_out % width else []
    out = np.empty((len(x), d_out), dtype=np.float32)
    for s in starts:
        panel = np.ascontiguousarray(w[:, s:s + width])
        out[:, s:s + width] = [np.matmul(row[None, :], panel)[0] for row in x]
    return out


@pytest.mark.parametrize("name", ["int8-ch", "int8-g16", "int4-g32", "int2-ch"])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_the_kernel_is_the_panel_gemvs_on_the_dequantized_matrix_bit_for_bit(name, n):
    rng = np.random.default_rng(n)
    scheme = parse_scheme(name)
    q = quantize_tensor(rng.standard_normal((D_IN, D_OUT)).astype(np.float32), scheme)
    w = dequantize_tensor(q, scheme)  # npspec.sources.quantize's float32 values
    m = QuantizedMatrix.from_codes(q.codes, q.scales, panel_bytes=4 * D_IN * WIDTH)
    assert m.width == WIDTH and m.starts == (0, 40, 80, 120, 160, 163) and m.shape == (D_IN, D_OUT)
    np.testing.assert_array_equal(m.dequantize(), w)  # the same weights, bit for bit
    x, b = rng.standard_normal((n, D_IN)).astype(np.float32), rng.standard_normal(D_OUT).astype(np.float32)
    y = dequant_panels(x, m, b)
    assert y.dtype == np.float32 and y.shape == (n, D_OUT)
    np.testing.assert_array_equal(y, panel_reference(x, w, WIDTH) + b)
    for i in range(n):  # batch invariant: row i is the one-row product
        np.testing.assert_array_equal(y[i], dequant_panels(x[i:i + 1], m, b)[0])
    np.testing.assert_allclose(y, x @ w + b, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(dequant_gemm(x, m, b), x @ w + b, rtol=1e-5, atol=1e-4)


def test_a_float_matrix_goes_to_gemv_rows():
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((3, 8)).astype(np.float32), rng.standard_normal((8, 5)).astype(np.float32)
    np.testing.assert_array_equal(dequant_panels(x, w), np.matmul(x[:, None, :], w)[:, 0])


def test_panel_widths_follow_the_buffer_size():
    assert qpanel_width(1280, 3840, 512 << 10) == 96 and qpanel_width(5120, 1280, 512 << 10) == 24
    assert qpanel_width(64, 5, 512 << 10) == 5 and qpanel_width(5120, 1280, 1 << 10) == 8


@pytest.mark.parametrize("codes, scales, says", [
    (np.zeros((8, 4), np.float32), np.ones((1, 4), np.float32), "codes must be a 2-D int8 array [d_in, d_out], got float32"),
    (np.zeros(8, np.int8), np.ones((1, 4), np.float32), "codes must be a 2-D int8 array"),
    (np.zeros((8, 4), np.int8), np.ones((3, 4), np.float32), "n_groups dividing 8, got float32 [3, 4]"),
    (np.zeros((8, 4), np.int8), np.ones((1, 5), np.float32), "scales must be float32 [n_groups, 4]"),
    (np.zeros((8, 4), np.int8), np.ones((1, 4), np.float64), "got float64 [1, 4]"),
])
def test_bad_codes_or_scales_get_one_line_errors(codes, scales, says):
    with pytest.raises(ValueError) as e:
        QuantizedMatrix.from_codes(codes, scales)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_bad_calls_get_one_line_errors():
    m = QuantizedMatrix.from_codes(np.ones((8, 4), np.int8), np.ones((1, 4), np.float32))
    with pytest.raises(ValueError, match=r"x must be \[n, 8\] to multiply a quantized \[8, 4\] matrix, got \[2, 7\]"):
        dequant_panels(np.ones((2, 7), np.float32), m)
    with pytest.raises(ValueError, match="thread count must be a positive integer"):
        kernel("dequant-panels").build(0)


def test_a_model_keeps_codes_only_with_the_dequantizing_kernel():
    model = tiny_model(seed=3, role="draft")
    scheme = parse_scheme("int4-g8")
    q = quantize_model(model, scheme, kernel="dequant-panels")
    f = quantize_model(model, scheme)  # gemv-rows: dequantized at build
    assert holds_codes(q.params) and not holds_codes(f.params) and q.invariant
    assert q.n_params == f.n_params and q.n_bytes < f.n_bytes
    for lq, lf in zip(q.params["h"], f.params["h"]):
        np.testing.assert_array_equal(lq["mlp"]["c_fc"]["w"].dequantize(), lf["mlp"]["c_fc"]["w"])
    ids = np.array([3, 1, 4, 1, 5, 9, 2, 6])
    logits = q.forward(ids, q.new_cache())
    assert logits.dtype == np.float32 and logits.shape == (8, model.config.n_vocab)
    np.testing.assert_allclose(logits, f.forward(ids, f.new_cache()), rtol=1e-4, atol=1e-4)  # other GEMV shapes
    np.testing.assert_allclose(q.prefill(ids, q.new_cache()), logits, rtol=1e-4, atol=1e-4)
    for i in range(len(ids)):  # one-token forwards give the verify forward's rows, bit for bit
        cache = q.new_cache()
        q.forward(ids[:i], cache)
        np.testing.assert_array_equal(q.forward(ids[i:i + 1], cache)[0], logits[i])
    with pytest.raises(ValueError, match="holds int8 codes .*: kernel 'gemv-rows' cannot read them; use dequant-panels"):
        q.with_kernel("gemv-rows")
    with pytest.raises(ValueError, match="quantize or save the float32 model it came from"):
        quantize_model(q, scheme)
    awq_like = quantize_model(model, parse_scheme("bf16"), kernel="dequant-panels")  # no int codes: float32 weights
    assert not holds_codes(awq_like.params)


def test_a_quantized_directory_loads_as_codes(shipped, tmp_path):
    out = save_quantized(tmp_path / "q", shipped[1], parse_scheme("int8-g64"))
    q = load_quantized(out, kernel="dequant-panels")
    assert holds_codes(q.params) and q.kernel == "dequant-panels"
    assert isinstance(q.params["h"][0]["attn"]["c_attn"]["w"], QuantizedMatrix)
    with pytest.raises(CheckpointError):
        load_quantized(tmp_path / "missing", kernel="dequant-panels")


@pytest.mark.parametrize("name", ["int8-ch", "int4-g64"])
def test_a_dequantizing_self_draft_is_greedy_identical(shipped, val_ids, name):
    target = shipped[0]
    draft = load(f"{name}:self", "draft", kernel="dequant-panels")  # the shipped target quantized, codes kept
    assert holds_codes(draft.params) and draft.kernel == "dequant-panels"
    prompt = list(val_ids[:16])
    plain = speculative_generate(target, None, prompt, 40, gamma=0, temperature=0)
    gen = speculative_generate(target, draft, prompt, 40, gamma=4, temperature=0)
    assert gen.ids == plain.ids and gen.stats.drafted > 0 and gen.stats.accepted > 0


@pytest.mark.slow  # a whole command, 3 s or more: CI's second step
def test_the_cli_takes_the_dequantizing_draft_kernel():
    args = ["-m", "npspec.generate", "--json", "--temperature", "0", "--max-new-tokens", "16"]
    spec = json.loads(run_python(*args, "--draft", "int8-ch:self", "--draft-kernel", "dequant-panels").stdout)
    plain = json.loads(run_python(*args, "--gamma", "0").stdout)
    assert spec["ids"] == plain["ids"] and spec["stats"]["alpha"] > 0.5


def test_the_model_refuses_codes_with_a_float_kernel():
    q = quantize_model(tiny_model(seed=4), parse_scheme("int8-ch"), kernel="dequant-panels")
    with pytest.raises(ValueError, match="cannot read them"):
        Model(q.config, q.params, kernel="gemv-panels")
