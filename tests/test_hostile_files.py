"""Hostile files: what npspec is asked to replace or read is not a regular file, or holds what no model may.

Only a regular file the user named is ever replaced (npspec.sources.atomic.atomic_write: never a symlink, a
directory, a FIFO or a device such as /dev/null, which `--force` once turned into a regular file when
run as root); `--html FILE` refuses an existing file without `--force`; `vectors -` is stdout; a FIFO
named model.safetensors is refused, not read forever; weights holding NaN are refused before the
first byte of output; directories npspec makes get the umask's mode, not mkdtemp's 0700; a symlink loop
as a model, under one, or as convert's SRC, OUT_DIR or OUT_DIR's parent is named (Path.resolve raised RuntimeError);
a model file without read permission says permission denied (safetensors said "No such file", tokenizers' reading
"not a valid tokenizers file"); a checkpoint's config.json that is a FIFO, a loop, a directory or a link to /dev/zero
is named (it was blamed on model.safetensors).
"""

import builtins
import errno
import io
import json
import os
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest
import tokenizers

from npspec.sources import atomic, files, huggingface
from npspec.sources.atomic import NotRegularFile, atomic_write
from npspec.sources.errors import CheckpointError
from npspec.sources.files import load_model, save_converted, write_dir
from npspec.cli.generate import main as generate_main
from npspec.sources.init import init_tensors
from npspec.sources.quantized import is_quantized
from npspec.sources import cache
from npspec.testing.__main__ import main as kit_main

from conftest import ROOT, run_python
from model_files import SMALL, TOKENIZER, saved
from test_cli import GENERATE, assert_one_clean_line, offline_env
from test_convert import hf_dir
from test_hostile_convert import assert_refused, convert

needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")


def streams():
    return io.StringIO(), io.StringIO()


def one_line(err):
    text = err.getvalue()
    assert text.count("\n") == 1 and "Traceback" not in text, text
    return text


# --- atomic_write replaces a regular file only -------------------------------------------------------


def _symlink(p, tmp_path):
    (tmp_path / "target.txt").write_text("the link's target")
    p.symlink_to(tmp_path / "target.txt")


def _directory(p, tmp_path):
    p.mkdir()


def _fifo(p, tmp_path):
    os.mkfifo(p)


@pytest.mark.parametrize("make, what", [(_symlink, "symlink"), (_directory, "directory"),
                                        pytest.param(_fifo, "FIFO", marks=needs_fifo)])
def test_atomic_write_refuses_what_is_not_a_regular_file(tmp_path, make, what):
    p = tmp_path / "out"
    make(p, tmp_path)
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(NotRegularFile, match=f"is a {what}, not a regular file"):
        atomic_write(p, lambda tmp: open(tmp, "w").write("new"))  # used to rename over the symlink
    assert sorted(os.listdir(tmp_path)) == before  # no temporary file left
    if what == "symlink":
        assert p.is_symlink() and (tmp_path / "target.txt").read_text() == "the link's target"


def test_atomic_write_refuses_a_device():
    assert atomic.kind(os.devnull) == "device"
    with pytest.raises(NotRegularFile, match="is a device"):
        atomic_write(os.devnull, lambda tmp: None)  # mkstemp in /dev is never reached


def test_vectors_force_refuses_dev_null(tmp_path):
    out, err = streams()
    assert kit_main(["vectors", os.devnull, "--force"], out=out, err=err) == 1  # root turned it into a file
    assert out.getvalue() == "" and "is a device, not a regular file" in one_line(err)
    assert atomic.kind(os.devnull) == "device"


