"""Where models come from: SPECs (load / resolve), the registry of names, `random:` and local models, the
conversion cache, and the rule that a draft must share the target's tokenizer. (The hub: test_sources_hub.py.)

Subprocesses get their own HF_HUB_CACHE and NPSPEC_CACHE (test_cli.offline_env), so the user's caches are
never touched.
"""

import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from npspec import sources
from npspec.sources.huggingface import write_hf_checkpoint
from npspec.sources.errors import CheckpointError
from npspec.sources.files import load_model
from npspec.model.gpt2 import GPT2Config
from npspec.sources.init import init_tensors, iter_tensors
from npspec.model.model import leaves
from npspec.sources import HUB_NAMES, SHAPES, cache, load, names, random_model, resolve, shipped_dir
from npspec.kernels.registry import role_candidates
from npspec.decode import speculative_generate
from npspec.decode.text import same_tokenizer

from conftest import ROOT, SHIPPED, run_python
from test_cli import GENERATE, assert_one_clean_line, offline_env

SMALL = GPT2Config(n_vocab=2048, n_ctx=64, n_embd=16, n_head=2, n_layer=2, eos_token_id=0)  # shakespeare's tokenizer
WIDE = GPT2Config(n_vocab=50257, n_ctx=64, n_embd=8, n_head=2, n_layer=1, eos_token_id=50256)  # GPT-2's tokenizer
COMMIT = "0123456789abcdef0123456789abcdef01234567"
TOKENIZER = (SHIPPED / "target" / "tokenizer.json").read_text()
GPT2_TOKENIZER = (ROOT / "weights" / "gpt2" / "tokenizer.json").read_text()


# --- random: models, local directories, names --------------------------------------------------------


@pytest.mark.slow  # a whole command, 3 s or more: CI's second step
def test_random_shapes_are_built_once_and_reused(tmp_path):
    m = load("random:tiny", cache_dir=tmp_path)
    ref = random_model("tiny", kernel=m.kernel)  # load chose m's kernel (npspec.sources.choices): compare like with like
    assert m.config == SHAPES["tiny"]
    for a, b in ((m.params["wte"], ref.params["wte"]), (m.params["h"][1]["mlp"]["c_proj"]["w"],
                                                         ref.params["h"][1]["mlp"]["c_proj"]["w"])):
        assert np.array_equal(a, b)  # the same seeded init, through save -> load
    held = [(getattr(a, "panels", a), getattr(b, "panels", b)) for a, b in zip(leaves(m.params), leaves(ref.params))]
    assert all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) and a.flags.f_contiguous == b.flags.f_contiguous
               for a, b in held)  # every tensor (a packing kernel's panels), bit for bit, in the same layout
    ids = np.array([464, 3290, 318])
    assert np.array_equal(m.forward(ids, m.new_cache()), ref.forward(ids, ref.new_cache()))
    assert m.metadata["source"] == "random:tiny (npspec.sources.init, seed 0)"
    assert m.tokenizer.to_str() == ref.tokenizer.to_str()  # GPT-2's
    entry = Path(m.source)
    assert entry.parent == tmp_path / "random" and sorted(os.listdir(entry)) == ["model.safetensors", "tokenizer.json"]
    assert os.listdir(entry.parent) == [entry.name]  # no staging leftovers
    assert m.metadata["source_sha256"] == "null"  # no source file
    mtime = (entry / "model.safetensors").stat().st_mtime_ns
    assert load("random:tiny", cache_dir=tmp_path).source == str(entry)
    assert (entry / "model.safetensors").stat().st_mtime_ns == mtime


