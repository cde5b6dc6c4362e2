"""Hostile files: what npspec is asked to replace or read is not a regular file, or holds what no model may.

Only a regular file the user named is ever replaced (npspec.atomic.atomic_write: never a symlink, a
directory, a FIFO or a device such as /dev/null, which `--force` once turned into a regular file when
run as root); `--html FILE` refuses an existing file without `--force`; `vectors -` is stdout; a FIFO
named model.safetensors is refused, not read forever; weights holding NaN are refused before the
first byte of output; directories npspec makes get the umask's mode, not mkdtemp's 0700; a symlink loop
as a model, under one, or as convert's SRC, OUT_DIR or OUT_DIR's parent is named (Path.resolve raised RuntimeError).
"""

import io
import json
import os
import threading

import numpy as np
import pytest

from npspec import atomic, files
from npspec.atomic import NotRegularFile, atomic_write
from npspec.errors import CheckpointError
from npspec.files import load_model, save_converted, write_dir
from npspec.generate import main as generate_main
from npspec.init import init_tensors
from npspec.quantized import is_quantized
from npspec.sources import cache
from npspec.testing.__main__ import main as kit_main

from conftest import run_python
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


# --- modes ---------------------------------------------------------------------------------------------


def test_converted_directories_and_cache_entries_get_the_umask_mode(tmp_path):
    mode = 0o777 & ~atomic.umask()
    out = write_dir(tmp_path / "out", lambda staging: saved(staging))
    assert out.stat().st_mode & 0o777 == mode  # mkdtemp made it 0700
    entry = cache.cached(tmp_path / "cache", tmp_path / "cache" / "random" / "e", lambda staging: None, "e")
    assert entry.stat().st_mode & 0o777 == mode
