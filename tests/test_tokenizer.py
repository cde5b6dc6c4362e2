"""Tokenizers: GPT-2's as shipped in weights/gpt2/, prompts to ids, and when two tokenizers count as the same.

The test vectors (tests/data/gpt2_test_vectors.json) come with the tokenizer files: "published"
ids are printed in a named public source (transformers, tiktoken), "cross_checked" ids are the ones
three implementations agreed on. See weights/gpt2/PROVENANCE.md. `same_tokenizer` is the one
predicate the speculative loop and the CLI use to accept a target/draft pair.
"""

import hashlib
import json
import re

import pytest
from tokenizers import Tokenizer

from npspec.sources.shipped import gpt2_tokenizer, gpt2_tokenizer_json, shipped_dir
from npspec.decode.text import encode_prompt, same_tokenizer

from conftest import ROOT, SHIPPED

GPT2_DIR = ROOT / "weights" / "gpt2"
VECTORS = json.loads((ROOT / "tests" / "data" / "gpt2_test_vectors.json").read_text(encoding="utf-8"))
EOT = 50256  # <|endoftext|>
SPECIAL = "<|endoftext|>"


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_file(str(shipped_dir("gpt2", "tokenizer.json") / "tokenizer.json"))


def plain_ids(tok, text):
    """Plain encoding (no special-token matching), as openai/gpt-2's encoder.py and tiktoken's encode_ordinary:
    the tokenizer's own pre-tokenizer and BPE model, without its added-token pass."""
    return [t.id for piece, _ in tok.pre_tokenizer.pre_tokenize_str(text) for t in tok.model.tokenize(piece)]


def vector_id(v):
    return repr(v["text"][:24])


def test_shipped_files_match_provenance_hashes():
    # PROVENANCE.md's table: | `name` | bytes | `sha256` | ... ; test_vectors.json lives in tests/data/
    table = re.findall(r"^\| `([^`]+)` \| [\d,]+ \| `([0-9a-f]{64})` \|", (GPT2_DIR / "PROVENANCE.md").read_text(),
                       flags=re.M)
    files = {"test_vectors.json": ROOT / "tests" / "data" / "gpt2_test_vectors.json"}
    assert {name for name, _ in table} == {"encoder.json", "vocab.bpe", "tokenizer.json", "test_vectors.json",
                                           "LICENSE-openai-gpt-2.txt"}
    for name, sha in table:
        path = files.get(name, GPT2_DIR / name)
        assert hashlib.sha256(path.read_bytes()).hexdigest() == sha, f"{path} differs from PROVENANCE.md"


def test_vocabulary(tok):
    assert tok.get_vocab_size() == 50257
    assert tok.token_to_id(SPECIAL) == EOT
    assert tok.id_to_token(EOT) == SPECIAL
    assert tok.get_added_tokens_decoder()[EOT].special


@pytest.mark.parametrize("v", VECTORS["published"] + VECTORS["cross_checked"], ids=vector_id)
def test_vector_encodes_and_decodes(tok, v):
    text, ids = v["text"], v["ids"]
    if v.get("allowed_special") or SPECIAL not in text:
        assert tok.encode(text).ids == ids
        assert tok.decode(ids, skip_special_tokens=False) == text
    if not v.get("allowed_special"):
        assert plain_ids(tok, text) == ids  # the BPE itself, special tokens not matched
        assert tok.decode(ids) == text


def test_special_token_in_text_is_the_special_id(tok):
    # As transformers' GPT2TokenizerFast: the literal "<|endoftext|>" in a prompt becomes id 50256
    # (plain encoding gives 7 ordinary tokens, checked by the vector "<|endoftext|> as text" above).
    assert tok.encode("<|endoftext|> as text").ids == [EOT, 355, 2420]
    assert tok.encode("a<|endoftext|>b").ids == [64, EOT, 65]
    assert tok.decode([64, EOT, 65]) == "ab"  # special tokens are skipped when decoding
    assert tok.decode([64, EOT, 65], skip_special_tokens=False) == "a<|endoftext|>b"


def test_empty_prompt_starts_from_endoftext(tok):
    assert tok.encode("").ids == []
    assert encode_prompt(tok, "", EOT) == [EOT]
    assert encode_prompt(tok, "The dog", EOT) == [464, 3290]
    assert encode_prompt(tok, "<|endoftext|>", EOT) == [EOT]


def test_empty_prompt_without_eos_is_refused(tok):
    with pytest.raises(ValueError, match="prompt is empty.*give a prompt"):
        encode_prompt(tok, "", None)


def test_the_tokenizer_npspec_loads_is_the_shipped_file(tok):
    assert gpt2_tokenizer_json() == (GPT2_DIR / "tokenizer.json").read_text(encoding="utf-8")
    assert gpt2_tokenizer().to_str() == tok.to_str()


def edited(text, edit):
    """A Tokenizer from tokenizer.json `text` after `edit(d)` changes its parsed JSON `d` in place."""
    d = json.loads(text)
    edit(d)
    return Tokenizer.from_str(json.dumps(d))


def test_same_tokenizer_ignores_truncation_and_padding():
    # runtime settings some repositories save in tokenizer.json; ids and text are the same
    text = gpt2_tokenizer_json()
    a, b, c = Tokenizer.from_str(text), Tokenizer.from_str(text), Tokenizer.from_str(text)
    assert same_tokenizer(a, a) and same_tokenizer(a, b)
    b.enable_truncation(16)
    c.enable_padding(pad_id=EOT, pad_token=SPECIAL)
    for other in (b, c):
        assert a.to_str() != other.to_str()
        assert same_tokenizer(a, other) and same_tokenizer(other, a)
    assert same_tokenizer(b, c)


@pytest.mark.slow  # a whole command, 3 s or more: CI's second step
def test_same_tokenizer_tells_other_merges_and_vocabularies_apart():
    text = gpt2_tokenizer_json()
    a = Tokenizer.from_str(text)

    def drop_last_merge(d):  # one merge fewer: other ids for some text
        d["model"]["merges"] = d["model"]["merges"][:-1]

    def swap_two_ids(d):  # the same tokens, two of them numbered the other way round
        vocab = d["model"]["vocab"]
        vocab["a"], vocab["b"] = vocab["b"], vocab["a"]

    for edit in (drop_last_merge, swap_two_ids):
        other = edited(text, edit)
        assert not same_tokenizer(a, other) and not same_tokenizer(other, a), edit.__name__
    # each edit changes ids: " gazed" needs GPT-2's last merge ("Ġg", "azed"); "a" and "b" are ids 64 and 65
    assert (len(a.encode(" gazed").ids), len(edited(text, drop_last_merge).encode(" gazed").ids)) == (1, 2)
    assert (a.encode("a").ids, edited(text, swap_two_ids).encode("a").ids) == ([64], [65])
    assert not same_tokenizer(a, Tokenizer.from_file(str(SHIPPED / "draft" / "tokenizer.json")))


def test_shipped_pair_shares_one_tokenizer():
    target, draft = (Tokenizer.from_file(str(SHIPPED / role / "tokenizer.json")) for role in ("target", "draft"))
    assert same_tokenizer(target, draft)