def test_local_hf_directory_is_converted_into_the_cache(tmp_path):
    src = write_hf_checkpoint(tmp_path / "ckpt", init_tensors(SMALL, 2), SMALL, prefix="transformer.")
    (src / "tokenizer.json").write_text(TOKENIZER)
    m = load(str(src), cache_dir=tmp_path / "cache")
    path = Path(m.source)
    assert path.parent == tmp_path / "cache" / "local" and path.name.startswith("ckpt-")
    assert np.array_equal(m.params["wpe"], init_tensors(SMALL, 2)["wpe.weight"])
    assert sorted(os.listdir(src)) == ["config.json", "model.safetensors", "tokenizer.json"]  # source untouched
    assert resolve(str(src), tmp_path / "cache") == path  # reused
    os.utime(src / "model.safetensors", ns=(1, 1))  # an edited checkpoint is converted again
    assert resolve(str(src), tmp_path / "cache") != path
    converted = load(str(path), cache_dir=tmp_path / "other")  # a converted directory loads in place
    assert converted.source == str(path)
    other = tmp_path / "other"  # nothing converted there: at most the kernel choice (npspec.sources.choices) and its lock
    assert not other.exists() or sorted(os.listdir(other)) == [".locks", "choices.json"]


def test_one_registry_of_names():
    assert HUB_NAMES["gpt2-large"] == "openai-community/gpt2-large"
    assert HUB_NAMES["distilgpt2"] == "distilbert/distilgpt2"
    assert SHAPES == {name: n.config for name, n in names.NAMES.items()}
    assert HUB_NAMES == {name: n.hub for name, n in names.NAMES.items() if n.hub}
    assert set(SHAPES) - set(HUB_NAMES) == {"tiny", "tiny-draft"}  # test shapes exist only as random: models


def test_an_existing_path_wins_over_a_hub_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    m = load("random:tiny-draft", cache_dir=tmp_path / "c")
    os.symlink(m.source, tmp_path / "gpt2")
    assert Path(load("gpt2", cache_dir=tmp_path / "c").source).name == "gpt2"


def test_role_picks_the_shipped_model_and_the_kernel(shipped):
    target, draft = shipped
    assert (target.kernel, draft.kernel) == (role_candidates("target")[0], role_candidates("draft")[0])  # probe "off"
    assert Path(target.source) == SHIPPED / "target" and Path(draft.source) == SHIPPED / "draft"
    assert load(role="draft", kernel="gemm", threads=2).kernel == "gemm"
    with pytest.raises(ValueError, match="role must be 'target' or 'draft'"):
        load(role="verifier")


def test_source_tree_install_finds_shipped_pair():
    assert shipped_dir("shakespeare/target") == ROOT / "weights" / "shakespeare" / "target"


# --- the conversion cache ----------------------------------------------------------------------------


def test_cache_dir_env(tmp_path, monkeypatch):
    monkeypatch.setenv("NPSPEC_CACHE", str(tmp_path / "x"))
    assert cache.cache_dir() == tmp_path / "x"
    monkeypatch.delenv("NPSPEC_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "npspec"


def test_unwritable_cache_is_one_clean_line(tmp_path):
    (tmp_path / "file").write_text("")
    r = run_python(*GENERATE, "--target", "random:tiny", "--gamma", "0",
                   env=offline_env(tmp_path, NPSPEC_CACHE=str(tmp_path / "file" / "c")))
    assert_one_clean_line(r, "cannot write npspec's cache", "NPSPEC_CACHE")


CONCURRENT = ("import json, logging, os, sys, time, numpy as np, npspec.sources as s; "
              "open(sys.argv[1], 'a').close()\n"
              "while len(os.listdir(os.path.dirname(sys.argv[1]))) < 2: time.sleep(0.01)\n"
              "logging.basicConfig(level=logging.INFO, format='npspec: %(message)s')\n"
              "x = s.load('random:tiny'); print(json.dumps([x.source, float(np.float64(x.params['wte']).sum())]))")


def test_two_processes_converting_at_once(tmp_path):
    # both wait until the other has started, then convert the same model into the same cache
    (tmp_path / "go").mkdir()
    env = offline_env(tmp_path)
    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda i: run_python("-c", CONCURRENT, tmp_path / "go" / str(i), env=env), range(2)))
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    results = [json.loads(r.stdout) for r in runs]
    assert results[0] == results[1]
    assert sum("npspec: converting" in r.stderr for r in runs) == 1  # the lock: one converts, the other waits, reuses
    assert os.listdir(tmp_path / "npspec" / "random") == [os.path.basename(results[0][0])]  # one entry, no leftovers
    m = load_model(results[0][0])  # and it is whole
    assert np.array_equal(m.params["wte"], random_model("tiny").params["wte"])


