"""Text in and out: prompts to ids, and ids to text streamed without broken characters.

Byte-level BPE tokens (GPT-2's scheme, Radford et al. 2019, section 2.2) can end in the middle
of a UTF-8 character, and speculative decoding emits several tokens at once. `TextStreamer`
keeps the undecoded bytes and emits only complete characters, so the concatenated stream
equals `tokenizer.decode(all_ids)`. `same_tokenizer` is the one test of whether two models' ids
mean the same text. Imports tokenizers and the standard library only.
"""

import codecs
import json
from functools import lru_cache

from tokenizers import decoders


@lru_cache(maxsize=None)
def byte_decoder():
    """GPT-2's byte-level alphabet, inverted: printable unicode char -> byte value 0..255."""
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
    """True if two tokenizers.Tokenizer map text to the same ids and back.

    Compares their JSON without the runtime settings `truncation` and `padding` (the target's
    tokenizer does all encoding and decoding), so the same vocabulary saved by different
    repositories (gpt2-large, distilgpt2) still counts as the same.
    """
    def core(t):
        d = json.loads(t.to_str())
        return {k: v for k, v in d.items() if k not in ("truncation", "padding")}

    return a is b or a.to_str() == b.to_str() or core(a) == core(b)


def encode_prompt(tokenizer, text, eos_token_id):
    """Prompt text -> ids `[n]`; an empty prompt starts from `<|endoftext|>` (eos_token_id), as GPT-2 does."""
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
    """Turns ids into text chunks that never split a UTF-8 character.

    push(ids) -> str: the newly complete text for `ids` (any iterable of ints; several at once,
    as speculative decoding emits them); finish() -> str: whatever is left. The concatenation of
    every push and the finish equals `tokenizer.decode(all_ids)` exactly, and the text emitted so
    far is always a prefix of it: invalid bytes become U+FFFD (as in `decode`) only once no later
    byte can complete them. As `decode`: special tokens are skipped, ids the tokenizer does not
    know are dropped.

    For a byte-level decoder (GPT-2's, Radford et al. 2019, section 2.2) this mirrors `decode`:
    each token's characters map back to bytes through GPT-2's byte alphabet (a token with a
    character outside it contributes its own UTF-8 bytes), and an incremental UTF-8 decoder with
    errors="replace" holds back an incomplete character. Any other decoder: the whole sequence is
    re-decoded on each push (O(n^2) in tokens) and trailing U+FFFD characters are held back; this is
    exact for decoders whose output for a sequence is a prefix of their output for any extension.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.special = {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special}
        self.byte_level = isinstance(tokenizer.decoder, decoders.ByteLevel)
        self.bytes_of = byte_decoder()
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.ids = []  # every id so far (other decoders only)
        self.n_emitted = 0  # characters emitted so far (other decoders only)

    def token_bytes(self, i):
        """The bytes id `i` contributes to `decode` under a byte-level decoder (b"" if skipped)."""
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
