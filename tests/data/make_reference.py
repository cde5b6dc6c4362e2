"""Write the stored oracle reference: a tiny GPT-2 checkpoint and what transformers computes on it.

    pip install -e '.[oracle]'          # torch + transformers
    python tests/data/make_reference.py

tests/test_oracle.py checks npspec against these files on every run, without torch, so that a
user without the oracle extra still checks npspec's forward against Hugging Face transformers'
GPT2LMHeadModel; it reads them with `load_expected` below, which says how to regenerate stale files.
`hf_config`, `hf_model`, `write_checkpoint` (transformers' view of npspec's configs and tensors) and
`draft_tensors` serve this script and tests/test_oracle.py alike. Writes, atomically, into tests/data/reference/:
  hf/                  the checkpoint as transformers' `save_pretrained` writes it (config.json,
                       generation_config.json, model.safetensors, float32, `transformer.` prefix) and a
                       byte-level tokenizer.json (the 256 bytes + <|endoftext|>, no merges);
  expected.safetensors transformers' outputs (no pickle):
                         input_ids   int64   [n]            a fixed text, byte-encoded
                         logits      float32 [n, n_vocab]   GPT2LMHeadModel's logits for input_ids
                         prompt_ids  int64   [m]            the greedy prompt
                         greedy_ids  int64   [N_NEW]        transformers' greedy continuation
                       and string metadata: format_version, model_sha256 (of hf/model.safetensors),
                       greedy_text, min_greedy_margin, torch, transformers, generator.
Raise FORMAT_VERSION whenever what is written changes; the test then reports the files as stale
and prints the command above. Rerunning writes the same checkpoint, ids and greedy text; the logits are
bit-identical on the same machine and torch build, elsewhere they may differ in the last bits (torch's CPU
kernels vary; measured: 1e-6, far inside RTOL). Only the order of the metadata in expected.safetensors'
header may change. The weights are GPT-2's init (npspec.sources.init) with larger weights,
random layer-norm gains and random biases (so that a swapped or ignored parameter shows), seed SEED.
"""

import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

FORMAT_VERSION = "1"
HERE = Path(__file__).resolve().parent
OUT = HERE / "reference"
SEED = 0
N_CTX, N_EMBD, N_HEAD, N_LAYER = 64, 32, 4, 2
EOS = 256  # <|endoftext|>, after the 256 bytes
TEXT = "ROMEO: But soft, what light through yonder window breaks?"
PROMPT = "JULIET:"
N_NEW = 16
REGENERATE = "python tests/data/make_reference.py (needs the oracle extra: pip install -e '.[oracle]')"
# npspec's logits may differ from the stored ones by rounding only: at most RTOL of max |logit| (as in
# the oracle's other cases). The greedy ids must not hinge on rounding: every step's best logit
# leads the second by at least MIN_MARGIN of max |logit|, checked here before writing.
RTOL = 5e-5
MIN_MARGIN = 1e-3


class StaleReference(AssertionError):
    """The stored reference files are missing or do not belong together; the message says how to regenerate them."""


def load_expected(folder=OUT):
    """`(arrays, metadata)` of folder/expected.safetensors, checked against this script and folder/hf/model.safetensors.

    Raises StaleReference naming the problem and the command that regenerates the files."""
    from safetensors import safe_open

    expected, weights = folder / "expected.safetensors", folder / "hf" / "model.safetensors"
    for f in (expected, weights, folder / "hf" / "config.json", folder / "hf" / "tokenizer.json"):
        if not f.is_file():
            raise StaleReference(f"the stored reference {f} is missing; regenerate the files with {REGENERATE}")
    with safe_open(str(expected), framework="numpy") as f:
        metadata = f.metadata() or {}
        arrays = {name: f.get_tensor(name) for name in f.keys()}
    if metadata.get("format_version") != FORMAT_VERSION:
        raise StaleReference(f"{expected} has format version {metadata.get('format_version')!r} but "
                             f"tests/data/make_reference.py writes {FORMAT_VERSION!r}: the stored files are stale; "
                             f"regenerate them with {REGENERATE}")
    sha = hashlib.sha256(weights.read_bytes()).hexdigest()
    if metadata.get("model_sha256") != sha:
        raise StaleReference(f"{weights} (sha256 {sha[:12]}...) is not the checkpoint {expected} was computed on "
                             f"({str(metadata.get('model_sha256'))[:12]}...): the stored files are stale; "
                             f"regenerate them with {REGENERATE}")
    missing = {"input_ids", "logits", "prompt_ids", "greedy_ids"} - set(arrays)
    if missing:
        raise StaleReference(f"{expected} lacks {sorted(missing)}; regenerate the files with {REGENERATE}")
    return arrays, metadata