def test_publish_keeps_the_first_copy(tmp_path):
    # without a lock (e.g. no fcntl), the loser of the race discards its own copy
    final = Path(load("random:tiny-draft", cache_dir=tmp_path).source)
    before = (final / "model.safetensors").read_bytes()
    staging = tmp_path / "random" / ".staging"
    staging.mkdir()
    (staging / "model.safetensors").write_bytes(b"other")
    assert cache.publish(staging, final) is False
    assert not staging.exists() and (final / "model.safetensors").read_bytes() == before


def test_damaged_cache_entry_says_delete_it(tmp_path):
    entry = load("random:tiny-draft", cache_dir=tmp_path).source
    (Path(entry) / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match=f"the cached conversion {entry} is damaged: delete it and run again"):
        load("random:tiny-draft", cache_dir=tmp_path)


def test_killed_conversion_leftovers_are_cleaned(tmp_path):
    key = cache.random_key("tiny-draft", 0)
    stale = tmp_path / "random" / f".{key}.abc123.partial"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"half")
    m = load("random:tiny-draft", cache_dir=tmp_path)
    assert sorted(os.listdir(tmp_path / "random")) == [key] and Path(m.source).name == key


@pytest.mark.slow
def test_streamed_random_weights_are_init_tensors():
    # the cache writes random: models from iter_tensors (drawn on a worker thread, one tensor ahead)
    streamed, whole = list(iter_tensors(SHAPES["tiny"], 3)), init_tensors(SHAPES["tiny"], 3)
    assert [n for n, _ in streamed] == list(whole)
    assert all(np.array_equal(a.view(np.uint32), whole[n].view(np.uint32)) for n, a in streamed)


@pytest.mark.slow  # long (>10 s with its fixture): CI's second step
def test_random_gpt2_with_random_distilgpt2(tmp_path):
    # the first build writes ~0.8 GB (gpt2 + distilgpt2, converted) into a temp cache
    r = run_python(*GENERATE, "--target", "random:gpt2", "--draft", "random:distilgpt2", "--max-new-tokens", "16",
                   "--json", "Hello", env=offline_env(tmp_path))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert len(out["ids"]) == 16 and all(0 <= i < 50257 for i in out["ids"])
    assert sorted(os.listdir(tmp_path / "npspec" / "random")) == sorted(
        [cache.random_key("distilgpt2", 0), cache.random_key("gpt2", 0)])
    m = load_model(tmp_path / "npspec" / "random" / cache.random_key("gpt2", 0))
    assert m.config == SHAPES["gpt2"] and m.n_params == 124439808  # GPT-2 small without the tied head


# --- the same-tokenizer rule -------------------------------------------------------------------------


def test_same_tokenizer_ignores_runtime_settings_only():
    a, b = Tokenizer.from_str(GPT2_TOKENIZER), Tokenizer.from_str(GPT2_TOKENIZER)
    b.enable_truncation(16)  # a setting saved in tokenizer.json by some repositories
    assert a.to_str() != b.to_str() and same_tokenizer(a, b)
    d = json.loads(GPT2_TOKENIZER)
    d["model"]["merges"] = d["model"]["merges"][:-1]  # one merge fewer: other ids for some text
    assert not same_tokenizer(a, Tokenizer.from_str(json.dumps(d)))
    assert not same_tokenizer(a, Tokenizer.from_file(str(SHIPPED / "draft" / "tokenizer.json")))


