"""The compiled kernel "compiled-panels" (npspec.kernels.compiled, the `fast` extra): its batch-invariance contract, bit for bit.

Row i of an M-row product equals the one-row product for M = 1..16 at every position, whatever the other rows
hold, for thread counts 1, 2, 3 and 7, with either loop nest (PANELS: 512-bit tiles on 64-column panels, 256-bit
register blocks on 16-column panels); every element is the documented chain of fused multiply-adds, and the
bits are those the kernel gave before its tiles were generated from one body; whole forwards and their caches equal
one-token forwards; greedy speculative output equals greedy decoding on the shipped pair and on random:gpt2.
Without numba the tests that need it skip, saying why. Building the kernel: tests/test_compiled_build.py.
"""

import hashlib
from fractions import Fraction

import numpy as np
import pytest

from npspec.kernels import compiled, products as kernels
from npspec.kernels.compiled import blocks
from npspec.kernels.compiled.intrinsics import numpy_fma
from npspec.decode import speculative_generate
from npspec.kernels.registry import REGISTRY
from npspec.sources import random_model

from conftest import run_python, tiny_model

needs_numba = pytest.mark.skipif(not compiled.available(), reason="compiled-panels needs the 'fast' extra (numba)")
M_MAX = 16
THREADS = (1, 2, 3, 7)
PANELS = (compiled.PANEL, blocks.PANEL)  # the two loop nests (compiled.host_panel picks one for the host)


def matrix(d_in, d_out, seed=0, order="F"):
    w = np.random.default_rng(seed).standard_normal((d_in, d_out), dtype=np.float32)
    return np.asfortranarray(w) if order == "F" else w


def chain(x, w):  # [M, d_in], [d_in, d_out] -> [M, d_out]: the documented order, one numpy_fma step per k
    y = np.zeros((x.shape[0], w.shape[1]), np.float32)
    for k in range(x.shape[1]):
        y = numpy_fma(x[:, k : k + 1], w[k][None, :], y)
    return y


def values(shape, seed):  # the same float32 numbers on every machine and numpy: no RNG, a multiplicative hash
    i = np.arange(int(np.prod(shape)), dtype=np.uint64)
    v = (i * np.uint64(2654435761) + np.uint64(seed)) % np.uint64(2 ** 32)
    return (v / 2.0 ** 32 - 0.5).astype(np.float32).reshape(shape)


# shapes [d_in, d_out]: d_in odd or even, d_out a multiple of PANEL or not (a partial panel); large enough to be shared out
SHAPES = [(64, 67), (100, 33), (7, 5), (768, 2304), (3072, 768), (1280, 1283)]


@needs_numba
@pytest.mark.parametrize("panel", PANELS)
@pytest.mark.parametrize("d_in, d_out", SHAPES)
def test_every_row_of_an_m_row_product_is_the_one_row_product_at_every_position(d_in, d_out, panel):
    w, b = matrix(d_in, d_out), matrix(1, d_out, seed=1, order="C")[0]
    x = matrix(2 * M_MAX, d_in, seed=2, order="C")
    for threads in THREADS:
        kernel = compiled.CompiledPanels(threads, panel)
        single = np.concatenate([kernel(x[i : i + 1], w, b) for i in range(2 * M_MAX)])
        for m in range(1, M_MAX + 1):
            for start in range(0, 2 * M_MAX - m + 1, 3):  # the rows at many positions, among other rows
                got = kernel(x[start : start + m], w, b)
                assert np.array_equal(got, single[start : start + m]), f"threads={threads}, M={m}, start={start}"


