"""Bad input: one line naming the problem and the fix, exit status 1, no traceback, nothing half-written.

The table of issue 3 ("Bad input"), run as a user would (python -m npspec.generate, offline,
with temp caches), plus a hypothesis fuzz of the safetensors header: a header that lies
about offsets, sizes, shapes or dtypes must give CheckpointError, never a crash or a hang.
Options already covered by tests/test_cli.py (max-new-tokens 0, gamma -1, temperature -1,
top-p 1.5, top-k -2, a missing path, a prompt longer than the context) and loader errors
covered by tests/test_convert.py are not repeated here.
"""

import json
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npspec.checkpoint import CheckpointError, load_model
from npspec.convert import convert, read_hf_tensors, write_hf_checkpoint
from npspec.init import init_tensors
from npspec.model import GPT2Config

from conftest import ROOT, SHIPPED

SMALL = GPT2Config(n_vocab=2048, n_ctx=32, n_embd=8, n_head=2, n_layer=1, eos_token_id=0)
TOKENIZER = (SHIPPED / "target" / "tokenizer.json").read_text()
GPT2_TOKENIZER = (ROOT / "weights" / "gpt2" / "tokenizer.json").read_text()


def hf_checkpoint(d, config=SMALL, tensors=None, tokenizer=TOKENIZER, cfg_patch=None):
    """A Hugging Face GPT-2 directory (save_pretrained layout) with `tensors` (default: a seeded init)."""
    write_hf_checkpoint(d, init_tensors(config, 1) if tensors is None else tensors, config, prefix="transformer.")
    if cfg_patch:
        cfg = json.loads((d / "config.json").read_text())
        cfg.update(cfg_patch)
        (d / "config.json").write_text(json.dumps(cfg))
    if tokenizer is not None:
        (d / "tokenizer.json").write_text(tokenizer)
    return d


def converted(d, config=SMALL):
    src = hf_checkpoint(d.parent / (d.name + "-hf"), config)
    return convert(src, d)


def read_file(path):
    """(header dict, data bytes) of a safetensors file, read by hand."""
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_file(path, header, data, length=None):
    """A safetensors file from a header dict and data bytes; `length` overrides the 8-byte header length."""
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(h) if length is None else length) + h + data)


def env_for(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "NPSPEC_"))}
    env.update(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path / "hf"), NPSPEC_CACHE=str(tmp_path / "cache"),
               OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    return env


def run(args, tmp_path, module="npspec.generate"):
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=ROOT,
                          env=env_for(tmp_path), timeout=300)


def assert_one_clean_line(r, *phrases, prog="npspec.generate"):
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
    # the error is one line; before it may only come the progress note of a conversion that then failed
    *notes, error = r.stderr.strip().splitlines()
    assert error.startswith(f"{prog}: error: "), r.stderr
    assert all(n.startswith("npspec: converting ") for n in notes), r.stderr
    for phrase in phrases:
        assert phrase in error, (phrase, error)


def cache_entries(tmp_path):
    """Everything in npspec's cache but its lock files: must stay empty when a conversion fails."""
    root = tmp_path / "cache"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if ".locks" not in p.parts
                  and p.is_file()) if root.exists() else []


# --- broken model files, through the CLI ------------------------------------------------------------


def _empty_dir(d):
    d.mkdir()
    return d


def _a_file(d):
    d.write_text("hello")
    return d


def _truncated(d):
    converted(d)
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[:len(data) - 40])
    return d


def _not_safetensors(d):
    converted(d)
    (d / "model.safetensors").write_bytes(b"<html>rate limited</html>")
    return d


def _header_lies(d):
    converted(d)
    header, data = read_file(d / "model.safetensors")
    header["wpe.weight"]["data_offsets"][1] += 4  # claims 4 more bytes than its shape holds
    write_file(d / "model.safetensors", header, data)
    return d


