"""The math of the forward pass (npspec.model.gpt2): its pieces, shapes and dtype, the KV cache, and its checks.

Which product runs is not this file's subject (tests/test_kernels.py): here `model.prefill` (one
GEMM per product, masked attention) and `model.forward` (the model's kernel, attention row by
row) are two ways to compute the same logits, equal up to float32 rounding.
"""

import re
import sys

import numpy as np
import pytest

from npspec.model.gpt2 import (ContextOverflowError, GPT2Config, KVCache, attention, attention_masked, block, ffn, gelu, gpt2,
                         head_scale, layer_norm, mha, softmax)
from npspec.kernels.products import gemm

from conftest import tiny_model


def close(ours, theirs):
    """Equal up to float32 rounding: the two paths sum in different orders."""
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5 * np.abs(theirs).max())


# ---- the pieces ----

def test_gelu_is_the_tanh_approximation():
    x = np.array([[0.0, 1.0, -3.0, 2.5]], dtype=np.float32)
    g = gelu(x)
    assert g.dtype == np.float32 and g.shape == x.shape and g[0, 0] == 0
    np.testing.assert_allclose(gelu(x) - gelu(-x), x, rtol=1e-6)  # gelu(x) - gelu(-x) = x
    x64 = x.astype(np.float64)
    tanh_form = 0.5 * x64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64 ** 3)))
    np.testing.assert_allclose(g, tanh_form, rtol=1e-6, atol=1e-7)  # float32: 1 + tanh cancels near -3
    assert abs(float(gelu(np.float32([1.0]))[0]) - 0.8411920) < 1e-6  # the erf form (BERT's) gives 0.8413447


def test_softmax_is_stable_and_masks():
    s = softmax(np.array([[1000.0, 1000.0, -np.inf]], dtype=np.float32))  # stable, masked entry -> 0
    assert np.array_equal(s, np.array([[0.5, 0.5, 0.0]], dtype=np.float32))
    x = np.random.default_rng(0).normal(0, 5, (3, 4, 7)).astype(np.float32)
    s = softmax(x)
    assert s.dtype == np.float32 and s.shape == x.shape
    np.testing.assert_allclose(s.sum(-1), 1, rtol=1e-6)  # over the last axis only
    assert np.array_equal(softmax(x[1]), s[1])  # rows never mix
    before = x.copy()
    softmax(x)
    assert np.array_equal(x, before)  # its input untouched (it works in its own temporary)
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))  # the written-out form, bit for bit
    assert np.array_equal(s.view(np.int32), (e / np.add.reduce(e, axis=-1, keepdims=True)).view(np.int32))


@pytest.mark.parametrize("d_head", [1, 2, 3, 48, 64, 80, 96, 128, 7])
def test_the_head_scale_is_float32_of_one_over_the_square_root_in_double(d_head):
    assert head_scale(d_head).dtype == np.float32 and head_scale(d_head) == np.float32(1 / np.sqrt(d_head))


def test_layer_norm_normalises_each_row_then_scales_and_shifts():
    x = np.array([[0.0, 1.0, -3.0, 2.5]], dtype=np.float32)
    y = layer_norm(x, np.ones(4, np.float32), np.zeros(4, np.float32), 1e-5)
    assert y.dtype == np.float32 and y.shape == x.shape
    np.testing.assert_allclose([y.mean(), y.var()], [0, 1], atol=1e-4)
    g, b = np.float32([2, -1, 0.5, 3]), np.float32([0.1, 0.2, -0.3, 0])
    np.testing.assert_allclose(layer_norm(x, g, b, 1e-5), g * y + b, rtol=1e-6, atol=1e-6)
    # eps is added to the variance: with eps = var(x) the normalised row shrinks by sqrt(2)
    var = float(x.astype(np.float64).var())
    np.testing.assert_allclose(layer_norm(x, np.ones(4, np.float32), np.zeros(4, np.float32), var), y / np.sqrt(2),
                               rtol=1e-5, atol=1e-6)
    rows = np.random.default_rng(1).normal(0, 3, (5, 4)).astype(np.float32)
    assert np.array_equal(layer_norm(rows, g, b, 1e-5)[2:3], layer_norm(rows[2:3], g, b, 1e-5))  # rows never mix


