"""GPT-2's tokenizer as shipped in weights/gpt2/, loaded with `tokenizers` (issue 3, "GPT-2's tokenizer").

The test vectors (tests/data/gpt2_test_vectors.json) come with the tokenizer files: "published"
ids are printed in a named public source (transformers, tiktoken), "cross_checked" ids are the ones
three implementations agreed on. See weights/gpt2/PROVENANCE.md.
"""

import hashlib
import json
import re

import pytest
from tokenizers import Tokenizer

from npspec.models import shipped_dir
from npspec.text import encode_prompt

from conftest import ROOT

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
