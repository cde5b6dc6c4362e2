"""How many threads BLAS runs during a forward, set per forward through threadpoolctl (OpenBLAS, MKL, BLIS).

A Model runs BLAS at one thread in the forwards of a kernel with its own threads (they would compete for the cores:
bench/results/threads.md) and at `threads` otherwise (registry.Kernel.blas_threads). Imports threadpoolctl.
"""

from threadpoolctl import ThreadpoolController


class BlasThreads:
    """The BLAS libraries numpy loaded (about 10 ms to list); with none threadpoolctl knows, `limit` does nothing."""

    def __init__(self):
        self.libraries = ThreadpoolController().select(user_api="blas")

    def limit(self, n):  # a context manager: BLAS runs n threads (a positive int) inside it, its previous count after
        return self.libraries.limit(limits=n)
