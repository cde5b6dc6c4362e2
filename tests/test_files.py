"""npspec's converted format (npspec.files): write and read it, atomically, and refuse whatever is wrong with it.

A converted model is a directory with `model.safetensors` (float32, GPT-2 names, the config in
the header metadata; format 2 stores the block matrices transposed, in the forward's column-major
layout) and `tokenizer.json`. Loading reads each tensor once, straight into the array the forward
uses; a format-1 file loads and is rewritten once as format 2; a broken, lying or foreign file gives
one CheckpointError line.
"""

import json
import os
import shutil
import struct
import tempfile
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.numpy import save_file

from npspec.huggingface import read_hf_tensors, write_hf_checkpoint
from npspec import files
from npspec.atomic import atomic_write
from npspec.errors import CheckpointError
from npspec.files import load_model, save_converted
from npspec.gpt2 import GPT2Config
from npspec.init import init_tensors, init_tensors_varied
from npspec.model import Model, leaves
from npspec.sources import SHAPES, load

from conftest import ROOT, SHIPPED, run_python
from test_cli import GENERATE, assert_one_clean_line, offline_env

SMALL = GPT2Config(n_vocab=2048, n_ctx=32, n_embd=8, n_head=2, n_layer=1, eos_token_id=0)  # shakespeare's tokenizer
TOKENIZER = (SHIPPED / "target" / "tokenizer.json").read_text()
GPT2_TOKENIZER = (ROOT / "weights" / "gpt2" / "tokenizer.json").read_text()


def saved(d, config=SMALL, seed=1, tokenizer=TOKENIZER):
    """A converted model directory of `config` with a seeded init."""
    save_converted(d, init_tensors(config, seed), config, "test", "0" * 64, tokenizer)
    return d


def saved_format_1(d, config=SMALL, seed=1, tokenizer=TOKENIZER):
    """A converted model directory in the old format 1 (every tensor row-major, `[in, out]`), as npspec wrote it."""
    d.mkdir(parents=True, exist_ok=True)
    metadata = {k: v for k, v in files.converted_metadata(config, "test", "0" * 64).items() if k != "layout"}
    save_file(init_tensors_varied(config, seed), str(d / "model.safetensors"), metadata={**metadata, "format_version": "1"})
    (d / "tokenizer.json").write_text(tokenizer)
    return d


def logits(model, ids=(1, 5, 7, 2)):  # -> [len(ids), n_vocab] float32
    return model.forward(np.array(ids), model.new_cache())


def same_bits(a, b):
    """True if two models' parameter trees hold the same values (bit for bit, NaNs included) and layouts."""
    return all(x.shape == y.shape and x.flags.f_contiguous == y.flags.f_contiguous and
               np.array_equal(x.view(np.uint32), y.view(np.uint32)) for x, y in zip(leaves(a.params), leaves(b.params)))


def read_raw(path):
    """(header dict, data bytes) of a safetensors file, read by hand."""
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_raw(path, header, data, length=None):
    """A safetensors file from a header dict and data bytes; `length` overrides the 8-byte header length."""
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(h) if length is None else length) + h + data)


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
    memory, loaded = Model(SMALL, files.params_tree(init_tensors_varied(SMALL, 2), SMALL)), load_model(tmp_path / "m")
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


def test_a_format_1_file_loads_the_same_bits_and_is_rewritten_once(tmp_path):
    d = saved_format_1(tmp_path / "m", seed=4)
    weights = d / "model.safetensors"
    inode = weights.stat().st_ino
    notes = []
    old = load_model(d, note=notes.append)
    memory = Model(SMALL, files.params_tree(init_tensors_varied(SMALL, 4), SMALL))
    assert same_bits(old, memory) and np.array_equal(logits(old).view(np.uint32), logits(memory).view(np.uint32))
    assert len(notes) == 1 and "format 1" in notes[0] and "rewrote it once as format 2" in notes[0] and "\n" not in notes[0]
    assert old.metadata["format_version"] == "2" and old.metadata["source"] == "test"
    with safe_open(str(weights), "numpy") as f:
        assert f.metadata()["format_version"] == "2" and f.get_tensor("h.0.mlp.c_fc.weight").shape == (32, 8)
    assert sorted(os.listdir(d)) == ["model.safetensors", "tokenizer.json"]  # no temp file left
    assert weights.stat().st_ino != inode  # replaced whole (atomic_write), not written over in place
    rewritten = weights.stat().st_mtime_ns
    new = load_model(d, note=notes.append)
    assert len(notes) == 1 and weights.stat().st_mtime_ns == rewritten  # the second load rewrites nothing
    assert same_bits(new, memory) and np.array_equal(logits(new).view(np.uint32), logits(memory).view(np.uint32))


