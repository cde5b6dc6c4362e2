"""The products (npspec.kernels.products, and npspec.kernels.compiled where numba is installed) and the batch-invariance contract.

The contract: for an INVARIANT kernel, row i of an M-row product, and so of an M-row forward, is
bit-identical to the one-row result, whatever the other rows are. That is what makes greedy
speculative decoding emit exactly greedy decoding's tokens (tests/test_greedy_identity.py).
tests/test_kernels_model.py checks the registry, the Model that owns its kernel, the layout and the threads;
tests/test_compiled.py the compiled kernel's own contract (M up to 16, threads 1, 2, 3, 7).
"""

from dataclasses import replace

import numpy as np
import pytest

from npspec.model.tensors import params_tree
from npspec.sources.init import init_tensors
from npspec.kernels.layout import PANEL_BYTES, WHOLE_BYTES, panel_width, panels
from npspec.kernels.products import BLOCK_ROWS, SPLIT_BYTES, GemmBlocks, GemvPanels, gemm, gemm_panels
from npspec.model.model import Model
from npspec.kernels.registry import REGISTRY, invariant_names, names
from npspec.sources import SHAPES, random_model

from conftest import installed, make, tiny_model

M_MAX = 9  # a verify forward feeds gamma + 1 rows; gamma goes up to 8

KERNELS = installed(names(codes=False))  # dequant-panels has its own tests (tests/test_qkernels.py)
INVARIANT = installed([k for k in invariant_names() if not REGISTRY[k].reads_codes])


def matrix(d_in, d_out, order="C", seed=0):
    w = np.random.default_rng(seed).normal(0, 1, (d_in, d_out)).astype(np.float32)
    return np.asfortranarray(w) if order == "F" else w


# [d_in, d_out]: one whole panel; panels that divide d_out; a ragged last panel (as the head's 50257 columns);
# GPT-2's four block matrices
SHAPES_SMALL = [(16, 67), (512, 1280), (256, 2048)]
SHAPES_GPT2 = [(768, 2304), (768, 768), (768, 3072), (3072, 768)]


# ---- the products ----

@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("d_in, d_out", SHAPES_SMALL + SHAPES_GPT2[:1])
def test_every_kernel_computes_x_at_w_plus_b(name, order, d_in, d_out):
    kernel = make(name)
    w = matrix(d_in, d_out, order)
    b = np.random.default_rng(1).normal(0, 1, d_out).astype(np.float32)
    for n in (1, 3, M_MAX):
        x = np.random.default_rng(n).normal(0, 1, (n, d_in)).astype(np.float32)
        ref = x.astype(np.float64) @ w.astype(np.float64)
        for bias, want in ((None, ref), (b, ref + b)):
            y = kernel(x, w, bias)
            assert y.shape == (n, d_out) and y.dtype == np.float32
            assert np.abs(y - want).max() <= 1e-5 * np.abs(want).max(), f"{name}: n={n}, bias={bias is not None}"


def test_gemm_panels_is_plain_gemm_when_the_panels_do_not_divide_the_columns():
    x, w = matrix(5, 256, seed=2), matrix(256, 2048, "F")
    assert 2048 % panel_width(256, 2048)  # a ragged last panel
    assert np.array_equal(gemm_panels(x, w), gemm(x, w))


def test_panels_fit_and_are_contiguous_views_of_a_column_major_matrix():
    for d_in, d_out in [(768, 2304), (1280, 5120), (5120, 1280), (1280, 50257), (64, 67), (256, 1024), (256, 2048)]:
        w = panel_width(d_in, d_out)
        whole = d_in * d_out * 4 <= WHOLE_BYTES
        assert w == d_out if whole else (w % 8 == 0 and d_in * w * 4 <= PANEL_BYTES and w < d_out)
    a = np.asfortranarray(np.arange(12 * 40, dtype=np.float32).reshape(12, 40))
    p = panels(a, 16)  # two full panels of 16 columns; the last 8 columns are left out
    assert p.shape == (2, 12, 16) and np.shares_memory(p, a) and np.array_equal(p[1], a[:, 16:32])
    assert all(p[i].flags.f_contiguous for i in range(2))


# ---- the contract, product by product ----