def _missing_tensors(d):
    converted(d)
    header, data = read_file(d / "model.safetensors")
    del header["h.0.ln_2.bias"], header["ln_f.weight"]  # data no longer covered: safetensors refuses
    write_file(d / "model.safetensors", header, data)
    return d


def _missing_tensors_consistent(d):
    from safetensors import safe_open
    from safetensors.numpy import save_file

    converted(d)
    with safe_open(str(d / "model.safetensors"), "numpy") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    del tensors["h.0.ln_2.bias"], tensors["ln_f.weight"]
    tensors["h.0.mlp.c_fc.weight"] = np.zeros((8, 31), np.float32)
    save_file(tensors, str(d / "model.safetensors"), metadata=meta)
    return d


def _bad_metadata_heads(d):
    from safetensors import safe_open
    from safetensors.numpy import save_file

    converted(d)
    with safe_open(str(d / "model.safetensors"), "numpy") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    save_file(tensors, str(d / "model.safetensors"), metadata={**meta, "n_head": "3"})
    return d


def _bad_tokenizer(d):
    converted(d)
    (d / "tokenizer.json").write_text('{"version": "1.0", "model": ')
    return d


@pytest.mark.parametrize("make, phrases", [
    (_empty_dir, ["has no model.safetensors", "python -m npspec.convert"]),
    (_a_file, ["is a file", "give the directory"]),
    (_truncated, ["not a readable safetensors file", "reconvert"]),
    (_not_safetensors, ["not a readable safetensors file", "reconvert"]),
    (_header_lies, ["not a readable safetensors file", "reconvert"]),
    (_missing_tensors, ["not a readable safetensors file", "reconvert"]),
    (_missing_tensors_consistent, ["missing tensor h.0.ln_2.bias [8]", "missing tensor ln_f.weight [8]",
                                   "tensor h.0.mlp.c_fc.weight has shape [8, 31], expected [8, 32]", "reconvert"]),
    (_bad_metadata_heads, ["n_embd (8) is not divisible by n_head (3)", "reconvert"]),
    (_bad_tokenizer, ["not a valid tokenizers file", "reconvert"]),
], ids=lambda x: x.__name__.strip("_") if callable(x) else "")
def test_broken_converted_model(tmp_path, make, phrases):
    d = make(tmp_path / "model")
    r = run(["--target", str(d), "--gamma", "0", "--max-new-tokens", "2"], tmp_path)
    assert_one_clean_line(r, *phrases)
    assert r.stdout == ""  # nothing generated from a broken model


# --- broken Hugging Face checkpoints: converted on first use, nothing half-written ------------------


def _hf_missing_and_misshaped(d):
    t = init_tensors(SMALL, 1)
    del t["ln_f.bias"], t["h.0.attn.c_proj.weight"]
    t["wpe.weight"] = t["wpe.weight"][:, :4].copy()
    return hf_checkpoint(d, tensors=t)


def _hf_heads(d):
    return hf_checkpoint(d, cfg_patch={"n_head": 3})


def _hf_not_json(d):
    hf_checkpoint(d)
    (d / "config.json").write_text("{oops")
    return d


def _hf_llama(d):
    return hf_checkpoint(d, cfg_patch={"model_type": "llama"})


def _hf_untied(d):
    t = init_tensors(SMALL, 1)
    hf_checkpoint(d, tensors=t)
    from safetensors.numpy import save_file

    t = {"transformer." + k: v for k, v in t.items()}
    t["lm_head.weight"] = np.ones((2048, 8), np.float32)
    save_file(t, str(d / "model.safetensors"))
    return d


def _hf_pickle_only(d):
    hf_checkpoint(d)
    (d / "model.safetensors").unlink()
    (d / "pytorch_model.bin").write_bytes(b"\x80\x04")
    return d


def _hf_non_finite(d):
    t = init_tensors(SMALL, 1)
    t["h.0.mlp.c_fc.bias"][3] = np.inf
    return hf_checkpoint(d, tensors=t)


