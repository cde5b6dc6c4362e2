"""The compiled quantized product "compiled-quant" (npspec.kernels.compiled.quant, the `fast` extra), bit for bit.

On int8 codes and 4-bit codes two a byte, per channel and per group, its product equals compiled-panels' on the
dequantized float32 matrix for every row count 1..16 and thread counts 1, 2, 3 and 7, with either loop nest over the
codes (NESTS: the 512-bit tiles, or the 256-bit register blocks of 1 to 4 rows); a row never depends on the
other rows; a quantized model on it (the +emb head too) decodes as the dequantized model on compiled-panels, and a
self-draft on it keeps greedy output. The packing (QuantPanels) is plain NumPy and tested without numba; the
products skip without it, saying why.
"""

import json

import numpy as np
import pytest

from npspec.decode import speculative_generate
from npspec.kernels import compiled
from npspec.kernels.probe import choose_kernels
from npspec.kernels.registry import REGISTRY, STATIC_DEFAULT, codes_kernel, plain_baselines, role_candidates
from npspec.sources import first_kernel, load, random_model
from npspec.sources.quantize import dequantize_tensor, parse_scheme, quantize_tensor
from npspec.sources.quantized import quantize_model

from conftest import ROOT, run_python, tiny_model

needs_numba = pytest.mark.skipif(not compiled.available(), reason="compiled-quant needs the 'fast' extra (numba)")
M_MAX = 16
THREADS = (1, 2, 3, 7)
NESTS = (compiled.PANEL, compiled.blocks.PANEL)  # CompiledQuant's float_panel, which picks the nest over the codes
# schemes: 4-bit codes two a byte (int4-g64, int4-ch, int3-g4), int8 codes (int8-ch, int8-g32), and 4-bit codes kept
# one a byte because the group is odd (int4-g3)
SCHEMES = ("int8-ch", "int8-g32", "int4-g64", "int4-ch", "int3-g4")
SHAPES = [(64, 67), (128, 33), (768, 2304), (3072, 768), (1280, 1283)]


def quantized(d_in, d_out, scheme, seed=0):  # -> (QuantPanels, the dequantized float32 matrix, column-major)
    s = parse_scheme(scheme)
    w = np.random.default_rng(seed).standard_normal((d_in, d_out), dtype=np.float32)
    q = quantize_tensor(w, s, 0)
    return compiled.QuantPanels.from_codes(q.codes, q.scales), np.asfortranarray(dequantize_tensor(q, s, 0))


def rows(m, d_in, seed=2):
    return np.random.default_rng(seed).standard_normal((m, d_in), dtype=np.float32)


