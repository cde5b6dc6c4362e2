"""The registry of kernels (npspec.kernels.registry), the Model that owns its kernel, the column-major layout, and threads.

tests/test_kernels.py checks the products and the batch-invariance contract; tests/test_probe.py how a role's
kernel is chosen.
"""

import contextlib
import copy
import gc
import threading

import numpy as np
import pytest

from npspec.sources.files import params_tree
from npspec.sources.init import init_tensors
from npspec.kernels.layout import block_linears, column_major, fortran_copy
from npspec.kernels.products import GemmBlocks, GemvPanels, gemm, gemm_panels, gemv_rows
from npspec.kernels.workers import Workers, check_threads
from npspec.model.model import Model, leaves
from npspec.kernels.quantized import dequant_gemm, dequant_panels
from npspec.kernels.registry import REGISTRY, STATIC_DEFAULT, kernel, names, plain_baselines

from conftest import installed, make, tiny_model

KERNELS = installed(names(codes=False))


# ---- the registry and the Model that owns its kernel ----

@pytest.mark.parametrize("name", KERNELS)
def test_every_kernel_gives_the_prefills_logits(tiny, name):
    ids = np.arange(1, 9)
    ref = tiny.prefill(ids, tiny.new_cache())
    m = tiny.with_kernel(name)
    assert m.invariant == (name not in ("gemm", "gemm-panels")) == REGISTRY[name].invariant
    out = m.forward(ids, m.new_cache())
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-5 * np.abs(ref).max())


def test_a_prefill_runs_blas_at_the_models_threads_or_at_the_threads_it_is_given(tiny):
    limits = []

    class Blas:  # a BlasThreads that records each limit and runs nothing of the real BLAS's thread API
        def limit(self, n):
            limits.append(n)
            return contextlib.nullcontext()
    m = Model(tiny.config, tiny.params, kernel="gemv-panels", threads=3, blas=Blas())
    ids = np.arange(1, 5)
    m.prefill(ids, m.new_cache())
    m.prefill(ids, m.new_cache(), threads=1)
    m.forward(ids[:1], m.new_cache())
    assert limits == [3, 1, 1]  # the model's threads, the threads given, a panel kernel's forward: BLAS on one


def test_the_registry_builds_each_named_product_and_says_what_it_is():
    assert (make("gemv-rows"), make("gemm"), make("gemm-panels"), make("dequant-panels")) == \
        (gemv_rows, gemm, gemm_panels, dequant_panels)
    k = make("gemv-panels", threads=3)
    assert isinstance(k, GemvPanels) and k.threads == 3 and k.name == "gemv-panels"
    assert repr(k) == "GemvPanels(threads=3)" and isinstance(make("gemm-blocks"), GemmBlocks)
    assert [n for n in names() if REGISTRY[n].own_threads] == ["compiled-panels", "gemm-blocks", "gemv-panels",
                                                               "compiled-quant"]
    assert [n for n in names() if not REGISTRY[n].invariant] == ["gemm", "gemm-panels"]
    assert names(codes=True) == ("dequant-panels", "compiled-quant") and kernel("dequant-panels").prefill is dequant_gemm
    assert [n for n in names() if REGISTRY[n].packs] == ["compiled-panels", "compiled-quant"]
    assert all(kernel(n).prefill is gemm for n in names(codes=False))
    assert [REGISTRY[n].blas_threads(3) for n in ("gemm-blocks", "gemv-rows")] == [1, 3]
    assert STATIC_DEFAULT == "gemm-blocks" == Model.__init__.__defaults__[2]


def test_gemm_panels_is_the_benchs_and_not_the_product_clis():
    assert "gemm-panels" in names() and "gemm-panels" not in names(cli=True)
    assert set(names(cli=True)) == set(names()) - {"gemm-panels"}


def test_plain_baselines_hold_the_targets_own_kernel_the_compiled_one_when_installed_and_blas_once_each():
    extra = ("compiled-panels",) if REGISTRY["compiled-panels"].available() else ()
    assert plain_baselines("gemm-blocks") == ("gemm-blocks", *extra, "gemv-rows", "gemm")
    assert plain_baselines("gemv-rows") == ("gemv-rows", *extra, "gemm")


