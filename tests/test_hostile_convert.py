"""Hostile checkpoints and model inputs: configs, tokenizers and metadata that used to give tracebacks or a
truncated model, and forwards fed what they cannot take. Each gives one line naming the problem and the file.

Covered: a 400-digit layer_norm_epsilon (OverflowError) and one of 1e300 (inf in float32), in convert and
generate; a tokenizer.json that is not UTF-8 (convert: a traceback; generate: a message naming no file); a
config.json with fewer layers than the checkpoint (a truncated model behind a UserWarning); metadata
without eos_token_id; `forward` with 2-D ids or another model's cache (raw numpy errors); an OUT_DIR that is a
symlink (replaced by a directory, its staging left behind for good), and a staging directory whose lock cannot be
taken (left behind).
"""

import io
import json
import os

import numpy as np
import pytest
from safetensors.numpy import save_file

from npspec.cli import convert as convert_command
from npspec.sources import files
from npspec.sources.errors import CheckpointError
from npspec.sources.files import config_from_metadata, converted_metadata, load_model, write_dir
from npspec.model.gpt2 import GPT2Config, KVCache
from npspec.sources.init import init_tensors
from npspec.model.model import Model
from npspec.model.tensors import params_tree

from conftest import run_python
from test_cli import GENERATE, assert_one_clean_line, offline_env
from test_convert import CONFIG, hf_dir


def convert(*argv):
    """(exit status, stdout, stderr) of `npspec convert argv`, run in this process."""
    out, err = io.StringIO(), io.StringIO()
    status = convert_command.main([str(a) for a in argv], out=out, err=err)
    assert "Traceback" not in err.getvalue()
    return status, out.getvalue(), err.getvalue()


def assert_refused(result, *phrases):
    status, out, err = result
    assert status == 1 and out == "" and err.count("\n") == 1, (status, err)
    assert err.startswith("npspec.convert: error: ") and all(p in err for p in phrases), err


# --- layer_norm_epsilon --------------------------------------------------------------------------------


def test_a_400_digit_epsilon_is_one_line_in_convert(tmp_path):
    src = hf_dir(tmp_path / "hf", cfg_patch={"layer_norm_epsilon": 10 ** 400})
    assert_refused(convert(src, tmp_path / "out"), "layer_norm_epsilon", "an integer of 401 digits", "config.json")
    assert not (tmp_path / "out").exists()


def test_a_400_digit_epsilon_is_one_line_in_generate(tmp_path):
    src = hf_dir(tmp_path / "hf", cfg_patch={"layer_norm_epsilon": 10 ** 400})
    r = run_python(*GENERATE, "--target", src, "--gamma", "0", "--max-new-tokens", "2", env=offline_env(tmp_path))
    assert r.stdout == ""
    assert_one_clean_line(r, "layer_norm_epsilon", "401 digits")


def test_an_epsilon_that_is_inf_in_float32_is_refused(tmp_path):
    src = hf_dir(tmp_path / "hf", cfg_patch={"layer_norm_epsilon": 1e300})
    assert_refused(convert(src, tmp_path / "out"), "got 1e+300, which is inf in float32")
    for eps in (1e300, 1e-60):  # inf and 0 in float32: accepted before, NaN logits after
        with pytest.raises(ValueError, match="layer_norm_epsilon must be a finite number > 0"):
            GPT2Config(n_vocab=8, n_ctx=8, n_embd=8, n_head=2, n_layer=1, layer_norm_epsilon=eps)


def test_a_converted_file_whose_epsilon_overflows_float32_is_refused():
    metadata = converted_metadata(CONFIG, "test", None)
    with pytest.raises(CheckpointError, match="which is inf in float32"):
        config_from_metadata({**metadata, "layer_norm_epsilon": "1e300"}, "m/model.safetensors")


# --- JSON nested deeper than Python's parser recurses ------------------------------------------------------

DEEP = "[" * 200_000 + "]" * 200_000  # json.loads: RecursionError


def test_a_deeply_nested_config_is_one_line_in_convert(tmp_path):
    src = hf_dir(tmp_path / "hf")
    (src / "config.json").write_text(DEEP)
    assert_refused(convert(src, tmp_path / "out"), str(src / "config.json"), "nests brackets deeper")
    assert not (tmp_path / "out").exists()


def test_a_deeply_nested_config_is_one_line_in_generate(tmp_path):
    src = hf_dir(tmp_path / "hf")
    (src / "config.json").write_text(DEEP)
    r = run_python(*GENERATE, "--target", src, "--gamma", "0", "--max-new-tokens", "2", env=offline_env(tmp_path))
    assert r.stdout == ""
    assert_one_clean_line(r, str(src / "config.json"), "nests brackets deeper", "not a GPT-2 config")


