"""npspec's converted format (npspec.sources.files): write and read it, bit for bit, in format 2 and the old format 1.

A converted model is a directory with `model.safetensors` (float32, GPT-2 names, the config in
the header metadata; format 2 stores the block matrices transposed, in the forward's column-major
layout) and `tokenizer.json`. Loading reads each tensor once, straight into the array the forward
uses (memory measured here); a format-1 file loads and is rewritten once as format 2.
"""

import json
import os
import tracemalloc

import numpy as np
import pytest
from safetensors import safe_open

from npspec.sources import files
from npspec.sources.errors import CheckpointError
from npspec.sources.files import load_model, save_converted
from npspec.model.gpt2 import GPT2Config
from npspec.sources.init import init_tensors, init_tensors_varied
from npspec.model.model import Model
from npspec.sources import SHAPES, cache, load
from npspec.model.tensors import params_tree

from conftest import SHIPPED, run_python
from model_files import SMALL, TOKENIZER, GPT2_TOKENIZER, saved, saved_format_1, logits, same_bits


# --- the round trip ----------------------------------------------------------------------------------


def test_save_and_load_round_trip(tmp_path):
    d = saved(tmp_path / "m")
    assert sorted(os.listdir(d)) == ["model.safetensors", "tokenizer.json"]  # no temp files left
    m = load_model(d)
    ref = init_tensors(SMALL, 1)
    assert m.config == SMALL and m.source == str(d) and (m.kernel, m.threads) == ("gemm-blocks", 1)
    assert np.array_equal(m.params["wte"], ref["wte.weight"]) and m.params["wte"].dtype == np.float32
    assert np.array_equal(m.params["h"][0]["attn"]["c_attn"]["w"], ref["h.0.attn.c_attn.weight"])
    assert np.array_equal(m.params["ln_f"]["g"], ref["ln_f.weight"])
    assert m.tokenizer.to_str() == load_model(SHIPPED / "target").tokenizer.to_str()
    assert m.metadata == {"format_version": "2", "layout": "column-major-blocks", "n_vocab": "2048", "n_ctx": "32", "n_embd": "8", "n_head": "2",
                          "n_layer": "1", "layer_norm_epsilon": "1e-05", "eos_token_id": "0", "source": "test",
                          "source_sha256": "0" * 64}
    assert load_model(d, kernel="gemv-rows", threads=2).kernel == "gemv-rows"
    with pytest.raises(ValueError, match="unknown kernel"):
        load_model(d, kernel="gemv")


def test_format_2_round_trip_is_bit_identical_to_the_model_in_memory(tmp_path):
    tensors = init_tensors_varied(SMALL, 2)
    save_converted(tmp_path / "m", tensors, SMALL, "test", None, TOKENIZER)
    memory, loaded = Model(SMALL, params_tree(init_tensors_varied(SMALL, 2), SMALL)), load_model(tmp_path / "m")
    assert same_bits(memory, loaded)
    assert np.array_equal(logits(memory).view(np.uint32), logits(loaded).view(np.uint32))
    for lin in files.block_linears(loaded.params):  # read straight into the forward's layout: nothing to relay out
        assert lin["w"].flags.f_contiguous and lin["w"].base is not None
    with safe_open(str(tmp_path / "m" / "model.safetensors"), "numpy") as f:  # the file holds w.T, [out, in]
        assert f.metadata()["layout"] == "column-major-blocks"
        for name in ("h.0.attn.c_attn.weight", "h.0.attn.c_proj.weight", "h.0.mlp.c_fc.weight", "h.0.mlp.c_proj.weight"):
            assert np.array_equal(f.get_tensor(name), tensors[name].T), name
        assert np.array_equal(f.get_tensor("wte.weight"), tensors["wte.weight"])  # the rest as it is
        assert np.array_equal(f.get_tensor("h.0.mlp.c_fc.bias"), tensors["h.0.mlp.c_fc.bias"])


