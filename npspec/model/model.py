"""`Model`: a GPT-2's config, parameters, tokenizer and origin, and the kernel its forwards use.

The kernel is an explicit constructor argument that repr shows, changed only by `with_kernel` (a new Model over the
same weights) or, for the kernel probe's timings, `trial`; so is the longest prompt it prefills (`prefill_rows`).
Which kernel a role decodes with is npspec.kernels.probe's choice. Imports npspec.model.gpt2 and npspec.kernels (the
products, their layout, the registry, BLAS threads); no I/O.
"""

import copy

import numpy as np

from ..kernels.blas import BlasThreads
from .gpt2 import KVCache, attention, attention_masked, gpt2, gpt2_tree
from ..kernels.products import block_linears, column_major
from ..kernels.quantized import holds_codes
from ..kernels.registry import STATIC_DEFAULT, kernel as registry_kernel, names


class Model:
    """A GPT-2: `config` (gpt2.GPT2Config), `params` (the checkpoint's tree, block matrices made column-major in
    place), `tokenizer` (a tokenizers.Tokenizer or None), `source` (for messages), `metadata` (the file's header).
    kernel: the product of every decoding forward, a name of npspec.kernels.registry; threads: its threads (an int
    >= 1; BLAS's for the other kernels and every GEMM prefill), which never change a result. blas: a shared
    npspec.kernels.blas.BlasThreads. prefill_rows: the longest prompt (an int >= 0) `prefill` runs as a decoding
    forward. Raises ValueError for an unknown kernel, a bad thread count or prefill_rows, a kernel whose extra is
    missing, or int8 codes (npspec.kernels.quantized) with a kernel that cannot read them."""

    def __init__(self, config, params, tokenizer=None, source="", kernel=STATIC_DEFAULT, threads=1, metadata=None,
                 blas=None, prefill_rows=0):
        self.config = config
        self.params = column_major(params)
        self.tokenizer = tokenizer
        self.source = str(source)
        self.metadata = dict(metadata or {})
        self.blas = blas or BlasThreads()
        self._build(kernel, threads)
        self.prefill_rows = check_prefill_rows(prefill_rows)

    def _build(self, kernel, threads):
        """Build `kernel` at `threads` into this model (its linear; a compiled kernel packs its copy of the weights
        now). Raises as Model."""
        spec = registry_kernel(kernel)
        if holds_codes(self.params) and not spec.reads_codes:
            raise ValueError(f"this model holds int8 codes (npspec.kernels.quantized.QuantizedMatrix): kernel {kernel!r} "
                             f"cannot read them; use {' or '.join(names(codes=True))}")
        self.kernel, self.threads, self.spec = kernel, threads, spec
        self.linear = spec.build(threads)
        spec.prepare(self.linear, [lin["w"] for lin in block_linears(self.params)] + [self.params["wte"].T])
        self.blas_threads = spec.blas_threads(threads)

    def __repr__(self):
        c = self.config
        return (f"Model(source={self.source!r}, n_layer={c.n_layer}, n_embd={c.n_embd}, n_vocab={c.n_vocab}, "
                f"kernel={self.kernel!r}, threads={self.threads}, prefill_rows={self.prefill_rows})")

    def with_kernel(self, kernel, threads=None):
        """A new Model over the same weight arrays (no copy) decoding with `kernel` at `threads` (default: this
        model's); its prefill_rows is this model's for the same kernel, else 0. Raises as Model."""
        return Model(self.config, self.params, self.tokenizer, self.source, kernel,
                     self.threads if threads is None else threads, self.metadata, self.blas,
                     self.prefill_rows if kernel == self.kernel else 0)

    def trial(self, kernel, threads):
        """For the kernel probe's timings (npspec.kernels.probe): a shallow copy decoding with `kernel` at `threads`,
        only the kernel built (no new Model); prefill_rows 0. Raises as Model."""
        other = copy.copy(self)
        other._build(kernel, threads)
        other.prefill_rows = 0
        return other

    def with_prefill_rows(self, prefill_rows):
        """This model (the same weights and built kernel) with `prefill_rows`. Raises ValueError unless an int >= 0."""
        other = copy.copy(self)
        other.prefill_rows = check_prefill_rows(prefill_rows)
        return other

    @property
    def invariant(self):
        """True if the kernel is batch invariant (registry.Kernel.invariant): a verify forward's rows then equal one-token forwards, bit for bit."""
        return self.spec.invariant

    def new_cache(self):
        """An empty KVCache sized for this model."""
        return KVCache(self.config)

    def forward(self, ids, cache):  # [n_new] -> [n_new, n_vocab] float32
        """Logits for `ids` fed after `cache.length`, with this model's kernel and per-row attention (gpt2.gpt2).

        With an invariant kernel, row i is bit-identical to a one-token forward of ids[i]: the
        decoding and verify forwards use this. Raises as gpt2.gpt2.
        """
        with self.blas.limit(self.blas_threads):
            return gpt2(ids, self.params, self.config, cache, self.linear, attention)

    def forward_tree(self, ids, parents, cache):  # [n_new], [n_new] -> [n_new, n_vocab] float32
        """Logits of a tree of ids fed after `cache.length` in one forward (gpt2.gpt2_tree: tree attention).

        parents[i]: -1 or an earlier row. With an invariant kernel, each row is bit-identical to a
        one-token forward after its path. Raises as gpt2.gpt2_tree.
        """
        with self.blas.limit(self.blas_threads):
            return gpt2_tree(ids, parents, self.params, self.config, cache, self.linear)

    def prefill(self, ids, cache, threads=None):  # [n_new] -> [n_new, n_vocab] float32
        """Logits for `ids` fed after `cache.length`, for a prompt or a validation window: at most `prefill_rows`
        ids run as one decoding forward (`forward`: the kernel, per-row attention), more with one GEMM per product
        (the kernel's `prefill`; with a quantized kernel, one GEMM per dequantized panel, qkernels.dequant_gemm) and
        masked attention over all rows.

        The GEMM is not batch invariant, so a prefill is used only where its rows need not match one-token forwards
        (a prefill both decoders share). For a short prompt it can cost more than the kernel's forward, and OpenBLAS's
        threads spin for a while after a threaded call, on the cores a compiled kernel's threads need next
        (npspec.sources.choices.choose_prefill measures both).
        threads: BLAS's threads for a GEMM prefill (a positive int; default: the model's `threads`). The kernel probe
        passes 1 (npspec.sources.choices.time_forwards).
        """
        if len(ids) <= self.prefill_rows:
            return self.forward(ids, cache)
        with self.blas.limit(self.threads if threads is None else threads):
            return gpt2(ids, self.params, self.config, cache, self.spec.prefill, attention_masked)

    @property
    def n_params(self):
        return sum(a.size for a in leaves(self.params))

    @property
    def n_bytes(self):
        """Bytes of all weight arrays."""
        return sum(a.nbytes for a in leaves(self.params))


def check_prefill_rows(n):
    """n as an int if it is an int >= 0 (a numpy integer too, not a bool), else ValueError in one line."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"prefill_rows must be an int >= 0 (the longest prompt the decoding kernel prefills), "
                         f"got {n!r}")
    return int(n)


def leaves(tree):
    """Every array of a parameter tree (nested dicts and lists), depth first."""
    if isinstance(tree, dict):
        for v in tree.values():
            yield from leaves(v)
    elif isinstance(tree, list):
        for v in tree:
            yield from leaves(v)
    else:
        yield tree
