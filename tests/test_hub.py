"""Model SPECs, the conversion cache and the Hugging Face hub path, offline (issue 3: hub and cache, memory).

The hub is unreachable here, so the download path is tested on a hub-layout cache built by
hand in a temp dir (`models--org--name/{blobs, refs/main, snapshots/<commit>}`, as
huggingface_hub writes it) and read with HF_HUB_OFFLINE=1. Everything runs in subprocesses
with their own HF_HUB_CACHE and NPSPEC_CACHE, so the user's caches are never touched.
"""

import hashlib
import json
import os
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest

from npspec import hub
from npspec.checkpoint import load_model
from npspec.convert import write_hf_checkpoint
from npspec.init import SHAPES, init_tensors, random_model
from npspec.model import GPT2Config
from npspec.models import load, resolve

from conftest import ROOT, SHIPPED

SMALL = GPT2Config(n_vocab=2048, n_ctx=64, n_embd=16, n_head=2, n_layer=2, eos_token_id=0)  # shakespeare's tokenizer
WIDE = GPT2Config(n_vocab=50257, n_ctx=64, n_embd=8, n_head=2, n_layer=1, eos_token_id=50256)  # GPT-2's tokenizer
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def make_hub_cache(hf_cache, repo_id, config, seed=0, tokenizer=True, commit=COMMIT):
    """Write a tiny GPT-2 checkpoint into `hf_cache` as huggingface_hub lays out a downloaded repo.

    Files live in blobs/ (named by sha256, as the hub names LFS files; git's sha1 for small ones
    is not needed offline), snapshots/<commit>/ holds relative symlinks to them, refs/main the commit.
    """
    repo = hf_cache / ("models--" + repo_id.replace("/", "--"))
    staging = hf_cache / "staging" / repo_id
    write_hf_checkpoint(staging, init_tensors(config, seed), config)
    files = ["config.json", "model.safetensors"]
    if tokenizer:
        (staging / "tokenizer.json").write_text((SHIPPED / "target" / "tokenizer.json").read_text())
        files.append("tokenizer.json")
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    for name in files:
        data = (staging / name).read_bytes()
        blob = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / blob).write_bytes(data)
        os.symlink(f"../../blobs/{blob}", snap / name)
    return repo


def env_for(tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "NPSPEC_"))}
    env.update(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path / "hf"), HF_HOME=str(tmp_path / "hf_home"),
               NPSPEC_CACHE=str(tmp_path / "npspec"), OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    env.update(extra)
    return env


def py(code, env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)


def cli(args, env, module="npspec.generate"):
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=300)


LOAD = ("import json, numpy as np, npspec.models as m; x = m.load({spec!r}); "
        "print(json.dumps({{'path': str(x.path), 'n_vocab': x.config.n_vocab, 'n_embd': x.config.n_embd, "
        "'source': x.metadata['source'], 'sha': x.metadata['source_sha256'], "
        "'wte_sum': float(np.float64(x.params['wte']).sum()), 'tok_size': x.tokenizer.get_vocab_size()}}))")


