"""npspec.sources.quantized and the quantized SPEC: a quantized model is an npspec Model (the same forward on
dequantized weights), it saves and loads as a converted directory, `SCHEME:SPEC` / `SCHEME:self` load it,
and as a draft it keeps the output exactly target-distributed and greedy output identical."""

import json

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from npspec import testing as kit
from npspec.decode.drafters import ModelDrafter
from npspec.sources.errors import CheckpointError
from npspec.model.tensors import params_tree
from npspec.model.model import Model, leaves
from npspec.kernels.registry import role_candidates
from npspec.model.gpt2 import layer_norm
from npspec.sources.quantize import awq_objective, parse_scheme, round_trip
from npspec.sources.quantized import (awq_quantize_model, flat_tensors, is_quantized, linear_inputs, quantize_model,
                              save_quantized)
from npspec.sources import load
from npspec.decode import speculative_generate

from conftest import SHIPPED, run_python, tiny_model

SCHEMES = ["int8-ch", "int4-g32", "int2-g64+emb", "fp16", "bf16+emb"]


def same_params(a, b):
    return all(np.array_equal(x, y) for x, y in zip(leaves(a.params), leaves(b.params), strict=True))


def test_flat_tensors_inverts_params_tree(tiny):
    flat = flat_tensors(tiny.params, tiny.config)
    back = params_tree(flat, tiny.config)
    assert all(x is y for x, y in zip(leaves(back), leaves(tiny.params), strict=True))


@pytest.mark.parametrize("name", ["int8-ch", "int2-g8+emb", "bf16"])
def test_a_quantized_model_is_the_same_forward_on_round_tripped_weights(name):
    model = tiny_model(seed=1)
    scheme = parse_scheme(name)
    q = quantize_model(model, scheme)
    flat = flat_tensors(model.params, model.config)
    by_hand = {n: round_trip(t, scheme, 1 if n in ("wte.weight", "wpe.weight") else 0)
               if n.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")) or
               (scheme.embeddings and n in ("wte.weight", "wpe.weight")) else t for n, t in flat.items()}
    expected = Model(model.config, params_tree(by_hand, model.config), None, "", model.kernel)
    ids = np.array([3, 1, 4, 1, 5, 9, 2, 6])
    logits = q.forward(ids, q.new_cache())
    assert logits.dtype == np.float32 and logits.shape == (8, model.config.n_vocab)
    np.testing.assert_array_equal(logits, expected.forward(ids, expected.new_cache()))
    assert q.source == f"{name}:tiny" and q.metadata["quantization"] == name and q.kernel == model.kernel
    assert (np.array_equal(q.params["wte"], model.params["wte"])) != scheme.embeddings  # +emb changes wte only
    assert not np.array_equal(q.params["h"][0]["mlp"]["c_fc"]["w"], model.params["h"][0]["mlp"]["c_fc"]["w"])


def test_more_bits_stay_closer_to_the_original_logits():
    model = tiny_model(seed=2)
    ids = np.arange(10)
    ref = model.forward(ids, model.new_cache())
    err = [float(np.abs(quantize_model(model, parse_scheme(f"int{b}-ch")).forward(ids, model.new_cache()) - ref).max())
           for b in (2, 4, 8)]
    assert err[0] > err[1] > err[2] > 0


def test_linear_inputs_are_what_each_linear_receives():
    model = tiny_model(seed=3)
    wins = [np.array([1, 2, 3, 4]), np.array([5, 6, 7])]
    acts = linear_inputs(model, wins)
    d = model.config.n_embd
    assert {n: a.shape for n, a in acts.items()} == {f"h.{i}.{m}.weight": (7, 4 * d if m == "mlp.c_proj" else d)
                                                     for i in range(2) for m in ("attn.c_attn", "attn.c_proj",
                                                                                 "mlp.c_fc", "mlp.c_proj")}
    p = model.params
    first = layer_norm(p["wte"][wins[0]] + p["wpe"][:4], **p["h"][0]["ln_1"], eps=model.config.layer_norm_epsilon)
    np.testing.assert_array_equal(acts["h.0.attn.c_attn.weight"][:4], first)  # window 1, positions 0..3