def test_a_format_1_file_loads_the_same_bits_and_is_rewritten_once(tmp_path, notes):
    d = saved_format_1(tmp_path / "m", seed=4)
    weights = d / "model.safetensors"
    inode = weights.stat().st_ino
    old = load_model(d)
    memory = Model(SMALL, params_tree(init_tensors_varied(SMALL, 4), SMALL))
    assert same_bits(old, memory) and np.array_equal(logits(old).view(np.uint32), logits(memory).view(np.uint32))
    said = notes()
    assert len(said) == 1 and "format 1" in said[0] and "rewrote it once as format 2" in said[0] and "\n" not in said[0]
    assert old.metadata["format_version"] == "2" and old.metadata["source"] == "test"
    with safe_open(str(weights), "numpy") as f:
        assert f.metadata()["format_version"] == "2" and f.get_tensor("h.0.mlp.c_fc.weight").shape == (32, 8)
    assert sorted(os.listdir(d)) == ["model.safetensors", "tokenizer.json"]  # no temp file left
    assert weights.stat().st_ino != inode  # replaced whole (atomic_write), not written over in place
    rewritten = weights.stat().st_mtime_ns
    new = load_model(d)
    assert len(notes()) == 1 and weights.stat().st_mtime_ns == rewritten  # the second load rewrites nothing
    assert same_bits(new, memory) and np.array_equal(logits(new).view(np.uint32), logits(memory).view(np.uint32))


def test_a_read_only_format_1_directory_still_loads(tmp_path, monkeypatch, notes):
    d = saved_format_1(tmp_path / "m", seed=4)
    data = (d / "model.safetensors").read_bytes()

    def read_only(*args, **kwargs):  # what a read-only directory does to atomic_write (root may write anywhere)
        raise PermissionError(13, "Permission denied", str(d))

    monkeypatch.setattr(files.tempfile, "mkstemp", read_only)
    m = load_model(d)
    assert same_bits(m, Model(SMALL, params_tree(init_tensors_varied(SMALL, 4), SMALL)))
    assert m.metadata["format_version"] == "1"  # what the file still is
    said = notes()
    assert len(said) == 1 and "could not be rewritten" in said[0] and "Permission denied" in said[0] \
        and "relayout" in said[0] and "\n" not in said[0]
    assert (d / "model.safetensors").read_bytes() == data and sorted(os.listdir(d)) == ["model.safetensors",
                                                                                         "tokenizer.json"]


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_format_1_directory_on_disk_still_loads(tmp_path, notes):
    d = saved_format_1(tmp_path / "m", seed=4)
    d.chmod(0o555)
    try:
        assert load_model(d).metadata["format_version"] == "1"
        assert len(notes()) == 1 and "could not be rewritten" in notes()[0]
    finally:
        d.chmod(0o755)


def test_an_interrupted_rewrite_leaves_the_format_1_file(tmp_path, monkeypatch, notes):
    d = saved_format_1(tmp_path / "m")
    data = (d / "model.safetensors").read_bytes()
    real = files.write_safetensors

    def interrupted(path, shapes, array, metadata, done=None):
        real(path, dict(list(shapes.items())[:5]), array, metadata, done)  # a partial file, then Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(files, "write_safetensors", interrupted)
    with pytest.raises(KeyboardInterrupt):
        load_model(d)
    assert (d / "model.safetensors").read_bytes() == data and sorted(os.listdir(d)) == ["model.safetensors",
                                                                                         "tokenizer.json"]
    monkeypatch.undo()
    load_model(d)
    assert len(notes()) == 1 and "rewrote it once" in notes()[0]


def test_a_format_1_model_in_the_cache_is_rewritten_under_its_entry_lock(tmp_path, monkeypatch, notes, capsys):
    entry = saved_format_1(tmp_path / "cache" / "local" / "m-0123", seed=4)
    taken, real = [], cache.entry_lock
    monkeypatch.setattr(cache, "entry_lock", lambda root, final, **kw: taken.append(final) or real(root, final, **kw))
    m = load(str(entry), cache_dir=tmp_path / "cache", probe="off")
    assert m.metadata["format_version"] == "2" and taken == [entry.resolve()]  # cache.entry_lock was held
    said = [line for line in notes() if "format" in line]  # said through the "npspec" logger, not printed
    assert len(said) == 1 and "rewrote it once as format 2" in said[0] and capsys.readouterr().err == ""
    load(str(entry), cache_dir=tmp_path / "cache", probe="off")
    assert [line for line in notes() if "format" in line] == said


def test_save_refuses_tensors_that_do_not_fit(tmp_path):
    t = init_tensors(SMALL, 1)
    del t["ln_f.bias"]
    t["wpe.weight"] = t["wpe.weight"][:4]
    with pytest.raises(CheckpointError, match=r"cannot save: tensor wpe.weight has shape \[4, 8\], expected \[32, 8\]; "
                                              r"missing tensor ln_f.bias \[8\]"):
        save_converted(tmp_path / "m", t, SMALL, "test", "0" * 64, TOKENIZER)
    assert not (tmp_path / "m").exists()


