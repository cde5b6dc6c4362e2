"""Converted models written atomically (npspec.sources.files over npspec.sources.atomic): a failed or killed write leaves the old
files, a new directory appears whole or not at all, and only a regular file is ever replaced.
"""

import os
from pathlib import Path

import pytest

from npspec.sources.huggingface import write_hf_checkpoint
from npspec.sources.atomic import atomic_write
from npspec.model.gpt2 import GPT2Config
from npspec.sources.init import init_tensors

from conftest import run_python
from model_files import GPT2_TOKENIZER


def test_atomic_write_keeps_the_old_file_when_a_write_fails(tmp_path):
    path = tmp_path / "f"
    atomic_write(path, lambda tmp: Path(tmp).write_text("old"))
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # an ordinary file, not mkstemp's 0600

    def fails(tmp):
        Path(tmp).write_text("partial")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, fails)
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["f"]


FULL_DISK = ("import resource, signal, sys; from npspec.sources.huggingface import convert\n"
             "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) like a full disk\n"
             "resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[3]), resource.RLIM_INFINITY))\n"
             "try:\n    convert(sys.argv[1], sys.argv[2], force=True)\nexcept Exception as e:\n    print(type(e).__name__, e)\n")


@pytest.fixture
def wide_source(tmp_path):
    """A Hugging Face checkpoint whose model.safetensors (0.4 MB) is smaller than its tokenizer.json (1.6 MB)."""
    config = GPT2Config(n_vocab=50257, n_ctx=4, n_embd=2, n_head=1, n_layer=1, eos_token_id=50256)
    src = write_hf_checkpoint(tmp_path / "hf", init_tensors(config, 0), config)
    (src / "tokenizer.json").write_text(GPT2_TOKENIZER)
    return src


def test_a_failed_write_leaves_the_old_files(tmp_path, wide_source):
    out = tmp_path / "out"
    r = run_python("-B", "-c", FULL_DISK, wide_source, out, 10 ** 8)
    assert r.returncode == 0 and r.stdout == "", r.stderr
    before = {name: (out / name).read_bytes() for name in os.listdir(out)}
    r = run_python("-B", "-c", FULL_DISK, wide_source, out, 10 ** 5)  # model.safetensors cannot be written
    assert r.returncode == 0 and "File too large" in r.stdout, (r.stdout, r.stderr)
    assert {name: (out / name).read_bytes() for name in os.listdir(out)} == before
    assert sorted(before) == ["model.safetensors", "tokenizer.json"]


def test_a_new_out_dir_appears_whole_or_not_at_all(tmp_path, wide_source):
    (tmp_path / "new").mkdir()
    # model.safetensors fits under the limit, tokenizer.json does not
    r = run_python("-B", "-c", FULL_DISK, wide_source, tmp_path / "new" / "out", 10 ** 6)
    assert r.returncode == 0 and r.stdout.startswith("OSError") and "File too large" in r.stdout, r.stderr
    assert os.listdir(tmp_path / "new") == [".out.lock"]  # no out/, no staging (nor its lock): out's lock stays


# --- broken files, as the user sees them -------------------------------------------------------------

