"""Text in and out: prompts to ids, and ids to text streamed without broken characters.

Byte-level BPE tokens (GPT-2's scheme, Radford et al. 2019, section 2.2) can end in the middle
of a UTF-8 character, and speculative decoding emits several tokens at once. `TextStreamer`
keeps the undecoded bytes and emits only complete characters, so the concatenated stream
equals `tokenizer.decode(all_ids)`.
"""

import codecs
from functools import lru_cache


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

    push(ids) -> str: the newly complete text; finish() -> str: whatever is left (invalid
    bytes become U+FFFD, as in `tokenizer.decode`). Special tokens are skipped, as in
    `tokenizer.decode(ids)`.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        added = tokenizer.get_added_tokens_decoder()
        # added tokens are stored as plain text, not in the byte-level alphabet
        self.added = {i: b"" if t.special else t.content.encode("utf-8") for i, t in added.items()}
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.bytes_of = byte_decoder()

    def token_bytes(self, i):
        if i in self.added:
            return self.added[i]
        token = self.tokenizer.id_to_token(int(i))
        return bytes(self.bytes_of[c] for c in token)

    def push(self, ids):
        return self.decoder.decode(b"".join(self.token_bytes(i) for i in ids))

    def finish(self):
        return self.decoder.decode(b"", final=True)
