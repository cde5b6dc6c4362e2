"""Converting Hugging Face checkpoints, and loading npspec's layout (issue 2, section 3)."""

import json
import os
import struct

import numpy as np
import pytest
from safetensors.numpy import save_file

from npspec.checkpoint import CheckpointError, load_model, tensor_shapes
from npspec.convert import convert, read_hf_tensors
from npspec.init import init_tensors
from npspec.model import GPT2Config

from conftest import ROOT, SHIPPED

CONFIG = GPT2Config(n_vocab=2048, n_ctx=16, n_embd=8, n_head=2, n_layer=2, eos_token_id=0)  # shakespeare's tokenizer
TOKENIZER = (SHIPPED / "target" / "tokenizer.json").read_text()


def hf_dir(tmp_path, prefix="transformer.", extra=(), drop=(), dtype=np.float32):
    """A checkpoint laid out as save_pretrained writes it, built by hand (no torch needed)."""
    d = tmp_path / "hf"
    d.mkdir(exist_ok=True)
    cfg = {"model_type": "gpt2", "vocab_size": CONFIG.n_vocab, "n_positions": CONFIG.n_ctx, "n_embd": CONFIG.n_embd,
           "n_head": CONFIG.n_head, "n_layer": CONFIG.n_layer, "layer_norm_epsilon": 1e-5, "eos_token_id": 0}
    (d / "config.json").write_text(json.dumps(cfg))
    tensors = {prefix + k: v.astype(dtype) for k, v in init_tensors(CONFIG, 3).items() if k not in drop}
    for i in range(CONFIG.n_layer):
        tensors[f"{prefix}h.{i}.attn.bias"] = np.tril(np.ones((1, 1, 16, 16), np.float32))
    tensors.update(dict(extra))
    save_file(tensors, str(d / "model.safetensors"))
    (d / "tokenizer.json").write_text(TOKENIZER)
    return d


@pytest.mark.parametrize("prefix", ["transformer.", ""])
def test_convert_round_trip(tmp_path, prefix):
    src = hf_dir(tmp_path, prefix)
    convert(src, tmp_path / "out")
    m = load_model(tmp_path / "out")
    assert m.config == CONFIG
    ref = init_tensors(CONFIG, 3)
    assert np.array_equal(m.params["h"][1]["mlp"]["c_fc"]["w"], ref["h.1.mlp.c_fc.weight"])
    assert np.array_equal(m.params["wte"], ref["wte.weight"])
    meta = m.metadata
    assert meta["format_version"] == "1" and len(meta["source_sha256"]) == 64
    for key in ("n_vocab", "n_ctx", "n_embd", "n_head", "n_layer", "layer_norm_epsilon", "eos_token_id", "source"):
        assert key in meta
    assert sorted(os.listdir(tmp_path / "out")) == ["model.safetensors", "tokenizer.json"]  # no temp files left


def test_float16_source_is_cast(tmp_path):
    convert(hf_dir(tmp_path, dtype=np.float16), tmp_path / "out")
    w = load_model(tmp_path / "out").params["wpe"]
    assert w.dtype == np.float32
    assert np.array_equal(w, init_tensors(CONFIG, 3)["wpe.weight"].astype(np.float16).astype(np.float32))


def to_bf16_bits(a):
    """float32 -> bfloat16 bit patterns (uint16), truncating the low mantissa half."""
    return (np.ascontiguousarray(a, np.float32).view(np.uint32) >> 16).astype("<u2")


def save_bf16(tensors, path):
    """A safetensors file of BF16 tensors, written byte by byte from the format's spec (no torch, no safetensors)."""
    header, data = {}, b""
    for name, a in tensors.items():
        raw = to_bf16_bits(a).tobytes()
        header[name] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)