def qkv(h=2, n=5, t=9, dh=4, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.normal(0, 2, shape).astype(np.float32) for shape in ((h, n, dh), (h, t, dh), (h, t, dh)))


@pytest.mark.parametrize("n_past", [0, 1, 4])
def test_attention_rows_see_exactly_their_key_prefix(n_past):
    q, k, v = qkv()
    n = q.shape[1]
    out = attention(q, k, v, n_past)
    assert out.shape == q.shape and out.dtype == np.float32
    close(out, attention_masked(q, k, v, n_past))  # the prefill's masked form: the same law
    later = k.copy(), v.copy()
    later[0][:, n_past + n :], later[1][:, n_past + n :] = 99, -99  # keys past the last query's prefix
    assert np.array_equal(attention(q, *later, n_past), out)
    assert np.array_equal(attention_masked(q, *later, n_past), attention_masked(q, k, v, n_past))
    for i in range(n):  # row i is the one-row call over its own prefix, bit for bit (batch invariance)
        assert np.array_equal(out[:, i : i + 1], attention(q[:, i : i + 1], k, v, n_past + i))
        future = k.copy()
        future[:, n_past + i + 1 :] = 99  # a key after row i's position never changes row i
        assert np.array_equal(attention(q, future, v, n_past)[:, i], out[:, i])


def test_every_masked_row_keeps_a_key(tiny):
    # attention_masked uses a -inf mask: with n_past = 0 the first row has exactly one key
    out = attention_masked(*qkv(n=5, t=5), 0)
    assert np.isfinite(out).all()
    logits = tiny.prefill(np.array([5]), tiny.new_cache())
    assert np.isfinite(logits).all()


def test_shapes_match_the_signatures(tiny):
    c, p = tiny.config, tiny.params
    n, d, h = 3, c.n_embd, c.n_head
    x = np.random.default_rng(2).normal(0, 1, (n, d)).astype(np.float32)
    cache = tiny.new_cache()
    assert cache.k.shape == cache.v.shape == (c.n_layer, h, c.n_ctx, c.d_head) and cache.k.dtype == np.float32
    assert cache.k.nbytes + cache.v.nbytes == 2 * c.n_layer * c.n_ctx * c.n_embd * 4
    layer = p["h"][0]
    y = mha(x, **layer["attn"], cache=cache, layer=0, n_head=h, linear=gemm, attend=attention)
    assert y.shape == (n, d) and y.dtype == np.float32
    assert cache.length == 0 and np.abs(cache.k[0, :, :n]).sum() > 0 and not cache.k[0, :, n:].any()  # rows 0..n-1
    assert ffn(x, **layer["mlp"], linear=gemm).shape == (n, d)
    assert block(x, layer, tiny.new_cache(), 0, c, gemm, attention).shape == (n, d)
    logits = gpt2(np.arange(n), p, c, cache, gemm)
    assert logits.shape == (n, c.n_vocab) and logits.dtype == np.float32 and cache.length == n
    empty = gpt2(np.array([], dtype=np.int64), p, c, cache, gemm)  # nothing new: no logits, the cache stays
    assert empty.shape == (0, c.n_vocab) and empty.dtype == np.float32 and cache.length == n


@pytest.mark.parametrize("ids_dtype", [np.int64, np.int32, np.uint16])
def test_logits_are_float32_on_both_paths(tiny, ids_dtype):
    ids = np.arange(1, 7, dtype=ids_dtype)
    for run in (tiny.prefill, tiny.forward):
        logits = run(ids, tiny.new_cache())
        assert logits.dtype == np.float32 and logits.shape == (6, tiny.config.n_vocab)


# ---- the KV cache ----

