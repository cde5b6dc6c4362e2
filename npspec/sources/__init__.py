"""Where models come from: `load(spec, role)`, the SPEC rules, the shipped pair and `random_model`.

A SPEC is resolved in this order:
  1. an existing local path: a converted npspec directory (model.safetensors + tokenizer.json),
     or a Hugging Face checkpoint directory (config.json + model.safetensors [+ tokenizer.json]),
     converted on first use into the cache;
  2. `random:<shape>`, a name of npspec.sources.names (gpt2, gpt2-medium, gpt2-large, gpt2-xl,
     distilgpt2, tiny, tiny-draft): GPT-2's initialisation, seed 0, built once into the cache;
  3. a hub name: gpt2, gpt2-medium, gpt2-large, gpt2-xl (openai-community/...), distilgpt2
     (distilbert/distilgpt2), or any `org/name`: downloaded with huggingface_hub and converted
     once into the cache.
A Hugging Face checkpoint without tokenizer.json gets GPT-2's tokenizer (weights/gpt2/). The
cache directory and its layout are described in npspec.sources.cache.

A quantized SPEC, `SCHEME:SPEC` (not an existing path), is the model SPEC names quantized with
SCHEME (npspec.sources.quantize.parse_scheme: int<bits>-ch, int<bits>-g<group>, fp16, bf16, each
optionally +emb), built in memory (npspec.sources.quantized.quantize_model); `SCHEME:self` is the target
quantized, the self-speculative draft: `--draft int4-g64:self`. SPEC may itself be quantized, so
`int8-ch:fp16:DIR` is DIR quantized with fp16, then with int8-ch (any number of prefixes, the innermost
applied first). A directory written by
npspec.sources.quantized.save_quantized loads like any converted directory.

Submodules: `names` (the one registry of names), `cache` (the conversion cache and the hub),
`shipped` (the files npspec ships). Imports npspec.sources.atomic, npspec.sources.choices (a role's kernel), npspec.sources.errors, npspec.sources.files,
npspec.sources.init, npspec.model.model, npspec.kernels.quantized (holds_codes), npspec.sources.quantize, npspec.sources.quantized, npspec.kernels.registry and those.
"""

import os
import re
from pathlib import Path

from .atomic import expand, resolved
from .choices import CACHE_FILE, choose, choose_prefill
from ..kernels.compiled import KernelUnavailable
from .errors import CheckpointError, NoCodes
from .files import load_model
from ..model.tensors import params_tree
from .init import init_tensors
from ..model.model import Model
from .quantize import parse_scheme
from ..kernels.quantized import holds_codes
from .quantized import is_quantized, load_quantized, quantize_model
from ..kernels.registry import REGISTRY, ROLES, STATIC_DEFAULT, kernel as registry_kernel, role_candidates
from . import cache
from .names import HUB_NAMES, SHAPES
from .shipped import SHIPPED_PAIR, gpt2_tokenizer, shipped_dir


def cache_root(cache_dir=None):
    """The conversion cache's directory: `cache_dir` if given, else cache.cache_dir() ($NPSPEC_CACHE, ...)."""
    return Path(cache_dir).expanduser() if cache_dir is not None else cache.cache_dir()