@pytest.mark.parametrize("name", INVARIANT)
@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("d_in, d_out", SHAPES_SMALL + SHAPES_GPT2)
def test_invariant_kernels_rows_are_one_row_products(name, order, d_in, d_out):
    kernel = make(name)
    w, b = matrix(d_in, d_out, order), matrix(1, d_out, seed=3)[0]
    x = matrix(M_MAX, d_in, seed=4)
    single = np.concatenate([kernel(x[i : i + 1], w, b) for i in range(M_MAX)])
    for m in range(1, M_MAX + 1):
        assert np.array_equal(kernel(x[:m], w, b), single[:m]), f"{name}: M={m} rows differ from one-row products"
        assert np.array_equal(kernel(x[M_MAX - m :], w, b), single[M_MAX - m :])  # whatever rows come first


@pytest.mark.parametrize("kernel", [GemmBlocks, GemvPanels])
@pytest.mark.parametrize("d_in, d_out", [(768, 3072), (3072, 768), (768, 2304)])
def test_panel_kernels_give_the_same_bits_for_any_thread_count(kernel, d_in, d_out):
    w = matrix(d_in, d_out, "F")
    assert w.nbytes >= SPLIT_BYTES  # so its panels are shared out to the threads
    x = matrix(6, d_in, seed=5)
    ref = kernel(1)(x, w)
    for threads in (2, 3, 7, 64):
        assert np.array_equal(kernel(threads)(x, w), ref), f"threads={threads}"
        assert np.array_equal(kernel(threads)(x[:1], w), ref[:1])


def test_gemm_blocks_rows_do_not_depend_on_their_place_in_a_block_nor_on_the_other_rows():
    """Half the fact "gemm-blocks" rests on, checked directly: a GEMM of 2 rows gives row i the same bits wherever
    it sits in the block and whatever the other rows hold (on GPT-2's panel shapes, and on a whole matrix); the
    other half, the same bits for every row count up to the limit, is same_bits_rows' (tests/test_kernels_probe.py)."""
    rng = np.random.default_rng(7)
    for d_in, width in [(768, 48), (1280, 32), (3072, 8), (5120, 8), (1024, 40), (768, 2304)]:
        w = np.asfortranarray(rng.standard_normal((d_in, width), dtype=np.float32))
        row = rng.standard_normal(d_in, dtype=np.float32)
        want = None
        for place in range(BLOCK_ROWS):
            for other in (np.zeros, lambda shape: rng.standard_normal(shape, dtype=np.float32)):
                block = other((BLOCK_ROWS, d_in)).astype(np.float32)
                block[place] = row
                got = (block @ w)[place]
                want = got if want is None else want
                assert np.array_equal(got, want), f"[{d_in}, {width}]: row {place} of a block differs"


def test_gemm_blocks_cuts_rows_into_even_blocks_within_the_limit_and_never_uses_one_whole_matrix_panel():
    k = GemmBlocks(1)
    k.limits[100, 8] = 4  # as if probed
    assert [k.blocks(n, 100, 8) for n in (1, 2, 3, 4, 5, 8, 9)] == [(1, 2), (1, 2), (1, 3), (1, 4), (2, 3), (2, 4), (3, 3)]
    assert [k.out_rows(n, 100, 8) for n in (1, 5, 9)] == [2, 6, 9]
    k.limits[100, 8] = BLOCK_ROWS  # fixed blocks of two
    assert [k.blocks(n, 100, 8) for n in (1, 2, 3, 7)] == [(1, 2), (1, 2), (2, 2), (4, 2)]
    assert panel_width(16, 67, PANEL_BYTES, GemmBlocks.whole_bytes) < 67 or 16 * 67 * 4 <= PANEL_BYTES
    assert panel_width(256, 768, PANEL_BYTES, GemmBlocks.whole_bytes) == 160  # GemvPanels: one panel of 768
    assert panel_width(256, 768) == 768


@pytest.mark.parametrize("max_rows", [BLOCK_ROWS, 3, 16])
@pytest.mark.parametrize("d_in, d_out", [(768, 2304), (256, 1024)])
def test_gemm_blocks_rows_are_one_row_products_across_block_cuts(max_rows, d_in, d_out):
    """Rows cut into several blocks (a small max_rows, or more rows than the limit) still equal one-row products."""
    kernel = GemmBlocks(2, max_rows=max_rows)
    w = matrix(d_in, d_out, "F")
    x = matrix(20, d_in, seed=6)
    single = np.concatenate([kernel(x[i : i + 1], w) for i in range(20)])
    for m in (2, 3, 4, 7, 17, 20):
        assert np.array_equal(kernel(x[:m], w), single[:m]), f"max_rows={max_rows}: M={m}"


# ---- the contract, forward by forward ----