@needs_numba
@pytest.mark.parametrize("panel", PANELS)
def test_a_row_does_not_depend_on_what_the_other_rows_hold(panel):
    w = matrix(768, 2304)
    row = matrix(1, 768, seed=3, order="C")
    kernel = compiled.CompiledPanels(2, panel)
    want = kernel(row, w)[0]
    for other in (np.zeros, np.ones, lambda s: np.full(s, np.inf, np.float32), lambda s: matrix(*s, seed=4, order="C")):
        for m in (2, 5, 16):
            for place in (0, m // 2, m - 1):
                x = np.asarray(other((m, 768)), dtype=np.float32).copy()
                x[place] = row
                assert np.array_equal(kernel(x, w)[place], want), f"M={m}, row {place}"


@needs_numba
@pytest.mark.parametrize("d_in, d_out", [(768, 3072), (3072, 768), (1280, 1283)])
def test_thread_counts_and_loop_nests_do_not_change_a_bit(d_in, d_out):
    w = matrix(d_in, d_out)
    assert w.nbytes >= compiled.SPLIT_BYTES  # so the columns are really shared out
    x = matrix(M_MAX, d_in, seed=5, order="C")
    want = compiled.CompiledPanels(1)(x, w)
    for panel in PANELS:
        for threads in (1, 2, 3, 7, 64):
            assert np.array_equal(compiled.CompiledPanels(threads, panel)(x, w), want), f"{panel=}, {threads=}"


@needs_numba
@pytest.mark.parametrize("panel", PANELS)
def test_each_element_is_the_documented_chain_of_fused_multiply_adds(panel):
    """The docstring's order, written out in NumPy one step at a time: s = +0.0, then s = fma(x[m, k], w[k, n], s)
    for k = 0, 1, ... in increasing order (numpy_fma: one rounding per step, the test below holds it to exact
    arithmetic). Every last tile after the tiles of 8 (compiled.TAIL): 15 rows (8, then 7 in a padded tile of 8),
    14 and 13 (a tile of 6, padded at 13), 12 and 11 (a tile of 4, padded at 11), 9 (a single row), 8, and 6, 5, 4,
    2 and 1 alone; an odd d_in, and three panels (two full ones, then a partial last one whose second half tile8 has
    no column of; with 16-column panels, two groups of four panels for one row, then single ones). A product and a sum
    rounded apart fail it."""
    d_in, d_out = 201, 150
    w, x = matrix(d_in, d_out, seed=6), matrix(15, d_in, seed=7, order="C")
    want = unfused = np.zeros((15, d_out), np.float32)
    for k in range(d_in):
        want = numpy_fma(x[:, k : k + 1], w[k][None, :], want)
        unfused = np.add(unfused, np.multiply(x[:, k : k + 1], w[k][None, :]))
    assert not np.array_equal(want, unfused)  # the two orders of rounding differ here, so the check can tell them apart
    assert {compiled.TAIL[m % 8] for m in (15, 14, 13, 12, 11, 9, 8)} == {8, 6, 4, 1, 0}
    for m in (15, 14, 13, 12, 11, 9, 8, 6, 5, 4, 2, 1):
        assert np.array_equal(compiled.CompiledPanels(1, panel)(x[:m], w), want[:m]), f"M={m}"


# sha256 of the products of M = 1..24 rows, one thread, over values((201, 150), 1) and values((1280, 1283), 1),
# x = values((24, d_in), 2), from the kernel with four hand-written tiles (commit 7f830c0): the contract fixes every
# bit, so any machine gives these
OLD_TILES_SHA256 = "771b77b78c6ca5df50730db6816f5d69529575e553298c4ba1ecea6347ab024e"


@needs_numba
@pytest.mark.parametrize("panel", PANELS)
def test_the_tiles_made_from_one_body_give_the_bits_of_the_hand_written_ones_for_every_row_count(panel):
    """Every row count 1..24 (each tail tile, after 0, 1 and 2 tiles of 8), a partial last panel and a matrix large
    enough to be shared out at 3 threads; the small one is also held to the chain, row count by row count. The
    register blocks give the same digest."""
    digest, kernel, shared = hashlib.sha256(), compiled.CompiledPanels(1, panel), compiled.CompiledPanels(3, panel)
    for d_in, d_out in [(201, 150), (1280, 1283)]:
        w, x = np.asfortranarray(values((d_in, d_out), 1)), values((24, d_in), 2)
        want = chain(x, w) if d_in == 201 else None
        for m in range(1, 25):
            y = kernel(x[:m], w)
            digest.update(y.tobytes())
            assert np.array_equal(shared(x[:m], w), y) and (want is None or np.array_equal(y, want[:m])), (d_in, m)
    assert digest.hexdigest() == OLD_TILES_SHA256


def nearest_float32(value):  # Fraction -> np.float32: the float32 nearest `value`, ties to an even significand
    guess = np.float32(float(value))  # within one float32 step of the answer (float() rounds once more)
    candidates = [np.nextafter(guess, np.float32(-np.inf)), guess, np.nextafter(guess, np.float32(np.inf))]
    return min(candidates, key=lambda f: (abs(Fraction(float(f)) - value), int(f.view(np.uint32)) & 1))


def fma_cases():  # (a, b, c) float32 triples: random ones, and ones where rounding twice gives the wrong float32
    rng = np.random.default_rng(11)
    a, b, c = (rng.standard_normal(3000).astype(np.float32) * np.float32(2.0) ** rng.integers(-20, 20, 3000)
               for _ in range(3))
    c[:1000] = -(a[:1000].astype(np.float64) * b[:1000]).astype(np.float32)  # cancellation: a * b + c near 0
    f = np.float32
    # 1 + 2^-23 + 2^-24 - 2^-54: float64 rounds the sum onto the float32 midpoint, whose tie-to-even is the wrong
    # way up; and 1 + 2^-24 + 2^-54 (2^30 + 1 = 80581 x 13325), whose tie-to-even is the wrong way down
    crafted = [(f(2.0 ** -24 * (1 + 2.0 ** -15)), f(1 - 2.0 ** -15), f(1 + 2.0 ** -23)),
               (f(80581 * 2.0 ** -27), f(13325 * 2.0 ** -27), f(1.0)),
               (f(-80581 * 2.0 ** -27), f(13325 * 2.0 ** -27), f(-1.0))]
    return [*zip(a, b, c), *crafted], crafted


def test_numpy_fma_rounds_the_exact_value_once():
    """numpy_fma (the reference of the test above) against exact rational arithmetic: a * b + c rounded once
    to the nearest float32, ties to even, on random triples (a third cancelling to near 0) and on three built so that
    rounding to float64 first lands on a float32 midpoint: there the float64-then-float32 rounding is wrong, as the
    last assertion shows, so the check can fail."""
    cases, crafted = fma_cases()
    a, b, c = (np.array(v, dtype=np.float32) for v in zip(*cases))
    got = numpy_fma(a, b, c)
    want = [nearest_float32(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z))) for x, y, z in cases]
    assert [g.tobytes() for g in got] == [w.tobytes() for w in want]
    twice = [np.float32(float(x) * float(y) + float(z)) for x, y, z in crafted]  # rounded to float64, then float32
    assert all(t != w for t, w in zip(twice, want[-len(crafted):]))


