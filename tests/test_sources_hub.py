"""Models from the Hugging Face hub (npspec.sources.cache.from_hub): downloaded once, converted once, and what to
run when the hub cannot be reached.

The hub is unreachable here, so the download path is tested on a hub-layout cache built by
hand in a temp dir (`models--org--name/{blobs, refs/main, snapshots/<commit>}`, as
huggingface_hub writes it) and read with HF_HUB_OFFLINE=1. Subprocesses get their own
HF_HUB_CACHE and NPSPEC_CACHE (test_cli.offline_env), so the user's caches are never touched.
"""

import hashlib
import json
import os
import shutil

import numpy as np
import pytest

from npspec.sources.huggingface import write_hf_checkpoint
from npspec.model.gpt2 import GPT2Config
from npspec.sources.init import init_tensors

from conftest import ROOT, SHIPPED, run_python
from test_cli import GENERATE, assert_one_clean_line, offline_env

SMALL = GPT2Config(n_vocab=2048, n_ctx=64, n_embd=16, n_head=2, n_layer=2, eos_token_id=0)  # shakespeare's tokenizer
WIDE = GPT2Config(n_vocab=50257, n_ctx=64, n_embd=8, n_head=2, n_layer=1, eos_token_id=50256)  # GPT-2's tokenizer
COMMIT = "0123456789abcdef0123456789abcdef01234567"
TOKENIZER = (SHIPPED / "target" / "tokenizer.json").read_text()
GPT2_TOKENIZER = (ROOT / "weights" / "gpt2" / "tokenizer.json").read_text()


def make_hub_cache(hf_cache, repo_id, config, seed=0, tokenizer=True, commit=COMMIT):
    """Write a tiny GPT-2 checkpoint into `hf_cache` as huggingface_hub lays out a downloaded repo.

    Files live in blobs/ (named by sha256, as the hub names LFS files; git's sha1 for small ones
    is not needed offline), snapshots/<commit>/ holds relative symlinks to them, refs/main the commit.
    """
    repo = hf_cache / ("models--" + repo_id.replace("/", "--"))
    staging = write_hf_checkpoint(hf_cache / "staging" / repo_id, init_tensors(config, seed), config)
    if tokenizer:
        (staging / "tokenizer.json").write_text(TOKENIZER)
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    for name in ["config.json", "model.safetensors"] + (["tokenizer.json"] if tokenizer else []):
        data = (staging / name).read_bytes()
        blob = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / blob).write_bytes(data)
        os.symlink(f"../../blobs/{blob}", snap / name)
    return repo


LOAD = ("import json, logging, sys, numpy as np, npspec.sources as s; "
        "logging.basicConfig(level=logging.INFO, format='npspec: %(message)s'); x = s.load({spec!r}); "
        "print(json.dumps({{'path': x.source, 'n_vocab': x.config.n_vocab, 'n_embd': x.config.n_embd, "
        "'source': x.metadata['source'], 'sha': x.metadata['source_sha256'], "
        "'wte_sum': float(np.float64(x.params['wte']).sum()), 'tok_size': x.tokenizer.get_vocab_size()}}))")


def load_in_subprocess(spec, env):
    r = run_python("-c", LOAD.format(spec=spec), env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), r.stderr


# --- the hub, through an offline Hugging Face cache --------------------------------------------------