def check_rows(model, n_past, seed=0):
    """Feed M = 1..M_MAX ids at once after n_past prefilled ids: every forward's logits and new cache rows equal
    the one-token forwards', bit for bit, and the prefill's logits up to rounding."""
    ids = np.random.default_rng(seed).integers(0, model.config.n_vocab, n_past + M_MAX)
    one = model.new_cache()
    model.prefill(ids[:n_past], one)
    single = np.concatenate([model.forward(ids[i : i + 1], one) for i in range(n_past, n_past + M_MAX)])
    for m in range(1, M_MAX + 1):
        cache = model.new_cache()
        model.prefill(ids[:n_past], cache)
        batch = model.forward(ids[n_past : n_past + m], cache)
        assert batch.dtype == np.float32 and batch.shape == (m, model.config.n_vocab)
        assert np.array_equal(batch, single[:m]), \
            f"{model.kernel}: M={m} rows differ from one-token forwards by {np.abs(batch - single[:m]).max()}"
        t = n_past + m
        assert np.array_equal(cache.k[:, :, :t], one.k[:, :, :t]) and np.array_equal(cache.v[:, :, :t], one.v[:, :, :t])
    whole = model.prefill(ids, model.new_cache())[n_past:]
    np.testing.assert_allclose(single, whole, rtol=0, atol=1e-5 * np.abs(whole).max())  # and correct


def shape_of(name):
    return {k: getattr(SHAPES[name], k) for k in ("n_vocab", "n_ctx", "n_embd", "n_head", "n_layer")}


TINY_SHAPES = {
    "16x2x2": dict(n_vocab=67, n_ctx=40, n_embd=16, n_head=2, n_layer=2),
    "48x3x1": dict(n_vocab=101, n_ctx=40, n_embd=48, n_head=3, n_layer=1),
    "96x4x3": dict(n_vocab=257, n_ctx=40, n_embd=96, n_head=4, n_layer=3),
    "64x4x2": dict(n_embd=64, n_head=4),
    "96x3x1-v1000": dict(n_embd=96, n_head=3, n_layer=1, n_vocab=1000),
    "256x4x1-v2048": dict(n_embd=256, n_head=4, n_layer=1, n_vocab=2048, n_ctx=64),  # a head of ragged panels
    "tiny": shape_of("tiny"),
    "tiny-draft": shape_of("tiny-draft"),
}


@pytest.mark.parametrize("kernel", INVARIANT)
@pytest.mark.parametrize("shape", list(TINY_SHAPES))
def test_invariant_forward_rows_are_one_token_forwards(shape, kernel):
    model = tiny_model(seed=5, **TINY_SHAPES[shape]).with_kernel(kernel)
    for n_past in (0, 1, 13):
        check_rows(model, n_past, seed=n_past)


@pytest.fixture(scope="module")
def gpt2_shape():
    """GPT-2 (124M)'s exact matrix shapes (n_embd 768, 12 heads, the 50257 x 768 head), 3 of its 12 layers."""
    config = replace(SHAPES["gpt2"], n_layer=3)
    return Model(config, params_tree(init_tensors(config, seed=0), config), None, "gpt2-3-layers")


@pytest.mark.parametrize("kernel", INVARIANT)
def test_invariant_forward_rows_on_the_gpt2_shape(gpt2_shape, kernel):
    check_rows(gpt2_shape.with_kernel(kernel), n_past=9)


@pytest.mark.parametrize("kernel", ["gemm-blocks", "gemv-panels"])
def test_panel_kernel_threads_do_not_change_a_bit_of_a_forward(gpt2_shape, kernel):
    """The worker threads of a panel kernel share out whole panels: any thread count gives the same bits."""
    assert gpt2_shape.params["h"][0]["mlp"]["c_fc"]["w"].nbytes >= SPLIT_BYTES  # so the split really happens
    ids = np.arange(100, 106)
    out = {}
    for n in (1, 2, 3):
        m = gpt2_shape.with_kernel(kernel, threads=n)
        out[n] = m.forward(ids, m.new_cache()), m.forward(ids[:1], m.new_cache())
    for n in (2, 3):
        assert np.array_equal(out[n][0], out[1][0]) and np.array_equal(out[n][1], out[1][1])
    assert np.array_equal(out[1][0][:1], out[1][1])


@pytest.mark.slow
@pytest.mark.parametrize("kernel", INVARIANT)
@pytest.mark.parametrize("shape", ["gpt2", "distilgpt2"])
def test_invariant_forward_rows_on_full_gpt2_shapes(shape, kernel):
    check_rows(random_model(shape, kernel=kernel), n_past=11)
