"""The kernels: the products `x @ w` every linear layer of a forward runs through.

products (NumPy: BLAS GEMM/GEMV and the panel kernels on npspec's own threads), compiled (the numba kernel
compiled-panels, the `fast` extra), quantized (products over int8/int4 codes), blas (BLAS thread counts),
registry (every kernel by name, with its batch-invariance contract), and probe (each role's kernel, threads and
prefill length, measured in one call: choose_kernels). Imports numpy, threadpoolctl and, when a compiled kernel is
built, numba; nothing else of npspec.
"""
