"""A GPT-2 ready to run: its config, parameters, tokenizer, origin, and the kernel its forwards use.

Imports npspec.model.gpt2 (the math), npspec.kernels.products (the column-major layout), npspec.kernels.quantized (int8 codes) and
npspec.kernels.registry (the kernels by name); no I/O. `Model` is THE one place a kernel is held: an explicit constructor
argument that `repr(model)` shows, changed only by `with_kernel`, which returns a new Model over the same weights; so is
the longest prompt its kernel prefills (`prefill_rows`, changed by `with_prefill_rows`). Which kernel a role decodes
with by default, and that length, are npspec.kernels.registry's and npspec.sources.choices's business (npspec.sources.load).
"""

import copy

import numpy as np

from ..kernels.blas import BlasThreads
from .gpt2 import KVCache, attention, attention_masked, gpt2, gpt2_tree
from ..kernels.layout import block_linears, column_major
from ..kernels.quantized import holds_codes
from ..kernels.registry import STATIC_DEFAULT, kernel as registry_kernel, names


class Model:
    """A GPT-2 model: `config` (gpt2.GPT2Config), `params` (the checkpoint's tree), `tokenizer`
    (a tokenizers.Tokenizer, or None), `source` (where it came from, for messages), `metadata`
    (the converted file's header, `{}` for an in-memory model).

    kernel: the product of every decoding forward, a name of npspec.kernels.registry (default registry.STATIC_DEFAULT;
    npspec.sources.load picks each role's by measurement). A tree whose block matrices are int8 codes
    (qkernels.QuantizedMatrix, npspec.sources.quantized with kernel "dequant-panels") runs with a kernel that reads codes
    only, and its prefill dequantizes too (the Kernel's `prefill`).
    threads: the threads a forward uses (a positive int): the panel kernels' ("gemm-blocks",
    "gemv-panels") own workers, BLAS then running one thread inside them, or BLAS's threads for
    the other kernels and for every prefill (npspec.kernels.blas: `blas_threads` is the count BLAS gets
    in a decoding forward). Results never depend on it.
    blas: an npspec.kernels.blas.BlasThreads to share (default: a new one).
    note: None, or a function given one-line messages while the kernel is built (a compiled kernel's compile time).
    prefill_rows: the longest prompt (in ids, an int >= 0) that `prefill` runs as a decoding forward, with the kernel
    and its threads; longer ones run the prefill GEMM (default 0: every prefill). Which is faster depends on the
    BLAS and the kernel, so npspec.sources.load measures it for a role (npspec.sources.choices.choose_prefill).
    The block matrices are stored column-major (kernels.column_major), in place, one matrix at
    a time, whatever the kernel: the NumPy kernels read that layout, so changing to one of them never
    copies the weights; "compiled-panels" packs its own copy once, here (registry.Kernel.prepare). Raises ValueError for an unknown kernel, a bad thread count, or int8
    codes with a kernel that cannot read them, a kernel whose extra is not installed, or prefill_rows that is not
    an int >= 0.
    """

    def __init__(self, config, params, tokenizer=None, source="", kernel=STATIC_DEFAULT, threads=1, metadata=None,
                 blas=None, note=None, prefill_rows=0):
        self.config = config
        self.params = column_major(params)
        self.tokenizer = tokenizer
        self.source = str(source)
        self.metadata = dict(metadata or {})
        self.kernel = kernel
        self.threads = threads
        self.spec = registry_kernel(kernel)
        if holds_codes(self.params) and not self.spec.reads_codes:
            raise ValueError(f"this model holds int8 codes (npspec.kernels.quantized.QuantizedMatrix): kernel {kernel!r} cannot "
                             f"read them; use {' or '.join(names(codes=True))}")
        self.linear = self.spec.build(threads)
        self.spec.prepare(self.linear, [lin["w"] for lin in block_linears(self.params)] + [self.params["wte"].T])
        self.blas = blas or BlasThreads()
        self.blas_threads = self.spec.blas_threads(threads)
        self.prefill_rows = check_prefill_rows(prefill_rows)

    def __repr__(self):
        c = self.config
        return (f"Model(source={self.source!r}, n_layer={c.n_layer}, n_embd={c.n_embd}, n_vocab={c.n_vocab}, "
                f"kernel={self.kernel!r}, threads={self.threads}, prefill_rows={self.prefill_rows})")

    def with_kernel(self, kernel, threads=None, note=None):
        """The same model (same weight arrays, no copy) decoding with `kernel` and `threads` (default: this model's).
        Its prefill_rows is this model's for the same kernel (at any threads: --compare's plain decoding with the
        target's kernel at the threads asked for prefills as the target does), else 0: it was measured for that kernel.
        """
        return Model(self.config, self.params, self.tokenizer, self.source, kernel,
                     self.threads if threads is None else threads, self.metadata, self.blas, note,
                     self.prefill_rows if kernel == self.kernel else 0)

    def with_prefill_rows(self, prefill_rows):
        """This model (the same weights and built kernel: nothing packed again) with `prefill_rows` (see Model).
        Raises ValueError unless it is an int >= 0."""
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
