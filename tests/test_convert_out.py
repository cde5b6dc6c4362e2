"""Where `npspec convert SRC OUT_DIR` writes: nothing on disk is lost, overwritten or left half-made.

OUT_DIR must be new or empty, or hold an npspec model that --force replaces; never SRC, inside it or
holding it. A conversion killed (SIGKILL) leaves a staging directory that the next conversion beside
it removes; one interrupted (SIGINT) says so in one line and leaves nothing; of two conversions into
one new OUT_DIR, the second says the first finished first. A run is paused inside `files.write_weights` (after
it has written the weights into the staging directory) by PAUSED, so each case is deterministic.
"""

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from npspec.sources.files import load_model
from npspec.model.gpt2 import GPT2Config
from npspec.sources.huggingface import convert
from npspec.sources.init import init_tensors

from conftest import ROOT, run_python
from test_cli import CONVERT, GENERATE, assert_one_clean_line, offline_env
from test_convert import CONFIG, hf_dir

# argv: SRC OUT_DIR GO_FILE [options]: writes the staging directory's weights, prints "ready", waits for GO_FILE
PAUSED = ("import pathlib, sys, time\n"
          "import npspec.sources.files as files\n"
          "real = files.write_weights\n"
          "def paused(path, tensors, config, metadata, progress=None):\n"
          "    real(path, tensors, config, metadata, progress)\n"
          "    print('ready', flush=True)\n"
          "    while not pathlib.Path(sys.argv[3]).exists():\n"
          "        time.sleep(0.02)\n"
          "files.write_weights = paused\n"
          "from npspec.cli.convert import main\n"
          "sys.exit(main(sys.argv[1:3] + sys.argv[4:]))\n")


