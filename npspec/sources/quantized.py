"""Quantized models: quantize a Model, and save or load a quantized converted directory.

Imports npspec.model.gpt2 and npspec.kernels.products (to record a layer's inputs for AWQ), npspec.sources.files (the
converted format), npspec.model.model, npspec.kernels.quantized and npspec.sources.quantize; safetensors only, never pickle.

A quantized model is an ordinary npspec Model: with any kernel of npspec.kernels.products its quantized
tensors are dequantized to float32 when it is built or loaded (npspec.sources.quantize), so it runs the
very same forward and kernels as any model. With the kernel "dequant-panels" (npspec.kernels.quantized)
and an int scheme, its block matrices stay int8 codes and float32 scales
(qkernels.QuantizedMatrix), dequantized one panel at a time inside each product: the same
weights, a quarter of the bytes (embeddings, biases and layer norms stay float32; a +emb
scheme's wte and wpe are dequantized, and an AWQ model is always float32). Either way,
speculative decoding with it as the draft keeps the output exactly target-distributed and
greedy output identical to plain greedy decoding (any draft does: notes/derivation.md).
bench/qspeed.py measures what the codes cost in time.

A quantized converted directory is a converted directory (npspec.sources.files) whose
`model.safetensors` holds, for each quantized tensor NAME, `NAME.codes` (int8 codes, one a byte,
not packed; float16 values for fp16; uint16 bfloat16 bits for bf16) and, for int schemes,
`NAME.scales` (float32), every other tensor as float32 under its own name, and in its header
metadata `quantization` (the scheme's name, npspec.sources.quantize.parse_scheme) and
`quantization_format` besides the usual fields. Loading refuses a scheme it does not know. Its
`format_version` stays "1" (FILE_FORMAT): the codes and the float32 tensors are stored row-major in
the forward's shapes (npspec.sources.files' format 2 transposes only float32 block matrices, which a quantized
file does not hold); loading dequantizes them and Model lays the block matrices out, as before.
"""

import json
import os
from pathlib import Path

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from . import files
from .atomic import atomic_write
from .errors import CheckpointError, oneline
from .files import TOKENIZER_FILE, WEIGHTS_FILE, config_from_metadata, read_header, read_tokenizer, reading
from ..model.gpt2 import attention_masked, gpt2
from ..kernels.products import gemm
from ..model.model import Model
from ..kernels.registry import STATIC_DEFAULT, kernel as registry_kernel
from ..kernels.quantized import QuantizedMatrix, holds_codes
from .quantize import (LINEAR_SUFFIXES, Quantized, awq_round_trip, awq_search, dequantize_tensors, input_axis,
                       parse_scheme, quantize_tensors, quantized_names)
from ..model import tensors as gpt2_tensors
from ..model.tensors import params_tree, tensor_shapes

QUANTIZATION_FORMAT = "1"
FILE_FORMAT = "1"  # npspec.sources.files' format 1: every tensor row-major as the forward's shapes (format 2's layout is not used here)
HEADER_LIMIT = 100 << 20  # safetensors' own limit on a header's size (100 MB)
FIX = "requantize it with npspec.sources.quantized.save_quantized"


def flat_tensors(params, config):
    """flat_tensors (the tree as `{name: array}`, no copies), refusing a tree of int8 codes.

    Raises ValueError for a tree holding qkernels.QuantizedMatrix codes: quantize or save its float32 source.
    """
    if holds_codes(params):
        raise ValueError("this model holds int8 codes (kernel dequant-panels): quantize or save the float32 model "
                         "it came from instead")
    return gpt2_tensors.flat_tensors(params, config)


def quantized_model(config, tensors, quantized, scheme, tokenizer, source, kernel, threads, metadata, note=None):
    """The Model that `quantized` ({name: Quantized}) and the float32 rest of `tensors` stand for: dequantized,
    or, with a kernel that reads codes (registry.Kernel.reads_codes) and an int scheme, block matrices kept as
    QuantizedMatrix codes. note: passed to Model (a compiled kernel's compile time)."""
    codes = registry_kernel(kernel).reads_codes and scheme.kind == "int"
    kept = {n: q for n, q in quantized.items() if codes and n.endswith(LINEAR_SUFFIXES)}
    full = dequantize_tensors(tensors, {n: q for n, q in quantized.items() if n not in kept}, scheme)
    full.update({n: QuantizedMatrix.from_codes(q.codes, q.scales) for n, q in kept.items()})
    metadata = {**metadata, "quantization": scheme.name, "quantization_format": QUANTIZATION_FORMAT}
    return Model(config, params_tree(full, config), tokenizer, source, kernel, threads, metadata, note=note)


