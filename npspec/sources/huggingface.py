"""Hugging Face GPT-2 checkpoints: read them, check them (every check lives here: read_source for the config and
tokenizer, convert_tensors for the tensors), convert them into npspec's layout (`npspec convert SRC OUT_DIR`).

SRC holds `config.json` + `model.safetensors` [+ `tokenizer.json`], as save_pretrained writes it or the hub holds it.
Names with or without `transformer.`; float16, bfloat16 and float64 cast to float32; `attn.bias` buffers ignored; an
explicit `lm_head.weight` must equal `wte`. Every problem is reported at once; pickle is never loaded. Imports
npspec.sources' atomic, errors, files, progress; npspec.model; safetensors, tokenizers.
"""

import hashlib
import json
import os
import re
import warnings
from pathlib import Path

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file
from tokenizers import Tokenizer

from .atomic import described, kind, resolved
from .errors import CheckpointError, capped, oneline
from .files import out_dir_problem, read_header, read_tensor, reading, save_converted, unreadable, write_dir
from ..model.gpt2 import GPT2Config
from .progress import bar
from ..model.tensors import layer_count_problem, tensor_shapes

IGNORED = re.compile(r"^h\.[0-9]+\.attn\.(bias|masked_bias)$")


def sha256_file(path, chunk=1 << 20, progress=None):
    """Hex sha256 of a file's bytes (progress: None or a bar factory)."""
    h = hashlib.sha256()
    with open(path, "rb") as f, bar(progress, f"sha256 of {Path(path).name}", os.fstat(f.fileno()).st_size) as b:
        while block := f.read(chunk):
            h.update(block)
            b.update(len(block))
    return h.hexdigest()


def config_from_hf(cfg, where="config.json"):
    """GPT2Config from a transformers GPT-2 config.json dict. Raises CheckpointError for a missing or bad
    field and a variant npspec does not compute (another model_type, activation, MLP width, attention scaling)."""
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{where}: expected a JSON object, got {type(cfg).__name__}")
    unsupported = []
    if cfg.get("model_type", "gpt2") != "gpt2":
        unsupported.append(f"model_type {cfg['model_type']!r} (npspec runs GPT-2 only)")
    if cfg.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
        unsupported.append(f"activation_function {cfg['activation_function']!r} (GPT-2's is gelu_new)")
    if cfg.get("n_inner") is not None and cfg.get("n_inner") != 4 * cfg.get("n_embd", 0):
        unsupported.append(f"n_inner {cfg['n_inner']!r} (GPT-2's MLP is 4 * n_embd wide)")
    if cfg.get("scale_attn_by_inverse_layer_idx") or cfg.get("scale_attn_weights") is False:
        unsupported.append("non-standard attention scaling (scale_attn_by_inverse_layer_idx / scale_attn_weights)")
    if unsupported:
        raise CheckpointError(f"{where}: unsupported " + "; ".join(unsupported))
    missing = [k for k in ("vocab_size", "n_embd", "n_head", "n_layer") if k not in cfg]
    if "n_positions" not in cfg and "n_ctx" not in cfg:
        missing.append("n_positions")
    if missing:
        raise CheckpointError(f"{where}: missing GPT-2 field(s) {', '.join(missing)}; is it a GPT-2 config.json?")
    eos = cfg.get("eos_token_id")
    if isinstance(eos, list):  # newer configs may list several; GPT-2 has one
        eos = eos[0] if eos else None
    try:
        for k in ("vocab_size", "n_positions", "n_ctx", "n_embd", "n_head", "n_layer"):
            if k in cfg and (isinstance(cfg[k], bool) or not isinstance(cfg[k], int)):
                raise ValueError(f"{k} must be an integer, got {cfg[k]!r}")
        if eos is not None and (isinstance(eos, bool) or not isinstance(eos, int)):
            raise ValueError(f"eos_token_id must be an integer or null, got {eos!r}")
        eps = cfg.get("layer_norm_epsilon", 1e-5)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)):
            raise TypeError(f"layer_norm_epsilon must be a finite number > 0, got {eps!r}")
        if isinstance(eps, int) and abs(eps) > 10 ** 39:  # float() would overflow; float32 holds < 3.5e38
            raise ValueError(f"layer_norm_epsilon must be a finite number > 0 that float32 holds, got an integer of "
                             f"{len(str(abs(eps))):,} digits")
        return GPT2Config(
            n_vocab=cfg["vocab_size"], n_ctx=cfg.get("n_positions", cfg.get("n_ctx")),
            n_embd=cfg["n_embd"], n_head=cfg["n_head"], n_layer=cfg["n_layer"],
            layer_norm_epsilon=float(eps), eos_token_id=eos)
    except (ValueError, TypeError) as e:
        fix = "" if "config.json" in str(e) else "; fix the checkpoint's config.json"
        raise CheckpointError(f"{where}: {oneline(e)}{fix}") from e