# --- atomic writes -----------------------------------------------------------------------------------


def traced_load(path):
    """(model, peak bytes Python allocated while loading it)."""
    tracemalloc.start()
    try:
        m = load_model(path)
        return m, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_loading_holds_one_copy_of_the_weights(tmp_path):
    m, peak = traced_load(saved(tmp_path / "m", SHAPES["tiny"], 0, GPT2_TOKENIZER))  # 14 MB, mostly wte
    assert m.n_bytes == 4 * m.n_params
    # each tensor is read once, straight into the array the forward uses: no second copy
    # (the lower bound checks that tracemalloc sees those arrays at all)
    assert 0.9 * m.n_bytes <= peak <= 1.3 * m.n_bytes, (peak, m.n_bytes)


BLOCKS = GPT2Config(n_vocab=2048, n_ctx=64, n_embd=256, n_head=4, n_layer=6)  # 21 MB, 90% in the blocks


def test_format_2_loads_into_place_with_no_extra_copy(tmp_path):
    # most bytes in the blocks (not wte): format 2 holds them in the forward's layout, so each is read into its
    # final array and nothing is relaid out: the peak is the weights themselves (format 1 below: plus a matrix)
    m, peak = traced_load(saved(tmp_path / "m", BLOCKS, 0))
    assert m.params["h"][0]["mlp"]["c_fc"]["w"].flags.f_contiguous
    assert m.n_bytes <= peak <= 1.02 * m.n_bytes, (peak, m.n_bytes)


def test_format_1_relayout_and_rewrite_hold_one_matrix_extra(tmp_path):
    # the relayout to column-major frees each row-major matrix as soon as its copy exists, and the rewrite as
    # format 2 writes the laid-out arrays as they are: the peak is the weights plus about one matrix
    m, peak = traced_load(saved_format_1(tmp_path / "m", BLOCKS, 0))
    largest = max(h["mlp"]["c_fc"]["w"].nbytes for h in m.params["h"])
    assert m.params["h"][0]["mlp"]["c_fc"]["w"].flags.f_contiguous and m.metadata["format_version"] == "2"
    assert m.n_bytes + 0.9 * largest <= peak <= 1.1 * m.n_bytes + largest, (peak, m.n_bytes, largest)


RSS = ("import json, sys; from npspec.sources.files import load_model; from tokenizers import Tokenizer\n"
       "def peak():  # this process image's peak resident set (ru_maxrss would carry over the parent's)\n"
       "    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:'))\n"
       "Tokenizer.from_file(sys.argv[1] + '/tokenizer.json'); before = peak(); m = load_model(sys.argv[1])\n"
       "print(json.dumps([before, peak(), m.n_bytes]))")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux's /proc/self/status")
def test_loading_does_not_map_a_second_copy(tmp_path):
    # resident memory, not just Python's allocations: reading through a memory map of the file would
    # count its pages on top of the arrays (2x at the end of a load); readinto keeps it to one copy
    config = GPT2Config(n_vocab=50257, n_ctx=64, n_embd=512, n_head=8, n_layer=1)  # 116 MB of weights
    r = run_python("-c", RSS, saved(tmp_path / "m", config, 0, TOKENIZER))
    assert r.returncode == 0, r.stderr
    before, after, n_bytes = json.loads(r.stdout)
    grown = (after - before) * 1024  # VmHWM is in kB
    assert 0.9 * n_bytes <= grown <= 1.1 * n_bytes, (grown, n_bytes)


def test_a_streamed_save_refuses_tensors_out_of_order_or_misshaped(tmp_path):
    pairs = list(init_tensors(SMALL, 1).items())
    with pytest.raises(CheckpointError, match=r"^cannot save: expected tensor wpe.weight next, got ln_f.weight$"):
        save_converted(tmp_path / "a", iter([pairs[0], pairs[2]]), SMALL, "test", None, TOKENIZER)
    bad = [(n, a[:4] if n == "wpe.weight" else a) for n, a in pairs]
    with pytest.raises(CheckpointError, match=r"cannot save: tensor wpe.weight: got float32 \[4, 8\]"):
        save_converted(tmp_path / "b", iter(bad), SMALL, "test", None, TOKENIZER)
    assert os.listdir(tmp_path / "a") == [] and os.listdir(tmp_path / "b") == []  # nothing half-written left
