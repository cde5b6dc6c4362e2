"""A Model decoding with a compiled kernel holds its weights once: its block matrices are replaced in its tree by
their panels (npspec.kernels.compiled.Packed), which give the matrix back bit for bit; the model it came from keeps
its float32 arrays; other kernels built from it read float32 arrays again; its GEMM prefill keeps its bits. A
self-draft quantized from a loaded target shares the target's float32 tensors instead of loading it again.
"""

import numpy as np
import pytest

from npspec.kernels import compiled
from npspec.kernels.layout import block_linears
from npspec.sources import load, random_model

from conftest import tiny_model

needs_numba = pytest.mark.skipif(not compiled.available(), reason="compiled kernels need the 'fast' extra (numba)")


def matrices(model):
    return [lin["w"] for lin in block_linears(model.params)]


@needs_numba
@pytest.mark.parametrize("kernel", ["compiled-panels", "compiled-quant"])
def test_a_compiled_model_holds_panels_instead_of_the_matrices_and_its_source_is_unchanged(kernel):
    floats = tiny_model(seed=3, n_embd=96, n_head=4, n_layer=2, n_vocab=257, n_ctx=40)
    packed = floats.with_kernel(kernel, 2)
    assert all(isinstance(w, np.ndarray) for w in matrices(floats))
    assert all(isinstance(w, compiled.Packed) for w in matrices(packed))
    for w, p in zip(matrices(floats), matrices(packed)):
        back = np.asarray(p)
        assert back.flags.f_contiguous and back.dtype == np.float32 and np.array_equal(back, w)
        assert p.nbytes == p.panels.nbytes and p.size == w.size and p.shape == w.shape
    ids = np.arange(12) % 257
    want = floats.with_kernel("compiled-panels", 1)  # its own copy packed too
    a, b = want.new_cache(), packed.new_cache()
    assert np.array_equal(floats.prefill(ids[:6], floats.new_cache()), packed.prefill(ids[:6], b))
    want.prefill(ids[:6], a)
    assert np.array_equal(want.forward(ids[6:], a), packed.forward(ids[6:], b))


@needs_numba
def test_other_kernels_built_from_a_packed_model_read_float32_arrays_with_the_same_bits():
    floats = tiny_model(seed=4, n_embd=96, n_head=4, n_layer=2, n_vocab=257, n_ctx=40)
    packed = floats.with_kernel("compiled-panels", 2)
    ids = np.arange(7) % 257
    for kernel in ("gemv-panels", "gemm-blocks", "gemv-rows"):
        again, trial = packed.with_kernel(kernel, 1), packed.trial(kernel, 1)
        assert all(isinstance(w, np.ndarray) and w.flags.f_contiguous for w in matrices(again) + matrices(trial))
        want = floats.with_kernel(kernel, 1).forward(ids, floats.new_cache())
        assert np.array_equal(again.forward(ids, again.new_cache()), want)
        assert np.array_equal(trial.forward(ids, trial.new_cache()), want)
    assert all(isinstance(w, compiled.Packed) for w in matrices(packed))  # trials leave the tree as it was


@needs_numba
def test_a_model_loaded_with_a_compiled_kernel_is_loaded_into_panels(tmp_path):
    model = random_model("distilgpt2", kernel="compiled-panels")
    assert all(isinstance(w, compiled.Packed) for w in matrices(model))
    floats = sum(w.size for w in matrices(model)) * 4
    assert sum(w.nbytes for w in matrices(model)) < 1.01 * floats  # panels only (partial panels padded)


@needs_numba
def test_a_self_draft_quantizes_the_loaded_target_and_shares_its_float32_tensors(tmp_path):
    target = random_model("distilgpt2")
    draft = load("int4-g64:self", "draft", cache_dir=tmp_path, probe="off", target=target)
    assert draft.kernel == "compiled-quant" and draft.codes is compiled.QuantPanels
    assert draft.params["wte"] is target.params["wte"] and draft.params["ln_f"]["g"] is target.params["ln_f"]["g"]
    assert draft.source == f"int4-g64:{target.source}"
    assert sum(w.nbytes for w in matrices(draft)) < 0.15 * sum(w.nbytes for w in matrices(target))


@needs_numba
def test_two_kernels_share_the_panels_of_one_array_while_either_keeps_them():
    """A self-draft's head is the target's wte.T: packed once (compiled.kernel.SHARED), dropped with its last kernel."""
    w = np.asfortranarray(np.random.default_rng(0).standard_normal((96, 130), dtype=np.float32))
    a, b = compiled.CompiledPanels(1), compiled.CompiledQuant(2).floats
    assert a.entry(w.T.T)[1] is b.entry(w)[1]  # another view of the same memory
    other = np.array(w, order="F")  # equal values, another array: its own panels
    assert b.entry(other)[1] is not a.entry(w)[1] and np.array_equal(b.entry(other)[1], a.entry(w)[1])
    before = len(compiled.kernel.SHARED)
    del a, b
    assert len(compiled.kernel.SHARED) == before - 2