NUMPY_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
                "I8": "i1", "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?"}


def widen_bf16(bits):  # [...] uint16 -> [...] float32
    """bfloat16 bit patterns -> float32, exactly (a bfloat16 is a float32's top 16 bits)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def read_hf_tensors(path, progress=None):
    """{name without `transformer.`: array} of a Hugging Face safetensors file, in its dtypes but bfloat16
    (widened to float32 from its raw bytes), each read once with readinto. Raises CheckpointError for a file
    safetensors cannot read and dtypes numpy cannot hold (F8...)."""
    tensors, exotic = {}, []
    with reading(path):
        with safe_open(str(path), framework="numpy") as f:
            dtypes = {name: f.get_slice(name).get_dtype() for name in f.keys()}
        with open(path, "rb") as fh:
            data_start, header = read_header(fh)
            sizes = {name: header[name]["data_offsets"][1] - header[name]["data_offsets"][0] for name in dtypes}
            with bar(progress, f"reading {Path(path).name}", sum(sizes.values())) as b:
                for name, dtype in dtypes.items():
                    key = name[len("transformer."):] if name.startswith("transformer.") else name
                    if dtype in NUMPY_DTYPES:
                        a = read_tensor(fh, data_start, header[name], NUMPY_DTYPES[dtype], f"{path} (tensor {name})")
                        tensors[key] = widen_bf16(a) if dtype == "BF16" else a
                    elif not IGNORED.match(key):
                        exotic.append(f"{name} ({dtype})")
                    b.update(sizes[name])
    if exotic:
        raise CheckpointError(f"{path}: tensors of a dtype npspec cannot read: {capped(exotic)}; "
                              "save the checkpoint in float32, float16 or bfloat16")
    return tensors


def convert_tensors(raw, config):
    """{name: float32 array} npspec stores, from `raw` (prefix stripped), warning about unexpected
    tensors. Raises CheckpointError listing missing, misshaped or non-finite tensors (ten, then a count), an untied
    lm_head.weight, or (one line) far more layers asked for than `raw` holds."""
    if problem := layer_count_problem(config, list(raw), "config.json"):
        raise CheckpointError(f"{problem}; fix n_layer in config.json")
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
        raise CheckpointError(capped(problems))
    extra = sorted(n for n in raw if n not in expected and n != "lm_head.weight" and not IGNORED.match(n))
    if extra:
        warnings.warn(f"ignoring {len(extra)} unexpected tensor(s): {capped(extra).replace('; ', ', ')}", stacklevel=2)
    return out


def check_tokenizer(tokenizer_json, config, where, fix):
    """The Tokenizer of `tokenizer_json`. Raises CheckpointError ending with `fix` for text tokenizers
    cannot parse or more ids than n_vocab (another model's tokenizer)."""
    try:
        tokenizer = Tokenizer.from_str(tokenizer_json)
    except Exception as e:  # tokenizers raises a bare Exception for malformed JSON
        raise CheckpointError(f"{where} is not a valid tokenizers file ({oneline(e)}); {fix}") from e
    if tokenizer.get_vocab_size() > config.n_vocab:
        raise CheckpointError(f"{where} has {tokenizer.get_vocab_size()} ids but the model's n_vocab is "
                              f"{config.n_vocab}: it is not this model's tokenizer; {fix}")
    return tokenizer


def no_weights_error(src):
    """The CheckpointError for a checkpoint without model.safetensors, with the fix that fits."""
    src = Path(src)
    if (src / "model.safetensors.index.json").exists():
        hint = (" (it is sharded; npspec reads one model.safetensors: re-save it with "
                "save_pretrained(..., max_shard_size='100GB'))")
    elif (src / "pytorch_model.bin").exists():
        hint = (" (only pytorch_model.bin, a pickle file npspec never loads; re-save it with "
                "save_pretrained(..., safe_serialization=True))")
    else:
        hint = ""
    return CheckpointError(f"{src} has no model.safetensors{hint}")


def read_source(src, tokenizer_json=None):
    """(config, tokenizer text) of a Hugging Face directory, checked before any tensor is read: config.json,
    a model.safetensors header holding the tensors the config asks for (model.tensors.layer_count_problem), and
    `src/tokenizer.json` else `tokenizer_json`, parsing and fitting n_vocab. Raises CheckpointError with the fix (a file there but
    not a regular file is named as what it is)."""
    src = Path(src)
    if not src.is_dir():
        raise CheckpointError(f"source {src} is not a directory; give a Hugging Face checkpoint directory")
    cfg_path = src / "config.json"
    if not cfg_path.is_file():
        if kind(cfg_path) == "missing":
            raise CheckpointError(f"{src} has no config.json; is it a Hugging Face GPT-2 checkpoint?")
        raise CheckpointError(f"{cfg_path} is {described(cfg_path)}, not a regular file; put the checkpoint's own "
                              "config.json there")
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{cfg_path} is not valid JSON ({oneline(e)})") from e
    except RecursionError:  # Python's parser recurses once per bracket
        raise CheckpointError(f"{cfg_path} nests brackets deeper than the JSON parser can follow, so it is not a "
                              "GPT-2 config; put the checkpoint's own config.json there") from None
    except OSError as e:
        raise unreadable(cfg_path, e) from e
    config = config_from_hf(cfg, cfg_path)
    weights = src / "model.safetensors"
    if not weights.is_file():
        if kind(weights) != "missing":
            raise CheckpointError(f"{weights} is {described(weights)}, not a regular file; put the checkpoint's "
                                  "model.safetensors there")
        raise no_weights_error(src)
    with reading(weights), safe_open(str(weights), framework="numpy") as f:  # the header only: cheap
        names = list(f.keys())
    if problem := layer_count_problem(config, names, cfg_path):
        raise CheckpointError(f"{problem} ({weights}); fix n_layer in config.json")
    tok_path = src / "tokenizer.json"
    fix = f"put the model's own tokenizer.json in {src}"
    if tok_path.is_file():
        try:
            tokenizer_json, where = tok_path.read_text(encoding="utf-8"), tok_path
        except UnicodeDecodeError as e:
            raise CheckpointError(f"{tok_path} is not UTF-8 text ({e.reason} at byte {e.start:,}), so not a "
                                  f"tokenizers file; {fix}") from None
        except OSError as e:
            raise unreadable(tok_path, e) from e
    elif kind(tok_path) != "missing":  # never replaced by GPT-2's as if it were absent
        raise CheckpointError(f"{tok_path} is {described(tok_path)}, not a regular file; {fix}")
    elif tokenizer_json is None:
        raise CheckpointError(f"{src} has no tokenizer.json; add the model's tokenizer.json to it")
    else:
        where = f"GPT-2's tokenizer (used because {src} has no tokenizer.json)"
    check_tokenizer(tokenizer_json, config, where, fix)
    return config, tokenizer_json


def _converted(src, tokenizer_json, source, source_sha256):
    """save_converted's arguments but the directory, for the checked `src`. Raises CheckpointError."""
    config, tokenizer_json = read_source(src, tokenizer_json)
    return {"config": config, "tokenizer_json": tokenizer_json, "source": source or str(src.resolve()),
            "source_sha256": source_sha256}


def _save(src, save, progress=None):
    weights = src / "model.safetensors"
    tensors = convert_tensors(read_hf_tensors(weights, progress), save["config"])
    sha = save["source_sha256"] or sha256_file(weights, progress=progress)
    return lambda out: save_converted(out, tensors, **{**save, "source_sha256": sha}, progress=progress)


def overlap_problem(src, out_dir):
    """One line if OUT_DIR is SRC, inside it or holds it, or a symlink on either loops, else None."""
    try:
        s, o = resolved(src, "source"), resolved(out_dir, "OUT_DIR")
    except ValueError as e:  # a symlink loop
        return str(e)
    if o == s or s in o.parents:
        return (f"OUT_DIR {out_dir} is the source checkpoint {src} or inside it; npspec's files would replace or "
                "mix with the checkpoint's: choose an OUT_DIR outside the source")
    if o in s.parents:
        return f"the source checkpoint {src} is inside OUT_DIR {out_dir}; choose an OUT_DIR outside the source"
    return None


def convert(src, out_dir, source=None, tokenizer_json=None, source_sha256=None, force=False, progress=None):
    """Convert the Hugging Face directory `src` into `out_dir` (returned as a Path): new or empty, or with
    `force` one holding only an npspec model, never src, inside it or holding it; written whole or not at all
    (files.write_dir), every check (paths, config, tokenizer, out_dir) before a tensor is read. source: the metadata's
    `source` (default the resolved src); tokenizer_json: the text used without src/tokenizer.json; source_sha256:
    src's weights' hash if known; progress: None or a bar factory. Memory: about the weights (1.5x from float16).
    Raises CheckpointError with the fix, out_dir then as it was."""
    src, out_dir = Path(src), Path(out_dir)
    if problem := overlap_problem(src, out_dir):
        raise CheckpointError(problem)
    save = _converted(src, tokenizer_json, source, source_sha256)
    if problem := out_dir_problem(out_dir, force):
        raise CheckpointError(problem)
    return write_dir(out_dir, _save(src, save, progress), force)


def convert_into(src, out_dir, source=None, tokenizer_json=None, source_sha256=None, progress=None):
    """Convert `src` into the existing empty `out_dir` the caller publishes (the cache's staging directory);
    arguments as convert. Raises CheckpointError."""
    src = Path(src)
    _save(src, _converted(src, tokenizer_json, source, source_sha256), progress)(Path(out_dir))
    return Path(out_dir)


def write_hf_checkpoint(out_dir, tensors, config, prefix="", dtype=np.float32):
    """Write `tensors` (npspec names) as a Hugging Face GPT-2 checkpoint (config.json +
    model.safetensors), names with `prefix`, in `dtype`: convert's inverse without the tokenizer, for tests."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "activation_function": "gelu_new",
           "vocab_size": config.n_vocab, "n_positions": config.n_ctx, "n_ctx": config.n_ctx,
           "n_embd": config.n_embd, "n_head": config.n_head, "n_layer": config.n_layer,
           "layer_norm_epsilon": config.layer_norm_epsilon, "bos_token_id": config.eos_token_id,
           "eos_token_id": config.eos_token_id, "tie_word_embeddings": True}
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    save_file({prefix + k: np.ascontiguousarray(v, dtype=dtype) for k, v in tensors.items()},
              str(out_dir / "model.safetensors"))
    return out_dir
