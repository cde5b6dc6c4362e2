"""Where models come from: `load(spec, role)`, the SPEC rules, the shipped pair and `random_model`.

A SPEC is, in this order: an existing path (a converted directory, or a Hugging Face checkpoint converted once into
the cache: npspec.sources.cache); `random:<shape>` (npspec.sources.names; GPT-2's init, seed 0, built once); a hub
name (gpt2 ... gpt2-xl, distilgpt2, any `org/name`), downloaded and converted once. `SCHEME:SPEC` is that model
quantized in memory (npspec.sources.quantize.parse_scheme); `SCHEME:self` the target quantized; prefixes nest (`int8-ch:fp16:DIR`: the
innermost first). A role's kernel is
npspec.kernels.probe.choose_kernels' (its store: npspec.sources.choices). Imports npspec.model and npspec.kernels.
"""

import os
import re
from pathlib import Path

from .atomic import expand, resolved
from .choices import CACHE_FILE, ChoiceFile
from ..kernels.probe import choose_kernels
from .errors import CheckpointError, NoCodes
from .files import load_model
from ..model.tensors import params_tree
from .init import init_tensors
from ..model.model import Model
from .quantize import parse_scheme
from ..kernels.quantized import holds_codes
from .quantized import is_quantized, load_quantized, quantize_model
from ..kernels.registry import REGISTRY, ROLES, STATIC_DEFAULT, codes_kernel, kernel as registry_kernel
from . import cache
from .names import HUB_NAMES, SHAPES
from .shipped import SHIPPED_PAIR, gpt2_tokenizer, shipped_dir


def cache_root(cache_dir=None):
    """`cache_dir` as a Path, else cache.cache_dir() ($NPSPEC_CACHE, ...)."""
    return Path(cache_dir).expanduser() if cache_dir is not None else cache.cache_dir()


def choice_store(cache_dir=None):
    """The kernel probe's store: choices.json in the cache directory (npspec.sources.choices.ChoiceFile)."""
    return ChoiceFile(cache_root(cache_dir) / CACHE_FILE)


