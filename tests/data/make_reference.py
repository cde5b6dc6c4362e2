"""Write the stored oracle reference: a tiny GPT-2 checkpoint and what transformers computes on it.

    pip install -e '.[oracle]'          # torch + transformers
    python tests/data/make_reference.py

tests/test_reference.py checks npspec against these files on every run, without torch, so that a
user without the oracle extra still checks npspec's forward against Hugging Face transformers'
GPT2LMHeadModel. Writes, atomically, into tests/data/reference/:
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
and prints the command above. Rerunning writes bit-identical tensors (only the order of the
metadata in expected.safetensors' header may change). The weights are GPT-2's init (npspec.init) with larger weights,
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
# tests/test_oracle_family.py). The greedy ids must not hinge on rounding: every step's best logit
# leads the second by at least MIN_MARGIN of max |logit|, checked here before writing.
RTOL = 5e-5
MIN_MARGIN = 1e-3


def byte_tokenizer_json():
    """A byte-level BPE tokenizer with no merges: ids 0..255 are GPT-2's byte alphabet, 256 is <|endoftext|>."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    from npspec.text import byte_decoder

    by_byte = {b: c for c, b in byte_decoder().items()}
    tok = Tokenizer(models.BPE(vocab={by_byte[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    assert tok.token_to_id("<|endoftext|>") == EOS
    return tok.to_str()


def main(argv=None):
    from npspec.init import init_tensors_varied

    import torch
    import transformers
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer

    from npspec.model import GPT2Config

    torch.manual_seed(SEED)
    config = GPT2Config(n_vocab=EOS + 1, n_ctx=N_CTX, n_embd=N_EMBD, n_head=N_HEAD, n_layer=N_LAYER, eos_token_id=EOS)
    hf_config = transformers.GPT2Config(
        vocab_size=config.n_vocab, n_positions=N_CTX, n_embd=N_EMBD, n_head=N_HEAD, n_layer=N_LAYER,
        activation_function="gelu_new", layer_norm_epsilon=config.layer_norm_epsilon,
        bos_token_id=EOS, eos_token_id=EOS, tie_word_embeddings=True)
    model = transformers.GPT2LMHeadModel(hf_config)
    missing, unexpected = model.load_state_dict(
        {"transformer." + k: torch.from_numpy(v) for k, v in init_tensors_varied(config, SEED).items()}, strict=False)
    assert missing == ["lm_head.weight"] and not unexpected, (missing, unexpected)  # the head is tied
    model.eval()

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
