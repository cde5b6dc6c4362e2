"""The NumPy GPT-2 forward and its KV cache (issue 2, section 2)."""

from pathlib import Path

import numpy as np
import pytest

from npspec.model import ContextOverflowError, gelu, layer_norm, softmax

from conftest import tiny_model


def full(model, ids):
    return model.forward(np.asarray(ids), model.new_cache(), invariant=False)


@pytest.mark.parametrize("shape", [{}, dict(n_head=4, n_layer=3, n_embd=32), dict(n_head=1, n_layer=1)])
def test_cached_decoding_matches_whole_sequence(shape):
    m = tiny_model(seed=1, **shape)
    ids = np.random.default_rng(0).integers(0, m.config.n_vocab, 20)
    whole = full(m, ids)
    assert whole.shape == (20, m.config.n_vocab) and whole.dtype == np.float32
    cache = m.new_cache()
    steps = [m.forward(ids[:7], cache, invariant=False)]  # a prompt, then one token at a time
    steps += [m.forward(ids[i : i + 1], cache) for i in range(7, 20)]
    cached = np.concatenate(steps)
    assert cache.length == 20
    # float32 tolerance: summation order differs between GEMM and per-row products
    np.testing.assert_allclose(cached, whole, rtol=0, atol=1e-5 * np.abs(whole).max())
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
    np.testing.assert_allclose(again, full(tiny, ids)[10:16], rtol=0, atol=1e-5 * np.abs(again).max())


def test_rollback_cannot_grow(tiny):
    cache = tiny.new_cache()
    tiny.forward([1, 2, 3], cache)
    with pytest.raises(ValueError, match="holds 3"):
        cache.rollback(4)


def test_context_overflow_raises_before_any_work(tiny):
    n_ctx = tiny.config.n_ctx
    cache = tiny.new_cache()
    tiny.forward(np.arange(n_ctx - 2), cache)
    k, length = cache.k.copy(), cache.length
    with pytest.raises(ContextOverflowError, match="n_ctx=32"):
        tiny.forward([1, 2, 3], cache)
    assert cache.length == length and np.array_equal(cache.k, k)
    tiny.forward([1, 2], cache)  # exactly filling the context is fine
    assert cache.length == n_ctx


def test_ids_out_of_range(tiny):
    with pytest.raises(ValueError, match=r"\[0, 67\)"):
        tiny.forward([0, 67], tiny.new_cache())


@pytest.mark.parametrize("n_new", [1, 2, 3, 5, 9])
def test_invariant_rows_are_bit_identical_to_one_token_forwards(n_new):
    m = tiny_model(seed=2, n_embd=64, n_head=4)
    ids = np.random.default_rng(n_new).integers(0, m.config.n_vocab, 6 + n_new)
    a, b = m.new_cache(), m.new_cache()
    m.forward(ids[:6], a, invariant=False)
    m.forward(ids[:6], b, invariant=False)
    batched = m.forward(ids[6:], a)
    single = np.concatenate([m.forward(ids[i : i + 1], b) for i in range(6, 6 + n_new)])
    assert np.array_equal(batched, single)
    assert np.array_equal(a.k[:, :, : a.length], b.k[:, :, : b.length])


def test_math_pieces():
    x = np.array([[0.0, 1.0, -3.0, 2.5]], dtype=np.float32)
    # tanh GELU at a few known points: gelu(0) = 0, gelu(x) - gelu(-x) = x
    g = gelu(x)
    assert g.dtype == np.float32 and g[0, 0] == 0
    np.testing.assert_allclose(gelu(x) - gelu(-x), x, rtol=1e-6)
    s = softmax(np.array([[1000.0, 1000.0, -np.inf]], dtype=np.float32))  # stable, masked entry -> 0
    assert np.array_equal(s, np.array([[0.5, 0.5, 0.0]], dtype=np.float32))
    y = layer_norm(x, np.ones(4, np.float32), np.zeros(4, np.float32), 1e-5)
    np.testing.assert_allclose([y.mean(), y.var()], [0, 1], atol=1e-4)


def test_every_masked_row_keeps_a_key(tiny):
    # attention_masked uses a -inf mask: with n_past = 0 the first row has exactly one key.
    logits = tiny.forward(np.array([5]), tiny.new_cache(), invariant=False)
    assert np.isfinite(logits).all()