@needs_numba
def test_the_compiled_fma_is_the_exact_one_on_the_hard_cases():
    """The kernel's llvm.fma on the cases above, one element each (a [1, 1] product over d_in = 2: fma(a, b,
    fma(c, 1, 0)) = fma(a, b, c), since fma(c, 1, +0) = c)."""
    cases, _ = fma_cases()
    for a, b, c in cases[-200:]:
        x = np.array([[c, a]], dtype=np.float32)
        w = np.asfortranarray(np.array([[1.0], [b]], dtype=np.float32))
        assert compiled.CompiledPanels(1)(x, w)[0, 0].tobytes() == numpy_fma(a, b, c).tobytes(), (a, b, c)


def test_pack_lays_each_panel_k_major_with_zero_columns_past_d_out():
    w = matrix(5, 11)
    panels = compiled.pack(w, panel=4)
    assert panels.shape == (3, 5, 4) and panels.flags.c_contiguous and panels.dtype == np.float32
    assert panels.ctypes.data % compiled.ALIGN == 0  # no vector load of a panel row straddles two cache lines
    for n in range(11):
        assert np.array_equal(panels[n // 4, :, n % 4], w[:, n])
    assert not panels[2, :, 3].any()


@needs_numba
@pytest.mark.parametrize("order", ["C", "F"])
def test_it_computes_x_at_w_plus_b_in_float32(order):
    w, b = matrix(300, 70, order=order), matrix(1, 70, seed=1, order="C")[0]
    x = matrix(5, 300, seed=2, order="C")
    y = compiled.CompiledPanels(1)(x, w, b)
    ref = x.astype(np.float64) @ w.astype(np.float64) + b
    assert y.dtype == np.float32 and y.shape == (5, 70) and np.abs(y - ref).max() <= 1e-5 * np.abs(ref).max()


@needs_numba
@pytest.mark.parametrize("panel", PANELS)
def test_an_x_of_another_width_is_refused_not_read_past(panel):
    """The loop reads x's rows to d_in: a shorter row (or a 1-D x) is refused in one line before it runs."""
    kernel, w = compiled.CompiledPanels(1, panel=panel), matrix(8, 5)
    for shape in ((2, 7), (2, 9), (1, 100000), (8,)):
        with pytest.raises(ValueError, match=r"^x must be \[n, 8\] to multiply a \[8, 5\] matrix, got "):
            kernel(np.ones(shape, np.float32), w)
        with pytest.raises(ValueError, match=r"^x must be \[n, 8\]"):
            kernel(np.ones(shape, np.float32), kernel.pack(w))


def test_packed_panels_that_do_not_hold_their_shape_are_refused_not_read_past():
    """A Packed made by hand (its class is public) with another matrix's shape read past its panels (a segfault for
    a long d_in) or gave garbage for float64 panels; now one line each, as is a w that is no matrix."""
    w = matrix(128, 40)
    panels = compiled.pack(w, 16)
    assert np.array_equal(np.asarray(compiled.Packed(panels, w.shape)), w)
    for bad, shape in ((panels, (100000, 40)), (panels, (128, 4000)), (panels, (128, 16)), (panels, (128,)),
                       (panels.astype(np.float64), w.shape), (panels[:, :, ::2], (128, 20)), ([1.0], (1, 1))):
        with pytest.raises(ValueError, match=r"^panels (must be float32 \[n_panels, d_in, panel\]|\[.*\] do not hold)"):
            compiled.Packed(bad, shape)


@needs_numba
def test_a_panel_width_or_w_that_the_loops_cannot_take_is_refused_in_one_line():
    for panel in (0, -16, 3, 2.0, True):
        with pytest.raises(ValueError, match=r"^a panel of compiled-panels has a positive even number of columns"):
            compiled.CompiledPanels(1, panel=panel)
    kernel = compiled.CompiledPanels(1, panel=16)
    for w in (matrix(8, 5)[:, 0], [[1.0]], np.ones((8, 5, 2), np.float32)):
        with pytest.raises(ValueError, match=r"^w must be a \[d_in, d_out\] float32 matrix"):
            kernel(np.ones((1, 8), np.float32), w)


@needs_numba
@pytest.mark.parametrize("threads", [1, 2, 3, 7])
def test_whole_forwards_and_caches_equal_one_token_forwards(threads):
    model = tiny_model(seed=5, n_embd=96, n_head=4, n_layer=3, n_vocab=257, n_ctx=40).with_kernel("compiled-panels",
                                                                                                 threads)
    assert model.invariant and model.blas_threads == 1 and "kernel='compiled-panels'" in repr(model)
    ids = np.random.default_rng(threads).integers(0, 257, 9 + M_MAX)
    one = model.new_cache()
    model.prefill(ids[:9], one)
    single = np.concatenate([model.forward(ids[i : i + 1], one) for i in range(9, 9 + M_MAX)])
    for m in (1, 2, 3, 4, 5, 8, 16):
        cache = model.new_cache()
        model.prefill(ids[:9], cache)
        assert np.array_equal(model.forward(ids[9 : 9 + m], cache), single[:m]), f"M={m}"
        assert np.array_equal(cache.k[:, :, : 9 + m], one.k[:, :, : 9 + m])
        assert np.array_equal(cache.v[:, :, : 9 + m], one.v[:, :, : 9 + m])


@needs_numba
def test_greedy_identity_on_the_shipped_pair_with_compiled_kernels(shipped):
    target, draft = (m.with_kernel("compiled-panels", threads=2) for m in shipped)
    for prompt in (target.tokenizer.encode("ROMEO:").ids, [0], target.tokenizer.encode("JULIET:\nO").ids):
        plain = speculative_generate(target, None, prompt, 32, gamma=0, temperature=0).ids
        for gamma in (1, 3, 8):
            assert speculative_generate(target, draft, prompt, 32, gamma=gamma, temperature=0).ids == plain, gamma


@needs_numba
@pytest.mark.slow
def test_greedy_identity_random_gpt2_with_compiled_kernels():
    target = random_model("gpt2", kernel="compiled-panels", threads=2)
    draft = random_model("distilgpt2", tokenizer=target.tokenizer, kernel="compiled-panels", threads=2)
    ids = target.tokenizer.encode("Hello").ids
    plain = speculative_generate(target, None, ids, 32, gamma=0, temperature=0)
    assert len(plain.ids) == 32
    for gamma in (2, 4):
        assert speculative_generate(target, draft, ids, 32, gamma=gamma, temperature=0).ids == plain.ids


@needs_numba
def test_each_matrix_is_packed_once_with_its_share_out_planned_once():
    """CompiledPanels.entry: a matrix's panels, its runs' cuts and its thread count are made on its first product and
    reused (the hot path builds none of them); a small matrix, or one thread, runs as one call (no cuts)."""
    kernel = compiled.CompiledPanels(3)
    big, small = matrix(1280, 1283), matrix(64, 67)
    x = matrix(2, 1280, seed=3, order="C")
    kernel(x, big)
    entry = kernel.entry(big)
    count = -(-1283 // compiled.PANEL)
    assert entry[0] is big and entry[1].shape == (count, 1280, compiled.PANEL)
    assert entry[2].tolist() == [count * i // 3 for i in range(4)] and entry[3] == min(3, kernel.most_threads)
    kernel(x, big)
    assert kernel.entry(big) is entry and len(kernel.packed) == 1
    assert kernel.entry(small)[2:] == (None, 1) and compiled.CompiledPanels(1).entry(big)[2:] == (None, 1)


@needs_numba
def test_a_matrix_is_shared_out_from_the_compiled_kernels_own_threshold():
    """compiled.SPLIT_BYTES, not the NumPy kernels' kernels.SPLIT_BYTES: one byte below it a product is one call on
    this thread, at it the panels are cut into runs; gpt2's smallest block matrix (c_proj, 768 x 768) is shared out."""
    kernel = compiled.CompiledPanels(3)
    assert kernel.plan(10, compiled.SPLIT_BYTES - 1) == (None, 1)
    cuts, threads = kernel.plan(10, compiled.SPLIT_BYTES)
    assert cuts.tolist() == [0, 3, 6, 10] and threads == min(3, kernel.most_threads)
    assert compiled.SPLIT_BYTES < kernels.SPLIT_BYTES and 768 * 768 * 4 >= compiled.SPLIT_BYTES
