"""The one registry of kernels: what each product is, and the one place their defaults are written.

A `Kernel` says whether a product is batch invariant (npspec.kernels.products' contract), its prefill's product,
whether it shares work over its own threads (BLAS then runs one thread, npspec.kernels.blas), whether it reads int8
codes, whether the CLI offers it and the extra it needs; `kernel(name).build(threads)` makes the callable. A role's
default is the fastest of `role_candidates` on the user's machine (npspec.sources.choices measures it);
STATIC_DEFAULT is what a Model built with no role decodes with. Imports npspec.kernels.{products, quantized,
workers, compiled} (numba only when a compiled kernel is built).
"""

from dataclasses import dataclass, field
from typing import Callable

from . import compiled
from .compiled import KernelUnavailable
from .products import GemmBlocks, GemvPanels, gemm, gemm_panels, gemv_rows
from .quantized import dequant_gemm, dequant_panels
from .workers import check_threads


@dataclass(frozen=True)
class Kernel:
    """One product of the registry. make: threads -> the linear callable. prefill: the prefill's product.
    own_threads: it shares work over its own `threads`. reads_codes: it multiplies quantized.QuantizedMatrix codes.
    cli: offered by `npspec generate`. extra: the pip extra it needs (None: none); available: whether that is
    installed. prepare: (linear, matrices) -> None, called once by a Model with every `[d_in, d_out]` matrix its
    forwards multiply (the compiled kernel packs them then). version: raised when a change to the kernel's code
    changes its speed, so the probe's cached timings of it are measured again (npspec.sources.choices)."""

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

    def build(self, threads=1):
        """The `linear(x, w, b=None)` callable with `threads`. Raises ValueError for a bad thread count, or
        compiled.KernelUnavailable (one line, with the fix) when the kernel's extra is missing or broken."""
        check_threads(threads)
        if not self.available():
            raise KernelUnavailable(f"kernel {self.name} needs the {self.extra!r} extra: "
                                    f"pip install 'npspec[{self.extra}]' (or pick another kernel)")
        return self.make(threads)

    def blas_threads(self, threads):
        """BLAS threads of a decoding forward with `threads` (npspec.kernels.blas): 1 under a kernel with its own."""
        return 1 if self.own_threads else threads


def _plain(product):
    return lambda threads: product


REGISTRY = {k.name: k for k in (
    Kernel("compiled-panels", True, compiled.CompiledPanels, own_threads=True,
           extra="fast", available=compiled.available, prepare=lambda linear, matrices: linear.prepare(matrices),
           version=5),  # 2: numba's threads (OpenMP) instead of npspec's workers; 3: fused multiply-adds;
    # 4: 8-row tiles, prefetched panel rows, 512-bit vectors asked for; 5: matrices from 512 KiB shared out, 6-row
    # tiles
    Kernel("gemm-blocks", True, GemmBlocks, own_threads=True),
    Kernel("gemv-panels", True, GemvPanels, own_threads=True),
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