@pytest.mark.parametrize("prefix", ["transformer.", ""])
def test_bfloat16_source_is_widened_exactly(tmp_path, prefix):
    src = hf_dir(tmp_path, prefix)
    ref = init_tensors(CONFIG, 3)
    ref["wte.weight"][0, :4] = [1.5, -2.25, 0.15625, 2.0 ** 100]  # exactly representable in bfloat16
    raw = {prefix + k: v for k, v in ref.items()}
    raw["lm_head.weight"] = ref["wte.weight"]  # an explicit tied head, in bf16 too
    raw[prefix + "h.0.attn.masked_bias"] = np.array(-1e4, np.float32)
    save_bf16(raw, src / "model.safetensors")
    convert(src, tmp_path / "out")
    m = load_model(tmp_path / "out")
    assert m.params["wte"].dtype == np.float32
    assert m.params["wte"][0, :4].tolist() == [1.5, -2.25, 0.15625, 2.0 ** 100]
    # every value is the bf16 bit pattern widened: the high 16 bits kept, the low 16 zero
    for got, name in ((m.params["wte"], "wte.weight"), (m.params["h"][1]["attn"]["c_attn"]["w"],
                                                        "h.1.attn.c_attn.weight")):
        expected = (to_bf16_bits(ref[name]).astype(np.uint32) << 16).view(np.float32)
        assert np.array_equal(got, expected)
        assert np.abs(got - ref[name]).max() <= np.abs(ref[name]).max() * 2.0 ** -7  # bf16 has 8 significant bits


def test_bfloat16_bit_patterns():
    # hand-computed: 0x3FC0 = +1.5, 0xC010 = -2.25, 0x7F80 = +inf, 0x0001 = the smallest subnormal 2^-133
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "x.safetensors"
        h = json.dumps({"x": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]}}).encode()
        h += b" " * (-len(h) % 8)
        path.write_bytes(struct.pack("<Q", len(h)) + h + np.array([0x3FC0, 0xC010, 0x7F80, 0x0001], "<u2").tobytes())
        x = read_hf_tensors(path)["x"]
    assert x.dtype == np.float32 and x.shape == (2, 2)
    assert x.ravel().tolist() == [1.5, -2.25, float("inf"), 2.0 ** -133]


@pytest.mark.oracle
def test_bfloat16_matches_torch(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file as save_torch

    t = torch.randn(64, 33, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    save_torch({"a": t}, str(tmp_path / "t.safetensors"))
    assert np.array_equal(read_hf_tensors(tmp_path / "t.safetensors")["a"], t.float().numpy())


def test_float64_source_and_exotic_dtypes(tmp_path):
    convert(hf_dir(tmp_path, dtype=np.float64), tmp_path / "out")
    assert np.array_equal(load_model(tmp_path / "out").params["wpe"], init_tensors(CONFIG, 3)["wpe.weight"])
    src = hf_dir(tmp_path)
    h = json.dumps({"transformer.wte.weight": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}}).encode()
    (src / "model.safetensors").write_bytes(struct.pack("<Q", len(h)) + h + b"\x00\x00")
    with pytest.raises(CheckpointError, match=r"dtype npspec cannot read: transformer.wte.weight \(F8_E4M3\)"):
        convert(src, tmp_path / "out2")
    assert not (tmp_path / "out2").exists()


@pytest.mark.parametrize("patch, msg", [
    ({"activation_function": "relu"}, "unsupported activation_function 'relu'"),
    ({"n_inner": 16}, "unsupported n_inner 16"),
    ({"scale_attn_by_inverse_layer_idx": True}, "non-standard attention scaling"),
    ({"vocab_size": "2048"}, "vocab_size must be an integer"),
    ({"n_positions": None, "n_ctx": None}, "n_positions must be an integer"),
])
def test_unsupported_or_bad_config_refused(tmp_path, patch, msg):
    src = hf_dir(tmp_path)
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, **patch}))
    with pytest.raises(CheckpointError, match=msg):
        convert(src, tmp_path / "out")


def test_missing_config_fields_listed(tmp_path):
    src = hf_dir(tmp_path)
    cfg = json.loads((src / "config.json").read_text())
    del cfg["n_head"], cfg["n_positions"]
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="missing GPT-2 field.s. n_head, n_positions"):
        convert(src, tmp_path / "out")


def test_tokenizer_larger_than_vocabulary_warned(tmp_path):
    src = hf_dir(tmp_path)
    (src / "tokenizer.json").write_text((SHIPPED.parent / "gpt2" / "tokenizer.json").read_text())
    with pytest.warns(UserWarning, match="has 50257 tokens but the model's vocabulary holds 2048"):
        convert(src, tmp_path / "out")