def test_a_read_only_format_1_directory_still_loads(tmp_path, monkeypatch):
    d = saved_format_1(tmp_path / "m", seed=4)
    data = (d / "model.safetensors").read_bytes()

    def read_only(*args, **kwargs):  # what a read-only directory does to atomic_write (root may write anywhere)
        raise PermissionError(13, "Permission denied", str(d))

    monkeypatch.setattr(files.tempfile, "mkstemp", read_only)
    notes = []
    m = load_model(d, note=notes.append)
    assert same_bits(m, Model(SMALL, files.params_tree(init_tensors_varied(SMALL, 4), SMALL)))
    assert m.metadata["format_version"] == "1"  # what the file still is
    assert len(notes) == 1 and "could not be rewritten" in notes[0] and "Permission denied" in notes[0] \
        and "relayout" in notes[0] and "\n" not in notes[0]
    assert (d / "model.safetensors").read_bytes() == data and sorted(os.listdir(d)) == ["model.safetensors",
                                                                                         "tokenizer.json"]


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_format_1_directory_on_disk_still_loads(tmp_path):
    d = saved_format_1(tmp_path / "m", seed=4)
    d.chmod(0o555)
    try:
        notes = []
        assert load_model(d, note=notes.append).metadata["format_version"] == "1"
        assert len(notes) == 1 and "could not be rewritten" in notes[0]
    finally:
        d.chmod(0o755)


def test_an_interrupted_rewrite_leaves_the_format_1_file(tmp_path, monkeypatch):
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
    notes = []
    load_model(d, note=notes.append)
    assert len(notes) == 1 and "rewrote it once" in notes[0]


def test_a_format_1_model_in_the_cache_is_rewritten_under_its_entry_lock(tmp_path, capsys):
    entry = saved_format_1(tmp_path / "cache" / "local" / "m-0123", seed=4)
    m = load(str(entry), cache_dir=tmp_path / "cache")
    assert m.metadata["format_version"] == "2"
    assert (tmp_path / "cache" / ".locks" / "local--m-0123.lock").exists()  # cache.entry_lock's file was taken
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("npspec: ") and "rewrote it once as format 2" in err[0]
    load(str(entry), cache_dir=tmp_path / "cache")
    assert capsys.readouterr().err == ""


def test_save_refuses_tensors_that_do_not_fit(tmp_path):
    t = init_tensors(SMALL, 1)
    del t["ln_f.bias"]
    t["wpe.weight"] = t["wpe.weight"][:4]
    with pytest.raises(CheckpointError, match=r"cannot save: tensor wpe.weight has shape \[4, 8\], expected \[32, 8\]; "
                                              r"missing tensor ln_f.bias \[8\]"):
        save_converted(tmp_path / "m", t, SMALL, "test", "0" * 64, TOKENIZER)
    assert not (tmp_path / "m").exists()


# --- atomic writes -----------------------------------------------------------------------------------


def test_atomic_write_keeps_the_old_file_when_a_write_fails(tmp_path):
    path = tmp_path / "f"
    atomic_write(path, lambda tmp: Path(tmp).write_text("old"))
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # an ordinary file, not mkstemp's 0600

    def fails(tmp):
        Path(tmp).write_text("partial")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, fails)
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["f"]


FULL_DISK = ("import resource, signal, sys; from npspec.huggingface import convert\n"
             "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) like a full disk\n"
             "resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[3]), resource.RLIM_INFINITY))\n"
             "try:\n    convert(sys.argv[1], sys.argv[2], force=True)\nexcept Exception as e:\n    print(type(e).__name__, e)\n")