def test_awq_model_never_does_worse_than_rtn_per_layer_and_keeps_the_rest():
    model = tiny_model(seed=4)
    calibration = [np.arange(20) % 67, (np.arange(20) * 7) % 67]
    scheme = parse_scheme("int3-g8+emb")
    awq, rtn = awq_quantize_model(model, scheme, calibration), quantize_model(model, scheme)
    acts = linear_inputs(model, calibration)
    w = flat_tensors(model.params, model.config)
    a, r = flat_tensors(awq.params, awq.config), flat_tensors(rtn.params, rtn.config)
    for name, x in acts.items():
        assert awq_objective(x, w[name], a[name]) <= awq_objective(x, w[name], r[name])
    assert np.array_equal(a["wte.weight"], r["wte.weight"]) and a["h.0.ln_1.bias"] is w["h.0.ln_1.bias"]
    alphas = json.loads(awq.metadata["awq_alpha"])
    assert awq.source == "int3-g8+emb-awq:tiny" and set(alphas) == set(acts) and awq.metadata["quantization_method"] == "awq"
    assert any(not np.array_equal(a[n], r[n]) for n in acts)  # some layer chose alpha > 0
    ids = np.arange(6)
    assert awq.forward(ids, awq.new_cache()).dtype == np.float32


# ---- files

