"""Broken, lying or foreign converted models (npspec.sources.files): each gives one CheckpointError line naming the problem
and the fix, never a traceback or a hang, whatever the header claims.
"""

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.numpy import save_file

from npspec.sources.huggingface import read_hf_tensors, write_hf_checkpoint
from npspec.sources.errors import CheckpointError
from npspec.sources.files import load_model
from npspec.sources.init import init_tensors

from conftest import SHIPPED, run_python
from test_cli import GENERATE, assert_one_clean_line, offline_env
from model_files import SMALL, TOKENIZER, GPT2_TOKENIZER, saved, read_raw, write_raw


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
    (_empty_dir, ["has no model.safetensors", "npspec convert"]),
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
    with pytest.raises(CheckpointError, match="npspec convert"):
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


