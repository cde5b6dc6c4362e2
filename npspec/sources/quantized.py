"""Quantized models: quantize a Model (npspec.sources.quantize: RTN or AWQ), save and load a quantized directory.

A quantized model is an ordinary Model whose quantized tensors are dequantized to float32; with a kernel reading
codes and an int scheme its block matrices stay int codes and float32 scales ("dequant-panels":
npspec.kernels.quantized.QuantizedMatrix; "compiled-quant": compiled.QuantPanels, 4-bit codes two a byte, and a +emb
scheme's tied head too); an AWQ model stays float32. As a draft it keeps speculative decoding exact (notes/derivation.md). A quantized directory is a converted
one (npspec.sources.files, format_version "1": row-major in the forward's shapes) holding `NAME.codes` (int8, float16
or uint16 bfloat16 bits) and, for int schemes, `NAME.scales` (float32) for each quantized NAME, the rest float32,
and header fields `quantization` (the scheme's name) and `quantization_format`. Imports npspec.model,
npspec.kernels (products, quantized, registry), npspec.sources' atomic, errors, files, quantize; safetensors.
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
from ..kernels.quantized import holds_codes
from .quantize import (LINEAR_SUFFIXES, Quantized, awq_round_trip, awq_search, check_scheme, dequantize_tensors,
                       input_axis, parse_scheme, quantize_tensor, quantize_tensors, quantized_names)
from ..model import tensors as gpt2_tensors
from ..model.tensors import params_tree, tensor_shapes

QUANTIZATION_FORMAT = "1"
FILE_FORMAT = "1"  # npspec.sources.files' format 1: every tensor row-major as the forward's shapes (format 2's layout is not used here)
HEADER_LIMIT = 100 << 20  # safetensors' own limit on a header's size (100 MB)
FIX = "requantize it with npspec.sources.quantized.save_quantized"


def flat_tensors(params, config):
    """The tree as {name: array} (no copies). Raises ValueError for a tree of int8 codes (QuantizedMatrix)."""
    if holds_codes(params):
        raise ValueError("this model holds int8 codes (kernel dequant-panels): quantize or save the float32 model "
                         "it came from instead")
    return gpt2_tensors.flat_tensors(params, config)


def quantized_model(config, tensors, quantized, scheme, tokenizer, source, kernel, threads, metadata):
    """The Model `quantized` ({name: Quantized, or the kernel's codes object for as_codes names}) and the float32
    rest of `tensors` stand for:
    dequantized, or with a kernel that reads codes and an int scheme, block matrices kept as its codes class (and a
    +emb scheme's wte as its tied class, if it has one)."""
    spec = registry_kernel(kernel)
    kept = {n: q for n, q in quantized.items() if as_codes(n, spec, scheme) or
            (n == "wte.weight" and spec.reads_codes and scheme.kind == "int" and spec.tied is not None)}
    full = dequantize_tensors(tensors, {n: q for n, q in quantized.items() if n not in kept}, scheme)
    full.update({n: q if isinstance(q, spec.codes) else spec.codes.from_codes(q.codes, q.scales)
                 for n, q in kept.items() if n != "wte.weight"})
    if "wte.weight" in kept:  # the tied head's codes: wte.T's, [n_embd, n_vocab]
        full["wte.weight"] = spec.tied(spec.codes.from_codes(kept["wte.weight"].codes.T, kept["wte.weight"].scales.T))
    metadata = {**metadata, "quantization": scheme.name, "quantization_format": QUANTIZATION_FORMAT}
    return Model(config, params_tree(full, config), tokenizer, source, kernel, threads, metadata)


def as_codes(name, spec, scheme):  # -> whether a model decoding with Kernel `spec` keeps tensor `name` as codes
    return spec.reads_codes and scheme.kind == "int" and name.endswith(LINEAR_SUFFIXES)


def quantize_model(model, scheme, kernel=None, threads=None):
    """`model` quantized by `scheme`, source "<scheme>:<source>", decoding with `kernel` and `threads`
    (default the model's; "dequant-panels" keeps an int scheme's codes); `model` is unchanged, the tensors the scheme
    leaves alone shared. Raises ValueError for a group that does not divide a width or a model holding codes."""
    kernel = model.kernel if kernel is None else kernel
    spec = registry_kernel(kernel)
    tensors = flat_tensors(model.params, model.config)
    check_scheme(scheme, {n: t.shape for n, t in tensors.items()})
    quantized = {}
    for n in quantized_names(tensors, scheme):  # kept codes laid out one tensor at a time: no int8 copy of them all
        q = quantize_tensor(tensors[n], scheme, input_axis(n))
        quantized[n] = spec.codes.from_codes(q.codes, q.scales) if as_codes(n, spec, scheme) else q
    return quantized_model(model.config, tensors, quantized, scheme, model.tokenizer, f"{scheme.name}:{model.source}",
                           kernel, model.threads if threads is None else threads, model.metadata)


def linear_inputs(model, windows):
    """{name: `[n, d_in]` float32}: the inputs each block linear of `model` multiplies while it prefills
    each of `windows` (id arrays; n their total) from a fresh cache. Memory: 4 bytes * n * 7 n_embd a layer."""
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
    """`model` quantized by `scheme` with AWQ's scaling of every block linear (quantize.awq_search on
    linear_inputs of `calibration`, TRAINING ids; Lin et al. 2024 section 3.2, the scales folded into the weights),
    RTN for the embeddings of +emb; source "<scheme>-awq:<source>", metadata quantization_method "awq" and awq_alpha
    (JSON {name: alpha}); in memory only. Raises ValueError for a 16-bit scheme or a group not dividing a width."""
    tensors = {k: np.asarray(v) for k, v in flat_tensors(model.params, model.config).items()}  # packed: unpacked
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
    """Write `model` (with a tokenizer) quantized by `scheme` as a quantized directory, each file
    atomically; returns its Path. Raises ValueError as quantize_model, CheckpointError without a tokenizer."""
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
    """Whether `path` is a directory whose model.safetensors header names a quantization (False for
    anything unreadable: load_model reports it)."""
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


def load_quantized(path, kernel=STATIC_DEFAULT, threads=1):
    """A Model (dequantized float32) of a quantized directory, decoding with `kernel` at `threads`. Raises
    CheckpointError with the fix: an unknown scheme or format, missing or misshaped codes or scales, codes of the wrong
    dtype, a file safetensors cannot read, a bad tokenizer.json."""
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
    return quantized_model(config, tensors, quantized, scheme, tokenizer, path, kernel, threads, metadata)


CODE_DTYPES = {"int": np.int8, "fp16": np.float16, "bf16": np.uint16}


def read_quantized(f, config, scheme, where):
    """(float32 tensors, {name: Quantized}) of the open file `f`. Raises CheckpointError listing every
    problem."""
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


def expected_scales(name, shape, scheme):  # -> a tensor's scales' shape: its input axis divided by the group
    axis = input_axis(name)
    out = list(shape)
    out[axis] = 1 if scheme.group is None else shape[axis] // scheme.group
    return tuple(out)
