"""Shared helpers of the converted-format tests (test_files_*.py): small models saved in format 2 or the old
format 1, bit comparisons, and safetensors files read and written by hand."""

import json
import struct
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from npspec.sources import files
from npspec.sources.files import save_converted
from npspec.model.gpt2 import GPT2Config
from npspec.sources.init import init_tensors, init_tensors_varied
from npspec.model.model import leaves

from conftest import ROOT, SHIPPED

SMALL = GPT2Config(n_vocab=2048, n_ctx=32, n_embd=8, n_head=2, n_layer=1, eos_token_id=0)  # shakespeare's tokenizer
TOKENIZER = (SHIPPED / "target" / "tokenizer.json").read_text()
GPT2_TOKENIZER = (ROOT / "weights" / "gpt2" / "tokenizer.json").read_text()


def saved(d, config=SMALL, seed=1, tokenizer=TOKENIZER):
    """A converted model directory of `config` with a seeded init."""
    save_converted(d, init_tensors(config, seed), config, "test", "0" * 64, tokenizer)
    return d


def saved_format_1(d, config=SMALL, seed=1, tokenizer=TOKENIZER):
    """A converted model directory in the old format 1 (every tensor row-major, `[in, out]`), as npspec wrote it."""
    d.mkdir(parents=True, exist_ok=True)
    metadata = {k: v for k, v in files.converted_metadata(config, "test", "0" * 64).items() if k != "layout"}
    save_file(init_tensors_varied(config, seed), str(d / "model.safetensors"), metadata={**metadata, "format_version": "1"})
    (d / "tokenizer.json").write_text(tokenizer)
    return d


def logits(model, ids=(1, 5, 7, 2)):  # -> [len(ids), n_vocab] float32
    return model.forward(np.array(ids), model.new_cache())


def same_bits(a, b):
    """True if two models' parameter trees hold the same values (bit for bit, NaNs included) and layouts."""
    return all(x.shape == y.shape and x.flags.f_contiguous == y.flags.f_contiguous and
               np.array_equal(x.view(np.uint32), y.view(np.uint32)) for x, y in zip(leaves(a.params), leaves(b.params)))


def read_raw(path):
    """(header dict, data bytes) of a safetensors file, read by hand."""
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_raw(path, header, data, length=None):
    """A safetensors file from a header dict and data bytes; `length` overrides the 8-byte header length."""
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(h) if length is None else length) + h + data)


# --- the round trip ----------------------------------------------------------------------------------

