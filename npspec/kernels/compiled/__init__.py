""""compiled-panels" (the `fast` extra), batch invariant by construction: y[m, n] is s after s = +0.0,
s = fma(x[m, k], w[k, n], s) for k = 0 .. d_in - 1, each fma rounded once (notes/kernels.md). tiles (the loop nest
for 512-bit vectors), blocks (register blocks of 256-bit vectors), intrinsics, build (compiling them) and kernel
(`CompiledPanels`); qtiles and quant ("compiled-quant": the same chain over int codes scaled in registers); the one
part of npspec that touches numba.
"""

from .build import LAYERS, NAME, KernelUnavailable, available, compiled_product, compiled_runs, host_panel
from .kernel import ALIGN, SPLIT_BYTES, CompiledPanels, Packed, pack
from .quant import CompiledQuant, QuantPanels, QuantTied, quant_gemm
from .tiles import PANEL, TAIL

__all__ = ["ALIGN", "LAYERS", "NAME", "PANEL", "SPLIT_BYTES", "TAIL", "CompiledPanels", "CompiledQuant",
           "KernelUnavailable", "Packed", "QuantPanels", "QuantTied", "available", "compiled_product", "compiled_runs",
           "host_panel", "pack", "quant_gemm"]