def test_hub_repo_from_offline_cache_converts_once(tmp_path):
    repo = make_hub_cache(tmp_path / "hf", "someorg/tiny-gpt2", SMALL, seed=5)
    env = env_for(tmp_path)
    first = py(LOAD.format(spec="someorg/tiny-gpt2"), env)
    assert first.returncode == 0, first.stderr
    got = json.loads(first.stdout)
    entry = tmp_path / "npspec" / "hub" / "someorg--tiny-gpt2" / COMMIT
    assert got["path"] == str(entry) and got["source"] == f"hf://someorg/tiny-gpt2@{COMMIT}"
    assert (got["n_vocab"], got["n_embd"], got["tok_size"]) == (2048, 16, 2048)  # its own tokenizer.json
    assert got["wte_sum"] == float(np.float64(init_tensors(SMALL, 5)["wte.weight"]).sum())  # the very weights
    blob = (repo / "snapshots" / COMMIT / "model.safetensors").resolve()
    assert got["sha"] == blob.name == hashlib.sha256(blob.read_bytes()).hexdigest()
    assert "converting someorg/tiny-gpt2" in first.stderr
    assert sorted(os.listdir(entry)) == ["model.safetensors", "tokenizer.json"]
    assert sorted(os.listdir(entry.parent)) == [COMMIT]  # no staging leftovers
    assert sorted(os.listdir(tmp_path / "npspec")) == [".locks", "hub"]
    inode = (entry / "model.safetensors").stat().st_ino

    second = py(LOAD.format(spec="someorg/tiny-gpt2"), env)  # reuses the conversion
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout) == got
    assert "converting" not in second.stderr
    assert (entry / "model.safetensors").stat().st_ino == inode

    r = cli(["--target", "someorg/tiny-gpt2", "--draft", "someorg/tiny-gpt2", "--json", "--max-new-tokens", "5",
             "ROMEO:"], env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert len(out["ids"]) == 5 and out["stats"]["new_tokens"] == 5
    assert "converting" not in r.stderr


def test_hub_repo_without_tokenizer_gets_gpt2s(tmp_path):
    make_hub_cache(tmp_path / "hf", "someorg/no-tok", WIDE, tokenizer=False)
    r = py(LOAD.format(spec="someorg/no-tok"), env_for(tmp_path))
    assert r.returncode == 0, r.stderr
    path = json.loads(r.stdout)["path"]
    gpt2 = (ROOT / "weights" / "gpt2" / "tokenizer.json").read_text()
    assert (tmp_path / "npspec" / "hub" / "someorg--no-tok" / COMMIT / "tokenizer.json").read_text() == gpt2
    assert path.endswith(COMMIT)


def test_hub_repo_without_tokenizer_and_small_vocab_refused(tmp_path):
    make_hub_cache(tmp_path / "hf", "someorg/small", SMALL, tokenizer=False)
    r = cli(["--target", "someorg/small", "--gamma", "0"], env_for(tmp_path))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "has no tokenizer.json" in r.stderr and "GPT-2's tokenizer does not fit" in r.stderr
    assert not (tmp_path / "npspec").exists()  # refused before any conversion: nothing written


def test_no_network_no_cache_says_what_to_run(tmp_path):
    env = env_for(tmp_path)
    for spec, repo in (("gpt2", "openai-community/gpt2"), ("distilgpt2", "distilbert/distilgpt2"),
                       ("someorg/absent", "someorg/absent")):
        r = cli(["--target", spec, "--gamma", "0", "--max-new-tokens", "1"], env)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("npspec.generate: error:")
        assert "not in the local Hugging Face cache" in lines[0] and "HF_HUB_OFFLINE" in lines[0]
        assert f"on a connected machine run `hf download {repo} config.json model.safetensors tokenizer.json`" \
            in lines[0]
    r = cli(["--target", "gpt2", "--gamma", "0", "--debug"], env)
    assert r.returncode != 0 and "Traceback" in r.stderr  # --debug shows it


def test_connection_errors_fall_back_to_the_cache(tmp_path):
    # no HF_HUB_OFFLINE: the hub is tried at a local port nothing listens on (refused at once)
    env = env_for(tmp_path, HF_ENDPOINT="http://127.0.0.1:9")
    del env["HF_HUB_OFFLINE"]
    r = cli(["--target", "someorg/absent", "--gamma", "0"], env)
    assert r.returncode == 1 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "someorg/absent is not in the local Hugging Face cache and the hub cannot be reached; on a connected " \
           "machine run `hf download someorg/absent" in r.stderr
    make_hub_cache(tmp_path / "hf", "someorg/tiny-gpt2", SMALL)
    r = py(LOAD.format(spec="someorg/tiny-gpt2"), env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["path"].endswith(COMMIT)


def test_partial_hf_cache_says_what_to_run(tmp_path):
    repo = make_hub_cache(tmp_path / "hf", "someorg/partial", SMALL)
    (repo / "snapshots" / COMMIT / "model.safetensors").unlink()  # e.g. only config.json was fetched
    r = cli(["--target", "someorg/partial", "--gamma", "0"], env_for(tmp_path))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("npspec.generate: error: someorg/partial has no model.safetensors in the local "
                               "Hugging Face cache (revision 0123456789ab) and HF_HUB_OFFLINE is set")
    assert "`hf download someorg/partial config.json model.safetensors tokenizer.json`" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_offline_reuses_conversion_after_hf_cache_is_cleared(tmp_path):
    import shutil

    make_hub_cache(tmp_path / "hf", "someorg/tiny-gpt2", SMALL)
    env = env_for(tmp_path)
    assert py(LOAD.format(spec="someorg/tiny-gpt2"), env).returncode == 0
    shutil.rmtree(tmp_path / "hf")
    r = py(LOAD.format(spec="someorg/tiny-gpt2"), env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["path"].endswith(COMMIT)


def test_random_shapes_are_built_through_convert_and_reused(tmp_path):
    m = load("random:tiny", cache_dir=tmp_path)
    ref = random_model("tiny")
    assert m.config == SHAPES["tiny"]
    for a, b in ((m.params["wte"], ref.params["wte"]), (m.params["h"][1]["mlp"]["c_proj"]["w"],
                                                         ref.params["h"][1]["mlp"]["c_proj"]["w"])):
        assert np.array_equal(a, b)  # the same seeded init, through write -> convert -> load
    assert m.metadata["source"] == "random:tiny (npspec.init, seed 0)"
    assert m.tokenizer.to_str() == ref.tokenizer.to_str()  # GPT-2's
    entry = m.path
    assert entry.parent == tmp_path / "random" and sorted(os.listdir(entry)) == ["model.safetensors", "tokenizer.json"]
    assert os.listdir(entry.parent) == [entry.name]  # the temporary hub-layout copy is gone
    mtime = (entry / "model.safetensors").stat().st_mtime_ns
    assert load("random:tiny", cache_dir=tmp_path).path == entry
    assert (entry / "model.safetensors").stat().st_mtime_ns == mtime


def test_local_hf_directory_is_converted_into_the_cache(tmp_path):
    src = write_hf_checkpoint(tmp_path / "ckpt", init_tensors(SMALL, 2), SMALL, prefix="transformer.")
    (src / "tokenizer.json").write_text((SHIPPED / "target" / "tokenizer.json").read_text())
    m = load(str(src), cache_dir=tmp_path / "cache")
    assert m.path.parent == tmp_path / "cache" / "local" and m.path.name.startswith("ckpt-")
    assert np.array_equal(m.params["wpe"], init_tensors(SMALL, 2)["wpe.weight"])
    assert sorted(os.listdir(src)) == ["config.json", "model.safetensors", "tokenizer.json"]  # source untouched
    assert resolve(str(src), tmp_path / "cache") == m.path  # reused
    os.utime(src / "model.safetensors", ns=(1, 1))  # an edited checkpoint is converted again
    assert resolve(str(src), tmp_path / "cache") != m.path
    converted = load(str(m.path), cache_dir=tmp_path / "other")  # a converted directory loads in place
    assert converted.path == m.path and not (tmp_path / "other").exists()


def test_hub_names_and_spec_order(tmp_path, monkeypatch):
    assert hub.HUB_NAMES["gpt2-large"] == "openai-community/gpt2-large"
    assert hub.HUB_NAMES["distilgpt2"] == "distilbert/distilgpt2"
    # an existing local path wins over a hub name of the same spelling
    monkeypatch.chdir(tmp_path)
    m = load("random:tiny-draft", cache_dir=tmp_path / "c")
    os.symlink(m.path, tmp_path / "gpt2")
    assert load("gpt2", cache_dir=tmp_path / "c").path.name == "gpt2"


def test_cache_dir_env(tmp_path, monkeypatch):
    monkeypatch.setenv("NPSPEC_CACHE", str(tmp_path / "x"))
    assert hub.cache_dir() == tmp_path / "x"
    monkeypatch.delenv("NPSPEC_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub.cache_dir() == tmp_path / "xdg" / "npspec"


def test_unwritable_cache_is_one_clean_line(tmp_path):
    (tmp_path / "file").write_text("")
    r = cli(["--target", "random:tiny", "--gamma", "0"], env_for(tmp_path, NPSPEC_CACHE=str(tmp_path / "file" / "c")))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "cannot write npspec's cache" in r.stderr and "NPSPEC_CACHE" in r.stderr


CONCURRENT = ("import json, os, sys, time, numpy as np, npspec.models as m; "
              "open(sys.argv[1], 'a').close()\n"
              "while len(os.listdir(os.path.dirname(sys.argv[1]))) < 2: time.sleep(0.01)\n"
              "x = m.load('random:tiny'); print(json.dumps([str(x.path), float(np.float64(x.params['wte']).sum())]))")


def test_two_processes_converting_at_once(tmp_path):
    # both wait until the other has started, then convert the same model into the same cache
    (tmp_path / "go").mkdir()
    env = env_for(tmp_path)
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT, str(tmp_path / "go" / str(i))], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    results = [json.loads(o[0]) for o in outs]
    assert results[0] == results[1]
    assert sum("converting" in o[1] for o in outs) == 1  # the lock: one converts, the other waits and reuses
    entry = tmp_path / "npspec" / "random"
    assert os.listdir(entry) == [os.path.basename(results[0][0])]  # one entry, no staging leftovers
    m = load_model(results[0][0])  # and it is whole
    assert np.array_equal(m.params["wte"], random_model("tiny").params["wte"])


def test_publish_keeps_the_first_copy(tmp_path):
    # without a lock (e.g. no fcntl), the loser of the race discards its own copy
    final = load("random:tiny-draft", cache_dir=tmp_path).path
    before = (final / "model.safetensors").read_bytes()
    staging = tmp_path / "random" / ".staging"
    staging.mkdir()
    (staging / "model.safetensors").write_bytes(b"other")
    assert hub.publish(staging, final) is False
    assert not staging.exists() and (final / "model.safetensors").read_bytes() == before


def test_damaged_cache_entry_says_delete_it(tmp_path):
    from npspec.checkpoint import CheckpointError

    entry = load("random:tiny-draft", cache_dir=tmp_path).path
    (entry / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match=f"the cached conversion {entry} is damaged: delete it and run again"):
        load("random:tiny-draft", cache_dir=tmp_path)


def test_killed_conversion_leftovers_are_cleaned(tmp_path):
    key = hub.random_key("tiny-draft", 0)
    stale = tmp_path / "random" / f".{key}.abc123.partial"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"half")
    m = load("random:tiny-draft", cache_dir=tmp_path)
    assert sorted(os.listdir(tmp_path / "random")) == [key] and m.path.name == key


def test_loading_holds_one_copy_of_the_weights(tmp_path):
    path = load("random:tiny", cache_dir=tmp_path).path  # 14 MB of weights, mostly wte
    tracemalloc.start()
    try:
        m = load_model(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert m.n_bytes == 4 * m.n_params
    # each tensor is read once, straight into the array the forward uses: no second copy
    # (the lower bound checks that tracemalloc sees those arrays at all)
    assert 0.9 * m.n_bytes <= peak <= 1.3 * m.n_bytes, (peak, m.n_bytes)


def test_panel_layout_at_load_holds_one_matrix_extra(tmp_path):
    # most bytes in the blocks (not wte): the relayout to column-major must free each row-major
    # matrix as soon as its copy exists, so the peak is the weights plus about one matrix
    from npspec.checkpoint import save_converted

    config = GPT2Config(n_vocab=2048, n_ctx=64, n_embd=256, n_head=4, n_layer=6)  # 21 MB, 90% in the blocks
    save_converted(tmp_path / "m", init_tensors(config, 0), config, "test", "0" * 64,
                   (SHIPPED / "target" / "tokenizer.json").read_text())
    tracemalloc.start()
    try:
        m = load_model(tmp_path / "m")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    largest = max(h["mlp"]["c_fc"]["w"].nbytes for h in m.params["h"])
    assert m.params["h"][0]["mlp"]["c_fc"]["w"].flags.f_contiguous
    assert m.n_bytes <= peak <= 1.1 * m.n_bytes + largest, (peak, m.n_bytes, largest)


RSS = ("import json, sys; from npspec.checkpoint import load_model; from tokenizers import Tokenizer\n"
       "def peak():  # this process image's peak resident set (ru_maxrss would carry over the parent's)\n"
       "    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:'))\n"
       "Tokenizer.from_file(sys.argv[1] + '/tokenizer.json'); before = peak(); m = load_model(sys.argv[1])\n"
       "print(json.dumps([before, peak(), m.n_bytes]))")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux's /proc/self/status")
def test_loading_does_not_map_a_second_copy(tmp_path):
    # resident memory, not just Python's allocations: reading through a memory map of the file would
    # count its pages on top of the arrays (2x at the end of a load); readinto keeps it to one copy
    from npspec.checkpoint import save_converted

    config = GPT2Config(n_vocab=50257, n_ctx=64, n_embd=512, n_head=8, n_layer=1)  # 116 MB of weights
    save_converted(tmp_path / "m", init_tensors(config, 0), config, "test", "0" * 64,
                   (SHIPPED / "target" / "tokenizer.json").read_text())
    r = subprocess.run([sys.executable, "-c", RSS, str(tmp_path / "m")], capture_output=True, text=True, cwd=ROOT,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    before, after, n_bytes = json.loads(r.stdout)
    grown = (after - before) * 1024  # VmHWM is in kB
    assert 0.9 * n_bytes <= grown <= 1.3 * n_bytes, (grown, n_bytes)


def test_spec_help_names_the_forms():
    r = cli(["--help"], {**os.environ})
    assert r.returncode == 0
    assert "random:<shape>" in r.stdout and "org/name" in r.stdout


@pytest.mark.slow
def test_done_when_random_gpt2_with_random_distilgpt2(tmp_path):
    # the first build writes ~0.8 GB (gpt2 + distilgpt2, converted) into a temp cache
    r = cli(["--target", "random:gpt2", "--draft", "random:distilgpt2", "--max-new-tokens", "16", "--json", "Hello"],
            env_for(tmp_path))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert len(out["ids"]) == 16 and all(0 <= i < 50257 for i in out["ids"])
    assert sorted(os.listdir(tmp_path / "npspec" / "random")) == sorted(
        [hub.random_key("distilgpt2", 0), hub.random_key("gpt2", 0)])
    m = load_model(tmp_path / "npspec" / "random" / hub.random_key("gpt2", 0))
    assert m.config == SHAPES["gpt2"] and m.n_params == 124439808  # GPT-2 small without the tied head


def test_same_tokenizer_ignores_runtime_settings_only():
    from tokenizers import Tokenizer

    from npspec.models import same_tokenizer

    text = (ROOT / "weights" / "gpt2" / "tokenizer.json").read_text()
    a, b = Tokenizer.from_str(text), Tokenizer.from_str(text)
    b.enable_truncation(16)  # a setting saved in tokenizer.json by some repositories
    assert a.to_str() != b.to_str() and same_tokenizer(a, b)
    d = json.loads(text)
    d["model"]["merges"] = d["model"]["merges"][:-1]  # one merge fewer: other ids for some text
    assert not same_tokenizer(a, Tokenizer.from_str(json.dumps(d)))
    assert not same_tokenizer(a, Tokenizer.from_file(str(SHIPPED / "draft" / "tokenizer.json")))