def quantize_model(model, scheme, kernel=None, threads=None):
    """`model` with its weights quantized by `scheme` (a npspec.sources.quantize.Scheme) and dequantized back to float32.

    Same config and tokenizer; source "<scheme>:<model's source>"; decodes with `kernel` and
    `threads` (default: the model's); kernel "dequant-panels" keeps an int scheme's block matrices as
    codes (module docstring). The original model is not changed (its tensors that the
    scheme leaves alone are shared, not copied). Memory: one more float32 copy of the
    quantized tensors (int8 codes with "dequant-panels"). Raises ValueError if the scheme's group
    does not divide a width, or if `model` itself holds codes.
    """
    tensors = flat_tensors(model.params, model.config)
    quantized = quantize_tensors(tensors, scheme)
    return quantized_model(model.config, tensors, quantized, scheme, model.tokenizer, f"{scheme.name}:{model.source}",
                           model.kernel if kernel is None else kernel, model.threads if threads is None else threads,
                           model.metadata)


def linear_inputs(model, windows):
    """{name: `[n, d_in]` float32}: the inputs each block linear of `model` receives while it reads `windows`.

    windows: id arrays, each read from a fresh cache with the prefill path (one GEMM per
    product); n is the total number of ids. Records them by running npspec.model.gpt2.gpt2 with a
    kernel that keeps a copy of each input it multiplies by a block matrix (the forward itself
    is unchanged). Memory: 4 bytes * n * 7 n_embd per layer (the inputs of its four linears).
    """
    names = {id(a): n for n, a in flat_tensors(model.params, model.config).items() if n.endswith(LINEAR_SUFFIXES)}
    store = {}

    def recording(x, w, b=None):
        name = names.get(id(w))
        if name is not None:
            store.setdefault(name, []).append(np.array(x, dtype=np.float32))
        return gemm(x, w, b)

    for ids in windows:
        gpt2(np.asarray(ids), model.params, model.config, model.new_cache(), recording, attention_masked)
    return {n: np.concatenate(v) for n, v in store.items()}


def awq_quantize_model(model, scheme, calibration, kernel=None, threads=None):
    """`model` quantized with `scheme` and AWQ's activation-aware scaling of every block linear (npspec.sources.quantize.awq_search).

    calibration: id arrays from TRAINING text (never the text the model is then evaluated on),
    whose activations (linear_inputs, from the float32 model) calibrate each layer's search.
    Lin et al. 2024 (AWQ), Section 3.2, with the scales folded into the dequantized weights
    (Q(diag(s) w) / s) rather than into the previous operation: the same products. Tensors
    that are not block linears (the embeddings of a +emb scheme) get plain round-to-nearest.
    Returns a Model with source "<scheme>-awq:<source>" and metadata `quantization_method`
    "awq" and `awq_alpha` (a JSON {name: alpha}); in memory only (save_quantized writes RTN).
    Raises ValueError for a 16-bit scheme or a group that does not divide a width.
    """
    tensors = flat_tensors(model.params, model.config)
    full = dequantize_tensors(tensors, quantize_tensors(tensors, scheme), scheme)
    alphas = {}
    for name, x in linear_inputs(model, calibration).items():
        s, alphas[name], _ = awq_search(x, tensors[name], scheme)
        full[name] = awq_round_trip(tensors[name], s, scheme)
    metadata = {**model.metadata, "quantization": scheme.name, "quantization_method": "awq",
                "awq_alpha": json.dumps(alphas)}
    return Model(model.config, params_tree(full, model.config), model.tokenizer, f"{scheme.name}-awq:{model.source}",
                 model.kernel if kernel is None else kernel, model.threads if threads is None else threads, metadata)


def save_quantized(out_dir, model, scheme):
    """Write `model` quantized with `scheme` as a quantized converted directory (module docstring), each file atomically.

    model: a Model with a tokenizer. The metadata keeps the usual fields (config, source) and
    names the scheme. Returns the directory (a Path). Raises ValueError as quantize_model,
    CheckpointError for a model without a tokenizer.
    """
    if model.tokenizer is None:
        raise CheckpointError("cannot save a model without a tokenizer")
    c = model.config
    tensors = flat_tensors(model.params, c)
    quantized = quantize_tensors(tensors, scheme)
    out = {}
    for name, t in tensors.items():
        if name in quantized:
            out[f"{name}.codes"] = np.ascontiguousarray(quantized[name].codes)
            if quantized[name].scales is not None:
                out[f"{name}.scales"] = np.ascontiguousarray(quantized[name].scales)
        else:
            out[name] = np.ascontiguousarray(t, dtype=np.float32)
    metadata = {"format_version": FILE_FORMAT, "n_vocab": c.n_vocab, "n_ctx": c.n_ctx, "n_embd": c.n_embd, "n_head": c.n_head,
                "n_layer": c.n_layer, "layer_norm_epsilon": c.layer_norm_epsilon, "eos_token_id": c.eos_token_id,
                "source": model.metadata.get("source", model.source),
                "source_sha256": model.metadata.get("source_sha256", ""),
                "quantization": scheme.name, "quantization_format": QUANTIZATION_FORMAT}
    metadata = {k: json.dumps(v) if not isinstance(v, str) else v for k, v in metadata.items()}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(out_dir / WEIGHTS_FILE, lambda tmp: save_file(out, tmp, metadata=metadata))
    atomic_write(out_dir / TOKENIZER_FILE,
                 lambda tmp: Path(tmp).write_text(model.tokenizer.to_str(), encoding="utf-8"))
    return out_dir


