"""The real GPT-2 against transformers' published greedy outputs (marked hub).

They run only when the real checkpoint is in the local Hugging Face cache (else they skip, saying how to
fetch it); they prove the whole path: hub cache -> conversion -> load -> greedy decoding.
Source: huggingface/transformers tests/models/gpt2/test_modeling_gpt2.py, GPT2ModelLanguageGenerationTest,
openai-community/gpt2 in float32 with greedy decoding (generate(..., do_sample=False)):
  _test_lm_generate_gpt2_helper: input_ids [464, 3290] ("The dog"), max_length=20 -> THE_DOG;
  test_batch_generation: the unpadded runs of "Hello, my dog is a little" (max_length=20) and of
  "Today, I" (max_length=16, i.e. the same 13 new tokens), decoded with skip_special_tokens=True.
"""

import json
from pathlib import Path

import pytest
from huggingface_hub import try_to_load_from_cache

from npspec.sources.huggingface import convert
from npspec.sources.files import load_model
from npspec.sources import load
from npspec.sources.shipped import gpt2_tokenizer_json
from npspec.decode import speculative_generate
from npspec.decode.text import TextStreamer, encode_prompt

from conftest import ROOT

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
    found = [try_to_load_from_cache(repo_id, name) for name in ("config.json", "model.safetensors")]
    if not all(isinstance(p, str) for p in found):  # None: not cached; a sentinel: cached as missing
        return None
    return Path(found[0]).parent


def load_hub_model(name, cache_dir, role="target"):
    """npspec.sources.load(name, role) with npspec's cache in `cache_dir`; skips unless the checkpoint is cached."""
    if cached_snapshot(REPOS[name]) is None:
        pytest.skip(f"{REPOS[name]} is not in the local Hugging Face cache; to run this test: "
                    f"hf download {REPOS[name]} config.json model.safetensors tokenizer.json")
    return load(name, role, cache_dir=cache_dir)


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
    draft = load_hub_model("distilgpt2", tmp_path / "npspec-cache", "draft")
    ids, _ = greedy(real_gpt2, THE_DOG[:2], len(THE_DOG) - 2, draft=draft, gamma=4)
    assert THE_DOG[:2] + ids == THE_DOG


@pytest.mark.hub
def test_real_gpt2_from_converted_snapshot(tmp_path):
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
    vectors = json.loads((ROOT / "tests" / "data" / "gpt2_test_vectors.json").read_text(encoding="utf-8"))
    published = {v["text"]: v["ids"] for v in vectors["published"]}
    assert published["The dog"] == THE_DOG[:2]
    text = "The dog was found in a field near the intersection of West and West Streets.\n\nThe dog"
    assert published[text] == THE_DOG
