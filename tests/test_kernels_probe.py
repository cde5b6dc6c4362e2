"""kernels.same_bits_rows, the probe gemm-blocks rests on: how many rows this machine's BLAS keeps each row's bits for.

Its logic is tested with a fake BLAS that never calls the real one (so the result does not depend on this CPU);
its answer on the real BLAS is then checked on other numbers than its own, on any CPU.
"""

import numpy as np
import pytest

from npspec.kernels.products import BLOCK_ROWS, same_bits_rows


def fake_blas(breaks_at, row=0):
    """A product that never calls the real BLAS (so the probe's tests do not depend on this CPU's): each row is
    reduced on its own by NumPy's elementwise multiply and sum, so its bits never depend on the other rows, except
    that row `row` of every product of `breaks_at` or more rows is off by one unit in the last place."""
    def matmul(x, w):
        y = np.stack([(xi[:, None] * w).sum(axis=0) for xi in x])  # [m, d_in] x [d_in, width] -> [m, width]
        if x.shape[0] >= breaks_at:
            y[row] = np.nextafter(y[row], np.inf)
        return y
    return matmul


def test_same_bits_rows_finds_the_first_row_count_whose_rows_differ_from_a_two_row_gemm():
    assert same_bits_rows(64, 16, 12, fake_blas(breaks_at=99)) == 12  # never breaks: the cap
    assert same_bits_rows(64, 16, 12, fake_blas(breaks_at=5)) == 4
    assert same_bits_rows(64, 16, 12, fake_blas(breaks_at=7, row=6)) == 6  # the last row only
    assert same_bits_rows(64, 16, 12, fake_blas(breaks_at=2, row=1)) == BLOCK_ROWS  # cannot do better than 2


@pytest.mark.parametrize("d_in, width", [(768, 48), (1280, 32), (5120, 8), (256, 160)])
def test_same_bits_rows_holds_for_every_row_count_up_to_the_limit_on_this_blas(d_in, width):
    """The probe's answer, checked on other numbers than its own, with rows in other places."""
    limit = same_bits_rows(d_in, width)
    rng = np.random.default_rng(11)
    w = np.asfortranarray(rng.standard_normal((d_in, width), dtype=np.float32))
    x = rng.standard_normal((limit, d_in), dtype=np.float32)
    alone = [np.concatenate([x[i : i + 1], np.zeros((1, d_in), np.float32)]) @ w for i in range(limit)]
    for m in range(BLOCK_ROWS, limit + 1):
        y = x[limit - m :] @ w
        assert all(np.array_equal(y[j], alone[limit - m + j][0]) for j in range(m)), f"[{d_in}, {width}], {m} rows"