def is_quantized(path):
    """True if `path` is a directory whose model.safetensors header names a quantization (reads the header only).

    False for anything else, unreadable files included (npspec.sources.files.load_model then reports them).
    """
    weights = Path(path) / WEIGHTS_FILE
    if not weights.is_file():  # a FIFO would block open() forever; a directory, a device: not a model
        return False
    try:
        with open(weights, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            if n > min(os.fstat(fh.fileno()).st_size - 8, HEADER_LIMIT):  # not safetensors: never read n bytes
                return False
            return "quantization" in read_header(fh)[1].get("__metadata__", {})
    except (OSError, ValueError, AttributeError, TypeError):
        return False


def load_quantized(path, kernel=STATIC_DEFAULT, threads=1, note=None):
    """Load a quantized converted directory into a Model (dequantized float32 weights) decoding with `kernel`, `threads`
    (note: None, or told a compiled kernel's compile time).

    Raises CheckpointError, one line naming the problem and the fix: an unknown scheme or
    quantization format, missing or misshaped codes or scales, codes of the wrong dtype, a file
    safetensors cannot read, a malformed tokenizer.json.
    """
    path = Path(path)
    weights, tok = path / WEIGHTS_FILE, path / TOKENIZER_FILE
    with reading(weights, FIX):
        with safe_open(str(weights), framework="numpy") as f:
            metadata = f.metadata() or {}
            config = config_from_metadata(metadata, weights, versions=(FILE_FORMAT,))
            if metadata.get("quantization_format") != QUANTIZATION_FORMAT:
                raise CheckpointError(f"{weights}: quantization format {metadata.get('quantization_format')!r} is "
                                      f"unknown (expected {QUANTIZATION_FORMAT!r}); {FIX}")
            try:
                scheme = parse_scheme(metadata.get("quantization", ""))
            except ValueError as e:
                raise CheckpointError(f"{weights} names a quantization this npspec cannot load ({oneline(e)})") from e
            tensors, quantized = read_quantized(f, config, scheme, weights)
    tokenizer = read_tokenizer(tok, FIX)
    return quantized_model(config, tensors, quantized, scheme, tokenizer, path, kernel, threads, metadata, note)


CODE_DTYPES = {"int": np.int8, "fp16": np.float16, "bf16": np.uint16}


def read_quantized(f, config, scheme, where):
    """(float32 tensors, {name: Quantized}) from an open safetensors file `f`; CheckpointError lists every problem."""
    shapes = tensor_shapes(config)
    names = set(f.keys())
    chosen = set(quantized_names(list(shapes), scheme))
    tensors, quantized, problems = {}, {}, []
    for name, shape in shapes.items():
        if name not in chosen:
            if name not in names:
                problems.append(f"missing tensor {name} {list(shape)}")
                continue
            tensors[name] = f.get_tensor(name)
            if tensors[name].shape != shape or tensors[name].dtype != np.float32:
                problems.append(f"tensor {name} is {tensors[name].dtype} {list(tensors[name].shape)}, "
                                f"expected float32 {list(shape)}")
            continue
        if f"{name}.codes" not in names or (scheme.kind == "int" and f"{name}.scales" not in names):
            problems.append(f"missing the codes or scales of {name}")
            continue
        codes = f.get_tensor(f"{name}.codes")
        scales = f.get_tensor(f"{name}.scales") if scheme.kind == "int" else None
        if codes.shape != shape or codes.dtype != CODE_DTYPES[scheme.kind]:
            problems.append(f"{name}.codes is {codes.dtype} {list(codes.shape)}, expected "
                            f"{np.dtype(CODE_DTYPES[scheme.kind])} {list(shape)}")
        elif scales is not None and (scales.dtype != np.float32 or scales.shape != expected_scales(name, shape, scheme)):
            problems.append(f"{name}.scales is {scales.dtype} {list(scales.shape)}, expected float32 "
                            f"{list(expected_scales(name, shape, scheme))}")
        else:
            quantized[name] = Quantized(codes, scales)
    if problems:
        raise CheckpointError(f"{where}: " + "; ".join(problems) + f"; {FIX}")
    return tensors, quantized


def expected_scales(name, shape, scheme):
    """The shape of a tensor's scales under an int scheme: its input axis divided by the group (per channel: 1)."""
    axis = input_axis(name)
    out = list(shape)
    out[axis] = 1 if scheme.group is None else shape[axis] // scheme.group
    return tuple(out)