@pytest.fixture
def wide_source(tmp_path):
    """A Hugging Face checkpoint whose model.safetensors (0.4 MB) is smaller than its tokenizer.json (1.6 MB)."""
    config = GPT2Config(n_vocab=50257, n_ctx=4, n_embd=2, n_head=1, n_layer=1, eos_token_id=50256)
    src = write_hf_checkpoint(tmp_path / "hf", init_tensors(config, 0), config)
    (src / "tokenizer.json").write_text(GPT2_TOKENIZER)
    return src


def test_a_failed_write_leaves_the_old_files(tmp_path, wide_source):
    out = tmp_path / "out"
    r = run_python("-B", "-c", FULL_DISK, wide_source, out, 10 ** 8)
    assert r.returncode == 0 and r.stdout == "", r.stderr
    before = {name: (out / name).read_bytes() for name in os.listdir(out)}
    r = run_python("-B", "-c", FULL_DISK, wide_source, out, 10 ** 5)  # model.safetensors cannot be written
    assert r.returncode == 0 and "File too large" in r.stdout, (r.stdout, r.stderr)
    assert {name: (out / name).read_bytes() for name in os.listdir(out)} == before
    assert sorted(before) == ["model.safetensors", "tokenizer.json"]


def test_a_new_out_dir_appears_whole_or_not_at_all(tmp_path, wide_source):
    (tmp_path / "new").mkdir()
    # model.safetensors fits under the limit, tokenizer.json does not
    r = run_python("-B", "-c", FULL_DISK, wide_source, tmp_path / "new" / "out", 10 ** 6)
    assert r.returncode == 0 and r.stdout.startswith("OSError") and "File too large" in r.stdout, r.stderr
    assert os.listdir(tmp_path / "new") == []  # no out/, no staging left


# --- broken files, as the user sees them -------------------------------------------------------------


def _empty_dir(d):
    d.mkdir()


def _a_file(d):
    d.write_text("hello")


def _truncated(d):
    data = (saved(d) / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[:len(data) - 40])


def _not_safetensors(d):
    (saved(d) / "model.safetensors").write_bytes(b"<html>rate limited</html>")


def _header_lies(d):
    header, data = read_raw(saved(d) / "model.safetensors")
    header["wpe.weight"]["data_offsets"][1] += 4  # claims 4 more bytes than its shape holds
    write_raw(d / "model.safetensors", header, data)


def _missing_tensors(d):
    header, data = read_raw(saved(d) / "model.safetensors")
    del header["h.0.ln_2.bias"], header["ln_f.weight"]  # data no longer covered: safetensors refuses
    write_raw(d / "model.safetensors", header, data)


def _resaved(d, drop=(), replace=None, metadata=None):
    with safe_open(str(saved(d) / "model.safetensors"), "numpy") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys() if k not in drop}
    save_file({**tensors, **(replace or {})}, str(d / "model.safetensors"), metadata={**meta, **(metadata or {})})


def _missing_tensors_consistent(d):
    _resaved(d, drop=("h.0.ln_2.bias", "ln_f.weight"), replace={"h.0.mlp.c_fc.weight": np.zeros((31, 8), np.float32)})


def _untransposed_block_matrix(d):  # format 2 holds c_fc as [out, in] = [32, 8]; this one is [in, out]
    _resaved(d, replace={"h.0.mlp.c_fc.weight": np.zeros((8, 32), np.float32)})


def _unknown_layout(d):
    _resaved(d, metadata={"layout": "row-major"})


def _no_layout(d):
    header, data = read_raw(saved(d) / "model.safetensors")
    del header["__metadata__"]["layout"]
    write_raw(d / "model.safetensors", header, data)


def _unknown_format_version(d):
    _resaved(d, metadata={"format_version": "3"})


def _bad_metadata_heads(d):
    _resaved(d, metadata={"n_head": "3"})


def _bad_tokenizer(d):
    (saved(d) / "tokenizer.json").write_text('{"version": "1.0", "model": ')


