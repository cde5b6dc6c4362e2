"""The bench's kernel parts: verify_cost's M* and compiled-panels roofline, bench.profile's decompositions, bench.panels.

No timing is asserted: only what the tables hold and how their columns relate.
"""

import numpy as np
import pytest

from bench import models, panels, profile, verify_cost
from bench.common import read_table
from npspec.kernels import compiled
from npspec.model.model import Model

from conftest import tiny_model

needs_numba = pytest.mark.skipif(not compiled.available(), reason="compiled-panels needs the 'fast' extra (numba)")


def test_m_star_is_where_the_fmas_take_as_long_as_the_weight_read():
    # 40 GFMA/s against 20 GB/s: a weight (4 bytes) is read in 0.2 ns, in which 8 FMAs run
    assert verify_cost.m_star(40e9, 20e9) == 8.0
    assert verify_cost.m_star(10e9, 40e9) == 1.0


def test_products_against_forward_replays_exactly_the_forwards_products():
    model = tiny_model(n_layer=3).with_kernel("gemv-rows")
    row = profile.products_against_forward(model, calls=2, context=8)
    assert row["products"] == 4 * 3 + 1  # four per block and the head
    assert row["forward_ms"] > 0 and row["products_ms"] > 0
    assert row["around_ms"] == pytest.approx(row["forward_ms"] - row["products_ms"])
    assert model.linear.__name__ == "gemv_rows"  # the spy is gone
    four = profile.products_against_forward(model, calls=2, context=8, m=4)
    assert four["rows"] == 4 and four["products"] == row["products"] and row["rows"] == 1
    rows = profile.against_one_token([{"forward_ms": 10.0, "products_ms": 9.0, "around_ms": 1.0},
                                      {"forward_ms": 12.0, "products_ms": 10.0, "around_ms": 2.0}])
    assert [(r["v"], r["v_products"], r["v_around"]) for r in rows] == [(1.0, 0.9, 0.1), (1.2, 1.0, 0.2)]


def test_loop_against_forwards_accounts_for_every_second_of_the_loop():
    model = tiny_model(n_layer=2)
    row = profile.loop_against_forwards(model, [1, 2, 3, 4], tokens=6, calls=2)
    assert row["tokens"] == 6
    parts = row["prefill_ms_per_token"] + row["forwards_ms_per_token"] + row["rest_ms_per_token"]
    assert parts == pytest.approx(row["loop_ms_per_token"])
    assert row["prefill_ms_per_token"] > 0 and row["forwards_ms_per_token"] > 0
    assert "forward" not in vars(model) and "prefill" not in vars(model)  # the timers are gone


def test_a_decoding_start_is_timed_with_the_prefill_by_the_gemm_and_by_the_kernel_in_turn(monkeypatch):
    model, routes, real = tiny_model(n_layer=2), [], Model.with_prefill_rows

    def with_prefill_rows(self, n):  # the real copy, its prefills recorded with the prefill_rows they ran under
        other = real(self, n)
        prefill = other.prefill
        other.prefill = lambda ids, cache: routes.append((len(ids), n)) or prefill(ids, cache)
        return other
    monkeypatch.setattr(Model, "with_prefill_rows", with_prefill_rows)
    row = profile.start_by_route(model, 6, tokens=3, calls=2, pause=0)
    assert routes == [(5, 0), (5, 5)] * 3  # a warm-up round, then two, each the GEMM's start then the kernel's
    assert row["gemm_ms"] > 0 and row["kernel_ms"] > 0 and row["ratio"] == row["gemm_ms"] / row["kernel_ms"]


@needs_numba
def test_every_kernel_reads_the_column_major_copy_of_a_packed_model():
    """A compiled kernel's Model holds its block matrices packed; verify_cost times every kernel on models.column_major."""
    model = tiny_model(n_embd=32, n_vocab=97).with_kernel("compiled-panels")
    packed = model.params["h"][0]["mlp"]["c_fc"]["w"]
    assert not isinstance(packed, np.ndarray)
    params = models.column_major(model.params)
    w = params["h"][0]["mlp"]["c_fc"]["w"]
    assert isinstance(w, np.ndarray) and w.flags.f_contiguous and np.array_equal(w, np.asarray(packed))
    assert params["wte"] is model.params["wte"] and model.params["h"][0]["mlp"]["c_fc"]["w"] is packed
    ids = np.array([5, 6, 7])
    for kernel in ("gemv-rows", "compiled-panels"):
        logits = verify_cost.kernel_forward(params, model.config, kernel, 1)(ids, model.new_cache())
        np.testing.assert_allclose(logits, model.forward(ids, model.new_cache()), rtol=1e-5, atol=1e-5)