@pytest.mark.parametrize("scheme", SCHEMES + ("int4-g3",))
@pytest.mark.parametrize("d_in, d_out", [(192, 67), (384, 130)])
def test_packed_codes_dequantize_to_the_dequantized_models_values(scheme, d_in, d_out):
    """QuantPanels.dequantize is quantize.dequantize_tensor bit for bit; columns() its columns; 4-bit codes with an
    even group are stored two a byte (half the bytes), others one a byte; panels past d_out hold zeros."""
    q, want = quantized(d_in, d_out, scheme)
    assert np.array_equal(q.dequantize(), want) and q.dequantize().flags.f_contiguous
    ids = np.array([0, 5, d_out - 1, 64 % d_out])
    assert np.array_equal(q.columns(ids), want[:, ids].T)
    bits, group = parse_scheme(scheme).bits, parse_scheme(scheme).group or d_in
    assert q.nibbles == (bits <= 4 and group % 2 == 0)
    count = -(-d_out // compiled.PANEL)
    assert q.codes.shape == (count, d_in // 2 if q.nibbles else d_in, compiled.PANEL)
    assert q.scales.shape == (count, d_in // group, compiled.PANEL) and q.group == group
    assert not q.codes[-1, :, d_out - (count - 1) * compiled.PANEL:].any()
    assert q.nbytes == q.codes.nbytes + q.scales.nbytes and q.shape == (d_in, d_out)


def test_from_codes_refuses_other_dtypes_and_shapes():
    codes, scales = np.zeros((8, 3), np.int8), np.ones((2, 3), np.float32)
    for bad in ((codes.astype(np.int16), scales), (codes, scales.astype(np.float64)), (codes, np.ones((3, 3), np.float32)),
                (codes[0], scales)):
        with pytest.raises(ValueError, match="must be"):
            compiled.QuantPanels.from_codes(*bad)


def test_code_panels_that_do_not_hold_their_shape_are_refused_not_read_past():
    """QuantPanels made by hand with another shape gave values near 1e35 (read past the codes); now one line, as is a
    panel that is not a positive int."""
    w = np.random.default_rng(4).standard_normal((128, 40), dtype=np.float32)
    for scheme in ("int4-g64", "int8-ch"):
        codes, scales = quantize_tensor(w, parse_scheme(scheme), 0)[:2]
        q = compiled.QuantPanels.from_codes(codes, scales)
        assert np.array_equal(compiled.QuantPanels(q.codes, q.scales, q.shape, q.nibbles).dequantize(), q.dequantize())
        for bad in ((q.codes, q.scales, (10 ** 6, 40), q.nibbles), (q.codes, q.scales, (128, 4000), q.nibbles),
                    (q.codes, q.scales, q.shape, not q.nibbles),
                    (q.codes.astype(np.int16), q.scales, q.shape, q.nibbles),
                    (q.codes, q.scales[:, :, :32], q.shape, q.nibbles), (q.codes, q.scales, (128,), q.nibbles)):
            with pytest.raises(ValueError, match=r"^codes (must be int8|\[.*\] and scales \[.*\] do not hold)"):
                compiled.QuantPanels(*bad)
        for panel in (0, -1, True, 2.5):
            with pytest.raises(ValueError, match=r"^a panel holds a positive number of columns"):
                compiled.QuantPanels.from_codes(codes, scales, panel=panel)


def test_the_probe_chooses_among_the_kernels_reading_the_codes_a_model_holds():
    """registry.role_candidates for a model's codes class; first_kernel: compiled-quant for an int SCHEME:SPEC when
    installed, else STATIC_DEFAULT (the model then holds dequantized float32 weights)."""
    assert role_candidates("draft", compiled.QuantPanels) == (("compiled-quant",) if compiled.available() else ())
    assert role_candidates("target", REGISTRY["dequant-panels"].codes) == ("dequant-panels",)
    assert codes_kernel() == ("compiled-quant" if compiled.available() else STATIC_DEFAULT)
    assert first_kernel("int4-g64:self") == codes_kernel() and first_kernel("int8-ch+emb:x") == codes_kernel()
    assert first_kernel("fp16:self") == first_kernel("random:gpt2") == first_kernel(None) == STATIC_DEFAULT
    assert plain_baselines("compiled-quant", compiled.QuantPanels) == ("compiled-quant",)  # --compare of a codes target
    assert plain_baselines("dequant-panels", REGISTRY["dequant-panels"].codes) == ("dequant-panels",)


@needs_numba
@pytest.mark.parametrize("nest", NESTS)
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("d_in, d_out", SHAPES)
def test_every_row_count_and_thread_count_gives_compiled_panels_bits_on_the_dequantized_matrix(scheme, d_in, d_out,
                                                                                               nest):
    q, w = quantized(d_in, d_out, scheme)
    b = rows(1, d_out, seed=1)[0]
    x = rows(M_MAX + 3, d_in)
    want = np.concatenate([compiled.CompiledPanels(1)(x[i : i + 1], w, b) for i in range(M_MAX + 3)])
    for threads in THREADS:
        kernel = compiled.CompiledQuant(threads, float_panel=nest)
        assert kernel.blocks == (nest == compiled.blocks.PANEL)
        for m in range(1, M_MAX + 1):
            for start in (0, 3):
                got = kernel(x[start : start + m], q, b)
                assert np.array_equal(got, want[start : start + m]), f"threads={threads}, M={m}, start={start}"


@needs_numba
@pytest.mark.parametrize("nest", NESTS)
def test_a_row_does_not_depend_on_what_the_other_rows_hold(nest):
    q, _ = quantized(768, 2304, "int4-g64")
    row = rows(1, 768, seed=3)
    kernel = compiled.CompiledQuant(2, float_panel=nest)
    want = kernel(row, q)[0]
    for other in (np.zeros, np.ones, lambda s: np.full(s, np.inf, np.float32), lambda s: rows(*s, seed=4)):
        for m in (2, 5, 16):
            for place in (0, m // 2, m - 1):
                x = np.asarray(other((m, 768)), dtype=np.float32).copy()
                x[place] = row
                assert np.array_equal(kernel(x, q)[place], want), f"M={m}, row {place}"


def every_nibble_pair(d_out=67):  # -> (codes int8 [512, d_out], scales float32 [8, d_out]): all 256 pairs (k, k + 1)
    pairs = np.array([(lo, hi) for hi in range(-8, 8) for lo in range(-8, 8)], dtype=np.int8).reshape(-1)
    codes = np.stack([np.roll(pairs, 2 * n) for n in range(d_out)], axis=1)
    scales = np.random.default_rng(5).standard_normal((8, d_out), dtype=np.float32)
    scales[0, :6] = (0.0, -0.0, np.float32(1e-41), np.float32(3e37), np.float32(1e38), np.inf)  # zero, negative zero,
    # subnormal, huge (8 times it overflows), infinite
    return codes, scales


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
def test_every_pair_of_4_bit_codes_packs_and_unpacks_to_its_values():
    """Both codes of each of the 256 pairs (k even, k + 1) come back from a byte, -8 and 7 included."""
    codes, scales = every_nibble_pair()
    q = compiled.QuantPanels.from_codes(codes, scales)
    assert q.nibbles and np.array_equal(np.concatenate([q.panel_codes(0), q.panel_codes(1)], axis=1)[:, :67], codes)
    assert np.array_equal(q.dequantize(), codes.astype(np.float32) * np.repeat(scales, 64, axis=0), equal_nan=True)


@needs_numba
@pytest.mark.parametrize("nest", NESTS)
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
def test_every_pair_of_4_bit_codes_multiplies_as_its_dequantized_weights(nest):
    """Each nest's decode of a byte (the tiles: floor, then one fma for the low code; the register blocks: integer
    shifts and masks, then one multiply) gives float32(code) * scale bit for bit, for every pair of codes and a zero,
    negative, subnormal, huge or infinite scale: compiled-panels' output on the matrix."""
    codes, scales = every_nibble_pair()
    q = compiled.QuantPanels.from_codes(codes, scales)
    x = rows(9, 512, seed=6)
    want = np.concatenate([compiled.CompiledPanels(1)(x[i : i + 1], q.dequantize()) for i in range(9)])
    for m in range(1, 10):
        got = compiled.CompiledQuant(1, float_panel=nest)(x[:m], q)
        assert np.array_equal(got, want[:m], equal_nan=True), f"M={m}"


@needs_numba
@pytest.mark.parametrize("nest", NESTS)
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
def test_a_weight_overflows_only_where_its_dequantized_value_does(nest):
    """Each pair of 4-bit codes alone in its column (d_in 2, a group of 2), at scales 1e38 and inf: a code times the
    scale overflows for |code| >= 4 at 1e38, never for the others, and the product is compiled-panels' on the
    dequantized matrix."""
    pairs = np.array([(lo, hi) for hi in range(-8, 8) for lo in range(-8, 8)], dtype=np.int8).T  # [2, 256]
    x = np.concatenate([np.ones((1, 2), np.float32), rows(2, 2, seed=7)])
    for scale in (np.float32(1e38), np.float32(np.inf)):
        q = compiled.QuantPanels.from_codes(pairs, np.full((1, 256), scale, np.float32))
        want = np.concatenate([compiled.CompiledPanels(1)(x[i : i + 1], q.dequantize()) for i in range(3)])
        for m in (1, 3):
            got = compiled.CompiledQuant(1, float_panel=nest)(x[:m], q)
            assert np.array_equal(got, want[:m], equal_nan=True), f"scale={scale}, M={m}"


@needs_numba
def test_float_matrices_go_to_compiled_panels_and_bad_inputs_are_refused():
    w = np.asfortranarray(rows(96, 70, seed=5))
    x = rows(3, 96)
    assert np.array_equal(compiled.CompiledQuant(2)(x, w), compiled.CompiledPanels(2)(x, w))
    q, _ = quantized(96, 70, "int8-ch")
    with pytest.raises(ValueError, match=r"x must be \[n, 96\]"):
        compiled.CompiledQuant(1)(rows(3, 95), q)
    with pytest.raises(ValueError, match=r"x must be \[n, 96\] to multiply a \[96, 70\] matrix, got \[1, 100000\]"):
        compiled.CompiledQuant(1)(np.ones((1, 100000), np.float32), w)  # the loop would read past x's rows
    with pytest.raises(ValueError, match="codes laid out in 64-column panels, this kernel's are 16"):
        compiled.CompiledQuant(1, panel=16)(x, q)
    big, _ = quantized(3072, 768, "int8-ch")
    kernel = compiled.CompiledQuant(3)
    assert kernel.plan(big) is kernel.plan(big) and kernel.plan(big)[0] is not None
    assert compiled.CompiledQuant(1).plan(big) == (None, 1) and kernel.plan(q) == (None, 1)


@needs_numba
@pytest.mark.parametrize("scheme", ["int8-ch", "int4-g32", "int4-g32+emb", "int8-ch+emb"])
def test_a_quantized_model_decodes_as_the_dequantized_model_on_compiled_panels(scheme):
    """Whole forwards, one-token forwards, caches and prefills: the codes model (compiled-quant) equals the
    dequantized model (compiled-panels) bit for bit; a +emb scheme's tied head holds codes too."""
    base = tiny_model(seed=5, n_embd=96, n_head=4, n_layer=2, n_vocab=257, n_ctx=40)
    floats = quantize_model(base, parse_scheme(scheme), kernel="compiled-panels", threads=2)
    codes = quantize_model(base, parse_scheme(scheme), kernel="compiled-quant", threads=2)
    assert codes.codes is compiled.QuantPanels and floats.codes is None and codes.invariant
    assert isinstance(codes.params["wte"], compiled.QuantTied) == scheme.endswith("+emb")
    assert codes.n_bytes < floats.n_bytes / (2 if "+emb" in scheme else 1.5)
    ids = np.random.default_rng(1).integers(0, 257, 9 + M_MAX)
    a, b = floats.new_cache(), codes.new_cache()
    assert np.array_equal(floats.prefill(ids[:9], a), codes.prefill(ids[:9], b))
    single = np.concatenate([codes.forward(ids[i : i + 1], b) for i in range(9, 9 + M_MAX)])
    assert np.array_equal(single, np.concatenate([floats.forward(ids[i : i + 1], a) for i in range(9, 9 + M_MAX)]))
    for m in (1, 4, 8, 16):
        cache = codes.new_cache()
        codes.prefill(ids[:9], cache)
        assert np.array_equal(codes.forward(ids[9 : 9 + m], cache), single[:m]), f"M={m}"
        assert np.array_equal(cache.k[:, :, : 9 + m], b.k[:, :, : 9 + m])


@needs_numba
def test_a_codes_model_runs_only_with_its_kernel():
    codes = quantize_model(tiny_model(seed=1), parse_scheme("int8-ch"), kernel="compiled-quant")
    with pytest.raises(ValueError, match="holds int8 codes .QuantPanels.: kernel 'dequant-panels' cannot read them; "
                                         "use compiled-quant"):
        codes.with_kernel("dequant-panels")
    assert codes.with_kernel("compiled-quant", 3).codes is compiled.QuantPanels


@needs_numba
@pytest.mark.parametrize("scheme", ["int4-g32", "int8-ch+emb"])
def test_a_self_draft_and_a_quantized_target_on_compiled_quant_keep_greedy_output(scheme):
    """The quantized target decodes plainly as its dequantized self (lossless relative to itself); a self-draft on
    compiled-quant leaves greedy output the target's own."""
    target = tiny_model(seed=7, n_embd=96, n_head=4, n_layer=2, n_vocab=257, n_ctx=64).with_kernel("compiled-panels", 2)
    draft = quantize_model(target, parse_scheme(scheme), kernel="compiled-quant", threads=2)
    prompt = [1, 2, 3]
    plain = speculative_generate(target, None, prompt, 24, gamma=0, temperature=0).ids
    for gamma in (1, 3):
        assert speculative_generate(target, draft, prompt, 24, gamma=gamma, temperature=0).ids == plain
    q_target = quantize_model(target, parse_scheme(scheme), kernel="compiled-panels", threads=1)
    q_plain = speculative_generate(q_target, None, prompt, 24, gamma=0, temperature=0).ids
    assert speculative_generate(draft, None, prompt, 24, gamma=0, temperature=0).ids == q_plain
    assert speculative_generate(draft, draft, prompt, 24, gamma=3, temperature=0).ids == q_plain


@needs_numba
def test_load_keeps_a_quantized_drafts_codes_and_the_probe_chooses_compiled_quant(tmp_path):
    """load("int4-g64:self", "draft") with the kernel unset: the self-draft holds codes, not a float32 copy, and the
    probe's candidates are the kernels reading them (mode "off": the first, nothing timed)."""
    draft = load("int4-g64:random:gpt2", "draft", cache_dir=tmp_path, probe="off")
    assert draft.kernel == "compiled-quant" and draft.codes is compiled.QuantPanels
    target = random_model("gpt2")
    chosen = choose_kernels(target, draft, 2, None, "off")
    assert chosen.draft.kernel == "compiled-quant" and chosen.draft.model.codes is compiled.QuantPanels
    assert draft.n_bytes < 0.45 * target.n_bytes


@needs_numba
def test_the_cli_decodes_a_quantized_target_and_self_draft_on_compiled_quant_with_the_same_output(tmp_path):
    """`--target int8-ch:DIR --draft int4-g64:self --compare`: both roles keep codes (compiled-quant), and --compare's
    plain decodings of the quantized target read the same codes (registry.plain_baselines): the same output."""
    target = str(ROOT / "weights" / "shakespeare" / "target")
    r = run_python("-m", "npspec.generate", "--target", f"int8-ch:{target}", "--draft", "int4-g64:self", "--json",
                   "--temperature", "0", "--max-new-tokens", "12", "--compare", "--kernel-probe", "off", "ROMEO:",
                   env={"NPSPEC_CACHE": str(tmp_path)})
    assert r.returncode == 0, r.stderr[-2000:]
    record = json.loads(r.stdout)
    assert record["stats"]["target_kernel"] == record["stats"]["draft_kernel"] == "compiled-quant"
    assert record["compare"]["same_ids"] is True