@pytest.mark.parametrize("shape", [{}, dict(n_head=4, n_layer=3, n_embd=32), dict(n_head=1, n_layer=1)])
def test_cached_decoding_matches_whole_sequence(shape):
    m = tiny_model(seed=1, **shape)
    ids = np.random.default_rng(0).integers(0, m.config.n_vocab, 20)
    whole = m.prefill(ids, m.new_cache())
    assert whole.shape == (20, m.config.n_vocab) and whole.dtype == np.float32
    cache = m.new_cache()
    steps = [m.prefill(ids[:7], cache)]  # a prompt, then one token at a time
    steps += [m.forward(ids[i : i + 1], cache) for i in range(7, 20)]
    cached = np.concatenate(steps)
    assert cache.length == 20
    close(cached, whole)
    assert not np.array_equal(whole[5], whole[6])  # the positions really differ


def test_rollback_and_reforward(tiny):
    ids = np.random.default_rng(1).integers(0, tiny.config.n_vocab, 16)
    other = (ids + 1) % tiny.config.n_vocab
    cache = tiny.new_cache()
    tiny.forward(ids[:10], cache)
    tiny.forward(other[10:16], cache)  # a wrong continuation...
    k_before = cache.k.copy()
    cache.rollback(10)  # ...forgotten in O(1): nothing is copied or cleared
    assert cache.length == 10 and np.array_equal(cache.k, k_before)
    again = tiny.forward(ids[10:16], cache)
    close(again, tiny.prefill(ids, tiny.new_cache())[10:16])


@pytest.mark.parametrize("length, error, message", [
    (4, ValueError, "cannot roll the cache back to 4: it holds 3"),
    (-1, ValueError, "cannot roll the cache back to -1: it holds 3"),
    # rollback(1.5) was accepted and left length 1.5: the next forward failed on slicing
    *[(x, TypeError, f"rollback's length must be an integer, got {x!r}") for x in (1.5, 2.0, True, "2", None)],
])
def test_rollback_takes_an_integer_no_larger_than_the_length(tiny, length, error, message):
    cache = tiny.new_cache()
    tiny.forward([1, 2, 3], cache)
    with pytest.raises(error, match=re.escape(message)):
        cache.rollback(length)
    assert cache.length == 3
    cache.rollback(np.int64(2))  # NumPy integers are integers
    assert tiny.forward([4], cache).shape == (1, 67) and cache.length == 3
    cache.rollback(0)
    assert cache.length == 0


def test_context_overflow_raises_before_any_work(tiny):
    n_ctx = tiny.config.n_ctx
    assert issubclass(ContextOverflowError, ValueError)
    cache = tiny.new_cache()
    tiny.forward(np.arange(n_ctx - 2), cache)
    k, length = cache.k.copy(), cache.length
    for run in (tiny.forward, tiny.prefill):
        with pytest.raises(ContextOverflowError, match="30 cached \\+ 3 new positions exceed the context n_ctx=32"):
            run([1, 2, 3], cache)
        assert cache.length == length and np.array_equal(cache.k, k)
    tiny.forward([1, 2], cache)  # exactly filling the context is fine
    assert cache.length == n_ctx
    with pytest.raises(ContextOverflowError, match="n_ctx=32"):
        tiny.forward([1], cache)
    with pytest.raises(ContextOverflowError, match="33 new positions"):
        tiny.prefill(np.zeros(n_ctx + 1, dtype=np.int64), tiny.new_cache())


@pytest.mark.parametrize("ids", [[0, 67], [-1], [3, 1000]])
def test_ids_out_of_range(tiny, ids):
    cache = tiny.new_cache()
    for run in (tiny.forward, tiny.prefill):
        with pytest.raises(ValueError, match=r"ids must be integers in \[0, 67\)"):
            run(ids, cache)
    assert cache.length == 0


def test_ids_must_be_integers(tiny):
    with pytest.raises(ValueError, match=r"ids must be integers in \[0, 67\)"):
        tiny.forward(np.array([1.0, 2.0]), tiny.new_cache())


