"""Text in and out: prompts to ids (encode_prompt), ids to text streamed without broken characters
(TextStreamer), and same_tokenizer, the one test that two models' ids mean the same text. Imports tokenizers."""

import codecs
import json
from functools import lru_cache

from tokenizers import decoders


@lru_cache(maxsize=None)
def byte_decoder():
    """GPT-2's byte-level alphabet inverted: printable char -> byte 0..255 (Radford et al. 2019, section 2.2)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, n = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + n)] = b
            n += 1
    return chars


def same_tokenizer(a, b):
    """True if two tokenizers.Tokenizer map text to the same ids and back: their JSON without the runtime `truncation`
    and `padding` (so gpt2-large's and distilgpt2's count as the same)."""
    def core(t):
        d = json.loads(t.to_str())
        return {k: v for k, v in d.items() if k not in ("truncation", "padding")}

    return a is b or a.to_str() == b.to_str() or core(a) == core(b)


def encode_prompt(tokenizer, text, eos_token_id):
    """Prompt text -> ids `[n]`; an empty prompt starts from eos_token_id, as GPT-2 does. TypeError for a non-str,
    ValueError for text that is not UTF-8 or an empty prompt without eos_token_id."""
    if not isinstance(text, str):
        raise TypeError(f"the prompt must be a str, got {type(text).__name__}; pass ids to speculative_generate instead")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"the prompt is not valid UTF-8 text (undecodable bytes at {e.start}); pass UTF-8 text") from None
    ids = tokenizer.encode(text).ids
    if not ids:
        if eos_token_id is None:
            raise ValueError("the prompt is empty and the model has no eos_token_id to start from; give a prompt")
        ids = [eos_token_id]
    return ids


class TextStreamer:
    """Ids to text chunks that never split a UTF-8 character: push(ids) -> the newly complete text; finish() -> the
    rest. Their concatenation equals tokenizer.decode(all_ids), and the text so far is always a prefix of it. A
    byte-level decoder (GPT-2's) maps tokens to bytes through an incremental UTF-8 decoder (errors="replace"); any
    other re-decodes the whole sequence per push (O(n^2)) and holds back trailing U+FFFD."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.special = {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special}
        self.byte_level = isinstance(tokenizer.decoder, decoders.ByteLevel)
        self.bytes_of = byte_decoder()
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.ids = []  # every id so far (other decoders only)
        self.n_emitted = 0  # characters emitted so far (other decoders only)

    def token_bytes(self, i):
        token = self.tokenizer.id_to_token(int(i))
        if token is None or token in self.special:
            return b""
        if all(c in self.bytes_of for c in token):
            return bytes(self.bytes_of[c] for c in token)
        return token.encode("utf-8")

    def push(self, ids):
        if self.byte_level:
            return self.utf8.decode(b"".join(self.token_bytes(i) for i in ids))
        self.ids.extend(int(i) for i in ids)
        text = self.tokenizer.decode(self.ids)
        end = len(text.rstrip("\ufffd"))
        new = text[self.n_emitted:end]
        self.n_emitted = max(self.n_emitted, end)
        return new

    def finish(self):
        if self.byte_level:
            return self.utf8.decode(b"", final=True)
        text = self.tokenizer.decode(self.ids)
        new = text[self.n_emitted:]
        self.n_emitted = len(text)
        return new