def test_hub_repo_from_offline_cache_converts_once(tmp_path):
    repo = make_hub_cache(tmp_path / "hf", "someorg/tiny-gpt2", SMALL, seed=5)
    env = offline_env(tmp_path)
    got, err = load_in_subprocess("someorg/tiny-gpt2", env)
    entry = tmp_path / "npspec" / "hub" / "someorg--tiny-gpt2" / COMMIT
    assert got["path"] == str(entry) and got["source"] == f"hf://someorg/tiny-gpt2@{COMMIT}"
    assert (got["n_vocab"], got["n_embd"], got["tok_size"]) == (2048, 16, 2048)  # its own tokenizer.json
    assert got["wte_sum"] == float(np.float64(init_tensors(SMALL, 5)["wte.weight"]).sum())  # the very weights
    blob = (repo / "snapshots" / COMMIT / "model.safetensors").resolve()
    assert got["sha"] == blob.name == hashlib.sha256(blob.read_bytes()).hexdigest()
    assert "converting someorg/tiny-gpt2" in err
    assert sorted(os.listdir(entry)) == ["model.safetensors", "tokenizer.json"]
    assert sorted(os.listdir(entry.parent)) == [COMMIT]  # no staging leftovers
    assert sorted(os.listdir(tmp_path / "npspec")) == [".locks", "choices.json", "hub"]  # choices: npspec.sources.choices
    inode = (entry / "model.safetensors").stat().st_ino

    again, err = load_in_subprocess("someorg/tiny-gpt2", env)  # reuses the conversion
    assert again == got and "converting" not in err
    assert (entry / "model.safetensors").stat().st_ino == inode

    r = run_python(*GENERATE, "--target", "someorg/tiny-gpt2", "--draft", "someorg/tiny-gpt2", "--json",
                   "--max-new-tokens", "5", "ROMEO:", env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert len(out["ids"]) == 5 and out["stats"]["new_tokens"] == 5
    assert "converting" not in r.stderr


@pytest.mark.slow  # a whole command, 3 s or more: CI's second step
def test_hub_repo_without_tokenizer_gets_gpt2s(tmp_path):
    make_hub_cache(tmp_path / "hf", "someorg/no-tok", WIDE, tokenizer=False)
    got, _ = load_in_subprocess("someorg/no-tok", offline_env(tmp_path))
    assert (tmp_path / "npspec" / "hub" / "someorg--no-tok" / COMMIT / "tokenizer.json").read_text() == GPT2_TOKENIZER
    assert got["path"].endswith(COMMIT) and got["tok_size"] == 50257


def test_hub_repo_without_tokenizer_and_small_vocab_refused(tmp_path):
    make_hub_cache(tmp_path / "hf", "someorg/small", SMALL, tokenizer=False)
    r = run_python(*GENERATE, "--target", "someorg/small", "--gamma", "0", env=offline_env(tmp_path))
    assert_one_clean_line(r, "GPT-2's tokenizer (used because", "has no tokenizer.json)",
                          "has 50257 ids but the model's n_vocab is 2048", "put the model's own tokenizer.json")
    assert r.stdout == "" and not (tmp_path / "npspec").exists()  # refused before any conversion: nothing written


def test_no_network_no_cache_says_what_to_run(tmp_path):
    env = offline_env(tmp_path)
    for spec, repo in (("gpt2", "openai-community/gpt2"), ("distilgpt2", "distilbert/distilgpt2"),
                       ("someorg/absent", "someorg/absent")):
        r = run_python(*GENERATE, "--target", spec, "--gamma", "0", "--max-new-tokens", "1", env=env)
        assert_one_clean_line(r, "not in the local Hugging Face cache", "HF_HUB_OFFLINE",
                              f"on a connected machine run `hf download {repo} config.json model.safetensors "
                              "tokenizer.json`")
        assert len(r.stderr.strip().splitlines()) == 1
    r = run_python(*GENERATE, "--target", "gpt2", "--gamma", "0", "--debug", env=env)
    assert r.returncode != 0 and "Traceback" in r.stderr  # --debug shows it


@pytest.mark.slow  # a whole command, 3 s or more: CI's second step
def test_connection_errors_fall_back_to_the_cache(tmp_path):
    # no HF_HUB_OFFLINE: the hub is tried at a local port nothing listens on (refused at once)
    env = offline_env(tmp_path, HF_ENDPOINT="http://127.0.0.1:9", HF_HUB_OFFLINE=None)
    r = run_python(*GENERATE, "--target", "someorg/absent", "--gamma", "0", env=env)
    assert_one_clean_line(r, "someorg/absent is not in the local Hugging Face cache and the hub cannot be reached; "
                             "on a connected machine run `hf download someorg/absent")
    assert len(r.stderr.strip().splitlines()) == 1
    make_hub_cache(tmp_path / "hf", "someorg/tiny-gpt2", SMALL)
    assert load_in_subprocess("someorg/tiny-gpt2", env)[0]["path"].endswith(COMMIT)


def test_partial_hf_cache_says_what_to_run(tmp_path):
    repo = make_hub_cache(tmp_path / "hf", "someorg/partial", SMALL)
    (repo / "snapshots" / COMMIT / "model.safetensors").unlink()  # e.g. only config.json was fetched
    r = run_python(*GENERATE, "--target", "someorg/partial", "--gamma", "0", env=offline_env(tmp_path))
    assert_one_clean_line(r, "`hf download someorg/partial config.json model.safetensors tokenizer.json`")
    assert r.stderr.startswith("npspec.generate: error: someorg/partial has no model.safetensors in the local "
                               "Hugging Face cache (revision 0123456789ab) and HF_HUB_OFFLINE is set")
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow  # a whole command, 3 s or more: CI's second step
def test_offline_reuses_conversion_after_hf_cache_is_cleared(tmp_path):
    make_hub_cache(tmp_path / "hf", "someorg/tiny-gpt2", SMALL)
    env = offline_env(tmp_path)
    load_in_subprocess("someorg/tiny-gpt2", env)
    shutil.rmtree(tmp_path / "hf")
    assert load_in_subprocess("someorg/tiny-gpt2", env)[0]["path"].endswith(COMMIT)
