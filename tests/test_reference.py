"""npspec against stored transformers outputs, without torch (issue 3, "The oracle": stored reference files).

tests/data/make_reference.py (run with the oracle extra) wrote a tiny Hugging Face checkpoint with
transformers' `save_pretrained` and what GPT2LMHeadModel computes on it: logits for a fixed input
and a greedy continuation. Here npspec converts that checkpoint and must reproduce them: logits
within RTOL of their scale, greedy ids and text identical. If the files are missing, their format
version is not the script's, or the checkpoint is not the one the expectations were computed on,
the failure says how to regenerate them.
"""

import hashlib
import importlib.util
import shutil

import numpy as np
import pytest

from npspec.checkpoint import load_model
from npspec.convert import convert
from npspec.speculative import speculative_generate
from npspec.text import TextStreamer

from conftest import ROOT

_spec = importlib.util.spec_from_file_location("make_reference", ROOT / "tests" / "data" / "make_reference.py")
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)  # constants only: the script imports torch inside main()


class StaleReference(AssertionError):
    """The stored reference files are missing or do not belong together; the message says how to regenerate them."""


def load_expected(folder):
    """`(arrays, metadata)` of folder/expected.safetensors, checked against the script and folder/hf/model.safetensors.

    Raises StaleReference naming the problem and the command that regenerates the files."""
    from safetensors import safe_open

    expected, weights = folder / "expected.safetensors", folder / "hf" / "model.safetensors"
    for f in (expected, weights, folder / "hf" / "config.json", folder / "hf" / "tokenizer.json"):
        if not f.is_file():
            raise StaleReference(f"the stored reference {f} is missing; regenerate the files with {ref.REGENERATE}")
    with safe_open(str(expected), framework="numpy") as f:
        metadata = f.metadata() or {}
        arrays = {name: f.get_tensor(name) for name in f.keys()}
    if metadata.get("format_version") != ref.FORMAT_VERSION:
        raise StaleReference(f"{expected} has format version {metadata.get('format_version')!r} but "
                             f"tests/data/make_reference.py writes {ref.FORMAT_VERSION!r}: the stored files are stale; "
                             f"regenerate them with {ref.REGENERATE}")
    sha = hashlib.sha256(weights.read_bytes()).hexdigest()
    if metadata.get("model_sha256") != sha:
        raise StaleReference(f"{weights} (sha256 {sha[:12]}...) is not the checkpoint {expected} was computed on "
                             f"({str(metadata.get('model_sha256'))[:12]}...): the stored files are stale; "
                             f"regenerate them with {ref.REGENERATE}")
    missing = {"input_ids", "logits", "prompt_ids", "greedy_ids"} - set(arrays)
    if missing:
        raise StaleReference(f"{expected} lacks {sorted(missing)}; regenerate the files with {ref.REGENERATE}")
    return arrays, metadata


@pytest.fixture(scope="module")
def stored():
    try:
        return load_expected(ref.OUT)
    except StaleReference as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return load_model(convert(ref.OUT / "hf", tmp_path_factory.mktemp("reference") / "npspec"))


def test_logits_match_stored_transformers_logits(stored, model):
    arrays, _ = stored
    ids, theirs = arrays["input_ids"], arrays["logits"]
    assert theirs.shape == (len(ids), model.config.n_vocab) and theirs.dtype == np.float32
    scale = np.abs(theirs).max()
    cache = model.new_cache()
    gemm = model.forward(ids, model.new_cache(), invariant=False)
    rows = model.forward(ids, cache, invariant=True)
    for name, ours in [("GEMM path", gemm), ("row path", rows)]:
        err = np.abs(ours - theirs).max() / scale
        assert err <= ref.RTOL, f"{name}: logits differ from transformers' by {err:.2e} of their scale (bound {ref.RTOL})"


def test_greedy_ids_and_text_match_stored(stored, model):
    arrays, metadata = stored
    prompt, theirs = arrays["prompt_ids"].tolist(), arrays["greedy_ids"].tolist()
    assert len(theirs) == ref.N_NEW
    for draft, gamma in [(None, 0), (model, 3)]:
        streamer, pieces = TextStreamer(model.tokenizer), []
        gen = speculative_generate(model, draft, prompt, ref.N_NEW, gamma=gamma, temperature=0,
                                   on_emit=lambda ids, n: pieces.append(streamer.push(ids)))
        pieces.append(streamer.finish())
        assert gen.ids == theirs, f"gamma {gamma}: greedy ids differ from transformers'"
        assert "".join(pieces) == metadata["greedy_text"]


def test_reference_is_what_the_script_describes(stored, model):
    arrays, metadata = stored
    assert model.config.n_vocab == ref.EOS + 1 and model.config.n_ctx == ref.N_CTX
    assert (model.config.n_embd, model.config.n_head, model.config.n_layer) == (ref.N_EMBD, ref.N_HEAD, ref.N_LAYER)
    assert model.tokenizer.encode(ref.TEXT).ids == arrays["input_ids"].tolist()
    assert model.tokenizer.encode(ref.PROMPT).ids == arrays["prompt_ids"].tolist()
    assert float(metadata["min_greedy_margin"]) >= ref.MIN_MARGIN
    # small enough to commit: a few hundred KB at most
    assert sum(f.stat().st_size for f in ref.OUT.rglob("*") if f.is_file()) < 400_000


@pytest.mark.parametrize("damage", ["missing", "old version", "other checkpoint"])
def test_stale_reference_says_how_to_regenerate(tmp_path, damage):
    folder = tmp_path / "reference"
    shutil.copytree(ref.OUT, folder)
    if damage == "missing":
        (folder / "expected.safetensors").unlink()
    elif damage == "old version":
        from safetensors.numpy import save_file

        arrays, metadata = load_expected(folder)
        save_file(arrays, str(folder / "expected.safetensors"), metadata={**metadata, "format_version": "0"})
    else:
        weights = folder / "hf" / "model.safetensors"
        data = bytearray(weights.read_bytes())
        data[-1] ^= 1  # one bit of the last weight
        weights.write_bytes(bytes(data))
    with pytest.raises(StaleReference, match=r"regenerate (the files|them) with python tests/data/make_reference.py"):
        load_expected(folder)