def start_paused(tmp_path, src, out, *options):
    """A conversion run in a subprocess, returned once it has written its weights and is waiting for tmp_path/go."""
    env = {**os.environ, **{k: v for k, v in offline_env(tmp_path).items() if v is not None}}
    proc = subprocess.Popen([sys.executable, "-c", PAUSED, str(src), str(out), str(tmp_path / "go"), *options],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    assert proc.stdout.readline() == "ready\n", proc.communicate()
    return proc


def listing(d):
    """Every path under d (files and directories, hidden ones too), relative to d, but OUT_DIR's lock file
    (`.NAME.lock` beside it, files.dir_lock: it stays, as a lock file others may wait on must)."""
    return sorted(str(p.relative_to(d)) for p in d.rglob("*") if not p.name.endswith(".lock"))


def snapshot(d):
    return {name: (d / name).read_bytes() for name in listing(d) if (d / name).is_file()}


@pytest.fixture
def src(tmp_path):
    return hf_dir(tmp_path / "hf")


def other_model(tmp_path):
    """An npspec model converted from another checkpoint (seed 4): what --force may replace."""
    other = hf_dir(tmp_path / "hf-other", tensors=init_tensors(CONFIG, 4))
    return convert(other, tmp_path / "work" / "out")


# --- OUT_DIR and SRC --------------------------------------------------------------------------------


@pytest.mark.parametrize("where, phrase", [
    ("src", "is the source checkpoint"), ("src/sub", "is the source checkpoint"),
    ("parent", "is inside OUT_DIR")], ids=["same", "inside", "holds"])
def test_out_dir_is_never_the_source_inside_it_or_around_it(src, where, phrase):
    out = {"src": src, "src/sub": src / "sub", "parent": src.parent}[where]
    before = snapshot(src)
    for force in ((), ("--force",)):
        r = run_python(*CONVERT, src, out, *force)
        assert_one_clean_line(r, phrase, "choose an OUT_DIR outside the source", prog="npspec.convert")
    assert snapshot(src) == before and listing(src) == sorted(before)  # the checkpoint is untouched


def test_a_parent_of_out_dir_that_is_a_file_is_named(src, tmp_path):
    (tmp_path / "afile").write_text("keep")
    r = run_python(*CONVERT, src, tmp_path / "afile" / "x" / "out")
    assert_one_clean_line(r, f"cannot create {tmp_path / 'afile' / 'x' / 'out'}: {tmp_path / 'afile'} is a file, "
                             "not a directory", prog="npspec.convert")
    r = run_python(*CONVERT, src, tmp_path / "afile")
    assert_one_clean_line(r, f"OUT_DIR {tmp_path / 'afile'} is a file", prog="npspec.convert")
    assert (tmp_path / "afile").read_text() == "keep"


def test_a_non_empty_out_dir_is_never_overwritten(src, tmp_path):
    out = tmp_path / "work" / "out"
    out.mkdir(parents=True)
    (out / "model.safetensors").write_bytes(b"someone else's file")
    (out / "notes.txt").write_text("mine")
    for force in ((), ("--force",)):
        r = run_python(*CONVERT, src, out, *force)
        assert_one_clean_line(r, f"OUT_DIR {out} is not empty and is not (only) an npspec model; nothing was written",
                              prog="npspec.convert")
    assert snapshot(out) == {"model.safetensors": b"someone else's file", "notes.txt": b"mine"}
    assert listing(tmp_path / "work") == ["out", "out/model.safetensors", "out/notes.txt"]


def test_an_npspec_model_is_replaced_only_with_force(src, tmp_path):
    out = other_model(tmp_path)
    (out / ".model.safetensors.x1y2.tmp").write_bytes(b"left by a killed write of an older npspec")
    before = snapshot(out)
    r = run_python(*CONVERT, src, out)
    assert_one_clean_line(r, f"OUT_DIR {out} already holds an npspec model; pass --force to replace it",
                          prog="npspec.convert")
    assert snapshot(out) == before
    r = run_python(*CONVERT, src, out, "--force")
    assert r.returncode == 0, r.stderr
    assert listing(tmp_path / "work") == ["out", "out/model.safetensors", "out/tokenizer.json"]  # replaced whole
    assert np.array_equal(load_model(out).params["wte"], init_tensors(CONFIG, 3)["wte.weight"])


def test_an_empty_out_dir_is_written(src, tmp_path):
    (tmp_path / "work" / "out").mkdir(parents=True)
    assert run_python(*CONVERT, src, tmp_path / "work" / "out").returncode == 0
    assert listing(tmp_path / "work") == ["out", "out/model.safetensors", "out/tokenizer.json"]


# --- killed, interrupted, concurrent ----------------------------------------------------------------


def test_a_killed_conversion_leaves_a_staging_dir_that_the_next_one_removes(src, tmp_path):
    work = tmp_path / "work"
    proc = start_paused(tmp_path, src, work / "out")
    proc.kill()
    proc.wait()
    (partial,) = listing(work)[:1]
    assert partial.startswith(".out.") and partial.endswith(".partial")  # what SIGKILL leaves
    r = run_python(*CONVERT, src, work / "out")
    assert r.returncode == 0, r.stderr
    assert listing(work) == ["out", "out/model.safetensors", "out/tokenizer.json"]  # the leftover is gone


def test_a_model_set_aside_by_a_killed_replacement_is_put_back(src, tmp_path):
    # --force sets the old model aside, renames the new one in, deletes the old: killed between the two renames
    out = other_model(tmp_path)
    before = snapshot(out)
    os.rename(out, tmp_path / "work" / ".out.k1ll3d.old")
    r = run_python(*CONVERT, src, out)
    assert_one_clean_line(r, "already holds an npspec model; pass --force", prog="npspec.convert")
    assert listing(tmp_path / "work") == ["out", "out/model.safetensors", "out/tokenizer.json"]
    assert snapshot(out) == before


def test_sigint_during_a_conversion_is_one_line_and_leaves_nothing(src, tmp_path):
    proc = start_paused(tmp_path, src, tmp_path / "work" / "out")
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130 and stdout == "", (proc.returncode, stderr)
    assert stderr == f"npspec.convert: interrupted; {tmp_path / 'work' / 'out'} was left as it was\n"
    assert listing(tmp_path / "work") == []


def test_two_conversions_into_one_new_out_dir(src, tmp_path):
    out = tmp_path / "work" / "out"
    first = start_paused(tmp_path, src, out)  # started first, finishes last
    r = run_python(*CONVERT, src, out, env=offline_env(tmp_path))
    assert r.returncode == 0, r.stderr
    won = snapshot(out)
    (tmp_path / "go").touch()
    _, stderr = first.communicate(timeout=60)
    assert first.returncode == 1 and stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    assert stderr == (f"npspec.convert: error: another conversion into {out} finished first; it was left as that "
                      "run wrote it (pass --force to replace it)\n")
    assert snapshot(out) == won and listing(tmp_path / "work") == ["out", "out/model.safetensors", "out/tokenizer.json"]


def test_a_failed_cached_conversion_leaves_no_lock_file(tmp_path):
    t = init_tensors(CONFIG, 1)
    t["h.0.mlp.c_fc.bias"][3] = np.inf  # refused after the tensors are read, under the cache's lock
    d = hf_dir(tmp_path / "ckpt", tensors=t)
    r = run_python(*GENERATE, "--target", d, "--gamma", "0", "--max-new-tokens", "2", env=offline_env(tmp_path))
    assert_one_clean_line(r, "h.0.mlp.c_fc.bias holds non-finite values")
    root = tmp_path / "npspec"
    assert [p for p in root.rglob("*") if p.is_file()] == []


# --- one rule for a checkpoint without tokenizer.json ---------------------------------------------------


@pytest.mark.slow  # a whole command, 3 s or more: CI's second step
def test_convert_falls_back_to_gpt2s_tokenizer_as_target_dir_does(tmp_path):
    config = GPT2Config(n_vocab=50257, n_ctx=4, n_embd=2, n_head=1, n_layer=1, eos_token_id=50256)
    d = hf_dir(tmp_path / "hf", config=config, tensors=init_tensors(config, 0), tokenizer=None)
    r = run_python(*CONVERT, d, tmp_path / "out")
    assert r.returncode == 0, r.stderr
    gpt2 = (ROOT / "weights" / "gpt2" / "tokenizer.json").read_text()
    assert (tmp_path / "out" / "tokenizer.json").read_text() == gpt2
    r = run_python(*GENERATE, "--target", d, "--gamma", "0", "--max-new-tokens", "2", "--json",
                   env=offline_env(tmp_path))
    assert r.returncode == 0, r.stderr  # --target DIR takes the same directory