# ---- matmul strategies (issue 5): every invariant strategy keeps rows bit-identical ----

def _rows_are_invariant(model, matmul, n_max=9, n_past=4):
    from npspec.model import gpt2

    ids = np.random.default_rng(n_max).integers(0, model.config.n_vocab, n_past + n_max)
    single_cache = model.new_cache()
    model.forward(ids[:n_past], single_cache, invariant=False)
    single = np.concatenate([gpt2(ids[i : i + 1], model.params, model.config, single_cache, matmul=matmul)
                             for i in range(n_past, n_past + n_max)])
    for m in range(1, n_max + 1):
        cache = model.new_cache()
        model.forward(ids[:n_past], cache, invariant=False)
        batched = gpt2(ids[n_past : n_past + m], model.params, model.config, cache, matmul=matmul)
        assert batched.dtype == np.float32 and batched.shape == (m, model.config.n_vocab)
        assert np.array_equal(batched, single[:m]), f"{matmul}: M={m} rows differ from one-token forwards"
        assert np.array_equal(cache.k[:, :, : cache.length], single_cache.k[:, :, : cache.length])
    return single


@pytest.mark.parametrize("matmul", ["rows", "panels"])
@pytest.mark.parametrize("shape", [dict(n_embd=64, n_head=4), dict(n_embd=96, n_head=3, n_layer=1, n_vocab=1000),
                                   dict(n_embd=256, n_head=4, n_layer=1, n_vocab=2048, n_ctx=64)])
def test_invariant_strategies_are_bit_identical_for_m_1_to_9(matmul, shape):
    m = tiny_model(seed=5, **shape)
    single = _rows_are_invariant(m, matmul)
    whole = full(m, np.random.default_rng(9).integers(0, m.config.n_vocab, 13))  # the ids _rows_are_invariant used
    np.testing.assert_allclose(single, whole[4:], rtol=0, atol=1e-5 * np.abs(whole).max())  # and correct


@pytest.fixture(scope="module")
def gpt2_shape():
    """GPT-2 (124M)'s exact matrix shapes (n_embd 768, 12 heads, n_vocab 50257), 3 of its 12 layers."""
    from dataclasses import replace

    from npspec.checkpoint import Model, params_tree
    from npspec.init import SHAPES, init_tensors

    config = replace(SHAPES["gpt2"], n_layer=3)
    return Model(config, params_tree(init_tensors(config, seed=0), config), None, Path("gpt2-3-layers"), {})


@pytest.mark.parametrize("matmul", ["rows", "panels"])
def test_invariant_strategies_on_the_gpt2_shape(gpt2_shape, matmul):
    _rows_are_invariant(gpt2_shape, matmul)


def test_panel_layout_on_the_gpt2_shape(gpt2_shape):
    from npspec.checkpoint import Model
    from npspec.model import panel_layout

    import copy
    m = Model(gpt2_shape.config, panel_layout(copy.deepcopy(gpt2_shape.params)), None, gpt2_shape.path, {})
    _rows_are_invariant(m, None)  # default: "panels" on contiguous panels, incl. the head's ragged tail


def test_panel_threads_do_not_change_a_bit(gpt2_shape):
    """The worker threads of "panels" share out whole panels: any thread count gives the same bits."""
    from npspec.checkpoint import Model
    from npspec.model import SPLIT_BYTES, get_threads, panel_layout, set_threads

    import copy
    m = Model(gpt2_shape.config, panel_layout(copy.deepcopy(gpt2_shape.params)), None, gpt2_shape.path, {})
    assert m.params["h"][0]["mlp"]["c_fc"]["w"].nbytes >= SPLIT_BYTES  # so the split really happens
    ids = np.arange(100, 106)
    previous = get_threads()
    try:
        out = {}
        for n in (1, 2, 3):
            set_threads(n)
            out[n] = m.forward(ids, m.new_cache()), m.forward(ids[:1], m.new_cache())
    finally:
        set_threads(previous)
    for n in (2, 3):
        assert np.array_equal(out[n][0], out[1][0]) and np.array_equal(out[n][1], out[1][1])
    assert np.array_equal(out[1][0][:1], out[1][1])


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_set_threads_refuses_bad_counts(bad):
    from npspec.model import get_threads, set_threads

    before = get_threads()
    with pytest.raises(ValueError, match="positive integer"):
        set_threads(bad)
    assert get_threads() == before