@pytest.mark.parametrize("make, phrases", [
    (_empty_dir, ["has no model.safetensors", "python -m npspec.convert"]),
    (_a_file, ["is a file", "give the directory"]),
    (_truncated, ["not a readable safetensors file", "reconvert"]),
    (_not_safetensors, ["not a readable safetensors file", "reconvert"]),
    (_header_lies, ["not a readable safetensors file", "reconvert"]),
    (_missing_tensors, ["not a readable safetensors file", "reconvert"]),
    (_missing_tensors_consistent, ["missing tensor h.0.ln_2.bias [8]", "missing tensor ln_f.weight [8]",
                                   "tensor h.0.mlp.c_fc.weight has shape [31, 8], expected [32, 8]", "reconvert"]),
    (_untransposed_block_matrix, ["tensor h.0.mlp.c_fc.weight has shape [8, 32], expected [32, 8]",
                                  "stores block matrices transposed", "reconvert"]),
    (_unknown_layout, ["layout 'row-major'", "does not know", "reconvert"]),
    (_no_layout, ["layout None", "does not know", "reconvert"]),
    (_unknown_format_version, ["format_version '3'", "cannot read", "reconvert"]),
    (_bad_metadata_heads, ["n_embd (8) is not divisible by n_head (3)", "reconvert"]),
    (_bad_tokenizer, ["not a valid tokenizers file", "reconvert"]),
], ids=lambda x: x.__name__.strip("_") if callable(x) else "")
def test_broken_converted_model(tmp_path, make, phrases):
    make(tmp_path / "model")
    r = run_python(*GENERATE, "--target", tmp_path / "model", "--gamma", "0", "--max-new-tokens", "2",
                   env=offline_env(tmp_path))
    assert_one_clean_line(r, *phrases)
    assert r.stdout == ""  # nothing generated from a broken model