def hf_config(config):
    """transformers' GPT2Config for an npspec GPT2Config (tanh GELU, tied head, eos as bos)."""
    import transformers

    return transformers.GPT2Config(
        vocab_size=config.n_vocab, n_positions=config.n_ctx, n_embd=config.n_embd, n_head=config.n_head,
        n_layer=config.n_layer, layer_norm_epsilon=config.layer_norm_epsilon, activation_function="gelu_new",
        bos_token_id=config.eos_token_id, eos_token_id=config.eos_token_id, tie_word_embeddings=True)


def hf_model(tensors, config):
    """transformers' GPT2LMHeadModel (eval mode) holding `tensors` (npspec names, float32 arrays)."""
    import torch
    import transformers

    model = transformers.GPT2LMHeadModel(hf_config(config))
    missing, unexpected = model.load_state_dict(
        {"transformer." + k: torch.from_numpy(v) for k, v in tensors.items()}, strict=False)
    assert missing == ["lm_head.weight"] and not unexpected, (missing, unexpected)  # the head is tied to wte
    return model.eval()


def write_checkpoint(out, tensors, config, layout, dtype, tokenizer_file):
    """A Hugging Face checkpoint directory holding `tensors` (npspec names, float32) and a copy of `tokenizer_file`,
    written as users meet them: layout "save_pretrained" (transformers writes it: `transformer.` prefix; float32,
    float16 or bfloat16) or "hub" (as the hub's gpt2 file: no prefix, the old attention buffers; float32 or float16)."""
    import torch
    from safetensors.numpy import save_file

    out = Path(out)
    if layout == "save_pretrained":
        hf_model(tensors, config).to(getattr(torch, dtype)).save_pretrained(out)
    else:
        assert layout == "hub" and dtype in ("float32", "float16")
        out.mkdir(parents=True)
        (out / "config.json").write_text(hf_config(config).to_json_string(), encoding="utf-8")
        data = {k: np.ascontiguousarray(v, dtype=dtype) for k, v in tensors.items()}
        causal = np.tril(np.ones((config.n_ctx, config.n_ctx), dtype=dtype))[None, None]
        for i in range(config.n_layer):  # the buffers the hub's gpt2 file holds; both readers ignore them
            data[f"h.{i}.attn.bias"] = causal
            data[f"h.{i}.attn.masked_bias"] = np.array(-1e4, dtype=dtype)
        save_file(data, str(out / "model.safetensors"))
    shutil.copyfile(tokenizer_file, out / "tokenizer.json")
    return out


def draft_tensors(tensors, n_layer, noise=0.0, seed=0):
    """A draft made from a target's tensors by keeping every other layer (embeddings and ln_f shared), as
    DistilGPT2 was initialised (Sanh et al. 2019, section 3), plus Gaussian noise of `noise` times each
    block matrix's own std. Returns (tensors, its number of layers)."""
    rng = np.random.default_rng(seed)
    out = {name: tensors[name] for name in ("wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias")}
    keep = range(0, n_layer, 2)
    for j, i in enumerate(keep):
        for name, a in tensors.items():
            if name.startswith(f"h.{i}."):
                if noise and a.ndim == 2:
                    a = a + rng.normal(0, noise * a.std(), a.shape).astype(np.float32)
                out[f"h.{j}." + name[len(f"h.{i}."):]] = a
    return out, len(keep)


