"""How many threads BLAS runs during a forward: set per forward through threadpoolctl's API.

npspec's kernels with their own threads (npspec.kernels.registry's `own_threads`: "compiled-panels", "gemm-blocks",
"gemv-panels") share a product out to their own threads (npspec's workers, each of which calls single-threaded BLAS, or numba's
for "compiled-panels", which call none). If BLAS ran threads of its
own as well, the two kinds would compete for the cores, and OpenBLAS' idle threads keep spinning
for a while after each threaded call, on the very cores the kernel's threads need
(bench/results/threads.md measures it). So a Model runs BLAS with one thread during the forwards
of such a kernel (registry.Kernel.blas_threads) and with `threads` during those of a BLAS kernel ("gemm", "gemv-rows", and
every prefill), and puts the previous count back afterwards.

threadpoolctl is a runtime dependency for this one job: it is the portable way to set the thread
count of OpenBLAS, MKL or BLIS at run time (their environment variables are read once, when
numpy loads BLAS), small, pure Python, and kept by the scikit-learn developers.
"""

from threadpoolctl import ThreadpoolController


class BlasThreads:
    """The BLAS libraries numpy loaded; `limit(n)` is a context manager running its body with n BLAS threads.

    Costs about 10 ms to build (it lists the loaded libraries) and tens of microseconds per
    `limit`. With no BLAS that threadpoolctl knows (e.g. Apple's Accelerate), `limit` does nothing.
    """

    def __init__(self):
        self.libraries = ThreadpoolController().select(user_api="blas")

    def limit(self, n):
        """A context manager: BLAS runs `n` threads (a positive int) inside it, its previous count after."""
        return self.libraries.limit(limits=n)