@needs_fifo
def test_vectors_force_refuses_a_fifo_without_opening_it(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    out, err = streams()
    assert kit_main(["vectors", str(tmp_path / "fifo"), "--force"], out=out, err=err) == 1
    assert "is a FIFO" in one_line(err) and atomic.kind(tmp_path / "fifo") == "FIFO"


def test_vectors_dash_writes_to_stdout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out, err = streams()
    assert kit_main(["vectors", "-"], out=out, err=err) == 0
    assert json.loads(out.getvalue())["format"] == "npspec-speculative-vectors"
    assert os.listdir(tmp_path) == []  # it used to write a file named "-"


def test_vectors_with_a_300_character_name_is_one_line(tmp_path):
    out, err = streams()
    assert kit_main(["vectors", str(tmp_path / ("v" * 300))], out=out, err=err) == 1
    assert "File name too long" in one_line(err) and out.getvalue() == ""


# --- --html ------------------------------------------------------------------------------------------


def test_html_refuses_an_existing_file_without_force(tmp_path):
    page = tmp_path / "round.html"
    page.write_text("mine")
    out, err = streams()
    assert generate_main(["--html", str(page), "--max-new-tokens", "2"], out=out, err=err) == 1
    assert "exists; pass --force to replace it" in one_line(err) and out.getvalue() == ""
    assert page.read_text() == "mine"


def test_html_refuses_a_symlink_even_with_force(tmp_path):
    (tmp_path / "elsewhere.html").write_text("not npspec's")
    (tmp_path / "round.html").symlink_to(tmp_path / "elsewhere.html")
    out, err = streams()
    assert generate_main(["--html", str(tmp_path / "round.html"), "--force"], out=out, err=err) == 1
    assert "is a symlink, not a regular file" in one_line(err)
    assert (tmp_path / "elsewhere.html").read_text() == "not npspec's"


def test_html_with_force_replaces_the_file_and_says_where(tmp_path):
    page = tmp_path / "round.html"
    page.write_text("old")
    out, err = streams()
    assert generate_main(["--html", str(page), "--force", "--max-new-tokens", "2", "--quiet"], out=out, err=err) == 0
    assert page.read_text().startswith("<!DOCTYPE html>") or "<html" in page.read_text()
    assert f"wrote {page}" in err.getvalue()


def test_force_without_html_is_refused():
    out, err = streams()
    assert generate_main(["--force"], out=out, err=err) == 1
    assert "--force replaces an existing --html FILE" in one_line(err)


# --- model files that are not regular files, or hold what no model may -------------------------------


@needs_fifo
def test_a_fifo_named_model_safetensors_is_refused_not_read_forever(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    os.mkfifo(d / "model.safetensors")
    (d / "tokenizer.json").write_text(TOKENIZER)
    result = []
    t = threading.Thread(target=lambda: result.append(is_quantized(d)), daemon=True)
    t.start()
    t.join(30)  # used to block in open() until a writer came
    assert result == [False]
    with pytest.raises(CheckpointError, match="model.safetensors is a FIFO, not a regular file"):
        load_model(d)


def test_nan_weights_are_refused_before_the_prompt_is_printed(tmp_path):
    t = init_tensors(SMALL, 1)
    t["h.0.mlp.c_fc.weight"][3, 5] = np.nan
    save_converted(tmp_path / "m", t, SMALL, "test", None, TOKENIZER)
    r = run_python(*GENERATE, "--target", tmp_path / "m", "--gamma", "0", "--max-new-tokens", "4",
                   env=offline_env(tmp_path))
    assert r.stdout == ""  # "ROMEO:" used to come first
    assert_one_clean_line(r, "h.0.mlp.c_fc.weight holds NaN or inf")
    assert "RuntimeWarning" not in r.stderr


def test_inf_weights_are_refused_at_load(tmp_path):
    t = init_tensors(SMALL, 1)
    t["wte.weight"][7, 0] = -np.inf
    save_converted(tmp_path / "m", t, SMALL, "test", None, TOKENIZER)
    with pytest.raises(CheckpointError, match="tensor wte.weight holds NaN or inf"):
        load_model(tmp_path / "m")


def test_finite_checks_in_chunks():
    a = np.zeros(10, np.float32)
    assert files.finite(a, chunk=3)
    a[9] = np.nan  # in the last, short chunk
    assert not files.finite(a, chunk=3)


# --- symlink loops: named, never a RuntimeError from Path.resolve -------------------------------------


def symlink_loop(d):
    """d/a -> d/b -> d/a; returns d/a."""
    (d / "a").symlink_to(d / "b")
    (d / "b").symlink_to(d / "a")
    return d / "a"


@pytest.mark.parametrize("option", ["--target", "--draft"])
@pytest.mark.parametrize("under", ["", "sub"], ids=["the-loop", "under-it"])
def test_a_symlink_loop_as_a_model_is_named(tmp_path, monkeypatch, option, under):
    loop = symlink_loop(tmp_path)
    monkeypatch.setenv("NPSPEC_CACHE", str(tmp_path / "cache"))
    out, err = streams()
    assert generate_main([option, str(loop / under), "--max-new-tokens", "2"], out=out, err=err) == 1
    assert f"{loop} is a symlink loop" in one_line(err) and out.getvalue() == ""  # --target: a RuntimeError


@pytest.mark.parametrize("where", ["source", "OUT_DIR", "OUT_DIR's parent"])
def test_a_symlink_loop_in_convert_is_named(tmp_path, where):
    loop, hf = symlink_loop(tmp_path), hf_dir(tmp_path / "hf")
    src, out_dir = {"source": (loop, tmp_path / "out"), "OUT_DIR": (hf, loop),
                    "OUT_DIR's parent": (hf, loop / "out")}[where]
    assert_refused(convert(src, out_dir), where.split("'")[0], f"{loop} is a symlink loop")  # a RuntimeError
    assert sorted(os.listdir(tmp_path)) == ["a", "b", "hf"]  # nothing written


# --- a checkpoint's file that is there but is not a regular file: named, never taken as absent ---------------------


def _loop_to_itself(p, tmp_path):
    p.symlink_to(p.name)


def _to_dev_zero(p, tmp_path):
    p.symlink_to("/dev/zero")


NOT_FILES = [pytest.param("config.json", _fifo, "a FIFO", marks=needs_fifo),
             ("config.json", _loop_to_itself, "a symlink loop"), ("config.json", _directory, "a directory"),
             pytest.param("config.json", _to_dev_zero, "a symlink to a device (/dev/zero)",
                          marks=pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")),
             pytest.param("model.safetensors", _fifo, "a FIFO", marks=needs_fifo),
             pytest.param("tokenizer.json", _fifo, "a FIFO", marks=needs_fifo)]


@pytest.mark.parametrize("name, make, what", NOT_FILES, ids=lambda v: v if isinstance(v, str) else "")
def test_a_checkpoint_file_that_is_not_a_regular_file_is_named(tmp_path, monkeypatch, name, make, what):
    src = hf_dir(tmp_path / "hf")
    (src / name).unlink()
    make(src / name, tmp_path)
    said = f"{src / name} is {what}, not a regular file"  # config.json's was blamed on model.safetensors
    assert_refused(convert(src, tmp_path / "out"), said)  # a tokenizer.json FIFO: GPT-2's tokenizer instead
    monkeypatch.setenv("NPSPEC_CACHE", str(tmp_path / "cache"))
    out, err = streams()
    assert generate_main(["--target", str(src), "--gamma", "0", "--max-new-tokens", "2"], out=out, err=err) == 1
    assert said in one_line(err) and out.getvalue() == ""


# --- files npspec may not read: the OS's reason, not safetensors' "No such file" nor "not a tokenizers file" ----------


def without_read_permission(path, monkeypatch):
    """Take read permission away from `path` (mode 000). Root reads it anyway, so for root what the OS does for another
    user is simulated on `path` only: opening it (os.open, open) raises PermissionError, safetensors' safe_open the
    FileNotFoundError "No such file or directory" it raises for any file it cannot open, and tokenizers'
    Tokenizer.from_file the bare Exception "Permission denied (os error 13)" (as both do for root without
    CAP_DAC_OVERRIDE: test_a_model_file_without_read_permission_for_real)."""
    path.chmod(0)
    if os.geteuid() != 0:
        return
    name = str(path)

    def guard(real, error):
        def call(p, *args, **kwargs):
            if isinstance(p, (str, os.PathLike)) and os.fspath(p) == name:
                raise error()
            return real(p, *args, **kwargs)
        return call

    denied = guard(io.open, lambda: PermissionError(errno.EACCES, "Permission denied", name))
    monkeypatch.setattr(os, "open", guard(os.open, lambda: PermissionError(errno.EACCES, "Permission denied", name)))
    monkeypatch.setattr(io, "open", denied)
    monkeypatch.setattr(builtins, "open", denied)
    for module in (files, huggingface):
        monkeypatch.setattr(module, "safe_open", guard(module.safe_open,
                                                       lambda: FileNotFoundError(f"No such file or directory: {name}")))
    monkeypatch.setattr(files, "Tokenizer", type("Tokenizer", (), {
        "from_str": staticmethod(tokenizers.Tokenizer.from_str),
        "from_file": staticmethod(guard(tokenizers.Tokenizer.from_file,
                                        lambda: Exception("Permission denied (os error 13)")))}))


PERMISSION = r"could not be read \(permission denied\); give the user running npspec read permission on it"


@pytest.mark.parametrize("name", ["model.safetensors", "tokenizer.json"])
def test_a_model_file_without_read_permission_says_permission_denied(tmp_path, monkeypatch, name):
    d = saved(tmp_path / "m")
    without_read_permission(d / name, monkeypatch)
    with pytest.raises(CheckpointError, match=f"^{d / name} {PERMISSION}") as e:
        load_model(d)  # was FileNotFoundError / "not a valid tokenizers file ... reconvert it"
    assert "reconvert" not in str(e.value)


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "tokenizer.json"])
def test_a_checkpoint_file_without_read_permission_says_permission_denied(tmp_path, monkeypatch, name):
    src = hf_dir(tmp_path / "hf")
    without_read_permission(src / name, monkeypatch)
    status, out, err = convert(src, tmp_path / "out")
    assert status == 1 and f"{src / name} could not be read (permission denied); give the user" in err, err


SETPRIV = ["--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-dac_override,-dac_read_search"]


def drops_root_file_access():
    """Whether setpriv can run this interpreter as root without the capabilities that let root read any file."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        return False
    return subprocess.run(["setpriv", *SETPRIV, sys.executable, "-c", "pass"], capture_output=True).returncode == 0


@pytest.mark.skipif(not drops_root_file_access(), reason="root and setpriv (another user: the tests above are real)")
def test_a_model_file_without_read_permission_for_real(tmp_path):
    d = saved(tmp_path / "m")
    (d / "model.safetensors").chmod(0)
    env = {k: v for k, v in {**os.environ, **offline_env(tmp_path)}.items() if v is not None}
    r = subprocess.run(["setpriv", *SETPRIV, sys.executable, "-m", "npspec.generate", "--target", d, "--gamma", "0"],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert_one_clean_line(r, f"{d / 'model.safetensors'} could not be read (permission denied)")


# --- modes ---------------------------------------------------------------------------------------------


def test_converted_directories_and_cache_entries_get_the_umask_mode(tmp_path):
    mode = 0o777 & ~atomic.umask()
    out = write_dir(tmp_path / "out", lambda staging: saved(staging))
    assert out.stat().st_mode & 0o777 == mode  # mkdtemp made it 0700
    entry = cache.cached(tmp_path / "cache", tmp_path / "cache" / "random" / "e", lambda staging: None, "e")
    assert entry.stat().st_mode & 0o777 == mode