def byte_tokenizer_json():
    """A byte-level BPE tokenizer with no merges: ids 0..255 are GPT-2's byte alphabet, 256 is <|endoftext|>."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    from npspec.decode.text import byte_decoder

    by_byte = {b: c for c, b in byte_decoder().items()}
    tok = Tokenizer(models.BPE(vocab={by_byte[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    assert tok.token_to_id("<|endoftext|>") == EOS
    return tok.to_str()


def main(argv=None):
    from npspec.sources.init import init_tensors_varied

    import torch
    import transformers
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer

    from npspec.model.gpt2 import GPT2Config

    torch.manual_seed(SEED)
    config = GPT2Config(n_vocab=EOS + 1, n_ctx=N_CTX, n_embd=N_EMBD, n_head=N_HEAD, n_layer=N_LAYER, eos_token_id=EOS)
    model = hf_model(init_tensors_varied(config, SEED), config)

    tokenizer_json = byte_tokenizer_json()
    tok = Tokenizer.from_str(tokenizer_json)
    input_ids = np.array(tok.encode(TEXT).ids, dtype=np.int64)
    prompt_ids = np.array(tok.encode(PROMPT).ids, dtype=np.int64)
    assert len(input_ids) <= N_CTX and len(prompt_ids) + N_NEW <= N_CTX
    with torch.no_grad():
        logits = model(torch.from_numpy(input_ids)[None]).logits[0].numpy()
        mask = torch.ones(1, len(prompt_ids), dtype=torch.long)
        out = model.generate(torch.from_numpy(prompt_ids)[None], attention_mask=mask, max_new_tokens=N_NEW,
                             do_sample=False, eos_token_id=None, pad_token_id=EOS)
        greedy_ids = out[0, len(prompt_ids):].numpy()
        # the gap between the best and second-best logit at every greedy step: the stored ids must not
        # hinge on rounding (the test allows RTOL of the logits' scale)
        step_logits = model(out[:, :-1]).logits[0, len(prompt_ids) - 1:].numpy()
    top2 = np.sort(step_logits, axis=-1)[:, -2:]
    margin = float((top2[:, 1] - top2[:, 0]).min() / np.abs(step_logits).max())
    if margin < MIN_MARGIN:
        sys.exit(f"greedy margin {margin:.2e} is too small to be portable; change SEED")
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tok)
    greedy_text = hf_tok.decode(greedy_ids.tolist(), skip_special_tokens=True, clean_up_tokenization_spaces=False)

    OUT.mkdir(exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".reference-", dir=OUT))
    try:
        hf_dir = staging / "hf"
        model.save_pretrained(hf_dir)
        (hf_dir / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
        metadata = {
            "format_version": FORMAT_VERSION,
            "model_sha256": hashlib.sha256((hf_dir / "model.safetensors").read_bytes()).hexdigest(),
            "greedy_text": greedy_text, "min_greedy_margin": f"{margin:.3e}",
            "torch": torch.__version__, "transformers": transformers.__version__,
            "generator": "tests/data/make_reference.py",
        }
        save_file({"input_ids": input_ids, "logits": np.ascontiguousarray(logits, dtype=np.float32),
                   "prompt_ids": prompt_ids, "greedy_ids": greedy_ids.astype(np.int64)},
                  str(staging / "expected.safetensors"), metadata=metadata)
        for name in ("hf", "expected.safetensors"):  # replace each piece whole
            target = OUT / name
            if target.is_dir():
                shutil.rmtree(target)
            (staging / name).replace(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    sizes = {p.relative_to(OUT).as_posix(): p.stat().st_size for p in sorted(OUT.rglob("*")) if p.is_file()}
    print(json.dumps({"wrote": str(OUT), "bytes": sizes, **metadata}, indent=2))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent.parent))  # this checkout's npspec
    sys.exit(main())