def _is_repo_id(name):
    # org/name as the hub spells it: one slash, letters, digits, '-', '_', '.', no leading or trailing '-' / '.'
    return re.fullmatch(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*", name) is not None and \
        ".." not in name and not name.endswith((".", "-"))


def resolve(spec, cache_dir=None, progress=None):
    """The converted directory (a Path) a SPEC names, converted into the cache first if needed (progress: None or
    a bar factory). Raises CheckpointError naming the problem and the fix."""
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
            return cache.from_local(path, root, progress)
        return path  # a converted directory; load_model reports anything wrong with it
    if spec.startswith("random:"):
        return cache.from_random(spec[len("random:"):], root, progress=progress)
    repo_id = HUB_NAMES.get(spec, spec)
    if _is_repo_id(repo_id) and not spec.startswith((".", "~", "/")):
        return cache.from_hub(repo_id, root, spec, progress)
    if spec.startswith((".", "~", "/")) or spec.count("/") > 1 or "\\" in spec:
        raise CheckpointError(f"model {spec!r} is not an existing directory; give the path of a converted model or "
                              "of a Hugging Face checkpoint (config.json + model.safetensors)")
    raise CheckpointError(
        f"unknown model {spec!r}: not an existing directory, not random:<shape> ("
        + ", ".join(SHAPES) + "), not a hub name (" + ", ".join(HUB_NAMES) + ") nor org/name")


def load(spec=None, role="target", cache_dir=None, kernel=None, threads=1, progress=None, target=None,
         probe="cached"):
    """A Model from a SPEC; None loads the shipped `role` ("target" or "draft"). kernel: a registry name run at
    `threads`, else the role's fastest candidate at `threads` or one (choose_kernels, as `probe`, a mode of
    npspec.kernels.probe.MODES, says). cache_dir: npspec's cache (default $NPSPEC_CACHE, else ~/.cache/npspec);
    progress: None or a bar factory; target: the SPEC a draft's `SCHEME:self` stands for (None: the shipped target),
    or the target Model itself (quantized from its arrays, not loaded again).
    Raises CheckpointError with the fix, ValueError for another role, kernel, thread count or probe mode."""
    if role not in ROLES:
        raise ValueError(f"role must be 'target' or 'draft', got {role!r}")
    if kernel is not None and (not isinstance(kernel, str) or kernel not in REGISTRY):
        raise ValueError(f"kernel must be None (the {role}'s fastest, measured) or one of {', '.join(REGISTRY)}, "
                         f"got {kernel!r:.60}")
    model = _load(spec, role, cache_dir, first_kernel(spec) if kernel is None else kernel, threads, progress, target)
    if kernel is not None:
        if registry_kernel(kernel).reads_codes and not holds_codes(model.params):
            raise NoCodes(kernel, role, model.source)
        return model
    chosen = choose_kernels(model if role == "target" else None, model if role == "draft" else None, threads,
                            choice_store(cache_dir), probe)
    return getattr(chosen, role).model


def first_kernel(spec):
    """The kernel a SPEC is loaded with before the probe chooses: for `SCHEME:SPEC` with an int scheme the installed
    kernel that keeps its codes (registry.codes_kernel), else STATIC_DEFAULT. Raises as split_quantized."""
    quantized = None if spec is None else split_quantized(spec)
    return codes_kernel() if quantized is not None and quantized[0].kind == "int" else STATIC_DEFAULT


def split_quantized(spec):
    """(Scheme, inner SPEC) of `SCHEME:SPEC` (its head starts int, fp or bf and a digit; not an existing
    path), else None. Raises CheckpointError, one line, for a bad scheme or nothing after the colon."""
    text = str(spec)
    head, colon, inner = text.partition(":")
    if not colon or not re.match(r"(int|fp|bf)[0-9]", head):
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


def _load(spec, role, cache_dir, kernel, threads, progress, target):
    layers = []  # (SPEC, scheme) of each SCHEME: prefix, outermost first: peeled in a loop, so any number nest
    while spec is not None and (quantized := split_quantized(spec)) is not None:
        layers.append((spec, quantized[0]))
        spec = quantized[1]
    if layers and spec == "self":
        inner, scheme = layers[-1]
        if role == "target":
            raise CheckpointError(f"model {inner!r}: `self` stands for the target, so it belongs in the draft's SPEC "
                                  f"(--draft {scheme.name}:self)")
        model = target if isinstance(target, Model) else _load(target, "target", cache_dir, STATIC_DEFAULT, threads,
                                                                 progress, None)
    else:  # a model only quantized: loaded with STATIC_DEFAULT (nothing packed), the outermost layer gets `kernel`
        model = _load_base(spec, role, cache_dir, STATIC_DEFAULT if layers else kernel, threads, progress)
    for i, (outer, scheme) in enumerate(reversed(layers)):  # the innermost scheme first, as SCHEME:SPEC reads
        try:
            model = quantize_model(model, scheme, kernel if i == len(layers) - 1 else STATIC_DEFAULT)
        except ValueError as e:
            raise CheckpointError(f"model {outer!r}: {e}") from None
    return model


def _load_base(spec, role, cache_dir, kernel, threads, progress):
    """The model a SPEC without a SCHEME: prefix names (None: the shipped `role`; a saved quantized directory too)."""
    if spec is None:
        return load_model(shipped_dir(f"{SHIPPED_PAIR}/{role}"), kernel, threads, progress)
    path = resolve(spec, cache_dir, progress)
    try:
        root, real = resolved(cache_root(cache_dir), "the cache directory ($NPSPEC_CACHE)"), resolved(path, "model")
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    in_cache = root in real.parents
    try:
        if is_quantized(path):
            return load_quantized(path, kernel, threads)
        # a format-1 file is rewritten once as format 2: in the cache, under the entry's own lock
        return load_model(path, kernel, threads, progress,
                          cache.entry_lock(root, real) if in_cache else None)
    except CheckpointError as e:
        if in_cache:
            raise CheckpointError(f"{e} (the cached conversion {path} is damaged: delete it and run again)") from e
        raise


def random_model(shape, seed=0, tokenizer=None, kernel=STATIC_DEFAULT, threads=1):
    """An in-memory Model of `shape` (names.SHAPES) with GPT-2's init, `tokenizer` (default GPT-2's). Memory: the
    weight bytes (gpt2-large: 3.1e9). Raises ValueError naming the shapes for an unknown one; errors.NoCodes for a
    kernel that reads int8 codes (the weights are float32)."""
    if not isinstance(shape, str) or shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r:.60}; random_model takes one of {', '.join(SHAPES)} "
                         "(npspec.sources.names.SHAPES)")
    if registry_kernel(kernel).reads_codes:
        raise NoCodes(kernel, "model", f"random:{shape}", spec=f"npspec.load('int8-ch:random:{shape}', role, "
                      f"kernel={kernel!r})")
    config = SHAPES[shape]
    tokenizer = gpt2_tokenizer() if tokenizer is None else tokenizer
    return Model(config, params_tree(init_tensors(config, seed), config), tokenizer, f"random:{shape}", kernel, threads)