@needs_numba
def test_verify_cost_times_compiled_panels_and_marks_its_m_star(tmp_path):
    assert verify_cost.main(["--quick", "--out", str(tmp_path), "--models", "shipped:target", "--max-m", "2",
                             "--repeats", "1", "--kernels", "compiled-panels,gemv-panels"]) == 0
    rows, meta = read_table(tmp_path / "verify_cost.csv")
    assert {r["kernel"] for r in rows} == {"compiled-panels", "gemv-panels"}
    stars = {r["panels_m_star"] for r in rows}
    assert len(stars) == 1 and float(stars.pop()) > 0  # one M* per thread count, on every row
    assert all(float(r["panels_roofline_v"]) >= 1.0 for r in rows if r["M"] == "2")
    assert (tmp_path / "verify_cost.png").is_file()
    assert float(meta["compiled_panels_GFMAs_1_threads"]) > 0


@pytest.mark.slow  # long (>10 s): CI's second step
@needs_numba
def test_bench_panels_times_every_configuration_on_the_same_matrices(tmp_path, monkeypatch):
    monkeypatch.setattr(panels, "ROWS", (1, 3))
    monkeypatch.setattr(panels, "SPLIT_SHAPES", ((64, 128), (128, 256)))
    assert panels.main(["--quick", "--out", str(tmp_path), "--shape", "tiny", "--repeats", "1"]) == 0
    rows, _ = read_table(tmp_path / "panels.csv")
    ways = {r["way"] for r in rows}
    assert {f"{compiled.LAYERS[0]}-{p}" for p in panels.WIDTHS} | {"workers-64", "blas-gemv"} <= ways
    assert {r["M"] for r in rows if r["way"] == "blas-gemv"} == {"1"}
    assert (tmp_path / "panels_codes.csv").is_file()
    split, _ = read_table(tmp_path / "panels_split.csv")
    assert sorted((r["d_in"], r["d_out"], r["way"]) for r in split) == sorted(
        (str(d_in), str(d_out), way) for d_in, d_out in panels.SPLIT_SHAPES for way in ("one call", "2 runs"))
    assert all(float(r["us"]) > 0 for r in split)


@pytest.mark.slow  # a whole command, 3 s or more: CI's second step
@needs_numba
def test_bench_panels_on_one_thread_writes_no_split_table(tmp_path, monkeypatch):
    monkeypatch.setattr(panels, "ROWS", (1,))
    assert panels.main(["--quick", "--out", str(tmp_path), "--shape", "tiny", "--repeats", "1", "--threads", "1"]) == 0
    assert (tmp_path / "panels.csv").is_file() and not (tmp_path / "panels_split.csv").exists()


@needs_numba
def test_bench_panels_codes_times_both_nests_of_compiled_quant_against_the_float32_panels(tmp_path, monkeypatch):
    monkeypatch.setattr(panels, "CODE_ROWS", (1, 2))
    assert panels.main(["--quick", "--codes", "--out", str(tmp_path), "--shape", "tiny", "--repeats", "1"]) == 0
    rows, _ = read_table(tmp_path / "panels_codes.csv")
    ways = {"compiled-panels (float32)"} | {f"{s} {n}" for s in panels.CODE_SCHEMES for n in ("tiles", "blocks")}
    assert sorted((r["M"], r["way"]) for r in rows) == sorted((str(m), w) for m in (1, 2) for w in ways)
    assert not (tmp_path / "panels.csv").exists()
    megabytes = {r["way"]: float(r["MB"]) for r in rows}
    assert megabytes["int4-g64 blocks"] < megabytes["int8-ch blocks"] < megabytes["compiled-panels (float32)"] / 3


@needs_numba
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_bench_panels_workers_variant_gives_the_kernel_s_bits(threads):
    """bench.panels times the compiled loop on npspec's own workers beside the kernel; it must compute the same
    products (every panel once, an odd panel count's last one included)."""
    rng = np.random.default_rng(threads)
    ws = [np.asfortranarray(rng.standard_normal(s, dtype=np.float32)) for s in [(130, 5 * compiled.PANEL - 3), (64, 64)]]
    xs = [rng.standard_normal((6, w.shape[0]), dtype=np.float32) for w in ws]
    kernel = compiled.CompiledPanels(1)
    for got, x, w in zip(panels.workers_products(threads)(xs, ws), xs, ws):
        assert np.array_equal(got, kernel(x, w)), f"threads={threads}, {w.shape}"


def test_block_matrices_are_a_gpt2_blocks_four_shapes_column_major():
    ws = panels.block_matrices("tiny", copies=2)
    d = ws[1].shape[0]
    assert [w.shape for w in ws] == [(d, 3 * d), (d, d), (d, 4 * d), (4 * d, d)] * 2
    assert all(w.flags.f_contiguous and w.dtype == np.float32 for w in ws)