def test_a_kernel_whose_extra_is_missing_says_how_to_install_it():
    fake = REGISTRY["compiled-panels"].__class__(**{**REGISTRY["compiled-panels"].__dict__, "available": lambda: False})
    with pytest.raises(ValueError, match=r"kernel compiled-panels needs the 'fast' extra: pip install 'npspec\[fast\]'"):
        fake.build(1)


@pytest.mark.parametrize("name", ["fast", "panels", "rows", "GEMM", ""])
def test_unknown_kernel_names_are_refused(tiny, name):
    message = f"unknown kernel {name!r}; pick one of {', '.join(names())}"
    with pytest.raises(ValueError, match=message):
        kernel(name)
    with pytest.raises(ValueError, match=message):
        tiny.with_kernel(name)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2", None])
def test_bad_thread_counts_are_refused(tiny, bad):
    message = f"the thread count must be a positive integer, got {bad!r}"
    refusals = [check_threads, GemvPanels, lambda t: Model(tiny.config, tiny.params, threads=t),
                *(lambda t, k=k: kernel(k).build(t) for k in names())]
    if bad is not None:  # with_kernel(threads=None) keeps the model's count
        refusals.append(lambda t: tiny.with_kernel("gemv-panels", threads=t))
    for refuse in refusals:
        with pytest.raises(ValueError, match=message):
            refuse(bad)
    assert tiny.threads == 1


def test_check_threads_takes_numpy_integers():
    assert check_threads(np.int64(3)) == 3 and type(check_threads(np.int64(3))) is int


def test_model_repr_shows_the_kernel(tiny):
    assert repr(tiny) == ("Model(source='tiny', n_layer=2, n_embd=16, n_vocab=67, kernel='gemm-blocks', threads=1, "
                          "prefill_rows=0)")
    assert "kernel='gemm', threads=2, prefill_rows=0)" in repr(tiny.with_kernel("gemm", threads=2))
    assert "kernel='gemv-panels', threads=1, prefill_rows=0)" in repr(tiny_model(role="draft"))
    assert repr(tiny.with_prefill_rows(16)).endswith("threads=1, prefill_rows=16)")


def test_a_prompt_up_to_prefill_rows_runs_as_a_decoding_forward_and_a_longer_one_as_the_gemm(tiny):
    """With a panel kernel, a forward runs BLAS on one thread and the GEMM prefill on the model's three: the limits
    show which ran, and the logits and caches are the forward's, bit for bit, or the GEMM prefill's."""
    limits = []

    class Blas:  # records each limit, runs nothing of the real BLAS's thread API
        def limit(self, n):
            limits.append(n)
            return contextlib.nullcontext()
    gemm_only = Model(tiny.config, tiny.params, kernel="gemv-panels", threads=3, blas=Blas())
    m = Model(tiny.config, tiny.params, kernel="gemv-panels", threads=3, blas=Blas(), prefill_rows=4)
    ids = np.arange(1, 6)
    for n, route in ((4, 1), (5, 3), (1, 1)):
        limits.clear()
        cache, ref_cache = m.new_cache(), m.new_cache()
        out = m.prefill(ids[:n], cache)
        assert limits == [route]
        ref = m.forward(ids[:n], ref_cache) if route == 1 else gemm_only.prefill(ids[:n], ref_cache)
        assert np.array_equal(out, ref) and np.array_equal(cache.k, ref_cache.k) and cache.length == n
    one_by_one = m.new_cache()
    rows = np.concatenate([m.forward(ids[i : i + 1], one_by_one) for i in range(4)])
    assert np.array_equal(m.prefill(ids[:4], m.new_cache()), rows)  # an invariant kernel's rows: one-token forwards
    gemm = gemm_only.prefill(ids[:4], gemm_only.new_cache())
    assert not np.array_equal(gemm, rows)  # the GEMM's bits differ here, so the routes above are told apart


