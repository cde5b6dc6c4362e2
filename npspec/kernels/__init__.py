"""The kernels, the products `x @ w` of every linear layer: products (NumPy's), compiled (numba's, the `fast`
extra), quantized (int8 codes), layout, workers (threads), blas (BLAS threads) and registry (every kernel by name).
Imports numpy, threadpoolctl and, when a compiled kernel is built, numba; nothing else of npspec.
"""
