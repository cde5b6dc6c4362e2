"""Converting Hugging Face GPT-2 checkpoints into npspec's format, and every check made on the way.

A checkpoint is built by hand as save_pretrained writes it (no torch needed). Float16, float64
and bfloat16 sources are cast to float32 (bfloat16 bit-exactly); every problem is reported at
once, through the API and through `npspec convert` and `python -m npspec.generate`,
and a refused conversion writes nothing.
"""

import json
import os
import struct

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from npspec.sources.huggingface import convert, read_hf_tensors
from npspec.sources.errors import CheckpointError
from npspec.sources.files import load_model
from npspec.model.tensors import tensor_shapes
from npspec.model.gpt2 import GPT2Config
from npspec.sources.init import init_tensors

from conftest import ROOT, SHIPPED, run_python
from test_cli import CONVERT, GENERATE, assert_one_clean_line, cache_entries, offline_env

CONFIG = GPT2Config(n_vocab=2048, n_ctx=16, n_embd=8, n_head=2, n_layer=2, eos_token_id=0)  # shakespeare's tokenizer
SMALL = GPT2Config(n_vocab=2048, n_ctx=32, n_embd=8, n_head=2, n_layer=1, eos_token_id=0)
TOKENIZER = (SHIPPED / "target" / "tokenizer.json").read_text()
GPT2_TOKENIZER = (ROOT / "weights" / "gpt2" / "tokenizer.json").read_text()


def hf_dir(d, config=CONFIG, prefix="transformer.", extra=(), drop=(), dtype=np.float32, tensors=None,
           cfg_patch=None, tokenizer=TOKENIZER):
    """A checkpoint laid out as save_pretrained writes it, attention-mask buffers included: config.json,
    model.safetensors (`tensors`, default a seeded init, without `drop`, plus `extra`) and tokenizer.json."""
    d.mkdir(parents=True, exist_ok=True)
    cfg = {"model_type": "gpt2", "vocab_size": config.n_vocab, "n_positions": config.n_ctx, "n_embd": config.n_embd,
           "n_head": config.n_head, "n_layer": config.n_layer, "layer_norm_epsilon": 1e-5, "eos_token_id": 0}
    (d / "config.json").write_text(json.dumps({**cfg, **(cfg_patch or {})}))
    tensors = init_tensors(config, 3) if tensors is None else tensors
    tensors = {prefix + k: v.astype(dtype) for k, v in tensors.items() if k not in drop}
    for i in range(config.n_layer):
        tensors[f"{prefix}h.{i}.attn.bias"] = np.tril(np.ones((1, 1, 16, 16), np.float32))
    tensors.update(dict(extra))
    save_file(tensors, str(d / "model.safetensors"))
    if tokenizer is not None:
        (d / "tokenizer.json").write_text(tokenizer)
    return d


def test_tensor_names_match_transformers_layout():
    names = tensor_shapes(CONFIG)
    assert "h.1.attn.c_attn.weight" in names and names["h.1.attn.c_attn.weight"] == (8, 24)
    assert len(names) == 4 + 12 * CONFIG.n_layer


@pytest.mark.parametrize("prefix", ["transformer.", ""])
def test_convert_round_trip(tmp_path, prefix):
    convert(hf_dir(tmp_path / "hf", prefix=prefix), tmp_path / "out")
    m = load_model(tmp_path / "out")
    assert m.config == CONFIG
    ref = init_tensors(CONFIG, 3)
    assert np.array_equal(m.params["h"][1]["mlp"]["c_fc"]["w"], ref["h.1.mlp.c_fc.weight"])
    assert np.array_equal(m.params["wte"], ref["wte.weight"])
    meta = m.metadata
    assert (meta["format_version"], meta["layout"]) == ("2", "column-major-blocks") and len(meta["source_sha256"]) == 64
    for key in ("n_vocab", "n_ctx", "n_embd", "n_head", "n_layer", "layer_norm_epsilon", "eos_token_id", "source"):
        assert key in meta
    assert sorted(os.listdir(tmp_path / "out")) == ["model.safetensors", "tokenizer.json"]  # no temp files left