@pytest.mark.parametrize("make, phrases", [
    (_hf_missing_and_misshaped, ["missing tensor ln_f.bias [8]", "missing tensor h.0.attn.c_proj.weight [8, 8]",
                                 "tensor wpe.weight has shape [32, 4], expected [32, 8]"]),
    (_hf_heads, ["n_embd (8) is not divisible by n_head (3)", "fix the checkpoint's config.json"]),
    (_hf_not_json, ["config.json is not valid JSON"]),
    (_hf_llama, ["unsupported model_type 'llama'"]),
    (_hf_untied, ["lm_head.weight differs from wte.weight"]),
    (_hf_pickle_only, ["no model.safetensors", "never loads", "safe_serialization=True"]),
    (_hf_non_finite, ["h.0.mlp.c_fc.bias holds non-finite values"]),
], ids=lambda x: x.__name__.strip("_") if callable(x) else "")
def test_broken_hf_checkpoint(tmp_path, make, phrases):
    d = make(tmp_path / "ckpt")
    before = sorted(os.listdir(d))
    r = run(["--target", str(d), "--gamma", "0", "--max-new-tokens", "2"], tmp_path)
    assert_one_clean_line(r, *phrases)
    assert cache_entries(tmp_path) == []  # the failed conversion left nothing in the cache
    assert sorted(os.listdir(d)) == before  # and did not touch the source
    out = tmp_path / "out"
    r = run([str(d), str(out)], tmp_path, module="npspec.convert")  # the converter says the same
    assert_one_clean_line(r, *phrases, prog="npspec.convert")
    assert not out.exists() or os.listdir(out) == []


# --- options, names and pairs ------------------------------------------------------------------------


@pytest.mark.parametrize("args, phrases", [
    (["--max-new-tokens", "-5"], ["--max-new-tokens must be >= 1"]),
    (["--top-p", "0"], ["top_p must be in (0, 1]"]),
    (["--top-p", "nan"], ["top_p must be in (0, 1]"]),
    (["--temperature", "nan"], ["temperature must be a finite number >= 0"]),
    (["--target", "bogus"], ["unknown model 'bogus'", "random:<shape>", "gpt2-large", "org/name"]),
    (["--target", "random:gpt3"], ["unknown random shape 'gpt3'", "random:gpt2-xl", "random:tiny"]),
    (["--draft", "./no/such/dir"], ["'./no/such/dir' is not an existing directory"]),
])
def test_bad_options_and_names(tmp_path, args, phrases):
    r = run(args + (["--max-new-tokens", "2"] if "--max-new-tokens" not in args else []), tmp_path)
    assert_one_clean_line(r, *phrases)
    assert cache_entries(tmp_path) == []


def test_pair_with_different_tokenizers(tmp_path):
    r = run(["--target", "random:tiny-draft", "--draft", str(SHIPPED / "draft"), "--max-new-tokens", "2"], tmp_path)
    assert_one_clean_line(r, "use different tokenizers", "pick a draft trained with the target's tokenizer")


def test_pair_with_different_vocabularies(tmp_path):
    wide = GPT2Config(n_vocab=50304, n_ctx=32, n_embd=8, n_head=2, n_layer=1, eos_token_id=50256)  # padded vocab
    d = hf_checkpoint(tmp_path / "wide", wide, tokenizer=GPT2_TOKENIZER)
    r = run(["--target", "random:tiny-draft", "--draft", str(d), "--max-new-tokens", "2"], tmp_path)
    assert_one_clean_line(r, "draft vocabulary (50304) differs from the target's (50257)")


def test_bad_input_table_is_in_readme():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Troubleshooting"):]
    for phrase in ("has no model.safetensors", "not a readable safetensors file", "missing tensor",
                   "is not divisible by n_head", "unknown model", "not in the local Hugging Face cache",
                   "draft vocabulary", "different tokenizers", "the prompt has", "--max-new-tokens must be >= 1",
                   "cannot write npspec's cache"):
        assert phrase in section, phrase