def test_every_problem_reported_at_once(tmp_path):
    bad = {"transformer.h.0.mlp.c_fc.weight": np.zeros((3, 3), np.float32)}
    src = hf_dir(tmp_path, extra=bad, drop=("ln_f.bias", "h.1.attn.c_proj.weight"))
    with pytest.raises(CheckpointError) as e:
        convert(src, tmp_path / "out")
    msg = str(e.value)
    assert "missing tensor ln_f.bias" in msg and "missing tensor h.1.attn.c_proj.weight" in msg
    assert "h.0.mlp.c_fc.weight has shape [3, 3], expected [8, 32]" in msg
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_untied_head_refused_and_extras_warned(tmp_path):
    src = hf_dir(tmp_path, extra={"lm_head.weight": np.ones((2048, 8), np.float32)})
    with pytest.raises(CheckpointError, match="lm_head.weight differs"):
        convert(src, tmp_path / "out")
    src = hf_dir(tmp_path, extra={"something.else": np.ones(2, np.float32)})
    with pytest.warns(UserWarning, match="something.else"):
        convert(src, tmp_path / "out")


def test_non_finite_refused(tmp_path):
    w = init_tensors(CONFIG, 3)["wte.weight"].copy()
    w[0, 0] = np.nan
    with pytest.raises(CheckpointError, match="wte.weight holds non-finite"):
        convert(hf_dir(tmp_path, extra={"transformer.wte.weight": w}), tmp_path / "out")


def test_failed_write_leaves_old_files(tmp_path, monkeypatch):
    convert(hf_dir(tmp_path), tmp_path / "out")
    before = (tmp_path / "out" / "model.safetensors").read_bytes()
    import safetensors.numpy

    def boom(tensors, path, metadata=None):
        with open(path, "wb") as f:
            f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.numpy, "save_file", boom)
    with pytest.raises(OSError, match="disk full"):
        convert(hf_dir(tmp_path), tmp_path / "out")
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == before
    assert sorted(os.listdir(tmp_path / "out")) == ["model.safetensors", "tokenizer.json"]


def test_new_out_dir_appears_whole_or_not_at_all(tmp_path, monkeypatch):
    import npspec.checkpoint

    real, calls = npspec.checkpoint.atomic_write, []

    def second_write_fails(path, write):
        calls.append(path)
        if len(calls) == 2:  # model.safetensors written, tokenizer.json fails
            raise OSError("disk full")
        return real(path, write)

    monkeypatch.setattr(npspec.checkpoint, "atomic_write", second_write_fails)
    with pytest.raises(OSError, match="disk full"):
        convert(hf_dir(tmp_path), tmp_path / "new" / "out")
    assert len(calls) == 2 and os.listdir(tmp_path / "new") == []  # no out/, no staging left


def test_convert_cli_unwritable_out_dir(tmp_path):
    import subprocess
    import sys

    (tmp_path / "file").write_text("")
    r = subprocess.run([sys.executable, "-m", "npspec.convert", str(hf_dir(tmp_path)), str(tmp_path / "file" / "out")],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("npspec.convert: error: cannot write") and "writable OUT_DIR" in r.stderr


def test_load_errors(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_model(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        load_model(tmp_path / "empty")
    src = hf_dir(tmp_path)  # a Hugging Face directory is not a converted one
    with pytest.raises(CheckpointError, match="python -m npspec.convert"):
        load_model(src)
    convert(src, tmp_path / "out")
    data = (tmp_path / "out" / "model.safetensors").read_bytes()
    (tmp_path / "out" / "model.safetensors").write_bytes(data[: len(data) // 2])  # truncated
    with pytest.raises(CheckpointError, match="reconvert"):
        load_model(tmp_path / "out")
    (tmp_path / "out" / "model.safetensors").write_bytes(b"not a safetensors file at all")
    with pytest.raises(CheckpointError):
        load_model(tmp_path / "out")


def test_tensor_names_match_transformers_layout():
    names = tensor_shapes(CONFIG)
    assert "h.1.attn.c_attn.weight" in names and names["h.1.attn.c_attn.weight"] == (8, 24)
    assert len(names) == 4 + 12 * CONFIG.n_layer