def test_float16_source_is_cast(tmp_path):
    convert(hf_dir(tmp_path / "hf", dtype=np.float16), tmp_path / "out")
    w = load_model(tmp_path / "out").params["wpe"]
    assert w.dtype == np.float32
    assert np.array_equal(w, init_tensors(CONFIG, 3)["wpe.weight"].astype(np.float16).astype(np.float32))


def to_bf16_bits(a):
    """float32 -> bfloat16 bit patterns (uint16), truncating the low mantissa half."""
    return (np.ascontiguousarray(a, np.float32).view(np.uint32) >> 16).astype("<u2")


def write_safetensors(path, header, data):
    """A safetensors file from a header dict and data bytes, written byte by byte from the format's spec."""
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)


def save_bf16(tensors, path):
    """A safetensors file of BF16 tensors (no torch, no safetensors)."""
    header, data = {}, b""
    for name, a in tensors.items():
        raw = to_bf16_bits(a).tobytes()
        header[name] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    write_safetensors(path, header, data)


@pytest.mark.parametrize("prefix", ["transformer.", ""])
def test_bfloat16_source_is_widened_exactly(tmp_path, prefix):
    src = hf_dir(tmp_path / "hf", prefix=prefix)
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


def test_bfloat16_bit_patterns(tmp_path):
    # hand-computed: 0x3FC0 = +1.5, 0xC010 = -2.25, 0x7F80 = +inf, 0x0001 = the smallest subnormal 2^-133
    path = tmp_path / "x.safetensors"
    write_safetensors(path, {"x": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]}},
                      np.array([0x3FC0, 0xC010, 0x7F80, 0x0001], "<u2").tobytes())
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
    convert(hf_dir(tmp_path / "hf", dtype=np.float64), tmp_path / "out")
    assert np.array_equal(load_model(tmp_path / "out").params["wpe"], init_tensors(CONFIG, 3)["wpe.weight"])
    src = hf_dir(tmp_path / "hf")
    write_safetensors(src / "model.safetensors",
                      {"transformer.wte.weight": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}}, b"\0\0")
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
    with pytest.raises(CheckpointError, match=msg):
        convert(hf_dir(tmp_path / "hf", cfg_patch=patch), tmp_path / "out")


def test_missing_config_fields_listed(tmp_path):
    src = hf_dir(tmp_path / "hf")
    cfg = json.loads((src / "config.json").read_text())
    del cfg["n_head"], cfg["n_positions"]
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="missing GPT-2 field.s. n_head, n_positions"):
        convert(src, tmp_path / "out")


def test_tokenizer_larger_than_vocabulary_refused(tmp_path):
    # GPT-2's 50257 ids for a model of 2048: not this model's tokenizer
    src = hf_dir(tmp_path / "hf", tokenizer=GPT2_TOKENIZER)
    message = (f"{src / 'tokenizer.json'} has 50257 ids but the model's n_vocab is 2048: it is not this model's "
               f"tokenizer; put the model's own tokenizer.json in {src}")
    with pytest.raises(CheckpointError) as e:
        convert(src, tmp_path / "out")
    assert str(e.value) == message
    assert not (tmp_path / "out").exists()
    r = run_python(*CONVERT, src, tmp_path / "out")
    assert_one_clean_line(r, message, prog="npspec.convert")
    assert not (tmp_path / "out").exists()
    convert(hf_dir(tmp_path / "hf"), tmp_path / "out")  # into an existing directory: left as it was
    before = {name: (tmp_path / "out" / name).read_bytes() for name in os.listdir(tmp_path / "out")}
    (src / "tokenizer.json").write_text(GPT2_TOKENIZER)
    with pytest.raises(CheckpointError, match="has 50257 ids but the model's n_vocab is 2048"):
        convert(src, tmp_path / "out")
    assert {name: (tmp_path / "out" / name).read_bytes() for name in os.listdir(tmp_path / "out")} == before