# --- the safetensors header, fuzzed ------------------------------------------------------------------

DTYPES = ["F32", "F16", "BF16", "F64", "I64", "I32", "U8", "BOOL", "F8_E4M3", "F4", "C64", "X", ""]
BIG = st.integers(-3, 2**64 + 3) | st.integers(0, 4096)


@st.composite
def lies(draw, header):
    """A copy of `header` (and a header length) with one lie.

    Lies safetensors itself catches (offsets, sizes, garbage fields, the header length) and lies
    that stay self-consistent, so only npspec's own checks can catch them: a reshape keeping the
    element count, a dtype of the same byte size or half of it (shape widened to match), two
    names over the same bytes, and metadata (a huge n_layer must not make the loader list 1e12 names).
    """
    h = json.loads(json.dumps(header))
    names = sorted(k for k in h if k != "__metadata__")
    kind = draw(st.sampled_from(["offsets", "shape", "dtype", "drop", "duplicate", "metadata", "length", "garbage",
                                 "reshape", "retype"]))
    length = None
    name = draw(st.sampled_from(names))
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
        size = {"F32": 4, "BF16": 2, "F16": 2, "F64": 8}.get(entry["dtype"], 4)
        new = draw(st.sampled_from(["F32", "I32", "U32", "F16", "BF16", "I16", "F64", "I64"]))
        factor = size / {"F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "F64": 8, "I64": 8}[new]
        last = entry["shape"][-1] * factor if entry["shape"] else factor
        if last == int(last) and last >= 1:
            entry["dtype"] = new
            entry["shape"] = (entry["shape"][:-1] or []) + [int(last)]
    return h, length


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    d = converted(tmp_path_factory.mktemp("pristine") / "model")
    return read_file(d / "model.safetensors")


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_lying_header_gives_checkpoint_error(pristine, data):
    header, payload = pristine
    h, length = data.draw(lies(header))
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        write_file(d / "model.safetensors", h, payload, length)
        (d / "tokenizer.json").write_text(TOKENIZER)
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
def pristine_bf16(tmp_path_factory):
    d = tmp_path_factory.mktemp("bf16")
    t = init_tensors(SMALL, 1)
    header = {name: {"dtype": "BF16", "shape": list(a.shape)} for name, a in t.items()}
    data, offset = b"", 0
    for name, a in t.items():
        bits = (a.view(np.uint32) >> 16).astype("<u2").tobytes()
        header[name]["data_offsets"] = [offset, offset + len(bits)]
        data += bits
        offset += len(bits)
    return header, data


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_lying_bf16_header_gives_checkpoint_error(pristine_bf16, data):
    # the converter reads bfloat16 from the raw bytes, at the offsets the header gives
    header, payload = pristine_bf16
    h, length = data.draw(lies(header))
    with tempfile.TemporaryDirectory() as d:
        write_file(Path(d) / "model.safetensors", h, payload, length)
        try:
            tensors = read_hf_tensors(Path(d) / "model.safetensors")
        except CheckpointError as e:
            assert "\n" not in str(e)
            return
    for name, a in tensors.items():
        entry = h[name]
        assert list(a.shape) == entry["shape"]
        assert a.size == int(np.prod(entry["shape"], dtype=np.int64))


def test_a_foreign_tokenizer_in_a_converted_dir_is_refused(tmp_path):
    import shutil

    from npspec.checkpoint import CheckpointError, load_model

    model = tmp_path / "model"
    shutil.copytree(ROOT / "weights" / "shakespeare" / "target", model)
    shutil.copy(ROOT / "weights" / "gpt2" / "tokenizer.json", model / "tokenizer.json")  # 50257 ids for n_vocab 2048
    with pytest.raises(CheckpointError, match="50257 ids but the model's n_vocab is 2048"):
        load_model(model)
