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
from npspec.huggingface import convert
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
        assert err <= ref.RTOL, \
            f"{name}: logits differ from transformers' by {err:.2e} of their scale (bound {ref.RTOL})"


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


# ---- Published expectations for the real GPT-2 (marked hub) ----
# They run only when the real checkpoint is in the local Hugging Face cache (here they skip); on a
# user's machine they prove the whole path: hub cache -> conversion -> load -> greedy decoding.
# Source: huggingface/transformers tests/models/gpt2/test_modeling_gpt2.py, GPT2ModelLanguageGenerationTest,
# openai-community/gpt2 in float32 with greedy decoding (generate(..., do_sample=False)):
#   _test_lm_generate_gpt2_helper: input_ids [464, 3290] ("The dog"), max_length=20 -> THE_DOG;
#   test_batch_generation: the unpadded runs of "Hello, my dog is a little" (max_length=20) and of
#   "Today, I" (max_length=16, i.e. the same 13 new tokens), decoded with skip_special_tokens=True.
THE_DOG = [464, 3290, 373, 1043, 287, 257, 2214, 1474, 262, 16246, 286, 2688, 290, 2688, 27262, 13, 198, 198, 464,
           3290]
PUBLISHED_TEXTS = [  # (prompt, new tokens, expected text)
    ("Hello, my dog is a little", 13, "Hello, my dog is a little bit of a mess. I'm not sure if he's going"),
    ("Today, I", 13, "Today, I'm going to be doing a lot of research on this. I"),
]
REPOS = {"gpt2": "openai-community/gpt2", "distilgpt2": "distilbert/distilgpt2"}


def cached_snapshot(repo_id):
    """The snapshot directory of `repo_id` in the local Hugging Face cache if it holds config.json and
    model.safetensors (of the revision `main` points to), else None. Never touches the network."""
    from pathlib import Path

    from huggingface_hub import try_to_load_from_cache

    found = [try_to_load_from_cache(repo_id, name) for name in ("config.json", "model.safetensors")]
    if not all(isinstance(p, str) for p in found):  # None: not cached; a sentinel: cached as missing
        return None
    return Path(found[0]).parent


def load_hub_model(name, cache_dir):
    """npspec.models.load(name) with npspec's cache in `cache_dir`; skips unless the checkpoint is cached."""
    from npspec.checkpoint import CheckpointError
    from npspec.models import load

    if cached_snapshot(REPOS[name]) is None:
        pytest.skip(f"{REPOS[name]} is not in the local Hugging Face cache; to run this test: "
                    f"hf download {REPOS[name]} config.json model.safetensors tokenizer.json")
    try:
        return load(name, cache_dir=cache_dir)
    except CheckpointError as e:
        if "unknown model" in str(e):
            pytest.skip(f"npspec.models.load does not know the hub name {name!r}: {e}")
        raise


@pytest.fixture(scope="module")
def real_gpt2(tmp_path_factory):
    return load_hub_model("gpt2", tmp_path_factory.mktemp("npspec-cache"))


def greedy(model, prompt_ids, n_new, draft=None, gamma=0):
    """(ids, streamed text) of greedy decoding with npspec."""
    streamer, pieces = TextStreamer(model.tokenizer), []
    gen = speculative_generate(model, draft, prompt_ids, n_new, gamma=gamma, temperature=0,
                               on_emit=lambda ids, n: pieces.append(streamer.push(ids)))
    return gen.ids, "".join(pieces) + streamer.finish()


@pytest.mark.hub
def test_real_gpt2_greedy_the_dog(real_gpt2):
    from npspec.text import encode_prompt

    prompt = encode_prompt(real_gpt2.tokenizer, "The dog", real_gpt2.config.eos_token_id)
    assert prompt == THE_DOG[:2]
    ids, text = greedy(real_gpt2, prompt, len(THE_DOG) - 2)
    assert prompt + ids == THE_DOG
    assert "The dog" + text == "The dog was found in a field near the intersection of West and West Streets.\n\nThe dog"


@pytest.mark.hub
@pytest.mark.parametrize("prompt, n_new, expected", PUBLISHED_TEXTS, ids=["my-dog", "today"])
def test_real_gpt2_greedy_published_texts(real_gpt2, prompt, n_new, expected):
    ids, text = greedy(real_gpt2, real_gpt2.tokenizer.encode(prompt).ids, n_new)
    assert prompt + text == expected


@pytest.mark.hub
def test_real_gpt2_with_distilgpt2_draft(real_gpt2, tmp_path):
    # speculative greedy decoding is token-identical to greedy decoding: the published ids again
    draft = load_hub_model("distilgpt2", tmp_path / "npspec-cache")
    ids, _ = greedy(real_gpt2, THE_DOG[:2], len(THE_DOG) - 2, draft=draft, gamma=4)
    assert THE_DOG[:2] + ids == THE_DOG


@pytest.mark.hub
def test_real_gpt2_from_converted_snapshot(tmp_path):
    from npspec.hub import gpt2_tokenizer_json

    snapshot = cached_snapshot(REPOS["gpt2"])
    if snapshot is None:
        pytest.skip(f"{REPOS['gpt2']} is not in the local Hugging Face cache")
    model = load_model(convert(snapshot, tmp_path / "gpt2", tokenizer_json=gpt2_tokenizer_json()))
    blob = (snapshot / "model.safetensors").resolve()
    if blob.parent.name == "blobs":  # the hub cache names a large file by its sha256
        assert model.metadata["source_sha256"] == blob.name
    assert model.config.n_vocab == 50257 and model.config.n_layer == 12 and model.config.n_embd == 768
    ids, _ = greedy(model, THE_DOG[:2], len(THE_DOG) - 2)
    assert THE_DOG[:2] + ids == THE_DOG


def test_published_ids_are_the_shipped_test_vectors():
    # the constants above agree with the tokenizer's published vectors (tests/data/gpt2_test_vectors.json)
    import json

    vectors = json.loads((ROOT / "tests" / "data" / "gpt2_test_vectors.json").read_text(encoding="utf-8"))
    published = {v["text"]: v["ids"] for v in vectors["published"]}
    assert published["The dog"] == THE_DOG[:2]
    text = "The dog was found in a field near the intersection of West and West Streets.\n\nThe dog"
    assert published[text] == THE_DOG