def test_every_problem_reported_at_once(tmp_path):
    bad = {"transformer.h.0.mlp.c_fc.weight": np.zeros((3, 3), np.float32)}
    src = hf_dir(tmp_path / "hf", extra=bad, drop=("ln_f.bias", "h.1.attn.c_proj.weight"))
    with pytest.raises(CheckpointError) as e:
        convert(src, tmp_path / "out")
    msg = str(e.value)
    assert "missing tensor ln_f.bias" in msg and "missing tensor h.1.attn.c_proj.weight" in msg
    assert "h.0.mlp.c_fc.weight has shape [3, 3], expected [8, 32]" in msg
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_untied_head_refused_and_extras_warned(tmp_path):
    src = hf_dir(tmp_path / "hf", extra={"lm_head.weight": np.ones((2048, 8), np.float32)})
    with pytest.raises(CheckpointError, match="lm_head.weight differs"):
        convert(src, tmp_path / "out")
    src = hf_dir(tmp_path / "hf", extra={"something.else": np.ones(2, np.float32)})
    with pytest.warns(UserWarning, match="something.else"):
        convert(src, tmp_path / "out")


def test_non_finite_refused(tmp_path):
    w = init_tensors(CONFIG, 3)["wte.weight"].copy()
    w[0, 0] = np.nan
    with pytest.raises(CheckpointError, match="wte.weight holds non-finite"):
        convert(hf_dir(tmp_path / "hf", extra={"transformer.wte.weight": w}), tmp_path / "out")


# --- broken checkpoints, as the user meets them: converted on first use, nothing half-written ---------


def _hf_missing_and_misshaped(d):
    t = init_tensors(SMALL, 1)
    del t["ln_f.bias"], t["h.0.attn.c_proj.weight"]
    t["wpe.weight"] = t["wpe.weight"][:, :4].copy()
    hf_dir(d, SMALL, tensors=t)


def _hf_heads(d):
    hf_dir(d, SMALL, cfg_patch={"n_head": 3})


def _hf_not_json(d):
    (hf_dir(d, SMALL) / "config.json").write_text("{oops")


def _hf_llama(d):
    hf_dir(d, SMALL, cfg_patch={"model_type": "llama"})


def _hf_untied(d):
    hf_dir(d, SMALL, extra={"lm_head.weight": np.ones((2048, 8), np.float32)})


def _hf_pickle_only(d):
    (hf_dir(d, SMALL) / "model.safetensors").unlink()
    (d / "pytorch_model.bin").write_bytes(b"\x80\x04")


def _hf_non_finite(d):
    t = init_tensors(SMALL, 1)
    t["h.0.mlp.c_fc.bias"][3] = np.inf
    hf_dir(d, SMALL, tensors=t)


def _hf_foreign_tokenizer(d):
    hf_dir(d, SMALL, tokenizer=GPT2_TOKENIZER)


@pytest.mark.parametrize("make, phrases", [
    (_hf_missing_and_misshaped, ["missing tensor ln_f.bias [8]", "missing tensor h.0.attn.c_proj.weight [8, 8]",
                                 "tensor wpe.weight has shape [32, 4], expected [32, 8]"]),
    (_hf_heads, ["n_embd (8) is not divisible by n_head (3)", "fix the checkpoint's config.json"]),
    (_hf_not_json, ["config.json is not valid JSON"]),
    (_hf_llama, ["unsupported model_type 'llama'"]),
    (_hf_untied, ["lm_head.weight differs from wte.weight"]),
    (_hf_pickle_only, ["no model.safetensors", "never loads", "safe_serialization=True"]),
    (_hf_non_finite, ["h.0.mlp.c_fc.bias holds non-finite values"]),
    (_hf_foreign_tokenizer, ["has 50257 ids but the model's n_vocab is 2048", "put the model's own tokenizer.json"]),
], ids=lambda x: x.__name__.strip("_") if callable(x) else "")
def test_broken_hf_checkpoint(tmp_path, make, phrases):
    d = tmp_path / "ckpt"
    make(d)
    before = sorted(os.listdir(d))
    r = run_python(*GENERATE, "--target", d, "--gamma", "0", "--max-new-tokens", "2", env=offline_env(tmp_path))
    assert_one_clean_line(r, *phrases)
    assert r.stdout == ""
    assert cache_entries(tmp_path) == []  # the failed conversion left nothing in the cache
    assert sorted(os.listdir(d)) == before  # and did not touch the source
    out = tmp_path / "out"
    r = run_python(*CONVERT, d, out, env=offline_env(tmp_path))  # the converter says the same
    assert_one_clean_line(r, *phrases, prog="npspec.convert")
    assert not out.exists() or os.listdir(out) == []


