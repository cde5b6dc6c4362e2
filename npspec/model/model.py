"""`Model`: a GPT-2's weights, tokenizer and origin, with the kernel its forwards use and the prompts it prefills by
it, both explicit (npspec.kernels.probe chooses a role's). Imports npspec.model.gpt2 and npspec.kernels; no I/O.
"""

import copy

import numpy as np

from ..kernels.blas import BlasThreads
from ..kernels.compiled import Packed
from .gpt2 import KVCache, attention, attention_masked, gpt2, gpt2_tree
from ..kernels.layout import block_linears, column_major
from ..kernels.quantized import codes_class
from ..kernels.registry import REGISTRY, STATIC_DEFAULT, kernel as registry_kernel


class Model:
    """A GPT-2: `config` (gpt2.GPT2Config), `params` (the checkpoint's tree; block matrices made column-major in
    place, or replaced in place by their panels for a kernel that packs: held once), `tokenizer` (tokenizers.Tokenizer or None), `source`, `metadata` (the file's header). kernel: a name of
    npspec.kernels.registry; threads: its threads (an int >= 1; BLAS's for other kernels and GEMM prefills), which
    never change a result. blas: a shared npspec.kernels.blas.BlasThreads. prefill_rows: the longest prompt (an int
    >= 0) `prefill` runs by the kernel. Raises ValueError for an unknown kernel, bad threads or prefill_rows, a
    kernel whose extra is missing, or int8 codes with a kernel that cannot read them."""

    def __init__(self, config, params, tokenizer=None, source="", kernel=STATIC_DEFAULT, threads=1, metadata=None,
                 blas=None, prefill_rows=0):
        self.config = config
        self.params = column_major(params)
        self.tokenizer = tokenizer
        self.source = str(source)
        self.metadata = dict(metadata or {})
        self.blas = blas or BlasThreads()
        self._build(kernel, threads, own=True)
        self.prefill_rows = check_prefill_rows(prefill_rows)

    def _build(self, kernel, threads, own=False):  # kernel, threads, spec, linear (prepared), blas_threads
        """own: the tree is this model's, its block matrices laid out for the kernel in place, one at a time (packed
        for a kernel that packs, else float32 arrays); a trial's kernel that cannot read packed matrices gets a copy
        of the tree holding them unpacked. Raises as Model."""
        spec = registry_kernel(kernel)
        held = codes_class(self.params)
        if held is not None and spec.codes is not held:
            readers = [k.name for k in REGISTRY.values() if k.codes is held]
            raise ValueError(f"this model holds int8 codes ({held.__name__}): kernel {kernel!r} cannot read them; "
                             f"use {' or '.join(readers)}")
        self.kernel, self.threads, self.spec = kernel, threads, spec
        self.linear = spec.build(threads)
        if own or (not spec.packs and any(isinstance(lin["w"], Packed) for lin in block_linears(self.params))):
            self.params = laid_out(self.params if own else tree_copy(self.params), spec, self.linear)
        spec.prepare(self.linear, [lin["w"] for lin in block_linears(self.params)] + [self.params["wte"].T])
        self.blas_threads = spec.blas_threads(threads)

    def __repr__(self):
        c = self.config
        return (f"Model(source={self.source!r}, n_layer={c.n_layer}, n_embd={c.n_embd}, n_vocab={c.n_vocab}, "
                f"kernel={self.kernel!r}, threads={self.threads}, prefill_rows={self.prefill_rows})")

    def with_kernel(self, kernel, threads=None):
        """A new Model over the same arrays (a packing kernel's panels are new, as float32 arrays unpacked from
        panels) decoding with `kernel` at `threads` (default this model's); prefill_rows this model's for the same
        kernel, else 0. This model is unchanged. Raises as Model."""
        return Model(self.config, tree_copy(self.params), self.tokenizer, self.source, kernel,
                     self.threads if threads is None else threads, self.metadata, self.blas,
                     self.prefill_rows if kernel == self.kernel else 0)

    def trial(self, kernel, threads):
        """For the kernel probe's timings: a shallow copy with only `kernel` built at `threads` (and its
        weights packed), prefill_rows 0. Raises as Model."""
        other = copy.copy(self)
        other._build(kernel, threads)
        other.prefill_rows = 0
        return other

    def with_prefill_rows(self, prefill_rows):
        """This model, the same built kernel, with `prefill_rows`. Raises as Model."""
        other = copy.copy(self)
        other.prefill_rows = check_prefill_rows(prefill_rows)
        return other

    @property
    def codes(self):
        """The class of int codes its block matrices hold (npspec.kernels.registry's Kernel.codes), or None."""
        return codes_class(self.params)

    @property
    def invariant(self):
        """Whether the kernel is batch invariant: a verify's rows equal one-token forwards, bit for bit."""
        return self.spec.invariant

    def new_cache(self):  # -> an empty gpt2.KVCache for this model
        return KVCache(self.config)

    def forward(self, ids, cache):  # [n_new] -> [n_new, n_vocab] float32
        """Logits of `ids` after `cache.length` by the kernel, per-row attention (gpt2.gpt2); with an invariant
        kernel row i equals a one-token forward of ids[i], bit for bit. Raises as gpt2.gpt2."""
        with self.blas.limit(self.blas_threads):
            return gpt2(ids, self.params, self.config, cache, self.linear, attention)

    def forward_tree(self, ids, parents, cache):  # [n_new], [n_new] -> [n_new, n_vocab] float32
        """Logits of a tree of ids (parents[i]: -1 or an earlier row) in one forward (gpt2.gpt2_tree);
        with an invariant kernel each row equals a one-token forward after its path. Raises as gpt2.gpt2_tree."""
        with self.blas.limit(self.blas_threads):
            return gpt2_tree(ids, parents, self.params, self.config, cache, self.linear)

    def prefill(self, ids, cache, threads=None):  # [n_new] -> [n_new, n_vocab] float32
        """Logits of `ids` after `cache.length` for a prompt: at most prefill_rows ids by `forward`, more by the
        kernel's prefill product (one GEMM; not batch invariant) and masked attention, at `threads` BLAS threads
        (default the model's; the probe passes 1). Raises as gpt2.gpt2."""
        if len(ids) <= self.prefill_rows:
            return self.forward(ids, cache)
        with self.blas.limit(self.threads if threads is None else threads):
            return gpt2(ids, self.params, self.config, cache, self.spec.prefill, attention_masked)

    @property
    def n_params(self):
        return sum(a.size for a in leaves(self.params))

    @property
    def n_bytes(self):  # bytes of every weight array
        return sum(a.nbytes for a in leaves(self.params))


def laid_out(params, spec, linear):  # -> params, each block matrix as `spec` reads it, replaced in place
    for lin in block_linears(params):
        if spec.packs and isinstance(lin["w"], np.ndarray):
            lin["w"] = linear.pack(lin["w"])
        elif not spec.packs and isinstance(lin["w"], Packed):
            lin["w"] = np.asarray(lin["w"])  # column-major, the values packed
    return params


def tree_copy(tree):  # a parameter tree's dicts and lists copied, its arrays shared
    if isinstance(tree, dict):
        return {k: tree_copy(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [tree_copy(v) for v in tree]
    return tree


def check_prefill_rows(n):  # -> int(n) for an int >= 0 (numpy's too, not a bool), else ValueError
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"prefill_rows must be an int >= 0 (the longest prompt the decoding kernel prefills), "
                         f"got {n!r}")
    return int(n)


def leaves(tree):  # every array of a parameter tree (nested dicts and lists), depth first
    if isinstance(tree, dict):
        for v in tree.values():
            yield from leaves(v)
    elif isinstance(tree, list):
        for v in tree:
            yield from leaves(v)
    else:
        yield tree