def test_with_prefill_rows_shares_the_built_kernel_and_with_kernel_keeps_it_only_for_the_same_kernel(tiny):
    m = tiny.with_kernel("gemv-panels", threads=2).with_prefill_rows(np.int64(16))
    assert m.prefill_rows == 16 and type(m.prefill_rows) is int and m.kernel == "gemv-panels" and m.threads == 2
    assert m.linear is not tiny.linear and m.with_prefill_rows(4).linear is m.linear and m.prefill_rows == 16
    assert m.with_kernel("gemv-panels").prefill_rows == 16 and m.with_kernel("gemv-panels", threads=2).prefill_rows == 16
    assert m.with_kernel("gemv-rows").prefill_rows == 0 and m.with_kernel("gemv-panels", threads=1).prefill_rows == 16
    for bad in (-1, True, 1.5, "4", None):
        with pytest.raises(ValueError, match=r"prefill_rows must be an int >= 0 .*, got"):
            m.with_prefill_rows(bad)
        with pytest.raises(ValueError, match="prefill_rows must be an int >= 0"):
            Model(tiny.config, tiny.params, prefill_rows=bad)


def test_with_kernel_shares_the_arrays(tiny):
    other = tiny.with_kernel("gemv-rows")
    assert other is not tiny and other.kernel == "gemv-rows" and tiny.kernel == "gemm-blocks"
    assert other.threads == tiny.threads and tiny.with_kernel("gemv-panels", threads=2).threads == 2
    assert (other.config, other.tokenizer, other.source, other.metadata) == (tiny.config, None, "tiny", {})
    pairs = list(zip(leaves(tiny.params), leaves(other.params), strict=True))
    assert all(a is b for a, b in pairs)  # no copy of any weight
    assert other.linear is gemv_rows and isinstance(tiny.linear, GemmBlocks)


def test_column_major_keeps_values_in_place(tiny):
    c = tiny.config
    params = params_tree(init_tensors(c, seed=3), c)  # C-order, as read from a file
    before = copy.deepcopy(params)
    untouched = [params["wte"], params["wpe"], params["h"][0]["ln_1"]["g"], params["h"][1]["mlp"]["c_fc"]["b"]]
    assert column_major(params) is params
    for w, w0 in zip(block_linears(params), block_linears(before), strict=True):
        assert w["w"].flags.f_contiguous and w["w"].shape == w0["w"].shape and np.array_equal(w["w"], w0["w"])
    assert all(a is b for a, b in zip(untouched, [params["wte"], params["wpe"], params["h"][0]["ln_1"]["g"],
                                                  params["h"][1]["mlp"]["c_fc"]["b"]]))
    first = params["h"][0]["attn"]["c_attn"]["w"]
    assert column_major(params)["h"][0]["attn"]["c_attn"]["w"] is first  # already column-major: not copied


@pytest.mark.parametrize("shape", [(2, 3), (5, 3), (128, 7), (129, 300), (300, 129), (2 * 128 + 1, 64)])
def test_fortran_copy_is_a_column_major_copy_across_strips(shape):
    w = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)  # a partial strip where 128 does not divide
    f = fortran_copy(w)
    assert f.flags.f_contiguous and f.dtype == w.dtype and np.array_equal(f, w) and not np.shares_memory(f, w)
    assert fortran_copy(f) is f  # already column-major: no copy
    strided = np.arange(2 * shape[0] * shape[1], dtype=np.float64).reshape(2 * shape[0], shape[1])[::2]
    assert np.array_equal(fortran_copy(strided), strided) and fortran_copy(strided).flags.f_contiguous


def test_block_linears_walks_each_blocks_four_products_in_order(tiny):
    d, n_layer = tiny.config.n_embd, tiny.config.n_layer
    shapes = [lin["w"].shape for lin in block_linears(tiny.params)]
    assert shapes == [(d, 3 * d), (d, d), (d, 4 * d), (4 * d, d)] * n_layer


