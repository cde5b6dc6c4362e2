"""TextStreamer: streamed text never breaks a UTF-8 character and always adds up to `decode`.

Byte-level BPE tokens can end inside a UTF-8 character (GPT-2 spells most emoji and CJK characters
with two or three tokens), and speculative decoding emits several tokens at once. One checker,
`check_stream`, states what TextStreamer must do for ANY id sequence cut into ANY chunks:
  * the concatenated stream equals `tokenizer.decode(all_ids)`, exactly;
  * after every push, the text emitted so far is a prefix of that final decode (nothing emitted is
    ever wrong, so U+FFFD appears only where the full decode has one);
  * after every push, what is withheld is only U+FFFD in `decode(ids so far)`: a partial character,
    never complete text.
The properties run it on random ids for both shipped tokenizers, weighted toward the tokens that
are partial UTF-8 (pieces of emoji/CJK), special tokens, and ids the tokenizer does not know.
"""

import json
from functools import lru_cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, decoders

from npspec.decode.text import TextStreamer

from conftest import ROOT, SHIPPED

TOKENIZERS = {"gpt2": ROOT / "weights" / "gpt2" / "tokenizer.json",
              "shakespeare": SHIPPED / "target" / "tokenizer.json"}
MULTIBYTE = "👋🌍🚀 你好，世界！ 日本語のテキスト 한국어 😀🎉👨‍👩‍👧 ñé €…“”"
FFFD = "\ufffd"


def check_stream(tok, ids, sizes):
    """Push `ids` in chunks of `sizes` (cycled; 0 = an empty push; some size > 0) and check the properties above."""
    assert any(sizes)
    full = tok.decode(ids)
    streamer, emitted, i, k = TextStreamer(tok), "", 0, 0
    while i < len(ids) or k == 0:
        n = sizes[k % len(sizes)]
        chunk, i, k = ids[i:i + n], i + n, k + 1
        piece = streamer.push(chunk)
        assert FFFD not in piece or FFFD in full
        emitted += piece
        assert full.startswith(emitted), (ids, emitted, full)
        so_far = tok.decode(ids[:i])
        assert so_far.startswith(emitted) and set(so_far[len(emitted):]) <= {FFFD}, (ids[:i], emitted, so_far)
    emitted += streamer.finish()
    assert emitted == full, (ids, sizes)
    return emitted


class Pools:
    """A tokenizer and its ids by kind, found with the tokenizer itself (not with npspec's byte map)."""

    def __init__(self, name, tok):
        self.name, self.tok = name, tok
        n = tok.get_vocab_size()
        alone = tok.decode_batch([[i] for i in range(n)])
        self.n = n
        self.partial = [i for i, s in enumerate(alone) if FFFD in s]  # tokens that are not whole characters
        self.special = sorted(i for i, t in tok.get_added_tokens_decoder().items() if t.special)
        self.multibyte = sorted(set(tok.encode(MULTIBYTE).ids))

    def __repr__(self):  # hypothesis prints this in a falsifying example
        return f"Pools({self.name!r})"


@lru_cache(maxsize=None)
def load(name):
    return Pools(name, Tokenizer.from_file(str(TOKENIZERS[name])))


@pytest.fixture(scope="module", params=sorted(TOKENIZERS))
def shipped_tok(request):
    return load(request.param)


def ids_strategy(pools):
    """Lists of up to 24 ids, weighted toward partial UTF-8 tokens, multibyte text and special tokens."""
    return st.lists(st.one_of(
        st.sampled_from(pools.partial), st.sampled_from(pools.partial),
        st.sampled_from(pools.multibyte), st.sampled_from(pools.special),
        st.integers(0, pools.n - 1),
        st.integers(pools.n, pools.n + 10),  # ids the tokenizer does not know: decode drops them
    ), max_size=24)


SIZES = st.lists(st.integers(0, 6), min_size=1, max_size=8).filter(any)  # chunk sizes, cycled; 0 = an empty push


