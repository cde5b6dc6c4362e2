"""Convert a Hugging Face GPT-2 checkpoint directory into npspec's layout.

    python -m npspec.convert SRC OUT_DIR

SRC is a directory as transformers' `save_pretrained` writes it (or as the hub holds it):
`config.json` + `model.safetensors` [+ `tokenizer.json`]. Tensor names may carry the
`transformer.` prefix or not; float16 sources are cast to float32; `attn.bias` and
`attn.masked_bias` buffers are ignored; an explicit `lm_head.weight` must equal `wte` (the
head is tied). Every problem is reported at once. Pickle files (`pytorch_model.bin`) are
never loaded. Writes are atomic (see checkpoint.save_converted).
"""

import argparse
import hashlib
import json
import re
import sys
import warnings
from pathlib import Path

import numpy as np

from .checkpoint import CheckpointError, save_converted, tensor_shapes
from .model import GPT2Config

IGNORED = re.compile(r"^h\.\d+\.attn\.(bias|masked_bias)$")


def sha256_file(path, chunk=1 << 20):
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def config_from_hf(cfg, where="config.json"):
    """GPT2Config from a transformers GPT-2 `config.json` dict. Raises CheckpointError."""
    try:
        return GPT2Config(
            n_vocab=int(cfg["vocab_size"]), n_ctx=int(cfg.get("n_positions", cfg.get("n_ctx"))),
            n_embd=int(cfg["n_embd"]), n_head=int(cfg["n_head"]), n_layer=int(cfg["n_layer"]),
            layer_norm_epsilon=float(cfg.get("layer_norm_epsilon", 1e-5)),
            eos_token_id=cfg.get("eos_token_id"))
    except (KeyError, TypeError) as e:
        raise CheckpointError(f"{where}: missing or bad GPT-2 field {e}") from e
    except ValueError as e:
        raise CheckpointError(f"{where}: {e}") from e


def read_hf_tensors(path):
    """All tensors of a Hugging Face safetensors file as float32 arrays, names without `transformer.`."""
    from safetensors import SafetensorError, safe_open

    tensors = {}
    try:
        with safe_open(str(path), framework="numpy") as f:
            for name in f.keys():
                a = f.get_tensor(name)
                key = name[len("transformer."):] if name.startswith("transformer.") else name
                tensors[key] = a
    except (SafetensorError, OSError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path} is not a readable safetensors file ({e})") from e
    return tensors


def convert_tensors(raw, config):
    """Check and cast `raw` (HF names, prefix stripped) to the tensors npspec stores.

    Returns `{name: float32 array}`. Warns about unexpected tensors; raises CheckpointError
    listing every missing, misshaped or non-finite tensor, and an untied `lm_head.weight`.
    """
    expected = tensor_shapes(config)
    problems, out = [], {}
    for name, shape in expected.items():
        if name not in raw:
            problems.append(f"missing tensor {name} {list(shape)}")
            continue
        a = raw[name]
        if tuple(a.shape) != shape:
            problems.append(f"tensor {name} has shape {list(a.shape)}, expected {list(shape)}")
            continue
        if a.dtype.kind != "f":
            problems.append(f"tensor {name} has dtype {a.dtype}, expected a float type")
            continue
        a = np.ascontiguousarray(a, dtype=np.float32)
        if not np.isfinite(a).all():
            problems.append(f"tensor {name} holds non-finite values")
        out[name] = a
    if "lm_head.weight" in raw and "wte.weight" in out:
        head = raw["lm_head.weight"]
        if head.shape != out["wte.weight"].shape or not np.array_equal(head.astype(np.float32), out["wte.weight"]):
            problems.append("lm_head.weight differs from wte.weight, but GPT-2's head is tied to wte "
                            "(npspec supports tied heads only)")
    if problems:
        raise CheckpointError("; ".join(problems))
    extra = sorted(n for n in raw if n not in expected and n != "lm_head.weight" and not IGNORED.match(n))
    if extra:
        warnings.warn(f"ignoring {len(extra)} unexpected tensor(s): {', '.join(extra)}", stacklevel=2)
    return out


def convert(src, out_dir, source=None, tokenizer_json=None):
    """Convert the Hugging Face checkpoint directory `src` into `out_dir`; return `out_dir` as a Path.

    source: the string stored as `source` in the metadata (default: the resolved `src` path).
    tokenizer_json: tokenizer text to use when `src` has no `tokenizer.json`.
    Raises CheckpointError naming the problem and the fix.
    """
    src, out_dir = Path(src), Path(out_dir)
    if not src.is_dir():
        raise CheckpointError(f"source {src} is not a directory; give a Hugging Face checkpoint directory")
    cfg_path, weights = src / "config.json", src / "model.safetensors"
    if not cfg_path.is_file():
        raise CheckpointError(f"{src} has no config.json; is it a Hugging Face GPT-2 checkpoint?")
    if not weights.is_file():
        hint = " (only pytorch_model.bin, a pickle file npspec never loads; re-save it with save_pretrained(..., safe_serialization=True))" \
            if (src / "pytorch_model.bin").exists() else ""
        raise CheckpointError(f"{src} has no model.safetensors{hint}")
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{cfg_path} is not valid JSON ({e})") from e
    config = config_from_hf(cfg, cfg_path)
    tok_path = src / "tokenizer.json"
    if tok_path.is_file():
        tokenizer_json = tok_path.read_text(encoding="utf-8")
    elif tokenizer_json is None:
        raise CheckpointError(f"{src} has no tokenizer.json; add the model's tokenizer.json to it")
    tensors = convert_tensors(read_hf_tensors(weights), config)
    save_converted(out_dir, tensors, config, source=source or str(src.resolve()),
                   source_sha256=sha256_file(weights), tokenizer_json=tokenizer_json)
    return out_dir


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m npspec.convert", description=__doc__.split("\n")[1])
    ap.add_argument("src", help="Hugging Face GPT-2 checkpoint directory (config.json + model.safetensors)")
    ap.add_argument("out_dir", help="where to write the npspec model (created if needed)")
    ap.add_argument("--debug", action="store_true", help="show a traceback on error")
    args = ap.parse_args(argv)
    try:
        out = convert(args.src, args.out_dir)
    except CheckpointError as e:
        if args.debug:
            raise
        print(f"npspec.convert: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