# --- hostile configs: checked against the file first, errors of bounded length ------------------------


def test_a_huge_n_layer_is_refused_from_the_header_at_once(tmp_path):
    for n_layer in (100_000, 10 ** 9):  # once a 56 MB error line, and a hang growing past 6 GB
        src = hf_dir(tmp_path / f"hf{n_layer}", cfg_patch={"n_layer": n_layer})
        message = (f"{src / 'config.json'} says n_layer {n_layer:,} ({4 + 12 * n_layer:,} tensors) but the file holds "
                   f"30 tensors (2 layers) ({src / 'model.safetensors'}); fix n_layer in config.json")
        r = run_python(*CONVERT, src, tmp_path / "out", timeout=60)
        assert_one_clean_line(r, message, prog="npspec.convert")
        assert r.stderr == f"npspec.convert: error: {message}\n"
        r = run_python(*GENERATE, "--target", src, "--gamma", "0", env=offline_env(tmp_path), timeout=60)
        assert_one_clean_line(r, message)
    assert not (tmp_path / "out").exists()


def test_a_long_list_of_problems_is_capped(tmp_path):
    src = hf_dir(tmp_path / "hf", cfg_patch={"n_layer": 4})  # 2 layers in the file: 24 tensors missing
    with pytest.raises(CheckpointError) as e:
        convert(src, tmp_path / "out")
    shown = [f"missing tensor h.2.{n} {s}" for n, s in [
        ("ln_1.weight", [8]), ("ln_1.bias", [8]), ("attn.c_attn.weight", [8, 24]), ("attn.c_attn.bias", [24]),
        ("attn.c_proj.weight", [8, 8]), ("attn.c_proj.bias", [8]), ("ln_2.weight", [8]), ("ln_2.bias", [8]),
        ("mlp.c_fc.weight", [8, 32]), ("mlp.c_fc.bias", [32])]]
    assert str(e.value) == "; ".join(shown) + "; ... and 14 more"


@pytest.mark.parametrize("eps", [-1, 0, float("nan"), float("inf"), "1e-5", None, True])
def test_a_bad_layer_norm_epsilon_is_refused_at_conversion(tmp_path, eps):
    src = hf_dir(tmp_path / "hf", cfg_patch={"layer_norm_epsilon": eps})
    got = float(eps) if type(eps) in (int, float) else eps  # a number reaches GPT2Config as a float
    message = (f"{src / 'config.json'}: config: " if type(eps) in (int, float) else f"{src / 'config.json'}: ") + \
        f"layer_norm_epsilon must be a finite number > 0, got {got!r}; fix the checkpoint's config.json"
    r = run_python(*CONVERT, src, tmp_path / "out")
    assert r.stderr == f"npspec.convert: error: {message}\n" and r.returncode == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("eps", ["-1", "0", "nan", "inf"])
def test_a_bad_layer_norm_epsilon_is_refused_at_load(tmp_path, eps):
    out = convert(hf_dir(tmp_path / "hf"), tmp_path / "out")
    with safe_open(str(out / "model.safetensors"), "numpy") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    save_file(tensors, str(out / "model.safetensors"), metadata={**meta, "layer_norm_epsilon": eps})
    with pytest.raises(CheckpointError) as e:
        load_model(out)
    assert str(e.value) == (f"{out / 'model.safetensors'}: bad model metadata (config: layer_norm_epsilon must be a "
                            f"finite number > 0, got {float(eps)!r}); reconvert it with npspec convert")