def test_set_threads_reads_the_environment(monkeypatch):
    from npspec.model import get_threads, set_threads

    previous = get_threads()
    try:
        monkeypatch.setenv("NPSPEC_NUM_THREADS", "3")
        set_threads()
        assert get_threads() == 3
        for bad in ("many", "0", "-2"):
            monkeypatch.setenv("NPSPEC_NUM_THREADS", bad)
            with pytest.raises(ValueError, match=f"NPSPEC_NUM_THREADS='{bad}' is not a positive integer"):
                set_threads()
    finally:
        set_threads(previous)


def test_loaded_models_are_in_panel_layout(shipped):
    from npspec.model import default_matmul

    for model in shipped:
        assert default_matmul(model.params, True) == "panels"
    assert shipped[0].matmul is None and shipped[1].matmul == "rows"  # a draft takes the fast one-row product


def test_the_drafts_product_does_not_change_greedy_output(shipped):
    import dataclasses

    from npspec.speculative import speculative_generate

    target, draft = shipped
    prompt = target.tokenizer.encode("ROMEO:").ids
    ar = speculative_generate(target, None, prompt, 24, gamma=0, temperature=0).ids
    for matmul in ("rows", "panels"):
        d = dataclasses.replace(draft, matmul=matmul)
        assert speculative_generate(target, d, prompt, 24, gamma=3, temperature=0).ids == ar


def test_load_refuses_an_unknown_role():
    from npspec.models import load

    with pytest.raises(ValueError, match="role must be 'target' or 'draft'"):
        load(None, "drafter")


def test_strategies_agree_and_bad_choices_are_refused(tiny):
    from npspec.model import MATMULS, gpt2

    ids = np.arange(1, 9)
    ref = full(tiny, ids)
    for matmul in MATMULS:
        invariant = matmul in ("rows", "panels")
        out = gpt2(ids, tiny.params, tiny.config, tiny.new_cache(), invariant=invariant, matmul=matmul)
        np.testing.assert_allclose(out, ref, rtol=0, atol=1e-5 * np.abs(ref).max())
    with pytest.raises(ValueError, match="not batch invariant"):
        gpt2(ids, tiny.params, tiny.config, tiny.new_cache(), invariant=True, matmul="gemm")
    with pytest.raises(ValueError, match="unknown matmul"):
        gpt2(ids, tiny.params, tiny.config, tiny.new_cache(), invariant=False, matmul="fast")


def test_panels_fit_and_are_contiguous_views_in_panel_layout():
    from npspec.model import PANEL_BYTES, WHOLE_BYTES, panel_width, panels

    for d_in, d_out in [(768, 2304), (1280, 5120), (5120, 1280), (1280, 50257), (64, 67), (256, 1024), (256, 2048)]:
        w = panel_width(d_in, d_out)
        whole = d_in * d_out * 4 <= WHOLE_BYTES
        assert w == d_out if whole else (w % 8 == 0 and d_in * w * 4 <= PANEL_BYTES and w < d_out)
    a = np.asfortranarray(np.arange(12 * 40, dtype=np.float32).reshape(12, 40))
    p = panels(a, 16)  # two full panels of 16 columns; the last 8 columns are left out
    assert p.shape == (2, 12, 16) and np.shares_memory(p, a) and np.array_equal(p[1], a[:, 16:32])
    assert all(p[i].flags.f_contiguous for i in range(2))


def test_panel_layout_keeps_values_and_switches_the_default(tiny):
    from npspec.checkpoint import Model
    from npspec.model import default_matmul, panel_layout

    import copy
    m = Model(tiny.config, panel_layout(copy.deepcopy(tiny.params)), None, tiny.path, {})
    w = m.params["h"][0]["mlp"]["c_fc"]["w"]
    assert w.flags.f_contiguous and np.array_equal(w, tiny.params["h"][0]["mlp"]["c_fc"]["w"])
    assert default_matmul(tiny.params, True) == "rows" and default_matmul(m.params, True) == "panels"
    assert default_matmul(m.params, False) == "gemm"
    _rows_are_invariant(m, None)  # the default invariant path of a panel-layout model
    ids = np.arange(1, 9)
    np.testing.assert_allclose(m.forward(ids, m.new_cache()), full(tiny, ids), rtol=0, atol=1e-5 * 30)