def _is_repo_id(name):
    # org/name as the hub spells it: one slash, letters, digits, '-', '_', '.', no leading or trailing '-' / '.'
    return re.fullmatch(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*", name) is not None and \
        ".." not in name and not name.endswith((".", "-"))


def resolve(spec, cache_dir=None, progress=None, note=None):
    """The converted model directory a SPEC (see the module docstring) names, converted into the cache first if needed.

    cache_dir: npspec's cache (default cache.cache_dir(): $NPSPEC_CACHE or ~/.cache/npspec).
    progress: a bar factory (npspec.sources.progress) for a build or conversion; None shows nothing.
    note: None, or called with one line for the user (a conversion starting, a wait for another process).
    Returns a Path. Raises CheckpointError naming the problem and the fix (a path the OS refuses to look
    at, e.g. a name too long, a symlink loop, and a `~user` that does not exist included).
    """
    root = cache_root(cache_dir)
    spec = str(spec)
    try:
        path = expand(spec, "model")
        resolved(path, "model")  # a symlink loop on it: named, rather than "not an existing directory"
        exists = path.exists()
    except OSError as e:
        raise CheckpointError(f"model {spec[:80]!r}{'...' if len(spec) > 80 else ''}: {e.strerror or e}; "
                              "give the path of a model directory") from None
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    if exists:
        if path.is_dir() and os.path.lexists(path / "config.json"):  # read_source names a config.json not a file
            return cache.from_local(path, root, progress, note)
        return path  # a converted directory; load_model reports anything wrong with it
    if spec.startswith("random:"):
        return cache.from_random(spec[len("random:"):], root, progress=progress, note=note)
    repo_id = HUB_NAMES.get(spec, spec)
    if _is_repo_id(repo_id) and not spec.startswith((".", "~", "/")):
        return cache.from_hub(repo_id, root, spec, progress, note)
    if spec.startswith((".", "~", "/")) or spec.count("/") > 1 or "\\" in spec:
        raise CheckpointError(f"model {spec!r} is not an existing directory; give the path of a converted model or "
                              "of a Hugging Face checkpoint (config.json + model.safetensors)")
    raise CheckpointError(
        f"unknown model {spec!r}: not an existing directory, not random:<shape> ("
        + ", ".join(SHAPES) + "), not a hub name (" + ", ".join(HUB_NAMES) + ") nor org/name")


def load(spec=None, role="target", cache_dir=None, kernel=None, threads=1, progress=None, target=None, note=None,
         probe="cached"):
    """Load a model from a SPEC (see the module docstring); None loads the shipped `role`.

    role: "target" or "draft": the shipped model used when spec is None, and the default kernel and its threads:
    the fastest of the role's candidates on this machine for this model's shapes, at `threads` or at one thread
    (npspec.sources.choices.choose over
    registry.role_candidates: "compiled-panels" when the `fast` extra is installed, else "gemm-blocks" or
    "gemv-panels" for a target, "gemv-panels" for a draft; all batch invariant, all on npspec's own threads, so
    that no BLAS thread spins on the cores the other model's workers need: npspec.kernels.blas). Which kernel the
    draft uses never changes the output: every q gives exactly the target's law, and greedy output is the
    target's argmax sequence (notes/derivation.md).
    kernel: None (the role's, measured), or a name of npspec.kernels.registry, overriding the role's (no probe: then
    `threads` as given; one that reads int8 codes, "dequant-panels", only for a model quantized with an int scheme).
    threads: the threads asked for (a kernel's own workers, or BLAS's).
    probe: how the choice uses its cache, one of choice.MODES ("cached": measured once per machine, kept in
    the cache directory's choices.json; "refresh": measured again and kept; "bypass": measured, nothing kept;
    "off": the role's first candidate, unmeasured).
    cache_dir: npspec's conversion cache (default: $NPSPEC_CACHE, else ~/.cache/npspec).
    progress: None (the default: nothing shown) or a bar factory such as npspec.sources.progress.terminal_bars,
    for building, converting and loading.
    target: the target's SPEC, what `self` stands for in a quantized draft SPEC `SCHEME:self`
    (None: the shipped target).
    note: None (the default: nothing said), or called with one line for the user about slow one-time
    work (a conversion into the cache, a wait for another process, a format-1 file rewritten); the
    commands print it on stderr.
    Returns a Model. Raises CheckpointError with the fix (a bad quantization scheme included),
    ValueError for another role, kernel or thread count (errors.NoCodes: a kernel reading int8 codes for float weights).
    """
    if role not in ROLES:
        raise ValueError(f"role must be 'target' or 'draft', got {role!r}")
    if kernel is not None and (not isinstance(kernel, str) or kernel not in REGISTRY):
        raise ValueError(f"kernel must be None (the {role}'s fastest, measured) or one of {', '.join(REGISTRY)}, "
                         f"got {kernel!r:.60}")
    model = _load(spec, role, cache_dir, STATIC_DEFAULT if kernel is None else kernel, threads, progress, target, note)
    if kernel is not None:
        if registry_kernel(kernel).reads_codes and not holds_codes(model.params):
            raise NoCodes(kernel, role, model.source)
        return model
    return role_model(model, role, threads, cache_dir, probe, note)


def role_model(model, role, threads, cache_dir=None, probe="cached", note=None, partner=None, rows=None):
    """`model` decoding with `role`'s default kernel and threads: npspec.sources.choices.choose over the role's candidates, for
    the model's shapes and `threads` asked for, cached in the cache directory's choices.json as `probe` says (see
    load); `model` itself when it already decodes so, else model.with_kernel (the same weights). note: gets a compiled
    kernel's compile note, and the probe's when it measures. partner: None, or the draft Model (with its kernel
    chosen) that a target decodes beside: the target's candidates are then timed in rounds with it
    (npspec.sources.choices.time_forwards). rows: the row counts its forwards multiply, to time (None: choice.ROLE_ROWS).
    Then the longest prompt that kernel prefills faster than the GEMM (Model.prefill_rows: npspec.sources.choices.
    choose_prefill, cached the same way; 0 with probe "off"). Raises ValueError for a bad role, probe mode or rows."""
    path, candidates = cache_root(cache_dir) / CACHE_FILE, role_candidates(role)
    while True:
        chosen = choose(role, model, threads, path, probe, note=note, partner=partner, rows=rows,
                        candidates=candidates)  # says when it measures; repr and --json show the choice
        try:
            if chosen != (model.kernel, model.threads):
                model = model.with_kernel(chosen.kernel, chosen.threads, note=note)
            break
        except KernelUnavailable as e:  # chosen unmeasured (cached, or --kernel-probe off) and it cannot be built here
            candidates = tuple(c for c in candidates if c != chosen.kernel)
            if not candidates:
                raise
            if note is not None:
                note(f"{e}; the {role} decodes with one of {', '.join(candidates)}")
    prefill_rows = choose_prefill(model, path, probe, note=note)
    return model if prefill_rows == model.prefill_rows else model.with_prefill_rows(prefill_rows)


def split_quantized(spec):
    """(Scheme, inner SPEC) of a quantized SPEC `SCHEME:SPEC`, or None for any other SPEC (an existing path included).

    A SPEC is quantized when the part before its first colon starts like a scheme (int, fp or
    bf and a digit). Raises CheckpointError, one line, for a bad scheme or nothing after the colon.
    """
    text = str(spec)
    head, colon, inner = text.partition(":")
    if not colon or not re.match(r"(int|fp|bf)\d", head):
        return None
    try:
        if expand(text, "model").exists():
            return None
    except (OSError, ValueError):
        pass
    try:
        scheme = parse_scheme(head)
    except ValueError as e:
        raise CheckpointError(f"model {text!r}: {e}") from None
    if not inner:
        raise CheckpointError(f"model {text!r}: give the model to quantize after the colon, e.g. {head}:self "
                              f"(the target) or {head}:<directory>")
    return scheme, inner


def _load(spec, role, cache_dir, kernel, threads, progress, target, note):
    layers = []  # (SPEC, scheme) of each SCHEME: prefix, outermost first: peeled in a loop, so any number nest
    while spec is not None and (quantized := split_quantized(spec)) is not None:
        layers.append((spec, quantized[0]))
        spec = quantized[1]
    if layers and spec == "self":
        inner, scheme = layers[-1]
        if role == "target":
            raise CheckpointError(f"model {inner!r}: `self` stands for the target, so it belongs in the draft's SPEC "
                                  f"(--draft {scheme.name}:self)")
        model = _load(target, "target", cache_dir, kernel, threads, progress, None, note)
    else:
        model = _load_base(spec, role, cache_dir, kernel, threads, progress, note)
    for outer, scheme in reversed(layers):  # the innermost scheme first, as SCHEME:SPEC reads
        try:
            model = quantize_model(model, scheme)
        except ValueError as e:
            raise CheckpointError(f"model {outer!r}: {e}") from None
    return model


def _load_base(spec, role, cache_dir, kernel, threads, progress, note):
    """The model a SPEC without a SCHEME: prefix names (None: the shipped `role`; a saved quantized directory too)."""
    if spec is None:
        return load_model(shipped_dir(f"{SHIPPED_PAIR}/{role}"), kernel, threads, progress, note)
    path = resolve(spec, cache_dir, progress, note)
    try:
        root, real = resolved(cache_root(cache_dir), "the cache directory ($NPSPEC_CACHE)"), resolved(path, "model")
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    in_cache = root in real.parents
    try:
        if is_quantized(path):
            return load_quantized(path, kernel, threads, note)
        # a format-1 file is rewritten once as format 2: in the cache, under the entry's own lock
        return load_model(path, kernel, threads, progress, note,
                          cache.entry_lock(root, real, note=note) if in_cache else None)
    except CheckpointError as e:
        if in_cache:
            raise CheckpointError(f"{e} (the cached conversion {path} is damaged: delete it and run again)") from e
        raise


def random_model(shape, seed=0, tokenizer=None, kernel=STATIC_DEFAULT, threads=1):
    """An in-memory Model with the exact shapes of `shape` (a name of names.SHAPES) and GPT-2's random init.

    tokenizer: a tokenizers.Tokenizer (default: GPT-2's, shipped in weights/gpt2/).
    Memory: the weight bytes (gpt2-large: 3.1e9 bytes). Raises ValueError, one line naming the shapes, for an
    unknown shape; errors.NoCodes for a kernel that reads int8 codes (the weights are float32).
    """
    if not isinstance(shape, str) or shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r:.60}; random_model takes one of {', '.join(SHAPES)} "
                         "(npspec.sources.names.SHAPES)")
    if registry_kernel(kernel).reads_codes:
        raise NoCodes(kernel, "model", f"random:{shape}", spec=f"npspec.load('int8-ch:random:{shape}', role, "
                      f"kernel={kernel!r})")
    config = SHAPES[shape]
    tokenizer = gpt2_tokenizer() if tokenizer is None else tokenizer
    return Model(config, params_tree(init_tensors(config, seed), config), tokenizer, f"random:{shape}", kernel, threads)
