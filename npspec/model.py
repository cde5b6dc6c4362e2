"""A GPT-2 ready to run: its config, parameters, tokenizer, origin, and the kernel its forwards use.

Imports npspec.gpt2 (the math), npspec.kernels (the column-major layout), npspec.qkernels (int8 codes) and
npspec.registry (the kernels by name); no I/O. `Model` is THE one place a kernel is held: an explicit constructor
argument that `repr(model)` shows, changed only by `with_kernel`, which returns a new Model over the same weights.
Which kernel a role decodes with by default is npspec.registry's and npspec.choice's business (npspec.sources.load).
"""

from .blas import BlasThreads
from .gpt2 import KVCache, attention, attention_masked, gpt2, gpt2_tree
from .kernels import block_linears, column_major
from .qkernels import holds_codes
from .registry import STATIC_DEFAULT, kernel as registry_kernel, names


class Model:
    """A GPT-2 model: `config` (gpt2.GPT2Config), `params` (the checkpoint's tree), `tokenizer`
    (a tokenizers.Tokenizer, or None), `source` (where it came from, for messages), `metadata`
    (the converted file's header, `{}` for an in-memory model).

    kernel: the product of every decoding forward, a name of npspec.registry (default registry.STATIC_DEFAULT;
    npspec.sources.load picks each role's by measurement). A tree whose block matrices are int8 codes
    (qkernels.QuantizedMatrix, npspec.quantized with kernel "dequant-panels") runs with a kernel that reads codes
    only, and its prefill dequantizes too (the Kernel's `prefill`).
    threads: the threads a forward uses (a positive int): the panel kernels' ("gemm-blocks",
    "gemv-panels") own workers, BLAS then running one thread inside them, or BLAS's threads for
    the other kernels and for every prefill (npspec.blas: `blas_threads` is the count BLAS gets
    in a decoding forward). Results never depend on it.
    blas: an npspec.blas.BlasThreads to share (default: a new one).
    note: None, or a function given one-line messages while the kernel is built (a compiled kernel's compile time).
    The block matrices are stored column-major (kernels.column_major), in place, one matrix at
    a time, whatever the kernel: the NumPy kernels read that layout, so changing to one of them never
    copies the weights; "compiled-panels" packs its own copy once, here (registry.Kernel.prepare). Raises ValueError for an unknown kernel, a bad thread count, or int8
    codes with a kernel that cannot read them, a kernel whose extra is not installed.
    """

    def __init__(self, config, params, tokenizer=None, source="", kernel=STATIC_DEFAULT, threads=1, metadata=None,
                 blas=None, note=None):
        self.config = config
        self.params = column_major(params)
        self.tokenizer = tokenizer
        self.source = str(source)
        self.metadata = dict(metadata or {})
        self.kernel = kernel
        self.threads = threads
        self.spec = registry_kernel(kernel)
        if holds_codes(self.params) and not self.spec.reads_codes:
            raise ValueError(f"this model holds int8 codes (npspec.qkernels.QuantizedMatrix): kernel {kernel!r} cannot "
                             f"read them; use {' or '.join(names(codes=True))}")
        self.linear = self.spec.build(threads, note)
        self.spec.prepare(self.linear, [lin["w"] for lin in block_linears(self.params)] + [self.params["wte"].T])
        self.blas = blas or BlasThreads()
        self.blas_threads = self.spec.blas_threads(threads)

    def __repr__(self):
        c = self.config
        return (f"Model(source={self.source!r}, n_layer={c.n_layer}, n_embd={c.n_embd}, n_vocab={c.n_vocab}, "
                f"kernel={self.kernel!r}, threads={self.threads})")

    def with_kernel(self, kernel, threads=None, note=None):
        """The same model (same weight arrays, no copy) decoding with `kernel` and `threads` (default: this model's)."""
        return Model(self.config, self.params, self.tokenizer, self.source, kernel,
                     self.threads if threads is None else threads, self.metadata, self.blas, note)

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
        """Logits for `ids` fed after `cache.length` with one GEMM per product and masked attention over all rows.

        The fast path for a prompt or a validation window; not batch invariant, so it is used
        only where its rows need not match one-token forwards (a prefill both decoders share).
        With a quantized kernel, one GEMM per dequantized panel (qkernels.dequant_gemm).
        threads: BLAS's threads for this prefill (a positive int; default: the model's `threads`). The kernel probe
        passes 1 (npspec.choice.time_forwards: OpenBLAS's threads spin for a while after a threaded call).
        """
        with self.blas.limit(self.threads if threads is None else threads):
            return gpt2(ids, self.params, self.config, cache, self.spec.prefill, attention_masked)

    @property
    def n_params(self):
        return sum(a.size for a in leaves(self.params))

    @property
    def n_bytes(self):
        """Bytes of all weight arrays."""
        return sum(a.nbytes for a in leaves(self.params))


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