def test_models_store_block_matrices_column_major(shipped, tiny):
    c = tiny.config
    params = params_tree(init_tensors(c, seed=3), c)
    assert Model(c, params).params is params  # in place
    for model in (Model(c, params), tiny, *shipped):
        assert all(np.asarray(lin["w"]).flags.f_contiguous for lin in block_linears(model.params))  # Packed too


# ---- the worker threads and BLAS's ----

def test_workers_run_every_job_and_raise_a_job_s_error_in_the_caller():
    w, seen = Workers(2), []
    w.run([lambda: seen.append(0), lambda: seen.append(1), lambda: seen.append(2)])
    assert sorted(seen) == [0, 1, 2] and {t.name for t in w.threads} == {"npspec-0", "npspec-1"}

    def boom():
        raise ZeroDivisionError("in a worker")
    with pytest.raises(ZeroDivisionError, match="in a worker"):
        w.run([lambda: None, boom])
    w.run([lambda: seen.append(3), lambda: seen.append(4)])  # still usable, nothing left over
    assert sorted(seen) == [0, 1, 2, 3, 4]

    def interrupt():
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):  # the caller's own error wins; the worker's is not kept for later
        w.run([interrupt, boom])
    w.run([lambda: seen.append(5), lambda: seen.append(6)])
    assert sorted(seen) == [0, 1, 2, 3, 4, 5, 6]


def test_an_interrupted_run_waits_for_its_workers_before_raising():
    """Ctrl-C in the caller's share of a product: run raises only once every worker is done, so no worker is left
    writing into a product the next run reads."""
    w, gate, order = Workers(1), threading.Event(), []

    def slow():
        gate.wait(5)
        order.append("worker done")

    def caller():
        threading.Timer(0.05, gate.set).start()
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        w.run([caller, slow])
    order.append("raised")
    w.run([lambda: order.append("next"), lambda: order.append("next")])
    assert order == ["worker done", "raised", "next", "next"]


def test_workers_left_behind_end_their_threads():
    """A Workers nothing holds any more is collected and its threads end: one whose last run was interrupted with a
    job still running, and a panel kernel's left behind by with_kernel (a probe's candidate) once it shared a
    product out."""
    w, gate = Workers(2), threading.Event()

    def caller():
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        w.run([caller, lambda: gate.wait(5), lambda: None])
    threading.Timer(0.05, gate.set).start()
    model = tiny_model().with_kernel("gemv-panels", 2)
    big = np.asfortranarray(np.ones((1024, 1025), np.float32))  # over SPLIT_BYTES: shared out to its worker
    model.linear(np.ones((1, 1024), np.float32), big)
    threads = w.threads + model.linear.workers.threads
    assert len(threads) == 3 and all(t.is_alive() for t in threads)
    del w, model
    gc.collect()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads)


@pytest.mark.parametrize("kernel, blas", [("gemm-blocks", 1), ("gemv-panels", 1), ("gemv-rows", 3), ("gemm", 3),
                                          *[pytest.param(*p.values, 1, marks=p.marks) for p in installed(["compiled-panels"])]])
def test_a_forward_runs_blas_with_one_thread_under_a_panel_kernel_and_with_threads_otherwise(tiny, kernel, blas):
    threadpoolctl = pytest.importorskip("threadpoolctl")
    if not threadpoolctl.threadpool_info():
        pytest.skip("no BLAS that threadpoolctl knows")
    m, seen = tiny.with_kernel(kernel, threads=3), []
    product = m.linear

    def spy(x, w, b=None):
        seen.append({lib.num_threads for lib in m.blas.libraries.lib_controllers})  # the BLAS the model limits
        # (numba, imported by compiled-panels, may load another BLAS later; nothing in a forward calls it)
        return product(x, w, b)
    m.linear = spy
    before = [i["num_threads"] for i in threadpoolctl.threadpool_info()]
    m.forward(np.arange(3), m.new_cache())
    assert seen and all(s == {blas} for s in seen)
    assert [i["num_threads"] for i in threadpoolctl.threadpool_info()] == before  # put back