def test_load_errors(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_model(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        load_model(tmp_path / "empty")
    src = write_hf_checkpoint(tmp_path / "hf", init_tensors(SMALL, 3), SMALL, prefix="transformer.")
    (src / "tokenizer.json").write_text(TOKENIZER)  # a Hugging Face directory is not a converted one
    with pytest.raises(CheckpointError, match="python -m npspec.convert"):
        load_model(src)
    data = (saved(tmp_path / "out") / "model.safetensors").read_bytes()
    (tmp_path / "out" / "model.safetensors").write_bytes(data[: len(data) // 2])  # truncated
    with pytest.raises(CheckpointError, match="reconvert"):
        load_model(tmp_path / "out")
    (tmp_path / "out" / "model.safetensors").write_bytes(b"not a safetensors file at all")
    with pytest.raises(CheckpointError):
        load_model(tmp_path / "out")


def test_a_foreign_tokenizer_in_a_converted_dir_is_refused(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(SHIPPED / "target", model)
    (model / "tokenizer.json").write_text(GPT2_TOKENIZER)  # 50257 ids for n_vocab 2048
    with pytest.raises(CheckpointError, match="50257 ids but the model's n_vocab is 2048"):
        load_model(model)


# --- the header, fuzzed ------------------------------------------------------------------------------

DTYPES = ["F32", "F16", "BF16", "F64", "I64", "I32", "U8", "BOOL", "F8_E4M3", "F4", "C64", "X", ""]
BIG = st.integers(-3, 2**64 + 3) | st.integers(0, 4096)
SIZES = {"F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "F64": 8, "I64": 8}


@st.composite
def lies(draw, header):
    """A copy of `header` (and a header length) with one lie.

    Lies safetensors itself catches (offsets, sizes, garbage fields, the header length) and lies
    that stay self-consistent, so only npspec's own checks can catch them: a reshape keeping the
    element count, a dtype of the same byte size or half of it (shape widened to match), two
    names over the same bytes, and metadata (a huge n_layer must not make the loader list 1e12 names).
    """
    h = json.loads(json.dumps(header))
    kind = draw(st.sampled_from(["offsets", "shape", "dtype", "drop", "duplicate", "metadata", "length", "garbage",
                                 "reshape", "retype"]))
    length = None
    name = draw(st.sampled_from(sorted(k for k in h if k != "__metadata__")))
    entry = h[name]
    if kind == "offsets":
        entry["data_offsets"] = [draw(BIG), draw(BIG)]
    elif kind == "shape":
        entry["shape"] = draw(st.lists(BIG, max_size=4))
    elif kind == "dtype":
        entry["dtype"] = draw(st.sampled_from(DTYPES))
    elif kind == "drop":
        del h[name]
    elif kind == "duplicate":
        h[name + ".copy"] = dict(entry)
    elif kind == "metadata" and "__metadata__" in h:
        key = draw(st.sampled_from(sorted(h["__metadata__"])))
        values = ["-1", "0", "1", "2", "3", "7", "1e9", "999999999999", "null", "[1]", "1.5", "x", ""]
        h["__metadata__"][key] = draw(st.sampled_from(values) | st.text(max_size=8))
    elif kind == "length":
        length = draw(st.integers(0, 2**64 - 1) | st.integers(0, 4096))
    elif kind == "garbage":
        entry[draw(st.sampled_from(["dtype", "shape", "data_offsets"]))] = draw(
            st.none() | st.text(max_size=4) | st.lists(st.text(max_size=2), max_size=2) | st.floats())
    elif kind == "reshape":
        n = int(np.prod(entry["shape"]))
        entry["shape"] = draw(st.sampled_from([[n], [1, n], [n, 1], list(reversed(entry["shape"]))]))
    elif kind == "retype":
        new = draw(st.sampled_from(sorted(SIZES)))
        factor = SIZES.get(entry["dtype"], 4) / SIZES[new]
        last = entry["shape"][-1] * factor if entry["shape"] else factor
        if last == int(last) and last >= 1:
            entry["dtype"] = new
            entry["shape"] = (entry["shape"][:-1] or []) + [int(last)]
    return h, length


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return read_raw(saved(tmp_path_factory.mktemp("pristine") / "model") / "model.safetensors")


def write_a_lie(d, pristine, data):
    """d/model.safetensors: the (header, payload) `pristine` with one lie drawn from `data`; returns its header."""
    header, payload = pristine
    h, length = data.draw(lies(header))
    write_raw(Path(d) / "model.safetensors", h, payload, length)
    return h


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_lying_header_gives_checkpoint_error(pristine, data):
    with tempfile.TemporaryDirectory() as d:
        write_a_lie(d, pristine, data)
        (Path(d) / "tokenizer.json").write_text(TOKENIZER)
        try:
            m = load_model(d)
        except CheckpointError as e:
            assert "\n" not in str(e)
            return
    # a lie that changes nothing the loader uses (e.g. an extra name) may load; it must still be whole
    for name, a in [("wte", m.params["wte"]), ("c_fc", m.params["h"][0]["mlp"]["c_fc"]["w"])]:
        assert a.dtype == np.float32 and np.isfinite(a).all(), name
    assert m.config.n_embd == 8 and m.params["wpe"].shape == (m.config.n_ctx, 8)


@pytest.fixture(scope="module")
def pristine_bf16():
    header, data = {}, b""
    for name, a in init_tensors(SMALL, 1).items():
        bits = (a.view(np.uint32) >> 16).astype("<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [len(data), len(data) + len(bits)]}
        data += bits
    return header, data


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_lying_bf16_header_gives_checkpoint_error(pristine_bf16, data):
    # the converter reads bfloat16 from the raw bytes, at the offsets the header gives
    with tempfile.TemporaryDirectory() as d:
        h = write_a_lie(d, pristine_bf16, data)
        try:
            tensors = read_hf_tensors(Path(d) / "model.safetensors")
        except CheckpointError as e:
            assert "\n" not in str(e)
            return
    for name, a in tensors.items():
        assert list(a.shape) == h[name]["shape"]
        assert a.size == int(np.prod(h[name]["shape"], dtype=np.int64))


# --- memory ------------------------------------------------------------------------------------------


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


RSS = ("import json, sys; from npspec.files import load_model; from tokenizers import Tokenizer\n"
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