@pytest.mark.parametrize("name", SCHEMES)
def test_save_and_load_a_quantized_directory(shipped, tmp_path, name):
    draft = shipped[1]
    scheme = parse_scheme(name)
    out = save_quantized(tmp_path / "q", draft, scheme)
    stored = load_file(str(out / "model.safetensors"))
    codes = stored["h.0.mlp.c_fc.weight.codes"]
    assert codes.dtype == {"int": np.int8, "fp16": np.float16, "bf16": np.uint16}[scheme.kind]
    assert codes.shape == (128, 512) and "h.0.mlp.c_fc.weight" not in stored
    assert ("wte.weight.codes" in stored) == scheme.embeddings and ("wte.weight" in stored) != scheme.embeddings
    if scheme.kind == "int":
        assert stored["h.0.mlp.c_fc.weight.scales"].shape == (1 if scheme.group is None else 128 // scheme.group, 512)
    with safe_open(str(out / "model.safetensors"), framework="numpy") as f:
        assert f.metadata()["quantization"] == name and f.metadata()["source"] == draft.metadata["source"]
    loaded = load(out, "draft")  # npspec.load finds it like any converted directory
    assert same_params(loaded, quantize_model(draft, scheme)) and loaded.kernel in role_candidates("draft")
    assert loaded.metadata["quantization"] == name and loaded.tokenizer.to_str() == draft.tokenizer.to_str()
    assert (out / "model.safetensors").stat().st_size < (SHIPPED / "draft" / "model.safetensors").stat().st_size


def rewrite(path, edit_tensors=None, **metadata):
    weights = path / "model.safetensors"
    with safe_open(str(weights), framework="numpy") as f:
        meta = {**f.metadata(), **metadata}
    tensors = load_file(str(weights))
    if edit_tensors:
        edit_tensors(tensors)
    save_file(tensors, str(weights), metadata=meta)


@pytest.mark.parametrize("edit, says", [
    (dict(quantization="int9-g64"), "names a quantization this npspec cannot load (quantization scheme 'int9-g64'"),
    (dict(quantization="nf4"), "unknown quantization scheme 'nf4'"),
    (dict(quantization_format="2"), "quantization format '2' is unknown"),
    (dict(quantization="int4-g64"), "h.0.attn.c_attn.weight.scales is float32 [4, 384], expected float32 [2, 384]"),
    (dict(edit_tensors=lambda t: t.pop("h.1.mlp.c_proj.weight.scales")), "missing the codes or scales of h.1.mlp"),
    (dict(edit_tensors=lambda t: t.update({"h.0.attn.c_proj.weight.codes": t["h.0.attn.c_proj.weight.codes"]
                                           .astype(np.int16)})), "codes is int16 [128, 128], expected int8"),
])
def test_loading_refuses_what_it_does_not_know_in_one_line(shipped, tmp_path, edit, says):
    out = save_quantized(tmp_path / "q", shipped[1], parse_scheme("int4-g32"))
    rewrite(out, **edit)
    with pytest.raises(CheckpointError) as e:
        load(out, "draft")
    assert says in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("content", [b"", b"\xff" * 16, (10**12).to_bytes(8, "little") + b"{}", (2).to_bytes(8, "little") + b"[]",
                                     (7).to_bytes(8, "little") + b"\xff\xfe{}{}{}"])
def test_is_quantized_reads_a_header_only_when_it_fits(tmp_path, content):
    (tmp_path / "model.safetensors").write_bytes(content)
    assert not is_quantized(tmp_path) and not is_quantized(tmp_path / "missing")


def test_save_refuses_a_group_that_does_not_divide(shipped, tmp_path):
    with pytest.raises(ValueError, match="group 48 does not divide the input width 128"):
        save_quantized(tmp_path, shipped[1], parse_scheme("int4-g48"))


# ---- the SPEC form

@pytest.mark.slow  # a whole command, 3 s or more: CI's second step
def test_scheme_self_is_the_target_quantized(shipped):
    q = load("int4-g64:self", "draft")  # the shipped target (target=None) quantized, with the draft's kernel
    assert same_params(q, quantize_model(shipped[0], parse_scheme("int4-g64")))
    assert q.kernel in role_candidates("draft", q.codes) and q.source.startswith("int4-g64:")  # the draft's, as probed and q.config == shipped[0].config
    q = load("int8-ch:self", "draft", target=SHIPPED / "draft")  # self is whatever the target's SPEC is
    assert same_params(q, quantize_model(shipped[1], parse_scheme("int8-ch")))
    q = load(f"bf16:{SHIPPED / 'draft'}", "draft")
    assert same_params(q, quantize_model(shipped[1], parse_scheme("bf16")))


@pytest.mark.parametrize("spec, role, says", [
    ("int9-g64:self", "draft", "model 'int9-g64:self': quantization scheme 'int9-g64': bits must be 2..8, got 9"),
    ("int4-g48:self", "draft", "group 48 does not divide the input width 256"),
    ("int4:self", "draft", "needs a granularity: int4-ch"),
    ("fp8:self", "draft", "unknown quantization scheme 'fp8'"),
    ("int4-g64:", "draft", "give the model to quantize after the colon, e.g. int4-g64:self"),
    ("int4-g64:self", "target", "`self` stands for the target, so it belongs in the draft's SPEC"),
    ("int4-g64:no/such/dir/x", "draft", "is not an existing directory"),
])
def test_bad_quantized_specs_get_one_line_errors(spec, role, says):
    with pytest.raises(CheckpointError) as e:
        load(spec, role)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_an_existing_directory_with_a_colon_is_a_directory(shipped, tmp_path):
    out = save_quantized(tmp_path / "int4-g64:self", shipped[1], parse_scheme("int2-ch"))
    assert load(out, "draft").metadata["quantization"] == "int2-ch"


@pytest.mark.slow  # a whole command, 3 s or more: CI's second step
def test_the_cli_drafts_with_the_target_quantized():
    args = ["-m", "npspec.generate", "--json", "--temperature", "0", "--max-new-tokens", "24"]
    spec = json.loads(run_python(*args, "--draft", "int4-g64:self").stdout)
    plain = json.loads(run_python(*args, "--gamma", "0").stdout)
    assert spec["ids"] == plain["ids"] and spec["stats"]["alpha"] > 0.5
    other = json.loads(run_python(*args, "--target", SHIPPED / "draft", "--draft", "fp16:self").stdout)
    assert other["stats"]["alpha"] > 0.95  # self is --target's model (the shipped draft), not the shipped target
    r = run_python(*args, "--draft", "int1-g64:self")
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [
        "npspec.generate: error: model 'int1-g64:self': quantization scheme 'int1-g64': bits must be 2..8, got 1 "
        "(symmetric 1 bit has no level but 0); 16-bit levels are fp16 and bf16"]


# ---- lossless as a draft

@pytest.mark.parametrize("name", ["int2-ch", "int2-g8+emb"])
def test_a_2_bit_draft_keeps_the_output_exactly_target_distributed(name):
    """The kit's exact check (enumeration on table targets over 3 ids) with a tiny model quantized to 2 bits
    as the draft, through ModelDrafter as the loop runs it."""
    draft = quantize_model(tiny_model(seed=5, role="draft", n_vocab=3, n_embd=16, n_layer=1), parse_scheme(name))
    report = kit.check_drafter(lambda p: kit.object_drafter(lambda: ModelDrafter(draft)), gammas=(1, 2),
                               eos_values=(None,), schedules=("constant",))
    assert report.ok, str(report)


@pytest.mark.parametrize("name", ["int2-ch+emb", "int3-g64", "int8-g32+emb"])
def test_a_quantized_self_draft_is_greedy_identical(shipped, val_ids, name):
    target = shipped[0]
    draft = quantize_model(target, parse_scheme(name), kernel="gemv-rows")
    prompt = list(val_ids[:16])
    plain = speculative_generate(target, None, prompt, 40, gamma=0, temperature=0)
    gen = speculative_generate(target, draft, prompt, 40, gamma=4, temperature=0)
    assert gen.ids == plain.ids and gen.stats.drafted > 0
