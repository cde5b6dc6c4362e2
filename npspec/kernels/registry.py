"""The one registry of kernels: what each product is, and the one place their defaults are written.

Imports npspec.kernels.products (the NumPy products), npspec.kernels.quantized (quantized) and npspec.kernels.compiled (the numba one, which
imports numba only when built). A `Kernel` says what a product is: its name, whether it is batch invariant (row i of
a verify equals the one-row forward bit for bit, npspec.kernels.products' contract), which product its model's prefill uses,
whether it shares work over its own threads (then BLAS runs one thread in its forwards, npspec.kernels.blas), whether it
reads int8 codes, whether the product CLI offers it, and the extra it needs. `kernel(name)` looks one up;
`Kernel.build(threads, note)` makes the `linear(x, w, b=None)` callable.

Defaults (`role_candidates`, `STATIC_DEFAULT`): a role's kernel is the fastest of its candidates, measured on the
user's machine for the model's shapes and thread count (npspec.kernels.probe.choose_kernels):
  * target (verifies gamma + 1 rows): "compiled-panels" when the `fast` extra is installed, "gemm-blocks" and
    "gemv-panels" (which is faster depends on the BLAS: issue 24's AMD and Intel figures);
  * draft (one row at a time): "compiled-panels" when installed, "gemv-panels".
STATIC_DEFAULT is what a Model built directly (no role, no probe) decodes with.
"""

from dataclasses import dataclass, field
from typing import Callable

from . import compiled
from .compiled import KernelUnavailable
from .products import GemmBlocks, GemvPanels, check_threads, gemm, gemm_panels, gemv_rows
from .quantized import dequant_gemm, dequant_panels


@dataclass(frozen=True)
class Kernel:
    """One product of the registry (module docstring).

    make: (threads, note) -> the linear callable. prefill: the product of the model's prefill (not invariant: one
    GEMM). own_threads: the product shares work over its own `threads` (BLAS then runs 1 thread in its forwards).
    reads_codes: it multiplies qkernels.QuantizedMatrix codes. cli: offered by `npspec generate`'s kernel options.
    extra: the pip extra it needs (None: none), available: whether that is installed. prepare: (linear, matrices) ->
    None, called once by a Model with every `[d_in, d_out]` matrix its forwards multiply (the compiled kernel packs
    them then, so that no decoding forward pays for it; the others need nothing). version: raised when a change to
    the kernel's code changes how fast it runs, so that the kernel probe's cached timings of it are measured again
    (npspec.sources.choices.machine_key).
    """

    name: str
    invariant: bool
    make: Callable = field(repr=False)
    prefill: Callable = field(repr=False, default=gemm)
    own_threads: bool = False
    reads_codes: bool = False
    cli: bool = True
    extra: str | None = None
    available: Callable = field(repr=False, default=lambda: True)
    prepare: Callable = field(repr=False, default=lambda linear, matrices: None)
    version: int = 1

    def build(self, threads=1, note=None):
        """The `linear(x, w, b=None)` callable with `threads`; note: gets one-line messages (compiled kernels).
        Raises ValueError for a bad thread count, or errors.KernelUnavailable (one line, with the fix) when the
        kernel's extra is missing or broken."""
        check_threads(threads)
        if not self.available():
            raise KernelUnavailable(f"kernel {self.name} needs the {self.extra!r} extra: "
                                    f"pip install 'npspec[{self.extra}]' (or pick another kernel)")
        return self.make(threads, note)

    def blas_threads(self, threads):
        """The BLAS threads of a decoding forward with `threads` (npspec.kernels.blas): 1 under a kernel with its own threads."""
        return 1 if self.own_threads else threads


def _plain(product):
    return lambda threads, note: product


REGISTRY = {k.name: k for k in (
    Kernel("compiled-panels", True, lambda threads, note: compiled.CompiledPanels(threads, note), own_threads=True,
           extra="fast", available=compiled.available, prepare=lambda linear, matrices: linear.prepare(matrices),
           version=5),  # 2: numba's threads (OpenMP) instead of npspec's workers; 3: fused multiply-adds;
    # 4: 8-row tiles, prefetched panel rows, 512-bit vectors asked for; 5: matrices from 512 KiB shared out, 6-row
    # tiles (npspec.kernels.compiled)
    Kernel("gemm-blocks", True, lambda threads, note: GemmBlocks(threads), own_threads=True),
    Kernel("gemv-panels", True, lambda threads, note: GemvPanels(threads), own_threads=True),
    Kernel("gemv-rows", True, _plain(gemv_rows)),
    Kernel("gemm", False, _plain(gemm)),
    Kernel("gemm-panels", False, _plain(gemm_panels), cli=False),  # the bench's, for comparison
    Kernel("dequant-panels", True, _plain(dequant_panels), prefill=dequant_gemm, reads_codes=True),
)}

STATIC_DEFAULT = "gemm-blocks"  # a Model built without a role (tests, in-memory models); roles: role_candidates
ROLES = ("target", "draft")
PLAIN_BASELINES = ("gemv-rows", "gemm")  # BLAS-threaded plain decodings, either may be the fastest; --compare


def kernel(name):
    """The registry's Kernel called `name`. Raises ValueError (one line, naming the choices) for an unknown name."""
    if name not in REGISTRY:
        raise ValueError(f"unknown kernel {name!r}; pick one of {', '.join(REGISTRY)}")
    return REGISTRY[name]


def names(cli=False, codes=None):
    """The kernel names, in the registry's order; cli: only those the product CLI offers; codes: True for those
    that read int8 codes, False for those that do not, None for both."""
    return tuple(k.name for k in REGISTRY.values() if (k.cli or not cli) and (codes is None or k.reads_codes == codes))


def invariant_names():
    """The batch-invariant kernels' names."""
    return tuple(k.name for k in REGISTRY.values() if k.invariant)


def role_candidates(role):
    """The kernels a role's default is chosen from, fastest first when equal (module docstring); only installed ones.
    Raises ValueError for a role other than "target" or "draft"."""
    if role not in ROLES:
        raise ValueError(f"role must be 'target' or 'draft', got {role!r}")
    names_ = ("compiled-panels", "gemm-blocks", "gemv-panels") if role == "target" else ("compiled-panels", "gemv-panels")
    return tuple(n for n in names_ if REGISTRY[n].available())


def plain_baselines(target_kernel):
    """The kernels --compare (and bench's "fastest plain decoding") times plain decoding with: the target's own, the
    installed compiled kernel and the BLAS-threaded ones, each once."""
    extra = [n for n in ("compiled-panels",) if REGISTRY[n].available()]
    return tuple(dict.fromkeys([target_kernel, *extra, *PLAIN_BASELINES]))