def test_a_deeply_nested_eos_token_id_in_the_metadata_is_refused():
    metadata = converted_metadata(CONFIG, "test", None)
    with pytest.raises(CheckpointError, match="eos_token_id nests its brackets too deep"):
        config_from_metadata({**metadata, "eos_token_id": DEEP}, "m/model.safetensors")


# --- tokenizer.json that is not UTF-8 -----------------------------------------------------------------


def test_a_tokenizer_that_is_not_utf8_is_named_in_convert(tmp_path):
    src = hf_dir(tmp_path / "hf", tokenizer=None)
    (src / "tokenizer.json").write_bytes(b'{"version": "1.0", "model": "\xff\xfe"}')
    assert_refused(convert(src, tmp_path / "out"), str(src / "tokenizer.json"), "is not UTF-8")


def test_a_tokenizer_that_is_not_utf8_is_named_in_generate(tmp_path):
    src = hf_dir(tmp_path / "hf", tokenizer=None)
    (src / "tokenizer.json").write_bytes(b"\x80not utf-8")
    r = run_python(*GENERATE, "--target", src, "--gamma", "0", "--max-new-tokens", "2", env=offline_env(tmp_path))
    assert_one_clean_line(r, str(src / "tokenizer.json"), "is not UTF-8")  # used to name no file


# --- layers ----------------------------------------------------------------------------------------------


def test_a_config_with_fewer_layers_than_the_checkpoint_is_refused(tmp_path):
    src = hf_dir(tmp_path / "hf", cfg_patch={"n_layer": 1})  # the checkpoint holds 2
    assert_refused(convert(src, tmp_path / "out"), "says n_layer 1 but the file holds 2 layers", "truncated")
    assert not (tmp_path / "out").exists()  # it used to convert one layer behind a UserWarning


# --- OUT_DIR ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("points_to", ["an empty directory", "nothing", "a model"])
def test_a_symlink_out_dir_is_refused_and_nothing_is_left_beside_it(tmp_path, points_to):
    src, out, target = hf_dir(tmp_path / "hf"), tmp_path / "out", tmp_path / "target"
    out.mkdir()
    if points_to == "an empty directory":
        target.mkdir()
    if points_to == "a model":
        assert convert(src, target)[0] == 0
    before = sorted(os.listdir(target)) if target.exists() else None
    (out / "link").symlink_to(target)
    # exit 0 used to replace the link by a directory and leave the link as out/.link.<random>.partial for good
    assert_refused(convert(src, out / "link", "--force"), f"OUT_DIR {out / 'link'} is a symlink (to {target})",
                   "nothing was written")
    assert os.listdir(out) == ["link"] and os.readlink(out / "link") == str(target)
    assert (sorted(os.listdir(target)) if target.exists() else None) == before


def test_a_staging_directory_whose_lock_cannot_be_taken_is_not_left_behind(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(files, "_lock_of", lambda staging: tmp_path / "file" / "x.lock")  # cannot be created
    with pytest.raises(OSError):
        write_dir(tmp_path / "out", lambda staging: None)
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".partial")]  # made before the lock: it stayed


# --- metadata --------------------------------------------------------------------------------------------


def test_metadata_without_eos_token_id_names_the_field(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    metadata = {k: v for k, v in converted_metadata(CONFIG, "test", None).items() if k != "eos_token_id"}
    tensors = {k: np.ascontiguousarray(v.T if k.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")) and
                                       k.startswith("h.") else v) for k, v in init_tensors(CONFIG, 1).items()}
    save_file(tensors, str(d / "model.safetensors"), metadata=metadata)
    (d / "tokenizer.json").write_text(json.dumps({}))
    with pytest.raises(CheckpointError, match=r"the model metadata has no eos_token_id \(") as e:
        load_model(d)
    assert "('eos_token_id')" not in str(e.value)


# --- forward's arguments -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small():
    return Model(CONFIG, params_tree(init_tensors(CONFIG, 1), CONFIG))


def test_forward_with_2d_ids_names_the_argument(small):
    with pytest.raises(ValueError, match=r"ids must be a 1-D array of token ids \[n_new\], got shape \[1, 3\]"):
        small.forward(np.array([[1, 2, 3]]), small.new_cache())


def test_forward_with_another_models_cache_names_the_argument(small):
    other = GPT2Config(n_vocab=2048, n_ctx=32, n_embd=16, n_head=2, n_layer=1)
    with pytest.raises(ValueError, match=r"cache must be this model's KVCache .* got \[1, 2, 32, 8\]"):
        small.forward(np.array([1, 2]), KVCache(other))
    with pytest.raises(ValueError, match="got a dict"):
        small.forward(np.array([1, 2]), {})