def test_kv_cache_starts_empty():
    config = GPT2Config(n_vocab=5, n_ctx=6, n_embd=4, n_head=2, n_layer=3)
    cache = KVCache(config)
    assert cache.length == 0 and cache.n_ctx == 6 and cache.k.shape == (3, 2, 6, 2) and not cache.k.any()
    assert cache.k.flags.writeable and cache.k.dtype == np.float32 and cache.k.flags.c_contiguous


def resident_kib():  # this process's VmRSS (Linux)
    return int(re.search(r"VmRSS:\s+(\d+) kB", open("/proc/self/status").read()).group(1))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_a_kv_cache_commits_memory_for_the_positions_written_not_n_ctx():
    """16 heads' first 4 positions, in a cache of 2 x 268 MB: a few 4 KiB pages, not a 2 MiB huge page a head."""
    config = GPT2Config(n_vocab=5, n_ctx=65536, n_embd=256, n_head=4, n_layer=4)
    before = resident_kib()
    cache = KVCache(config)
    cache.k[:, :, :4] = 1.0
    cache.v[:, :, :4] = 2.0
    assert resident_kib() - before < 8 << 10 and cache.k[3, 3, 3, 63] == 1.0 and not cache.k[:, :, 4:8].any()


# ---- GPT2Config ----

GOOD = dict(n_vocab=67, n_ctx=32, n_embd=16, n_head=2, n_layer=2)


def test_config_defaults_and_head_size():
    c = GPT2Config(**GOOD)
    assert c.layer_norm_epsilon == 1e-5 and c.eos_token_id is None and c.d_head == 8
    assert GPT2Config(**{**GOOD, "n_vocab": np.int64(67)}).n_vocab == 67  # numpy integers are integers


@pytest.mark.parametrize("name", ["n_vocab", "n_ctx", "n_embd", "n_head", "n_layer"])
@pytest.mark.parametrize("value", [0, -1, 1.5, True, "2", None])
def test_config_refuses_a_size_that_is_not_a_positive_integer(name, value):
    with pytest.raises(ValueError, match=f"config: {name} must be a positive integer, got {value!r}"):
        GPT2Config(**{**GOOD, name: value})


def test_config_refuses_heads_that_do_not_divide_the_width():
    message = r"config: n_embd \(16\) is not divisible by n_head \(3\); fix the checkpoint's config.json"
    with pytest.raises(ValueError, match=message):
        GPT2Config(**{**GOOD, "n_head": 3})


@pytest.mark.parametrize("eps", [0, 0.0, -1e-5, float("inf"), float("nan"), True, "1e-5", None])
def test_config_refuses_a_layer_norm_epsilon_that_is_not_finite_and_positive(eps):
    with pytest.raises(ValueError, match=f"config: layer_norm_epsilon must be a finite number > 0, got {eps!r}"):
        GPT2Config(**{**GOOD, "layer_norm_epsilon": eps})


@pytest.mark.parametrize("eps", [1e-5, 1e-3, 1, np.float32(1e-6), np.float64(1e-12)])
def test_config_takes_any_finite_positive_epsilon(eps):
    assert GPT2Config(**{**GOOD, "layer_norm_epsilon": eps}).layer_norm_epsilon == eps


@pytest.mark.parametrize("eos, ok", [(None, True), (0, True), (66, True), (67, False), (-1, False)])
def test_config_eos_must_be_in_the_vocabulary(eos, ok):
    if ok:
        assert GPT2Config(**GOOD, eos_token_id=eos).eos_token_id == eos
    else:
        with pytest.raises(ValueError, match=rf"config: eos_token_id {eos} is outside \[0, 67\)"):
            GPT2Config(**GOOD, eos_token_id=eos)


def test_the_epsilon_reaches_every_layer_norm(tiny):
    """A model whose config says another epsilon computes other logits (a check that eps is not hard-coded)."""
    ids = np.arange(1, 9)
    wide = GPT2Config(**{**tiny.config.__dict__, "layer_norm_epsilon": 10.0})
    ours = tiny.prefill(ids, tiny.new_cache())
    theirs = gpt2(ids, tiny.params, wide, KVCache(wide), gemm)
    assert np.abs(ours - theirs).max() > 1e-2 * np.abs(ours).max()
