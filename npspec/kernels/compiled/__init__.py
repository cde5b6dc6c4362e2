"""The compiled kernel "compiled-panels" (the optional extra `fast`): a numba loop nest, batch invariant by construction.

tiles (the loop nest, one tile body for every row count), intrinsics (fma, stack scratch, prefetch, vector width),
build (compiling it once per process) and kernel (`CompiledPanels`, which packs the matrices into panels). The
contract: y[m, n] = s after s = +0.0, s = fma(x[m, k], w[k, n], s) for k = 0, 1, ..., d_in - 1, fma rounding once;
notes/kernels.md says why nothing else can change it. The one part of npspec that touches numba.
"""

from .build import LAYERS, NAME, KernelUnavailable, available, compiled_product, compiled_runs
from .kernel import ALIGN, SPLIT_BYTES, CompiledPanels, pack
from .tiles import PANEL, TAIL

__all__ = ["ALIGN", "LAYERS", "NAME", "PANEL", "SPLIT_BYTES", "TAIL", "CompiledPanels", "KernelUnavailable",
           "available", "compiled_product", "compiled_runs", "pack"]
