"""The one registry of kernels (`kernel(name).build(threads)`) and the one place their defaults are written: a role's
is the fastest of `role_candidates` here (npspec.kernels.probe measures), a Model with no role gets STATIC_DEFAULT.
Imports npspec.kernels.{products, quantized, workers, compiled} (numba only when a compiled kernel is built).
"""

from dataclasses import dataclass, field
from typing import Callable

from . import compiled
from .compiled import KernelUnavailable
from .products import GemmBlocks, GemvPanels, gemm, gemm_panels, gemv_rows
from .quantized import QuantizedMatrix, dequant_gemm, dequant_panels
from .workers import check_threads


@dataclass(frozen=True)
class Kernel:
    """One product. invariant: batch invariant (npspec.kernels.products). make: threads -> the linear callable.
    own_threads: it shares work over its own threads (BLAS then runs one, npspec.kernels.blas). pool: whose threads
    run its forwards beside the calling one, "numba" (OpenMP), "npspec" (npspec.kernels.workers) or "blas" (the
    probe pairs a draft with its target by it). reads_codes: it multiplies int codes, held as `codes` (a class with
    from_codes(codes, scales)); tied: the class holding a quantized tied wte for it, or None. cli: `npspec generate`
    offers it. extra: the pip extra it needs. prepare: (linear, matrices) -> None, called once by a Model with the
    matrices its forwards multiply. packs: a Model on it holds block matrices as `linear.pack(w)`. version: raised
    when the kernel's speed changes, so the probe's cached timings of it are measured again."""

    name: str
    invariant: bool
    make: Callable = field(repr=False)
    prefill: Callable = field(repr=False, default=gemm)
    own_threads: bool = False
    pool: str = "blas"
    reads_codes: bool = False
    codes: type | None = None
    tied: type | None = None
    cli: bool = True
    extra: str | None = None
    available: Callable = field(repr=False, default=lambda: True)
    prepare: Callable = field(repr=False, default=lambda linear, matrices: None)
    packs: bool = False
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
        """BLAS threads of a decoding forward with `threads`: 1 under a kernel with its own."""
        return 1 if self.own_threads else threads


def _plain(product):
    return lambda threads: product


REGISTRY = {k.name: k for k in (
    Kernel("compiled-panels", True, lambda threads: compiled.CompiledPanels(threads, compiled.host_panel()),
           own_threads=True, pool="numba", extra="fast", available=compiled.available,
           prepare=lambda linear, matrices: linear.prepare(matrices), packs=True, version=6),
    # 2: numba's threads (OpenMP) instead of npspec's workers; 3: fused multiply-adds; 4: 8-row tiles, prefetched panel
    # rows, 512-bit vectors asked for; 5: matrices from 512 KiB shared out, 6-row tiles; 6: 256-bit register blocks
    # on 16-column panels without AVX-512
    Kernel("gemm-blocks", True, GemmBlocks, own_threads=True, pool="npspec"),
    Kernel("gemv-panels", True, GemvPanels, own_threads=True, pool="npspec"),
    Kernel("gemv-rows", True, _plain(gemv_rows)),
    Kernel("gemm", False, _plain(gemm)),
    Kernel("gemm-panels", False, _plain(gemm_panels), cli=False),  # the bench's, for comparison
    Kernel("dequant-panels", True, _plain(dequant_panels), prefill=dequant_gemm, reads_codes=True,
           codes=QuantizedMatrix),
    Kernel("compiled-quant", True, lambda threads: compiled.CompiledQuant(threads, float_panel=compiled.host_panel()),
           prefill=compiled.quant_gemm, own_threads=True, pool="numba",
           reads_codes=True, codes=compiled.QuantPanels, tied=compiled.QuantTied, extra="fast",
           available=compiled.available, prepare=lambda linear, matrices: linear.prepare(matrices), packs=True,
           version=4),  # 2: float matrices on compiled-panels' host panels; 3: 256-bit hosts' register blocks of codes;
    # 4: their one-row 4-bit blocks without spills
)}

STATIC_DEFAULT = "gemm-blocks"  # a Model built without a role (tests, in-memory models); roles: role_candidates
ROLES = ("target", "draft")
PLAIN_BASELINES = ("gemv-rows", "gemm")  # BLAS-threaded plain decodings, either may be the fastest; --compare


def kernel(name):
    """Raises ValueError (one line, naming the choices) for an unknown name."""
    if name not in REGISTRY:
        raise ValueError(f"unknown kernel {name!r}; pick one of {', '.join(REGISTRY)}")
    return REGISTRY[name]


def names(cli=False, codes=None):
    """The kernel names in order; cli: only those the CLI offers; codes: True/False: only those that do/don't read
    int8 codes."""
    return tuple(k.name for k in REGISTRY.values() if (k.cli or not cli) and (codes is None or k.reads_codes == codes))


def codes_kernel():  # -> the kernel a quantized model is loaded with before the probe chooses
    """"compiled-quant" if installed, else STATIC_DEFAULT (the model then holds dequantized float32 weights)."""
    return "compiled-quant" if REGISTRY["compiled-quant"].available() else STATIC_DEFAULT


def invariant_names():  # -> the batch-invariant kernels' names
    return tuple(k.name for k in REGISTRY.values() if k.invariant)


def role_candidates(role, codes=None):
    """The installed kernels a role's default is chosen from, first wins a tie; codes: the class of int codes the
    model holds (Model.codes), then the installed kernels reading them. Raises ValueError for a role other than
    "target" or "draft"."""
    if role not in ROLES:
        raise ValueError(f"role must be 'target' or 'draft', got {role!r}")
    if codes is not None:
        return tuple(k.name for k in REGISTRY.values() if k.codes is codes and k.available())
    names_ = ("compiled-panels", "gemm-blocks", "gemv-panels") if role == "target" else ("compiled-panels", "gemv-panels")
    return tuple(n for n in names_ if REGISTRY[n].available())


def plain_baselines(target_kernel, codes=None):
    """The kernels --compare times plain decoding with: the target's, the installed compiled one and BLAS's, once each;
    for a target holding int codes of class `codes`, the installed kernels reading them (role_candidates)."""
    if codes is not None:
        return tuple(dict.fromkeys([target_kernel, *role_candidates("target", codes)]))
    extra = [n for n in ("compiled-panels",) if REGISTRY[n].available()]
    return tuple(dict.fromkeys([target_kernel, *extra, *PLAIN_BASELINES]))