def _runtime_settings(tokenizer):  # truncation and padding only: the same ids for the same text
    t = Tokenizer.from_str(json.dumps(tokenizer))
    t.enable_truncation(16)
    t.enable_padding(pad_id=0, pad_token=t.id_to_token(0))
    return json.loads(t.to_str())


def _swapped_ids(tokenizer):  # the same tokens, two of them with each other's ids
    vocab = tokenizer["model"]["vocab"]
    vocab["a"], vocab["e"] = vocab["e"], vocab["a"]
    return tokenizer


def _one_merge_fewer(tokenizer):
    tokenizer["model"]["merges"] = tokenizer["model"]["merges"][:-1]
    return tokenizer


def draft_with_tokenizer(tmp_path, edit):
    """A copy of the shipped draft whose tokenizer.json is `edit(the shipped one as a dict)`."""
    d = tmp_path / "draft"
    shutil.copytree(SHIPPED / "draft", d)
    (d / "tokenizer.json").write_text(json.dumps(edit(json.loads(TOKENIZER))))
    return d


EDITS = pytest.mark.parametrize("edit, same", [(_runtime_settings, True), (_swapped_ids, False),
                                               (_one_merge_fewer, False)], ids=["runtime-settings", "ids", "merges"])


@pytest.mark.slow  # a whole command, 3 s or more: CI's second step
@EDITS
def test_the_cli_applies_the_same_tokenizer_rule(tmp_path, edit, same):
    draft = draft_with_tokenizer(tmp_path, edit)
    args = ("--json", "--max-new-tokens", "12", "--seed", "4")
    r = run_python(*GENERATE, "--draft", draft, *args, env=offline_env(tmp_path))
    if same:  # accepted: the output is the shipped pair's, whose draft tokenizer is the target's own
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["ids"] == json.loads(run_python(*GENERATE, *args).stdout)["ids"]
    else:
        assert_one_clean_line(r, "use different tokenizers", "pick a draft trained with the target's tokenizer")
        assert r.stdout == ""


@EDITS
def test_the_loop_applies_the_same_tokenizer_rule(shipped, tmp_path, edit, same):
    target, draft = shipped
    other = load(str(draft_with_tokenizer(tmp_path, edit)), "draft", cache_dir=tmp_path / "cache")
    prompt = target.tokenizer.encode("ROMEO:").ids
    emitted = []

    def generate(d):
        return speculative_generate(target, d, prompt, 12, gamma=4, temperature=0.8, rng=np.random.default_rng(4),
                                    on_emit=lambda ids, n: emitted.append(list(ids)))

    if same:
        assert generate(other).ids == generate(draft).ids
    else:
        with pytest.raises(ValueError, match="use different tokenizers; pick a draft trained with the target's"):
            generate(other)
        assert emitted == []  # refused before any output


def test_pair_with_another_tokenizer_and_vocabulary_size(tmp_path):
    # GPT-2's tokenizer and 50257 ids against Shakespeare's and 2048: the vocabulary sizes are named first
    r = run_python(*GENERATE, "--target", "random:tiny-draft", "--draft", SHIPPED / "draft", "--max-new-tokens", "2",
                   env=offline_env(tmp_path))
    assert_one_clean_line(r, "draft vocabulary (2048) differs from the target's (50257)",
                          "pick a draft with the target's tokenizer")
    assert r.stdout == ""


def test_pair_with_different_vocabularies(tmp_path):
    wide = GPT2Config(n_vocab=50304, n_ctx=32, n_embd=8, n_head=2, n_layer=1, eos_token_id=50256)  # padded vocab
    d = write_hf_checkpoint(tmp_path / "wide", init_tensors(wide, 1), wide, prefix="transformer.")
    (d / "tokenizer.json").write_text(GPT2_TOKENIZER)
    r = run_python(*GENERATE, "--target", "random:tiny-draft", "--draft", d, "--max-new-tokens", "2",
                   env=offline_env(tmp_path))
    assert_one_clean_line(r, "draft vocabulary (50304) differs from the target's (50257)")
    assert r.stdout == ""
