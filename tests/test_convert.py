"""Converting Hugging Face checkpoints, and loading npspec's layout (issue 2, section 3)."""

import json
import os
import warnings

import numpy as np
import pytest
from safetensors.numpy import save_file

from npspec.checkpoint import CheckpointError, load_model, tensor_shapes
from npspec.convert import convert
from npspec.init import init_tensors
from npspec.model import GPT2Config

from conftest import SHIPPED

CONFIG = GPT2Config(n_vocab=300, n_ctx=16, n_embd=8, n_head=2, n_layer=2, eos_token_id=299)
TOKENIZER = (SHIPPED / "target" / "tokenizer.json").read_text()


def hf_dir(tmp_path, prefix="transformer.", extra=(), drop=(), dtype=np.float32):
    """A checkpoint laid out as save_pretrained writes it, built by hand (no torch needed)."""
    d = tmp_path / "hf"
    d.mkdir(exist_ok=True)
    cfg = {"model_type": "gpt2", "vocab_size": CONFIG.n_vocab, "n_positions": CONFIG.n_ctx, "n_embd": CONFIG.n_embd,
           "n_head": CONFIG.n_head, "n_layer": CONFIG.n_layer, "layer_norm_epsilon": 1e-5, "eos_token_id": 299}
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
    src = hf_dir(tmp_path, extra={"lm_head.weight": np.ones((300, 8), np.float32)})
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
