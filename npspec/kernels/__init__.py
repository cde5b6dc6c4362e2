"""The kernels, the products `x @ w` of every linear layer: products (NumPy's), compiled (numba's, the `fast`
extra), quantized (int8 codes), layout, workers (threads), blas (BLAS threads), registry (every kernel by name) and
probe (each role's kernel, threads and prefill length, chosen in one call: choose_kernels).
Imports numpy, threadpoolctl and, when a compiled kernel is built, numba; nothing else of npspec.
"""