@settings(max_examples=400)
@given(data=st.data())
def test_random_ids_stream_like_decode(shipped_tok, data):
    pools = shipped_tok
    check_stream(pools.tok, data.draw(ids_strategy(pools), label="ids"), data.draw(SIZES, label="sizes"))


@settings(max_examples=200)
@given(text=st.text(st.characters(codec="utf-8"), max_size=40), data=st.data())
def test_encoded_text_streams_back_whole(shipped_tok, text, data):
    # Real text (any Unicode, emoji, CJK): the stream is the text itself and never shows U+FFFD.
    tok = shipped_tok.tok
    ids = tok.encode(text).ids
    out = check_stream(tok, ids, data.draw(SIZES, label="sizes"))
    assert out == text
    assert FFFD not in out or FFFD in text


def test_emoji_is_held_until_complete():
    tok = load("gpt2").tok
    s = TextStreamer(tok)
    assert tok.encode("Hello 👋!").ids == [15496, 50169, 233, 0]  # " 👋" is 50169 (" " + 3 bytes) + 233 (1 byte)
    assert s.push([15496]) == "Hello"
    assert s.push([50169]) == " "  # the space is complete; the first 3 bytes of the emoji are held
    assert s.push([]) == ""
    assert s.push([233, 0]) == "👋!"
    assert s.finish() == ""


def test_incomplete_tail_becomes_one_replacement_at_finish():
    tok = load("gpt2").tok
    s = TextStreamer(tok)
    assert s.push([15496, 50169]) == "Hello "  # stops after 3 of the emoji's 4 bytes
    assert s.finish() == FFFD == tok.decode([15496, 50169])[-1]


def test_special_token_between_pieces_of_a_character():
    # decode skips the special token, so the emoji's bytes join across it; so must the stream
    tok = load("gpt2").tok
    ids = [50169, 50256, 233]
    assert check_stream(tok, ids, [1]) == tok.decode(ids) == " 👋"


@lru_cache(maxsize=None)
def modified(name, added=(), decoder=None):
    tok = Tokenizer.from_str(load(name).tok.to_str())
    tok.add_tokens(list(added))
    if decoder == "Sequence([ByteLevel])":
        tok.decoder = decoders.Sequence([decoders.ByteLevel()])
    return Pools(f"{name} modified", tok)


@settings(max_examples=200)
@given(data=st.data())
def test_added_tokens_stream_like_decode(data):
    # Non-special added tokens go through the byte-level decoder too: "ĠxĊ" decodes to " x\n";
    # "héllo wörld" has a character outside GPT-2's byte alphabet, so it is kept as UTF-8.
    pools = modified("shakespeare", (AddedToken("ĠxĊ", special=False), AddedToken("héllo wörld", special=False),
                                          AddedToken("<sep>", special=True)))
    tok = pools.tok
    assert tok.decode([tok.token_to_id("ĠxĊ"), tok.token_to_id("héllo wörld")]) == " x\nhéllo wörld"
    ids = data.draw(ids_strategy(pools), label="ids") + [pools.n - 3, pools.n - 2, pools.n - 1]
    check_stream(tok, data.draw(st.permutations(ids), label="ids"), data.draw(SIZES, label="sizes"))


@settings(max_examples=100)
@given(data=st.data())
def test_other_decoders_stream_like_decode(data):
    # A decoder that is not a bare ByteLevel takes the re-decoding path; same properties.
    pools = modified("gpt2", decoder="Sequence([ByteLevel])")
    tok = pools.tok
    assert not TextStreamer(tok).byte_level
    check_stream(tok, data.draw(ids_strategy(pools), label="ids"), data.draw(SIZES, label="sizes"))


def test_pools_hold_what_the_properties_need(shipped_tok):
    # so the properties above really exercise partial characters and special tokens
    pools = shipped_tok
    tok = pools.tok
    assert len(pools.partial) >= 128 and pools.special == [tok.token_to_id("<|endoftext|>")]
    assert any(i in pools.partial for i in pools.multibyte)
    assert json.loads(tok.to_str())["decoder"]["type"] == "ByteLevel" and TextStreamer(tok).byte_level
